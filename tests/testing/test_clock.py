"""ManualClock: the time a test gives its breakers, and how a Breakers on it keeps that time
(the scripts' now_ms and the decisions from memory alike), with nothing slept."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest

from breaker_redis import BreakerConfig, BreakerOpen, Breakers, State, Transition
from breaker_redis.testing import ManualClock

PAY = BreakerConfig(trip="consecutive", failure_threshold=2, open_seconds=30, half_open_successes=1)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start_ms=1_700_000_000_000)


@pytest.fixture
def breakers(clock: ManualClock) -> Iterator[Breakers]:
    made = Breakers.from_url("memory://", clock=clock)
    yield made
    made.close()


def retry_after(breaker) -> float | None:
    with pytest.raises(BreakerOpen) as refusal:
        breaker.acquire()
    return refusal.value.retry_after


def test_it_starts_at_the_wall_clock_time_it_was_made() -> None:
    before = int(time.time() * 1000)
    clock = ManualClock()
    assert before <= clock.now_ms == clock() <= int(time.time() * 1000)


def test_it_stands_still_until_advanced(clock: ManualClock) -> None:
    assert clock() == clock.now_ms == 1_700_000_000_000
    assert clock.advance(1.5) == 1_700_000_001_500
    assert clock.advance(0.0004) == 1_700_000_001_500  # to the millisecond
    assert clock.advance(0) == clock() == 1_700_000_001_500
    assert clock.advance(2) == 1_700_000_003_500
    assert repr(clock) == "ManualClock(now_ms=1700000003500)"


@pytest.mark.parametrize("seconds", [-0.001, -5, math.nan, math.inf])
def test_it_never_goes_back(clock: ManualClock, seconds: float) -> None:
    with pytest.raises(ValueError, match="never goes back"):
        clock.advance(seconds)
    assert clock.now_ms == 1_700_000_000_000


@pytest.mark.parametrize("seconds", ["1", None, True])
def test_advance_takes_a_number_of_seconds(clock: ManualClock, seconds: object) -> None:
    with pytest.raises(TypeError, match="a number of seconds"):
        clock.advance(seconds)  # type: ignore[arg-type]


@pytest.mark.parametrize("start", [-1, 1.5, "0", True])
def test_a_start_is_milliseconds(start: object) -> None:
    with pytest.raises(ValueError, match="start_ms must be an int of milliseconds"):
        ManualClock(start)  # type: ignore[arg-type]


def test_advancing_past_open_seconds_admits_the_probe_without_sleeping(
    clock: ManualClock, breakers: Breakers
) -> None:
    started = time.monotonic()
    pay = breakers.get("pay", PAY)
    for _ in range(2):
        pay.acquire().failure()
    assert retry_after(pay) == 30.0
    clock.advance(29.999)
    assert retry_after(pay) == 0.001  # decided from memory on the same clock
    clock.advance(0.001)
    probe = pay.acquire()
    assert pay.state is State.HALF_OPEN
    probe.success()
    assert pay.state is State.CLOSED
    assert time.monotonic() - started < 10  # 30 s of the breaker's time, none of the test's


def test_the_scripts_reckon_in_its_time(clock: ManualClock, breakers: Breakers) -> None:
    seen: list[Transition] = []
    breakers.on_transition(seen.append)
    pay = breakers.get("pay", PAY)
    clock.advance(60)
    for _ in range(2):
        pay.acquire().failure()
    clock.advance(30)
    pay.acquire().success()
    assert [(t.old, t.new, t.at_ms) for t in seen] == [
        ("closed", "open", 1_700_000_060_000),
        ("open", "half_open", 1_700_000_090_000),
        ("half_open", "closed", 1_700_000_090_000),
    ]
