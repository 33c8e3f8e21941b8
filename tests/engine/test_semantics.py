"""Every rule of docs/design.md section 2 with exact trip points, on fakeredis, on
a real redis-server and on a 3-master Redis Cluster (the `store` fixture),
with time driven through now_ms."""

from __future__ import annotations

import pytest

from breaker_redis import BreakerConfig, BreakerOpen, State
from tests.support.stores import STORES, make_store

# 5 failures in 10 s open it for 10 s (the classic OpenResty lua_shared_dict breaker),
# 2 probe successes close it
PAY_5_IN_10S = BreakerConfig(
    trip="count",
    failure_threshold=5,
    window_seconds=10,
    open_seconds=10,
    half_open_successes=2,
    open_backoff=2.0,
    max_open_seconds=60,
)


@pytest.fixture(params=[*STORES, "cluster"])
def store(request: pytest.FixtureRequest):
    client = make_store(request)
    yield client
    client.close()


def outcomes(breaker, *results: str) -> None:
    for result in results:
        breaker.acquire().record(result)


def fail(breaker, n: int = 1) -> None:
    outcomes(breaker, *["failure"] * n)


def succeed(breaker, n: int = 1) -> None:
    outcomes(breaker, *["success"] * n)


def refused(breaker) -> BreakerOpen:
    with pytest.raises(BreakerOpen) as info:
        breaker.acquire()
    return info.value


# -- trip rules ------------------------------------------------------------------


def test_count_trips_on_the_fifth_failure_inside_the_window(make_breakers, clock):
    pay = make_breakers().get("pay", PAY_5_IN_10S)
    for _ in range(4):
        fail(pay)
        clock.advance(2000)
    assert pay.state is State.CLOSED
    fail(pay)
    assert pay.state is State.OPEN
    assert refused(pay).reason == "open"
    snap = pay.snapshot()
    assert (snap["window_failures"], snap["failures"], snap["trips"]) == (5, 5, 1)


def test_count_forgets_failures_that_slid_out_of_the_window(make_breakers, clock):
    pay = make_breakers().get("pay", PAY_5_IN_10S)
    fail(pay, 4)
    clock.advance(10_000)  # the bucket holding those four is now out of the 10 s window
    fail(pay)
    assert pay.state is State.CLOSED
    assert pay.snapshot()["window_failures"] == 1
    fail(pay, 3)
    assert pay.state is State.CLOSED
    fail(pay)
    assert pay.state is State.OPEN


def test_count_window_slides_bucket_by_bucket(make_breakers, clock):
    pay = make_breakers().get("pay", PAY_5_IN_10S)  # 10 buckets of 1 s
    fail(pay, 2)
    clock.advance(5000)
    fail(pay, 2)
    clock.advance(5000)  # first two slid out, last two still in
    assert pay.snapshot()["window_failures"] == 2
    fail(pay, 2)
    assert pay.state is State.CLOSED
    fail(pay)
    assert pay.state is State.OPEN


@pytest.mark.parametrize("slide", [1, 2, 66, 67, 99])
def test_a_full_window_slides_many_buckets_at_once(make_breakers, clock, store, slide):
    """A failure in each of 100 buckets, then `slide` buckets pass with no call: the
    failures of the buckets that left are gone, whether they were dropped by name
    (up to two thirds of the window) or the hash was rebuilt from those that stay."""
    cfg = BreakerConfig(trip="count", failure_threshold=1_000, window_seconds=100, window_buckets=100)
    pay = make_breakers().get("pay", cfg)
    for _ in range(100):
        fail(pay)
        clock.advance(1000)
    clock.advance((slide - 1) * 1000)
    assert pay.snapshot()["window_failures"] == 100 - slide
    succeed(pay)
    snap = pay.snapshot()
    assert (snap["window_failures"], snap["window_calls"]) == (100 - slide, 100 - slide + 1)
    # the buckets that left are gone from the hash: only those still in have fields
    fields = store.hkeys("breaker:{pay}:window")
    buckets = {f[1:] for f in fields if f[:1] in (b"c", b"f", b"s") and f[1:].isdigit()}
    assert len(buckets) == 100 - slide + 1
    clock.advance(1000)
    fail(pay)
    assert pay.snapshot()["window_failures"] == 100 - slide  # one more left, one more came


def test_the_window_hash_records_its_bucket_width_and_count(make_breakers, store):
    """bms and nb let a reader that does not know the config (the CLI) read the window."""
    pay = make_breakers().get("pay", BreakerConfig(trip="count", window_seconds=60, window_buckets=6))
    fail(pay, 2)
    bms, nb = store.hmget("breaker:{pay}:window", "bms", "nb")
    assert (int(bms), int(nb)) == (10_000, 6)
    store.hset("breaker:{pay}:config", mapping={"window_buckets": "3"})  # by hand
    fail(pay)  # the window keeps the shape a caller claimed in the last minute
    assert [int(v) for v in store.hmget("breaker:{pay}:window", "bms", "nb", "tf")] == [10_000, 6, 3]
    pay_breakers = make_breakers()
    pay_breakers.configure("pay", window_buckets=3)  # configure() drops the window: the new shape now
    fail(pay)
    assert [int(v) for v in store.hmget("breaker:{pay}:window", "bms", "nb", "tf")] == [20_000, 3, 1]


def test_rate_needs_minimum_calls(make_breakers):
    cfg = BreakerConfig(trip="rate", minimum_calls=20, failure_rate=0.5, window_seconds=60)
    hystrix = make_breakers().get("hystrix", cfg)
    fail(hystrix, 19)
    assert hystrix.state is State.CLOSED
    assert hystrix.snapshot()["window_calls"] == 19


def test_rate_trips_at_exactly_the_rate_once_minimum_calls_is_reached(make_breakers):
    cfg = BreakerConfig(trip="rate", minimum_calls=20, failure_rate=0.5, window_seconds=60)
    b = make_breakers().get("hystrix", cfg)
    for _ in range(9):
        outcomes(b, "success", "failure")
    outcomes(b, "success")
    assert b.state is State.CLOSED  # 19 calls
    outcomes(b, "failure")  # 20 calls, 10 failures: 50 %
    assert b.state is State.OPEN


def test_rate_below_threshold_stays_closed(make_breakers):
    cfg = BreakerConfig(trip="rate", minimum_calls=20, failure_rate=0.5, window_seconds=60)
    b = make_breakers().get("hystrix", cfg)
    for _ in range(10):
        outcomes(b, "success", "success", "failure")  # 33 %
    assert b.state is State.CLOSED
    assert b.snapshot()["window_calls"] == 30


def test_consecutive_resets_on_success(make_breakers):
    b = make_breakers().get("go", BreakerConfig(trip="consecutive", failure_threshold=5))
    fail(b, 4)
    succeed(b)
    fail(b, 4)
    snap = b.snapshot()
    assert (snap["state"], snap["consecutive_failures"]) == ("closed", 4)
    fail(b)
    assert b.state is State.OPEN


def test_slow_call_rate_trips(make_breakers, clock):
    cfg = BreakerConfig(
        trip="consecutive", failure_threshold=100, slow_call_seconds=1.0, slow_call_rate=0.5, minimum_calls=4
    )
    b = make_breakers().get("slow", cfg)
    for duration in (1000, 10, 999, 1500):  # 1000 ms counts as slow (>=)
        permit = b.acquire()
        clock.advance(duration)
        permit.success()
    snap = b.snapshot()
    assert (snap["state"], snap["window_slow"], snap["slow"]) == ("open", 2, 2)


def test_ignored_outcomes_count_nothing_in_the_window(make_breakers):
    b = make_breakers().get("ign", BreakerConfig(trip="consecutive", failure_threshold=2))
    fail(b)
    outcomes(b, "ignored", "ignored")
    snap = b.snapshot()
    assert (snap["consecutive_failures"], snap["window_calls"], snap["ignored"]) == (1, 1, 2)


# -- open, half_open, backoff -------------------------------------------------------


def test_open_denies_until_open_seconds_with_retry_after(make_breakers, clock):
    pay = make_breakers().get("pay", PAY_5_IN_10S)
    fail(pay, 5)
    clock.advance(4000)
    denied = refused(pay)
    assert (denied.reason, denied.retry_after, denied.breaker) == ("open", 6.0, "pay")
    clock.advance(5999)
    assert refused(pay).retry_after == pytest.approx(0.001)
    clock.advance(1)
    permit = pay.acquire()  # the probe
    assert permit.probe
    assert pay.state is State.HALF_OPEN


def test_half_open_first_failure_reopens_with_backoff(make_breakers, clock):
    pay = make_breakers().get("pay", PAY_5_IN_10S)
    fail(pay, 5)
    clock.advance(10_000)
    pay.acquire().failure()
    snap = pay.snapshot()
    assert snap["state"] == "open"
    assert 20.0 <= snap["retry_after"] < 22.0  # doubled, plus up to 10 % jitter
    assert snap["trips"] == 2


def test_half_open_successes_close_with_a_clean_window(make_breakers, clock):
    pay = make_breakers().get("pay", PAY_5_IN_10S)
    fail(pay, 5)
    clock.advance(10_000)
    pay.acquire().success()
    assert pay.state is State.HALF_OPEN
    pay.acquire().success()
    snap = pay.snapshot()
    assert (snap["state"], snap["window_calls"], snap["window_failures"]) == ("closed", 0, 0)
    fail(pay, 4)  # a clean window: four more are not enough
    assert pay.state is State.CLOSED


def test_half_open_admits_exactly_max_calls_probes(make_breakers, clock):
    cfg = BreakerConfig(
        trip="consecutive", failure_threshold=1, open_seconds=5, half_open_max_calls=3, half_open_successes=3
    )
    b = make_breakers().get("probe3", cfg)
    fail(b)
    clock.advance(5000)
    probes = [b.acquire() for _ in range(3)]
    assert all(p.probe for p in probes)
    assert refused(b).reason == "half_open_full"
    probes[0].success()  # a lease is free again
    fourth = b.acquire()
    assert fourth.probe
    assert refused(b).reason == "half_open_full"


def test_backoff_doubles_and_caps(make_breakers, clock):
    cfg = BreakerConfig(
        trip="consecutive", failure_threshold=1, open_seconds=10, open_backoff=2.0, max_open_seconds=35
    )
    b = make_breakers().get("backoff", cfg)
    fail(b)
    periods = [b.snapshot()["retry_after"]]
    for _ in range(4):
        clock.advance(int(periods[-1] * 1000))
        b.acquire().failure()
        periods.append(b.snapshot()["retry_after"])
    assert periods[0] == 10.0  # the first trip: exactly open_seconds
    for got, base in zip(periods[1:], (20, 35, 35, 35), strict=True):
        assert base <= got < base * 1.1, periods


def test_close_resets_the_backoff(make_breakers, clock):
    cfg = BreakerConfig(trip="consecutive", failure_threshold=1, open_seconds=10, open_backoff=2.0)
    b = make_breakers().get("backoff", cfg)
    fail(b)
    clock.advance(10_000)
    b.acquire().failure()
    clock.advance(23_000)
    b.acquire().success()
    assert b.state is State.CLOSED
    fail(b)
    assert b.snapshot()["retry_after"] == 10.0


def test_expired_probe_lease_counts_as_a_failed_probe(make_breakers, clock):
    cfg = BreakerConfig(
        trip="consecutive", failure_threshold=1, open_seconds=10, probe_timeout_seconds=3, open_backoff=2.0
    )
    b = make_breakers().get("dead", cfg)
    fail(b)
    clock.advance(10_000)
    lost = b.acquire()  # the worker holding it dies: it never records
    assert lost.probe
    clock.advance(2999)
    assert refused(b).reason == "half_open_full"
    clock.advance(1)
    denied = refused(b)
    assert denied.reason == "open" and 20.0 <= denied.retry_after < 22.0
    snap = b.snapshot()
    assert (snap["state"], snap["trips"], snap["probes_in_flight"]) == ("open", 2, 0)


def test_late_probe_result_after_its_lease_expired_counts_as_failure(make_breakers, clock):
    cfg = BreakerConfig(trip="consecutive", failure_threshold=1, open_seconds=10, probe_timeout_seconds=3)
    b = make_breakers().get("late", cfg)
    fail(b)
    clock.advance(10_000)
    probe = b.acquire()
    clock.advance(3000)
    probe.success()  # too late: the probe overran its lease
    assert b.state is State.OPEN


def test_stale_epoch_result_changes_nothing(make_breakers, clock):
    pay = make_breakers().get("pay", PAY_5_IN_10S)
    slow = pay.acquire()  # admitted while closed
    fail(pay, 5)  # trips: epoch moves on
    clock.advance(10_000)
    probe = pay.acquire()
    slow.failure()  # a result from before the trip must not re-trip half_open
    assert pay.state is State.HALF_OPEN
    probe.success()
    slow2 = pay.snapshot()
    assert slow2["stale"] == 1
    assert slow2["state"] == "half_open"


def test_permit_records_exactly_once(make_breakers):
    b = make_breakers().get("once", BreakerConfig(trip="consecutive", failure_threshold=2))
    permit = b.acquire()
    permit.failure()
    permit.failure()
    permit.success()
    snap = b.snapshot()
    assert (snap["calls"], snap["failures"], snap["successes"]) == (1, 1, 0)


# -- forces, reset, observe -----------------------------------------------------------


def test_force_open_wins_over_everything(make_breakers):
    b = make_breakers().get("f", BreakerConfig(mode="observe"))
    b.force_open()
    denied = refused(b)
    assert (denied.reason, denied.retry_after) == ("forced_open", None)
    snap = b.snapshot()
    assert (snap["state"], snap["forced"], snap["retry_after"]) == ("open", "open", None)


def test_force_closed_admits_and_counts_but_never_trips(make_breakers):
    b = make_breakers().get("f", BreakerConfig(trip="consecutive", failure_threshold=2))
    b.force_closed()
    fail(b, 10)
    snap = b.snapshot()
    assert (snap["state"], snap["forced"], snap["failures"], snap["window_failures"]) == (
        "closed",
        "closed",
        10,
        10,
    )
    b.clear_force()
    snap = b.snapshot()
    assert (snap["state"], snap["forced"], snap["window_failures"]) == ("closed", None, 0)
    fail(b, 2)
    assert b.state is State.OPEN


def test_reset_closes_clears_force_and_keeps_cumulative_counts(make_breakers):
    b = make_breakers().get("r", BreakerConfig(trip="consecutive", failure_threshold=2))
    fail(b, 2)
    assert b.state is State.OPEN
    b.reset()
    succeed(b)
    snap = b.snapshot()
    assert (snap["state"], snap["failures"], snap["successes"], snap["window_calls"]) == ("closed", 2, 1, 1)
    b.force_open()
    b.reset()
    assert b.snapshot()["forced"] is None


def test_clear_force_without_a_force_changes_nothing(make_breakers):
    b = make_breakers().get("c", BreakerConfig(trip="consecutive", failure_threshold=2))
    fail(b)
    epoch = b.snapshot()["epoch"]
    b.clear_force()
    snap = b.snapshot()
    assert (snap["epoch"], snap["consecutive_failures"]) == (epoch, 1)


def test_observe_mode_never_denies_but_counts_would_reject(make_breakers, clock):
    cfg = BreakerConfig(trip="consecutive", failure_threshold=2, open_seconds=10, mode="observe")
    b = make_breakers().get("obs", cfg)
    fail(b, 2)
    assert b.state is State.OPEN
    for _ in range(7):
        b.acquire().success()
    snap = b.snapshot()
    assert (snap["would_reject"], snap["rejected"], snap["state"]) == (7, 0, "open")
    clock.advance(10_000)
    probe = b.acquire()
    assert probe.probe
    b.acquire().failure()  # over the probe limit: admitted, but does not decide half_open
    assert b.snapshot()["would_reject"] == 8
    probe.success()
    assert b.state is State.CLOSED


def test_rejections_decided_in_memory_are_counted(make_breakers):
    b = make_breakers().get("rej", BreakerConfig(trip="consecutive", failure_threshold=1))
    fail(b)
    for _ in range(25):
        refused(b)
    assert b.snapshot()["rejected"] == 25


# -- bulkhead ----------------------------------------------------------------------


def test_bulkhead_limits_concurrent_calls(make_breakers, clock):
    b = make_breakers().get("bulk", BreakerConfig(max_concurrent_calls=2, probe_timeout_seconds=5))
    first, second = b.acquire(), b.acquire()
    assert refused(b).reason == "bulkhead"
    first.success()
    third = b.acquire()
    assert b.snapshot()["bulkhead_in_use"] == 2
    clock.advance(5000)  # both leases expire: a worker that died frees its slot
    b.acquire().success()
    second.success()
    third.success()
    assert b.snapshot()["bulkhead_in_use"] == 0


# -- time from Redis ------------------------------------------------------------------


def test_without_a_test_clock_time_comes_from_redis(store):
    from breaker_redis import Breakers

    breakers = Breakers(store, listen=False)
    try:
        b = breakers.get("t", BreakerConfig(trip="consecutive", failure_threshold=1, open_seconds=30))
        fail(b)
        denied = refused(b)
        assert denied.reason == "open" and 29.0 < denied.retry_after <= 30.0
    finally:
        breakers.close()
