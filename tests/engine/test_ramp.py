"""The ramp after a close (BreakerConfig.ramp_seconds, docs/recovery.md).

After a close the share of calls admitted rises linearly from ramp_from to 1
over ramp_seconds, for every worker together. Each worker decides it from
memory with a credit (breaker_redis/engine/ramp.py), so the counts below are
exact: at a share s, n calls admit floor(credit + n * s). Time is the test's
clock, moved by the test; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Any

import pytest

from breaker_redis import BreakerConfig, BreakerOpen, Breakers
from breaker_redis.asyncio import Breakers as AsyncBreakers
from breaker_redis.base.errors import REASONS
from breaker_redis.engine import core
from breaker_redis.testing import ManualClock
from breaker_redis.urls import client_from_url
from tests.support.redis_server import RedisServer
from tests.support.workers import subscribed

RAMP = BreakerConfig(failure_threshold=2, open_seconds=10, ramp_seconds=10, ramp_from=0.1)
# 100 calls a second at the share of each second: 0.1 + 0.09 t, then every call
RISING = [10, 19, 28, 37, 46, 55, 64, 73, 82, 91, 100, 100]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start_ms=1_700_000_000_000)


def ok() -> str:
    return "ok"


def boom() -> None:
    raise RuntimeError("the service failed")


def trip(breaker: Any) -> None:
    """Failures until the breaker opens (a call the ramp refuses sends nothing)."""
    while breaker.snapshot()["state"] == "closed":
        with contextlib.suppress(RuntimeError, BreakerOpen):
            breaker.call(boom)


def recover(breaker: Any, clock: ManualClock) -> None:
    """Open, its open period over, the probe succeeds: closed."""
    trip(breaker)
    clock.advance(breaker.snapshot()["retry_after"])
    assert breaker.call(ok) == "ok"
    assert breaker.snapshot()["state"] == "closed"


def calls(breaker: Any, n: int) -> tuple[int, list[BreakerOpen]]:
    """n calls: how many were admitted, and the refusals."""
    admitted, refused = 0, []
    for _ in range(n):
        try:
            breaker.call(ok)
            admitted += 1
        except BreakerOpen as refusal:
            refused.append(refusal)
    return admitted, refused


def test_the_share_admitted_rises_linearly_from_ramp_from_to_every_call(make_breakers, clock):
    pay = make_breakers().get("pay", RAMP)
    recover(pay, clock)
    rejected = pay.snapshot()["rejected"]
    admitted, shares = [], []
    for _ in RISING:
        shares.append(pay.snapshot()["ramp_share"])
        n, refused = calls(pay, 100)
        admitted.append(n)
        assert {(r.reason, r.breaker) for r in refused} <= {("ramp", "pay")}
        assert all(0 < r.retry_after <= 1.0 for r in refused if r.retry_after is not None)
        clock.advance(1)
    assert admitted == RISING
    assert "ramp" in REASONS
    assert shares == pytest.approx([0.1 + 0.09 * t for t in range(10)] + [1.0, 1.0])
    snap = pay.snapshot()
    assert snap["rejected"] - rejected == sum(100 - n for n in RISING)
    assert (snap["ramp_share"], snap["ramp_until_ms"]) == (1.0, None)
    assert pay.known is not None and pay.known.admits  # the healthy call's one test again


def test_without_ramp_seconds_a_close_admits_every_call(make_breakers, clock):
    pay = make_breakers().get("pay", BreakerConfig(failure_threshold=2, open_seconds=10))
    recover(pay, clock)
    assert calls(pay, 100) == (100, [])
    assert pay.known is not None and pay.known.admits
    assert (pay.snapshot()["ramp_share"], pay.snapshot()["ramp_until_ms"]) == (1.0, None)


def test_each_worker_admits_its_share_and_the_workers_together_the_same(make_breakers, clock):
    """Four workers on one store and one clock: the close is one worker's, the ramp everyone's."""
    workers = [make_breakers().get("pay", RAMP) for _ in range(4)]
    trip(workers[0])
    clock.advance(10)
    workers[0].call(ok)
    for second, share in enumerate([0.1, 0.19, 0.28, 0.37]):
        counts = [calls(w, 50 + 10 * i)[0] for i, w in enumerate(workers)]
        # each worker's credit carries over: floor of its calls so far times the shares so far
        assert sum(counts) == pytest.approx(share * 260, abs=4), second
        for i, count in enumerate(counts):
            assert abs(count - share * (50 + 10 * i)) <= 1, (second, i)
        clock.advance(1)


def test_a_trip_during_the_ramp_reopens_with_the_backoff_for_everyone(make_breakers, clock):
    one, other = (make_breakers().get("pay", RAMP) for _ in range(2))
    recover(one, clock)
    clock.advance(2)  # ramping: a share of 0.28
    trip(one)
    snap = one.snapshot()
    # the open period after a failed probe: twice the last one (10 s), plus up to 10 % jitter
    assert 20_000 <= snap["open_until_ms"] - clock.now_ms <= 22_000
    with pytest.raises(BreakerOpen) as refusal:
        other.acquire()
    assert refusal.value.reason == "open"


def test_once_the_ramp_is_over_a_trip_opens_for_open_seconds_again(make_breakers, clock):
    pay = make_breakers().get("pay", RAMP)
    recover(pay, clock)
    clock.advance(10)
    trip(pay)
    assert pay.snapshot()["open_until_ms"] - clock.now_ms == 10_000


def test_without_a_ramp_a_trip_after_a_close_opens_for_open_seconds(make_breakers, clock):
    pay = make_breakers().get("pay", BreakerConfig(failure_threshold=2, open_seconds=10))
    recover(pay, clock)
    trip(pay)
    assert pay.snapshot()["open_until_ms"] - clock.now_ms == 10_000


@pytest.mark.parametrize("force", ["trip", "force_open"])
@pytest.mark.parametrize("close", ["reset", "clear_force"])
def test_an_operator_closing_a_breaker_that_refused_starts_the_ramp(make_breakers, clock, force, close):
    pay = make_breakers().get("pay", RAMP)
    assert calls(pay, 10) == (10, [])  # the workers' config is stored with the state
    getattr(pay, force)()
    if force == "trip" and close == "clear_force":
        pay.force_open()  # (auto clears a force; a trip is none)
    getattr(pay, close)()
    assert calls(pay, 100)[0] == 10
    assert pay.snapshot()["ramp_share"] == pytest.approx(0.1)


def test_force_closed_admits_every_call_and_clearing_it_starts_no_ramp(make_breakers, clock):
    pay = make_breakers().get("pay", RAMP)
    recover(pay, clock)
    pay.force_closed()
    assert calls(pay, 100) == (100, [])
    pay.clear_force()
    assert calls(pay, 100) == (100, [])
    assert pay.snapshot()["ramp_until_ms"] is None


def test_a_reset_of_a_closed_breaker_leaves_its_ramp_running(make_breakers, clock):
    pay = make_breakers().get("pay", RAMP)
    recover(pay, clock)
    until = pay.snapshot()["ramp_until_ms"]
    pay.reset()
    assert pay.snapshot()["ramp_until_ms"] == until
    assert calls(pay, 100)[0] == 10


def test_in_observe_mode_the_ramp_counts_would_reject_and_admits(make_breakers, clock):
    pay = make_breakers().get("pay", BreakerConfig(failure_threshold=2, open_seconds=10, ramp_seconds=10))
    recover(pay, clock)
    pay.reconfigure(BreakerConfig(failure_threshold=2, open_seconds=10, ramp_seconds=10, mode="observe"))
    pay.forget()  # the next call learns the mode from Redis
    before = pay.snapshot()["would_reject"]
    assert calls(pay, 100) == (100, [])
    assert pay.snapshot()["would_reject"] - before == 90


def test_ramp_seconds_set_live_ramps_the_next_close(make_breakers, clock):
    breakers = make_breakers()
    pay = breakers.get("pay", BreakerConfig(failure_threshold=2, open_seconds=10))
    breakers.configure("pay", ramp_seconds=4, ramp_from=0.5)
    recover(pay, clock)
    assert calls(pay, 100)[0] == 50
    clock.advance(2)
    assert calls(pay, 100)[0] == 75
    breakers.configure("pay", ramp_seconds=0)  # and off again: every call at once
    assert calls(pay, 100) == (100, [])


def test_an_asyncio_worker_ramps_the_same(clock):
    async def scenario() -> list[int]:
        breakers = AsyncBreakers.from_url("memory://", clock=clock)
        pay = breakers.get("pay", RAMP)
        while (await pay.snapshot())["state"] == "closed":
            with contextlib.suppress(RuntimeError, BreakerOpen):
                await pay.call(_failing)
        clock.advance(10)
        await pay.call(_fine)
        admitted = []
        for _ in range(3):
            n = 0
            for _ in range(100):
                try:
                    await pay.call(_fine)
                    n += 1
                except BreakerOpen as refusal:
                    assert refusal.reason == "ramp"
            admitted.append(n)
            clock.advance(1)
        await breakers.aclose()
        return admitted

    assert asyncio.run(scenario()) == RISING[:3]


async def _fine() -> str:
    return "ok"


async def _failing() -> None:
    raise RuntimeError("the service failed")


def test_the_ramp_costs_no_round_trip_per_call(redis_server: RedisServer, monkeypatch):
    """Decided from memory: the script calls during the ramp are the batch flushes, as
    many as the same calls make with no ramp at all."""
    # the counts kept in memory go with the flushes this test makes, never on their own
    monkeypatch.setattr(core, "FLUSH_SECONDS", 3600.0)
    without = BreakerConfig(failure_threshold=2, open_seconds=10)
    assert [_script_calls_per_flush(redis_server, config) for config in (RAMP, without)] == [5, 5]


def _script_calls_per_flush(server: RedisServer, config: BreakerConfig) -> int:
    """Scripts run for 5 rounds of 200 calls, each round's successes then flushed once."""
    client_from_url(server.url).flushall()
    clock = ManualClock(start_ms=1_700_000_000_000)
    breakers = Breakers.from_url(server.url, clock=clock, batch_successes=True)
    breakers.recorder.schedule = lambda breaker: None  # type: ignore[method-assign]  # the test flushes
    pay = breakers.get("pay", config)
    subscribed([breakers])
    recover(pay, clock)
    pay.flush_batch()
    calls(pay, 1)  # the call after the close (refused by the ramp: 0.1 of a credit)
    pay.flush_batch()
    before = _script_calls(server)
    admitted = 0
    for _ in range(5):
        admitted += calls(pay, 200)[0]
        pay.flush_batch()
        clock.advance(1)
    spent = _script_calls(server) - before
    breakers.close()
    # the shares of the 5 seconds: 0.1, 0.19, 0.28, 0.37, 0.46 of 200 calls each
    assert admitted == (280 if config.ramp_seconds else 1000)
    return spent


def _script_calls(server: RedisServer) -> int:
    stats = server.client().info("commandstats")
    scripts = ("cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval")
    return sum(int(v["calls"]) for k, v in stats.items() if k in scripts)


def test_with_a_bulkhead_the_ramp_is_decided_from_memory_before_the_slot(redis_server: RedisServer):
    """A bulkhead slot is Redis's to hand out; the ramp is decided first, from memory, so a
    call it leaves out asks Redis for nothing."""
    client_from_url(redis_server.url).flushall()
    clock = ManualClock(start_ms=1_700_000_000_000)
    breakers = Breakers.from_url(redis_server.url, clock=clock)
    pay = breakers.get("pay", replace(RAMP, max_concurrent_calls=50))
    subscribed([breakers])
    recover(pay, clock)
    before = _script_calls(redis_server)
    admitted, refused = calls(pay, 100)
    spent = _script_calls(redis_server) - before
    breakers.close()
    assert (admitted, {r.reason for r in refused}) == (10, {"ramp"})
    assert spent == 2 * 10  # acquire and record of each admitted call, nothing for the others


def test_workers_asking_redis_for_a_bulkhead_slot_get_the_ramp_before_the_slot(make_breakers, clock):
    """Workers with no subscription (listen=False) ask acquire.lua for every call: with a
    bulkhead the script decides the ramp before the slot, with one credit for them all, so
    the 4 workers together admit exactly the share of their calls, and a call it refuses
    holds no slot."""
    workers = [make_breakers().get("pay", replace(RAMP, max_concurrent_calls=50)) for _ in range(4)]
    recover(workers[0], clock)
    rejected = workers[0].snapshot()["rejected"]
    admitted = []
    for _ in range(5):  # shares 0.1 to 0.46: fewer than the 50 slots, each admitted call holding one
        held, refused = [], []
        for call in range(100):
            try:
                held.append(workers[call % 4].acquire())
            except BreakerOpen as refusal:
                refused.append(refusal)
        assert {r.reason for r in refused} == {"ramp"}
        assert all(0 < r.retry_after <= 1.0 for r in refused if r.retry_after is not None)
        assert workers[0].snapshot()["bulkhead_in_use"] == len(held)  # the refused hold none
        for permit in held:
            permit.success()
        assert workers[0].snapshot()["bulkhead_in_use"] == 0
        admitted.append(len(held))
        clock.advance(1)
    assert admitted == RISING[:5]
    assert workers[0].snapshot()["rejected"] - rejected == sum(100 - n for n in RISING[:5])
    clock.advance(5)  # the ramp is over: every call admitted
    assert [calls(w, 25) for w in workers] == [(25, [])] * 4


def test_in_observe_mode_the_script_counts_would_reject_for_a_bulkhead_call_and_admits(make_breakers, clock):
    observing = BreakerConfig(failure_threshold=2, open_seconds=10, ramp_seconds=10, max_concurrent_calls=50)
    pay = make_breakers().get("pay", observing)
    recover(pay, clock)
    pay.reconfigure(replace(observing, mode="observe"))
    before = pay.snapshot()["would_reject"]
    assert calls(pay, 100) == (100, [])
    assert pay.snapshot()["would_reject"] - before == 90
