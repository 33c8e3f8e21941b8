"""OpenTelemetry metrics and span events (breaker_redis.opentelemetry, docs/opentelemetry.md),
read back with the SDK's in-memory reader and exporter, over real breakers: a trip and a
recovery, counted exactly, on the sync side and the asyncio one."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import fakeredis
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from breaker_redis import BreakerConfig, BreakerOpen
from breaker_redis import opentelemetry as otel
from breaker_redis.asyncio import Breakers as AsyncBreakers
from tests.support.clock import Clock
from tests.support.workers import subscribed

RECOVERS = BreakerConfig(
    trip="consecutive", failure_threshold=3, open_seconds=10, ignore_exceptions=(KeyError,)
)

Points = dict[tuple[str, frozenset[tuple[str, Any]]], float]


class Telemetry:
    """An SDK meter provider read in memory, and a tracer provider exporting to memory."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meters = MeterProvider(metric_readers=[self.reader])
        self.spans = InMemorySpanExporter()
        self.tracers = TracerProvider()
        self.tracers.add_span_processor(SimpleSpanProcessor(self.spans))
        self.tracer = self.tracers.get_tracer("test")

    def points(self) -> Points:
        """Every data point collected now: (instrument, attributes) -> value."""
        found: Points = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                assert scope.scope.name == "breaker_redis"
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        found[(metric.name, frozenset(point.attributes.items()))] = point.value  # type: ignore[union-attr]
        return found

    def units(self) -> dict[str, tuple[str, str]]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return {
            metric.name: (type(metric.data).__name__, metric.unit or "")
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }

    def events(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(span, event, attributes) of every span ended so far."""
        return [
            (span.name, event.name, dict(event.attributes or {}))
            for span in self.spans.get_finished_spans()
            for event in span.events
        ]


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    found = Telemetry()
    yield found
    found.meters.shutdown()
    found.tracers.shutdown()


def calls(name: str, outcome: str, reason: str = "") -> tuple[str, frozenset[tuple[str, Any]]]:
    attributes = {"breaker.name": name, "breaker.outcome": outcome}
    if reason:
        attributes["breaker.refusal.reason"] = reason
    return "breaker.calls", frozenset(attributes.items())


def states(name: str, current: str, ramp: float | None = 1.0) -> Points:
    """breaker.state's points, and while closed breaker.ramp_share's (``ramp``; None: left out)."""
    points: Points = {
        ("breaker.state", frozenset({"breaker.name": name, "breaker.state": s}.items())): int(s == current)
        for s in ("closed", "open", "half_open")
    }
    if current == "closed" and ramp is not None:
        points["breaker.ramp_share", frozenset({"breaker.name": name}.items())] = ramp
    return points


def transitions(name: str, old: str, new: str, cause: str) -> tuple[str, frozenset[tuple[str, Any]]]:
    attributes = {
        "breaker.name": name,
        "breaker.transition.from": old,
        "breaker.transition.to": new,
        "breaker.transition.cause": cause,
    }
    return "breaker.transitions", frozenset(attributes.items())


def boom() -> None:
    raise ConnectionError("upstream down")


def missing() -> None:
    raise KeyError("ignored by the config")


def test_a_trip_and_a_recovery_counted_exactly(make_breakers, clock: Clock, telemetry: Telemetry) -> None:
    breakers = make_breakers()
    otel.instrument(breakers, meter_provider=telemetry.meters)
    otel.instrument(breakers, meter_provider=telemetry.meters)  # a second time: nothing more
    pay, cart = breakers.get("pay", RECOVERS), breakers.get("cart", RECOVERS)
    assert telemetry.points() == {}  # nothing called, nothing known

    cart.call(lambda: None)
    pay.call(lambda: None)
    with pytest.raises(KeyError):
        pay.call(missing)
    with telemetry.tracer.start_as_current_span("checkout"):
        for _ in range(3):
            with pytest.raises(ConnectionError):
                pay.call(boom)
    with telemetry.tracer.start_as_current_span("refused"), pytest.raises(BreakerOpen):
        pay.call(lambda: None)
    with pytest.raises(BreakerOpen):
        pay.acquire()  # no span: counted all the same

    assert telemetry.points() == {
        calls("cart", "success"): 1,
        calls("pay", "success"): 1,
        calls("pay", "ignored"): 1,
        calls("pay", "failure"): 3,
        calls("pay", "refused", "open"): 2,
        **states("cart", "closed"),
        **states("pay", "open"),
        transitions("pay", "closed", "open", "consecutive"): 1,
    }
    assert telemetry.events() == [
        (
            "checkout",
            "breaker.trip",
            {
                "breaker.name": "pay",
                "breaker.transition.from": "closed",
                "breaker.transition.cause": "consecutive",
            },
        ),
        (
            "refused",
            "breaker.refusal",
            {"breaker.name": "pay", "breaker.refusal.reason": "open", "breaker.refusal.retry_after": 10.0},
        ),
    ]

    clock.advance(10_000)
    pay.call(lambda: None)  # the probe: half-open, then closed
    points = telemetry.points()
    assert points[calls("pay", "success")] == 2
    assert {
        k: v for k, v in points.items() if k[0] == "breaker.state" and ("breaker.name", "pay") in k[1]
    } == (states("pay", "closed", ramp=None))
    assert points[transitions("pay", "open", "half_open", "open_elapsed")] == 1
    assert points[transitions("pay", "half_open", "closed", "probes_succeeded")] == 1
    assert telemetry.units() == {
        "breaker.calls": ("Sum", "{call}"),
        "breaker.state": ("Gauge", "1"),
        "breaker.ramp_share": ("Gauge", "1"),
        "breaker.transitions": ("Sum", "{transition}"),
    }


def test_the_share_a_ramping_breaker_admits(make_breakers, clock: Clock, telemetry: Telemetry) -> None:
    """breaker.ramp_share: from ramp_from after the close to 1 at the ramp's end (docs/recovery.md)."""
    breakers = make_breakers()
    otel.instrument(breakers, meter_provider=telemetry.meters)
    pay = breakers.get("pay", replace(RECOVERS, ramp_seconds=10, ramp_from=0.2))
    pay.call(lambda: None)  # the workers' config is stored with the state: the ramp reads it
    pay.force_open()
    pay.clear_force()  # closing a breaker that refused calls starts the ramp
    with pytest.raises(BreakerOpen) as refused:
        pay.call(lambda: None)  # 0.2 of a credit: refused, reason ramp
    assert refused.value.reason == "ramp"
    share = ("breaker.ramp_share", frozenset({"breaker.name": "pay"}.items()))
    assert telemetry.points()[share] == pytest.approx(0.2)
    clock.advance(5_000)
    assert telemetry.points()[share] == pytest.approx(0.6)
    clock.advance(5_000)
    assert telemetry.points()[share] == 1.0
    assert telemetry.points()[calls("pay", "refused", "ramp")] == 1
    assert telemetry.points()[calls("pay", "success")] == 1


def test_a_permit_and_an_operator_trip(make_breakers, telemetry: Telemetry) -> None:
    breakers = make_breakers()
    otel.instrument(breakers, meter_provider=telemetry.meters)
    pay = breakers.get("pay", RECOVERS)
    with pay:
        pass
    pay.acquire().failure()
    with telemetry.tracer.start_as_current_span("admin"):
        pay.trip()
    points = telemetry.points()
    assert points[calls("pay", "success")] == 1
    assert points[calls("pay", "failure")] == 1
    assert points[transitions("pay", "closed", "open", "opened")] == 1
    assert telemetry.events() == [
        (
            "admin",
            "breaker.trip",
            {
                "breaker.name": "pay",
                "breaker.transition.from": "closed",
                "breaker.transition.cause": "opened",
            },
        )
    ]


def test_outside_any_span_a_tracer_provider_makes_a_span_of_each_event(
    make_breakers, telemetry: Telemetry
) -> None:
    """A trip and a refusal in code nobody traced (a job, a script): with a tracer
    provider each is a span of its own, named as the event; without one, nothing."""
    for traced in (True, False):
        breakers = make_breakers()
        name = f"job-{traced}"
        otel.instrument(
            breakers, meter_provider=telemetry.meters, tracer_provider=telemetry.tracers if traced else None
        )
        job = breakers.get(name, RECOVERS)
        job.trip()
        with pytest.raises(BreakerOpen):
            job.call(lambda: None)
    spans = [(span.name, dict(span.attributes or {})) for span in telemetry.spans.get_finished_spans()]
    assert [span[0] for span in spans] == ["breaker.trip", "breaker.refusal"]
    assert spans[0][1] == {
        "breaker.name": "job-True",
        "breaker.transition.from": "closed",
        "breaker.transition.cause": "opened",
    }
    assert spans[1][1]["breaker.name"] == "job-True"
    assert spans[1][1]["breaker.refusal.reason"] == "open"
    assert all(
        span.instrumentation_scope.name == "breaker_redis" for span in telemetry.spans.get_finished_spans()
    )


def test_inside_a_span_the_events_go_on_it_and_no_span_is_made(make_breakers, telemetry: Telemetry) -> None:
    breakers = make_breakers()
    otel.instrument(breakers, meter_provider=telemetry.meters, tracer_provider=telemetry.tracers)
    pay = breakers.get("pay", RECOVERS)
    with telemetry.tracer.start_as_current_span("POST /pay"):
        pay.trip()
        with pytest.raises(BreakerOpen):
            pay.call(lambda: None)
    assert [span.name for span in telemetry.spans.get_finished_spans()] == ["POST /pay"]
    assert [event[1] for event in telemetry.events()] == ["breaker.trip", "breaker.refusal"]


def test_the_healthy_call_written_inline_is_counted(make_breakers, telemetry: Telemetry) -> None:
    """guard()'s healthy path (successes batched, breaker/engine.py) makes no permit."""
    breakers = make_breakers(listen=True, batch_successes=True)
    otel.instrument(breakers, meter_provider=telemetry.meters)
    pay = breakers.get("pay", RECOVERS)
    subscribed([breakers])  # so that memory decides and successes are batched
    for _ in range(5):
        pay.call(lambda: None)
    with pytest.raises(ConnectionError):
        pay.call(boom)
    breakers.recorder.flush()
    assert telemetry.points() == {
        calls("pay", "success"): 5,
        calls("pay", "failure"): 1,
        **states("pay", "closed"),
    }


def test_two_breakers_objects_on_one_provider_are_both_counted(make_breakers, telemetry: Telemetry) -> None:
    first, second = make_breakers(prefix="a"), make_breakers(prefix="b")
    for breakers in (first, second):
        otel.instrument(breakers, meter_provider=telemetry.meters)
    first.get("pay").call(lambda: None)
    second.get("cart").call(lambda: None)
    second.get("cart").call(lambda: None)
    points = telemetry.points()
    assert points[calls("pay", "success")] == 1
    assert points[calls("cart", "success")] == 2


@pytest.mark.processes
def test_a_forked_worker_counts_its_own_calls(make_breakers, telemetry: Telemetry) -> None:
    """gunicorn --preload: the app (and its instrumented Breakers) is built, and may be
    called, before the fork; each worker's counts start at the fork, or the parent's would
    be counted once per worker."""
    breakers = make_breakers()
    otel.instrument(breakers, meter_provider=telemetry.meters)
    pay = breakers.get("pay", RECOVERS)
    pay.call(lambda: None)
    pay.call(lambda: None)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker
        status = 1
        try:
            pay.call(lambda: None)
            seen = telemetry.points().get(calls("pay", "success"))
            os.write(write, repr(seen).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as pipe:
        seen = pipe.read()
    assert os.waitpid(pid, 0)[1] == 0
    assert seen == "1"
    assert telemetry.points()[calls("pay", "success")] == 2


def test_an_uninstrumented_breakers_tells_no_one(make_breakers) -> None:
    breakers = make_breakers()
    assert breakers.call_observers == ()
    breakers.get("pay").call(lambda: None)


def test_the_asyncio_breakers(telemetry: Telemetry) -> None:
    clock = Clock()

    async def scenario() -> None:
        breakers = AsyncBreakers(
            fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer()), clock=clock, listen=False
        )
        otel.instrument(breakers, meter_provider=telemetry.meters)
        pay = breakers.get("pay", RECOVERS)
        await pay.call(lambda: None)
        with telemetry.tracer.start_as_current_span("checkout"):
            for _ in range(3):
                with pytest.raises(ConnectionError):
                    await pay.call(boom)
            with pytest.raises(BreakerOpen):
                await pay.call(lambda: None)
        await breakers.aclose()

    asyncio.run(scenario())
    assert telemetry.points() == {
        calls("pay", "success"): 1,
        calls("pay", "failure"): 3,
        calls("pay", "refused", "open"): 1,
        **states("pay", "open"),
        transitions("pay", "closed", "open", "consecutive"): 1,
    }
    assert [event for _, event, _ in telemetry.events()] == ["breaker.trip", "breaker.refusal"]


@pytest.mark.processes
def test_importing_breaker_redis_does_not_import_opentelemetry() -> None:
    """redis-py itself imports opentelemetry when it is installed: what counts is what
    breaker_redis adds to that."""
    code = (
        "import sys, redis, redis.asyncio, fakeredis; before = set(sys.modules)\n"
        "import breaker_redis, breaker_redis.asyncio\n"
        "print(sorted(m for m in set(sys.modules) - before if 'opentelemetry' in m))"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout == "[]\n"
