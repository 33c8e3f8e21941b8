"""on_transition: one call per transition cluster-wide, in the process whose call made it."""

from __future__ import annotations

import logging
import multiprocessing

import pytest

from breaker_redis import BreakerConfig, Breakers, Transition
from tests import mp_workers
from tests.workers import TRIP_AT_3, admits, fail, snapshot, subscribed

CYCLE = BreakerConfig(trip="consecutive", failure_threshold=2, open_seconds=10, half_open_successes=1)


def test_every_transition_is_reported_with_its_cause_epoch_and_time(make_breakers, clock):
    breakers = make_breakers()
    seen: list[Transition] = []
    breakers.on_transition(seen.append)
    b = breakers.get("pay", CYCLE)
    fail(b, 2)
    clock.advance(10_000)
    b.acquire().success()  # open -> half_open (the probe) -> closed
    b.force_open()
    b.clear_force()
    assert [(t.old, t.new, t.cause) for t in seen] == [
        ("closed", "open", "consecutive"),
        ("open", "half_open", "open_elapsed"),
        ("half_open", "closed", "probes_succeeded"),
        ("closed", "open", "forced_open"),
        ("open", "closed", "force_cleared"),
    ]
    assert [t.epoch for t in seen] == [seen[0].epoch + i for i in range(5)]
    assert seen[-1].epoch == b.snapshot()["epoch"]
    assert {t.name for t in seen} == {"pay"}
    assert seen[0].at_ms == clock.now - 10_000 and seen[1].at_ms == clock.now


def test_a_failing_callback_is_logged_and_never_reaches_the_caller(make_breakers, caplog):
    breakers = make_breakers()

    @breakers.on_transition
    def broken(transition: Transition) -> None:
        raise RuntimeError("the pager is down")

    seen: list[Transition] = []
    breakers.on_transition(seen.append)
    b = breakers.get("pay", TRIP_AT_3)
    with caplog.at_level(logging.ERROR, logger="breaker_redis"):
        fail(b, 3)  # the third failure trips it and returns normally
    assert [t.new for t in seen] == ["open"]  # later callbacks still run
    assert "the pager is down" in caplog.text


def test_only_the_worker_whose_call_made_it_is_called(store):
    workers = [Breakers(store), Breakers(store)]
    reports: list[list[str]] = [[], []]
    try:
        for w, report in zip(workers, reports, strict=True):
            w.on_transition(lambda t, report=report: report.append(t.new))
        a, b = (w.get("pay", TRIP_AT_3) for w in workers)
        subscribed(workers)
        assert admits(b)
        fail(a, 3)
        assert not admits(b)  # b heard of it, and asked Redis: no transition of its own
        assert reports == [["open"], []]
    finally:
        for w in workers:
            w.close()


def test_a_callback_must_be_callable(make_breakers):
    with pytest.raises(TypeError):
        make_breakers().on_transition("page me")  # type: ignore[arg-type]


@pytest.mark.multiprocess
def test_eight_processes_racing_a_trip_make_one_call_in_total(redis_server):
    redis_server.client().flushall()
    cfg = BreakerConfig(trip="count", failure_threshold=5, window_seconds=60, open_seconds=60)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(8) as pool:
        reports, barrier = manager.list(), manager.Barrier(8)
        args = (redis_server.url, "race", cfg, 20, barrier, reports)
        results = [pool.apply_async(mp_workers.race_to_trip, args) for _ in range(8)]
        admitted = sum(r.get(timeout=120) for r in results)
        calls = list(reports)
    assert admitted >= 5
    assert len(calls) == 1
    name, old, new, cause, epoch = calls[0]
    assert (name, old, new, cause) == ("race", "closed", "open", "count")
    assert epoch == snapshot(redis_server.url, "race", cfg)["epoch"]
