"""The count window (``window_calls``, lua/includes/ring.lua): the window rules judge
the last N outcomes that reached Redis, on fakeredis and on a real redis-server, with
time driven through now_ms (docs/design.md, "Trip rules")."""

from __future__ import annotations

from typing import Any

import pytest

from breaker_redis import BreakerConfig, BreakerOpen
from breaker_redis.base.config import LIVE_FIELD
from tests.support.workers import subscribed

RING = BreakerConfig(trip="rate", failure_rate=0.5, minimum_calls=10, window_calls=20, open_seconds=30)
HOUR = 3_600_000


def record(breaker: Any, *results: str) -> None:
    for result in results:
        breaker.acquire().record(result)


def window(breaker: Any) -> tuple[int, int, int]:
    s = breaker.snapshot()
    return s["window_calls"], s["window_failures"], s["window_slow"]


def keys(client: Any, name: str) -> dict[str, Any]:
    base = f"breaker:{{{name}}}"
    return {"window": client.hgetall(f"{base}:window"), "ring": client.get(f"{base}:ring")}


@pytest.fixture
def unbatched(make_breakers: Any) -> Any:
    return make_breakers(batch_successes=False)


def by_the_rule(outcomes: list[str], config: BreakerConfig) -> tuple[int, list[tuple[int, int]]]:
    """Where the rate rule trips on the last N outcomes in order, and the window
    (calls, failures) after each outcome up to then."""
    n = config.window_calls or 0
    seen: list[tuple[int, int]] = []
    for index in range(len(outcomes)):
        last = outcomes[max(0, index + 1 - n) : index + 1]
        calls, failures = len(last), last.count("failure")
        seen.append((calls, failures))
        if calls >= min(n, config.minimum_calls) and failures / calls >= config.failure_rate:
            return index, seen
    raise AssertionError("the rule never holds")


def test_the_window_slides_by_calls_not_by_time(unbatched, clock):
    """Each outcome one by one, an hour apart: the window is the last 20 outcomes in
    order, and the trip comes where the rule applied to them says."""
    outcomes = ["failure" if i % 3 == 0 else "success" for i in range(60)] + ["failure"] * 20
    trip, seen = by_the_rule(outcomes, RING)
    breaker = unbatched.get("pay", RING)
    for index, outcome in enumerate(outcomes[:trip]):
        record(breaker, outcome)
        clock.advance(HOUR)
        assert window(breaker)[:2] == seen[index], index
        assert breaker.state.value == "closed"
    record(breaker, outcomes[trip])
    assert breaker.state.value == "open"
    assert window(breaker)[:2] == seen[trip] == (20, 10)
    assert breaker.snapshot()["config"]["window_calls"] == 20


def test_minimum_calls_applies_and_is_held_to_the_window(unbatched):
    wide = unbatched.get("wide", BreakerConfig(trip="rate", minimum_calls=20, window_calls=100))
    record(wide, *["failure"] * 19)
    assert wide.state.value == "closed"
    record(wide, "failure")
    assert wide.state.value == "open"
    # a window of 10 with minimum_calls=20: ten calls are enough (Resilience4j's count window)
    narrow = unbatched.get("narrow", BreakerConfig(trip="rate", minimum_calls=20, window_calls=10))
    record(narrow, *["success"] * 5, *["failure"] * 4)
    assert narrow.state.value == "closed"
    record(narrow, "failure")
    assert narrow.state.value == "open"


def test_the_slow_call_rule_and_the_count_rule_judge_the_ring(unbatched, clock):
    config = BreakerConfig(
        trip="count",
        failure_threshold=3,
        window_calls=5,
        slow_call_seconds=1,
        slow_call_rate=0.6,
        minimum_calls=5,
    )
    breaker = unbatched.get("slow", config)
    record(breaker, "failure", "failure", *["success"] * 3)
    record(breaker, "failure")  # the first failure slid out: still 2 in the last 5
    assert window(breaker) == (5, 2, 0) and breaker.state.value == "closed"
    for _ in range(2):
        permit = breaker.acquire()
        clock.advance(1500)
        permit.success()
    assert window(breaker) == (5, 1, 2) and breaker.state.value == "closed"
    permit = breaker.acquire()
    clock.advance(1500)
    permit.failure()  # 3 slow of 5: 60 %
    assert breaker.snapshot()["state"] == "open"


def test_a_batch_longer_than_the_ring_leaves_only_successes(make_breakers, store):
    breakers = make_breakers(batch_successes=True)
    breaker = breakers.get("batch", RING)
    record(breaker, *["failure"] * 3, "ignored")
    for _ in range(45):
        breaker.acquire().success()
    breakers.flush()
    assert window(breaker) == (20, 0, 0)
    stored = keys(store, "batch")
    assert stored["ring"] == b"0" * 20
    assert stored["window"][b"rn"] == b"20" and stored["window"][b"rp"] == b"8"  # 3 + 45 = 48


def test_a_live_window_calls_starts_the_new_window_and_off_goes_back_to_time(unbatched, clock):
    breaker = unbatched.get("live", RING)
    record(breaker, *["failure"] * 4, *["success"] * 6)
    assert window(breaker) == (10, 4, 0)
    unbatched.configure("live", window_calls=4)
    assert window(breaker) == (0, 0, 0)  # a new window, at once
    record(breaker, "failure", "success", "success", "success")
    assert window(breaker) == (4, 1, 0)
    record(breaker, "success")  # the failure slid out of the last 4
    assert window(breaker) == (4, 0, 0)
    assert breaker.snapshot()["config"]["window_calls"] == 4
    unbatched.configure("live", window_calls="off")  # back to window_seconds (10 s)
    record(breaker, "failure")
    assert window(breaker) == (1, 1, 0)
    clock.advance(11_000)
    assert window(breaker) == (0, 0, 0)


def test_a_live_value_is_held_to_the_bound(unbatched, store):
    breaker = unbatched.get("bound", RING)
    store.hset("breaker:{bound}:config", "window_calls", "99999999")
    record(breaker, "failure")
    assert breaker.snapshot()["config"]["window_calls"] == LIVE_FIELD["window_calls"].high == 10_000
    store.hset("breaker:{bound}:config", "window_calls", "0")  # below the lowest: skipped
    assert breaker.snapshot()["config"]["window_calls"] == 20


def test_it_arms_only_within_reach_and_calms_beyond_twice_that(unbatched):
    """k more failures make at most tf + k failures in min(N, tc + k) calls."""
    config = BreakerConfig(trip="rate", failure_rate=0.5, minimum_calls=100, window_calls=100)
    breaker = unbatched.get("arm", config)

    def armed() -> bool:
        assert breaker.known is not None and breaker.known.state == "closed"
        return bool(breaker.known.armed)

    record(breaker, *["failure"] * 30, *["success"] * 49)
    assert not armed()  # 30 + 20 failures, but in 99 calls: below minimum_calls
    record(breaker, "success")
    assert armed()  # 30 + 20 >= 50 of 100
    record(breaker, *["success"] * 40)  # 20 failures slid out: 10 + 40 >= 50, twice the reach
    assert armed()
    record(breaker, "success")  # 9 + 40 < 50: calm again
    assert not armed()


def test_a_claimed_time_window_wins_until_no_one_claims_it(make_breakers, clock, store):
    """A rolling deploy: a worker judging by time (here without window_calls) and one
    with window_calls judge one window, the time window, while the first claims it."""
    old = make_breakers(batch_successes=False).get("deploy", BreakerConfig(trip="rate", minimum_calls=10))
    new = make_breakers(batch_successes=False).get("deploy", RING)
    record(old, *["failure"] * 4)
    record(new, *["failure"] * 4, *["success"] * 1)  # into the time window: adopted
    assert window(new) == window(old) == (9, 8, 0)
    assert b"rn" not in keys(store, "deploy")["window"]
    clock.advance(61_000)  # no one claimed the time window for a minute (the new worker never does)
    record(new, "failure")
    assert window(new) == (1, 1, 0) and keys(store, "deploy")["window"][b"rn"] == b"20"
    record(old, "failure")  # the old worker's time window replaces the ring, and wins again
    record(new, "success")
    assert window(old) == window(new) == (2, 1, 0)


def test_an_edited_ring_is_repaired(unbatched, store):
    breaker = unbatched.get("edited", RING)
    record(breaker, "failure", "success")
    store.hset("breaker:{edited}:window", "tf", "7")  # more failures than calls
    record(breaker, "success")
    assert window(breaker) == (1, 0, 0)
    with pytest.raises(BreakerOpen):
        record(breaker, *["failure"] * 10)
        breaker.acquire()


def test_two_sizes_share_the_ring_the_claimed_one_has(make_breakers, clock, store):
    """A deploy from window_calls=20 to 10: the new size adopts the ring of 20 while a
    worker of 20 wrote it in the last minute, then starts its own."""
    wide = make_breakers(batch_successes=False).get("sizes", RING)
    narrow = make_breakers(batch_successes=False).get("sizes", BreakerConfig(trip="rate", window_calls=10))
    record(wide, *["success"] * 15)
    record(narrow, "failure", *["success"] * 4)  # into the ring of 20: 20 calls, 1 failure
    assert window(narrow) == window(wide) == (20, 1, 0)
    assert keys(store, "sizes")["window"][b"rn"] == b"20"
    clock.advance(61_000)  # the worker of 20 stopped a minute ago; the narrow one never claims 20
    record(narrow, "success")
    assert window(narrow) == (1, 0, 0) and keys(store, "sizes")["window"][b"rn"] == b"10"


# -- batched successes take their place by when they ended (ring.lua, "Order") ----------------

# far from its rule (calm, so successes are batched), a ring of 50 that wraps
ORDERED = BreakerConfig(trip="rate", failure_rate=1.0, minimum_calls=10, window_calls=50, open_seconds=30)


def ring_in_order(client: Any, name: str) -> str:
    """The ring's outcomes, oldest first, as '0'/'1' (success/failure)."""
    stored = keys(client, name)
    ring, fields = stored["ring"].decode(), stored["window"]
    rp, tc = int(fields[b"rp"]), int(fields[b"tc"])
    return ring[rp:] + ring[:rp] if tc == len(ring) else ring[:tc]


def held_batches(breakers: Any) -> list[Any]:
    """The breakers' batches go only when the test sends them (flush_batch)."""
    held: list[Any] = []
    breakers.recorder.schedule = held.append
    return held


@pytest.mark.parametrize("seed", range(6))
def test_batched_successes_take_their_place_by_when_they_ended(make_breakers, store, clock, seed):
    """Three workers, a ms apart each call, their successes batched and sent at random
    moments, their failures at once: the ring holds the outcomes in the order they
    happened, as each outcome sent at once would have left it."""
    import random

    rng = random.Random(seed)
    workers = [make_breakers(batch_successes=True, listen=True) for _ in range(3)]
    for worker in workers:
        held_batches(worker)
    subscribed(workers)
    breakers = [worker.get("order", ORDERED) for worker in workers]
    for breaker in breakers:
        breaker.call(lambda: None)  # each learns the state: calm
    for breaker in breakers:
        breaker.flush_batch()
    happened = "000"
    for _ in range(120):
        clock.advance(1)
        who = rng.randrange(3)
        if rng.random() < 0.15:
            with pytest.raises(ZeroDivisionError):
                breakers[who].call(lambda: 1 / 0)
            happened += "1"
        else:
            breakers[who].call(lambda: None)
            happened += "0"
        if rng.random() < 0.05:
            breakers[rng.randrange(3)].flush_batch()
    assert sum(b._batch_count for b in breakers) > 0  # (some successes still held)
    for breaker in breakers:
        breaker.flush_batch()
    assert ring_in_order(store, "order") == happened[-50:]
    assert window(breakers[0])[:2] == (50, happened[-50:].count("1"))


def test_a_success_ended_with_a_failure_goes_after_it(make_breakers, store, clock):
    """The same ms (a test clock, or two calls within a microsecond): the batch's success
    is placed after the failure, as when it comes later."""
    a, b = make_breakers(batch_successes=True, listen=True), make_breakers(batch_successes=True, listen=True)
    held_batches(a)
    subscribed([a, b])
    pa, pb = a.get("tie", ORDERED), b.get("tie", ORDERED)
    pa.call(lambda: None)
    pa.flush_batch()
    clock.advance(1)
    pa.call(lambda: None)
    with pytest.raises(ZeroDivisionError):
        pb.call(lambda: 1 / 0)
    clock.advance(1)
    pa.call(lambda: None)
    pa.flush_batch()
    assert ring_in_order(store, "tie") == "0100"
