"""Arming only when a decision is within reach (docs/boundary.md, "Calm and armed").

A rate or slow-call rule arms when REACH (20) more failures could make it hold,
on the window as it is and as it will be once its oldest bucket slid out, and
calms again beyond twice that. Far from its threshold a breaker stays calm: a
background error rate costs one record per failure and nothing per success.
The guarantee is tested at its edge: a worker that stays silent after the
arming can move the trip by its held successes only once REACH failures came
after the arming notice, never before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from breaker_redis import BreakerConfig, BreakerOpen, Breakers
from breaker_redis.urls import client_from_url
from tests.support.redis_server import RedisServer
from tests.support.workers import admits, fail, subscribed

REACH = 20  # lua/_lib.lua
RATE = BreakerConfig(trip="rate", failure_rate=0.5, minimum_calls=20, window_seconds=600, open_seconds=30)


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture(params=["embedded", "real"])
def url(request: pytest.FixtureRequest) -> str:
    server = request.getfixturevalue("redis_server" if request.param == "real" else "embedded")
    client_from_url(server.url).flushall()
    return str(server.url)


@pytest.fixture
def clocked(url: str) -> Iterator[tuple[Breakers, Clock]]:
    """One worker whose every outcome goes to Redis at once, on a clock the test moves."""
    clock = Clock()
    breakers = Breakers.from_url(url, clock=clock, listen=False)
    yield breakers, clock
    breakers.close()


def armed(breaker: Any) -> bool:
    known = breaker.known
    assert known is not None and known.state == "closed"
    return bool(known.armed)


def succeed(breaker: Any, n: int = 1) -> None:
    for _ in range(n):
        breaker.acquire().success()


def test_a_rate_rule_arms_exactly_reach_failures_before_it_could_hold(clocked):
    breakers, _ = clocked
    pay = breakers.get("pay", RATE)
    succeed(pay, 300)
    # f failures on 300 successes: within reach once f + 20 >= 0.5 * (300 + f + 20), f >= 280
    fail(pay, 279)
    assert not armed(pay)
    fail(pay)
    assert armed(pay)
    assert pay.snapshot()["window_failures"] == 280


def test_once_armed_it_calms_only_beyond_twice_the_reach(clocked):
    breakers, _ = clocked
    pay = breakers.get("pay", RATE)
    succeed(pay, 300)
    fail(pay, 280)
    assert armed(pay)
    # calm again when 280 + 40 < 0.5 * (580 + s + 40): s > 20
    succeed(pay, 20)
    assert armed(pay)
    succeed(pay)
    assert not armed(pay)


def test_a_window_about_to_slide_arms_on_what_it_will_hold(clocked):
    """300 successes in the oldest bucket: sliding it out will lift the rate, so
    the breaker arms on the window without it (60 successes, 40 failures)."""
    breakers, clock = clocked
    config = BreakerConfig(
        trip="rate", failure_rate=0.5, minimum_calls=20, window_seconds=10, window_buckets=10, open_seconds=30
    )
    pay = breakers.get("pay", config)
    clock.now = 1_700_000_000_000  # a bucket boundary (1 s buckets)
    succeed(pay, 300)
    clock.now += 9_500  # the last bucket: the first one slides out in 0.5 s
    succeed(pay, 60)
    fail(pay, 39)  # as it is: 39 of 399; once slid: 39 of 99, 40 needed (40 + 20 >= 0.5 * 120)
    assert not armed(pay)
    fail(pay)
    assert armed(pay)
    clock.now += 500  # the slide: 40 of 100, one failure from the trip, and every worker armed
    fail(pay, 19)
    assert admits(pay)
    fail(pay)
    with pytest.raises(BreakerOpen):
        pay.acquire()


def test_a_background_error_rate_costs_one_record_per_failure(redis_server: RedisServer):
    """1 % failures against a 50 % rule: calm all along, so every success is batched
    and every failure is one record carrying the batch; nothing else is sent."""
    client_from_url(redis_server.url).flushall()
    breakers = Breakers.from_url(redis_server.url)
    scheduled: list[object] = []
    breakers.recorder.schedule = scheduled.append  # type: ignore[method-assign]  # the test sends
    pay = breakers.get("pay", RATE)
    subscribed([breakers])
    succeed(pay, 300)
    pay.flush_batch()
    commands = _script_calls(redis_server)
    for i in range(3000):
        if i % 100 == 99:
            fail(pay)
        else:
            pay.acquire().success()
    sent = _script_calls(redis_server) - commands
    pay.flush_batch()
    snap = pay.snapshot()
    breakers.close()
    assert sent == 30
    assert (snap["window_calls"], snap["window_failures"], snap["state"]) == (3300, 30, "closed")


def _script_calls(server: RedisServer) -> int:
    stats = server.client().info("commandstats")
    return sum(
        int(v["calls"])
        for k, v in stats.items()
        if k in ("cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval", "cmdstat_ping")
    )


@pytest.fixture
def two(url: str) -> Iterator[tuple[Breakers, Breakers]]:
    made = (Breakers.from_url(url), Breakers.from_url(url))
    yield made
    for w in made:
        w.close()


@pytest.mark.parametrize("silent", [False, True])
def test_the_guarantee_at_its_edge(two, silent):
    """B has 300 successes in Redis, A holds 40 batched, then B fails again and
    again. Armed at B's 280th failure. If A makes a call after that (it hears the
    notice first and sends its batch), the trip comes where it would with no
    batching at all: the 340th failure. If A stays silent (its batch held back),
    the trip comes REACH failures after the arming, the 300th, never earlier."""
    a_workers, b_workers = two
    held: list[object] = []
    a_workers.recorder.schedule = held.append  # type: ignore[method-assign]
    a, b = a_workers.get("pay", RATE), b_workers.get("pay", RATE)
    subscribed([a_workers, b_workers])
    succeed(b, 300)
    b.flush_batch()
    succeed(a, 40)
    assert a._batch_count == 40
    failures = 0

    def trips() -> int:
        nonlocal failures
        while True:
            fail(b)
            failures += 1
            if not admits(b):
                return failures

    if silent:
        with a._send_lock:  # A's listener thread hears the notice: its send waits here
            fail(b, 280)
            assert armed(b)
            failures = 280
            assert trips() == 280 + REACH
    else:
        fail(b, 280)
        assert armed(b)
        failures = 280
        assert admits(a)  # A drains the arming notice, then sends its batch
        assert a._batch_count == 0
        assert trips() == 340
