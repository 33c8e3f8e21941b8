"""The Python API of docs/design.md section 7: the ways to protect a call, exception
classification, fallbacks, validation, live config, threads."""

from __future__ import annotations

import dataclasses
import subprocess
import threading
import time

import pytest

from breaker_redis import Breaker, BreakerConfig, BreakerOpen, Breakers, State
from tests.support.redis_server import wait_until
from tests.support.workers import subscribed


class Upstream(Exception):
    pass


class NotFound(Exception):
    pass


def tripped(breakers: Breakers, name: str = "pay", **config) -> Breaker:
    cfg = BreakerConfig(trip="consecutive", failure_threshold=1, open_seconds=10, **config)
    breaker = breakers.get(name, cfg)
    breaker.acquire().failure()
    return breaker


def boom() -> None:
    raise Upstream("down")


# -- call, decorator, context manager ----------------------------------------------------


def test_call_returns_the_result_and_counts_a_success(make_breakers):
    b = make_breakers().get("pay")
    assert b.call(lambda x, y=0: x + y, 2, y=3) == 5
    assert b.snapshot()["successes"] == 1


def test_call_counts_a_failure_and_reraises(make_breakers):
    b = make_breakers().get("pay")
    with pytest.raises(Upstream):
        b.call(boom)
    assert b.snapshot()["failures"] == 1


def test_guard_judges_each_result_once(make_breakers):
    """guard()'s failed(result) runs once per call, on the healthy path (admitted
    from memory) as on the general one: a judge may read a response's body."""
    breakers = make_breakers(listen=True, batch_successes=True)
    b = breakers.get("pay", BreakerConfig(trip="consecutive", failure_threshold=10))
    subscribed([breakers])  # so that memory decides and successes are batched
    judged: list[str] = []

    def failed(result: str) -> BaseException | None:
        judged.append(result)
        return Upstream(result) if result == "bad" else None

    results = ["ok", "ok", "bad", "ok", "bad"]
    for result in results:
        assert b.guard(lambda r=result: r, (), {}, failed=failed) == result
    assert judged == results
    snapshot = b.snapshot()
    assert (snapshot["successes"], snapshot["failures"]) == (3, 2)


def test_a_call_admitted_from_memory_is_timed_under_a_slow_call_rule(make_breakers, clock):
    """guard()'s healthy path and a permit admitted from memory read the clock only
    when the knowledge they admit from has a slow-call rule: with one, a slow call is
    counted as slow (this fails when they never time); without, a long call is a
    plain success."""
    breakers = make_breakers(listen=True, batch_successes=True)
    slow_rule = BreakerConfig(
        trip="consecutive", failure_threshold=99, slow_call_seconds=1.0, slow_call_rate=0.9, minimum_calls=50
    )
    timed, untimed = breakers.get("timed", slow_rule), breakers.get("untimed", BreakerConfig())
    subscribed([breakers])
    for b in (timed, untimed):
        b.call(lambda: None)  # learns the config from the reply
        assert b.known is not None and b.known.calm
        b.call(clock.advance, 1500)
        permit = b.acquire()  # the permit of a call admitted from memory, timed the same way
        clock.advance(1500)
        permit.success()
    assert timed.snapshot()["window_slow"] == 2
    assert untimed.snapshot()["window_slow"] == 0


@pytest.mark.parametrize("timed", [False, True])
def test_the_healthy_permit_made_without_init_is_the_one_init_makes(make_breakers, clock, timed):
    """permit.from_memory sets every slot as Permit.__init__ does (it skips __init__ for
    speed): a slot added to one and not the other fails here, not on a healthy call."""
    from breaker_redis.engine.permit import Permit, Recording, from_memory

    breaker = make_breakers().get("pay")
    made = Permit(breaker, 7, "", 3, True, timed=timed)
    fast = from_memory(Permit, breaker, 7, 3, True, timed)
    slots = Recording.__slots__
    assert {slot: getattr(fast, slot) for slot in slots} == {slot: getattr(made, slot) for slot in slots}


def test_call_raises_breaker_open_without_calling(make_breakers):
    b = tripped(make_breakers())
    called = []
    with pytest.raises(BreakerOpen) as info:
        b.call(called.append, 1)
    assert called == []
    assert (info.value.breaker, info.value.reason, info.value.retry_after) == ("pay", "open", 10.0)
    assert "pay" in str(info.value)


def test_fallback_value_and_callable(make_breakers):
    b = tripped(make_breakers())
    assert b.call(boom, fallback="cached") == "cached"
    seen: list[BaseException] = []
    assert b.call(boom, fallback=lambda exc: seen.append(exc) or "degraded") == "degraded"
    assert isinstance(seen[0], BreakerOpen)


def test_fallback_receives_the_failure(make_breakers):
    b = make_breakers().get("pay")
    result = b.call(boom, fallback=lambda exc: f"fallback for {exc}")
    assert result == "fallback for down"
    assert b.snapshot()["failures"] == 1


def test_ignored_exceptions_reraise_even_with_a_fallback_and_count_nothing(make_breakers):
    cfg = BreakerConfig(trip="consecutive", failure_threshold=1, ignore_exceptions=(NotFound,))
    b = make_breakers().get("pay", cfg)

    def missing() -> None:
        raise NotFound

    with pytest.raises(NotFound):
        b.call(missing, fallback="x")
    snap = b.snapshot()
    assert (snap["state"], snap["ignored"], snap["failures"]) == ("closed", 1, 0)


def test_record_exceptions_limits_what_is_a_failure(make_breakers):
    cfg = BreakerConfig(trip="consecutive", failure_threshold=1, record_exceptions=(Upstream,))
    b = make_breakers().get("pay", cfg)
    with pytest.raises(KeyError):
        b.call(lambda: {}["x"])
    assert b.state is State.CLOSED
    with pytest.raises(Upstream):
        b.call(boom)
    assert b.state is State.OPEN


def test_predicate_decides_first(make_breakers):
    def only_5xx(exc: BaseException) -> bool | None:
        status = getattr(exc, "status", None)
        return None if status is None else status >= 500

    class HTTPError(Exception):
        def __init__(self, status: int) -> None:
            self.status = status

    cfg = BreakerConfig(trip="consecutive", failure_threshold=2, predicate=only_5xx)
    b = make_breakers().get("pay", cfg)
    for status in (404, 503):
        with pytest.raises(HTTPError):
            b.call(lambda s=status: (_ for _ in ()).throw(HTTPError(s)))
    with pytest.raises(Upstream):
        b.call(boom)  # no status: the predicate abstains, record_exceptions counts it
    snap = b.snapshot()
    assert (snap["ignored"], snap["failures"], snap["state"]) == (1, 2, "open")


def test_keyboard_interrupt_is_not_a_failure(make_breakers):
    b = make_breakers().get("pay", BreakerConfig(trip="consecutive", failure_threshold=1))

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        b.call(interrupted)
    assert b.state is State.CLOSED


def test_decorator_forms(make_breakers):
    b = make_breakers().get("pay", BreakerConfig(trip="consecutive", failure_threshold=1))

    @b
    def charge(amount: int) -> str:
        """Charge a card."""
        if amount < 0:
            raise Upstream("refused")
        return f"charged {amount}"

    @b.decorate(fallback="queued")
    def charge_or_queue(amount: int) -> str:
        return charge(amount)

    assert charge(3) == "charged 3"
    assert (charge.__name__, charge.__doc__) == ("charge", "Charge a card.")
    with pytest.raises(Upstream):
        charge(-1)
    assert charge_or_queue(5) == "queued"


def test_context_manager(make_breakers):
    b = make_breakers().get("pay", BreakerConfig(trip="consecutive", failure_threshold=2))
    with b as permit:
        assert not permit.probe
    with pytest.raises(Upstream), b:
        raise Upstream("down")
    with pytest.raises(Upstream), b, b:  # nested on one thread
        raise Upstream("down")
    snap = b.snapshot()
    assert (snap["successes"], snap["failures"], snap["state"]) == (1, 3, "open")
    with pytest.raises(BreakerOpen), b:
        pass


def test_permit_as_context_manager(make_breakers):
    b = make_breakers().get("pay")
    with b.acquire():
        pass
    with pytest.raises(Upstream), b.acquire():
        raise Upstream("down")
    with pytest.raises(ValueError, match="outcome"):
        b.acquire().record("maybe")
    snap = b.snapshot()
    assert (snap["successes"], snap["failures"]) == (1, 1)


# -- threads --------------------------------------------------------------------------


def test_threads_share_one_breaker_and_lose_no_count(make_breakers):
    b = make_breakers().get("pay", BreakerConfig(trip="count", failure_threshold=10_000, window_seconds=600))
    start = threading.Barrier(8)

    def work(i: int) -> None:
        start.wait()
        for n in range(100):
            permit = b.acquire()
            permit.failure() if (n + i) % 2 else permit.success()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = b.snapshot()
    assert (snap["calls"], snap["failures"], snap["successes"], snap["window_calls"]) == (800, 400, 400, 800)


def test_a_permit_records_exactly_once_across_threads(make_breakers):
    b = make_breakers().get("pay")
    permit = b.acquire()
    start = threading.Barrier(8)

    def settle() -> None:
        start.wait()
        permit.failure()

    threads = [threading.Thread(target=settle) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert permit.recorded
    assert b.snapshot()["calls"] == 1


# -- validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("trip", "percent"),
        ("failure_threshold", 0),
        ("failure_threshold", 2.5),
        ("failure_threshold", True),
        ("failure_rate", 0),
        ("failure_rate", 1.5),
        ("minimum_calls", 0),
        ("slow_call_seconds", -1),
        ("slow_call_rate", 0),
        ("window_seconds", 0),
        ("window_seconds", float("nan")),
        ("window_buckets", 0),
        ("window_buckets", 1000),
        ("open_seconds", -5),
        ("open_backoff", 0.5),
        ("max_open_seconds", 0),
        ("half_open_max_calls", 0),
        ("half_open_successes", 0),
        ("probe_timeout_seconds", 0),
        ("max_concurrent_calls", 0),
        ("mode", "dry-run"),
        ("record_exceptions", (ValueError, "x")),
        ("ignore_exceptions", ValueError),
        ("predicate", 42),
    ],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=rf"BreakerConfig\.{field}\b"):
        BreakerConfig(**{field: value})


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        BreakerConfig().failure_threshold = 3  # type: ignore[misc]


@pytest.mark.parametrize("name", ["", "pay{1}", "a}", "a b", "a\tb", "a\x00b", "\u00a0", "x" * 201])
def test_bad_names_are_refused(store, name):
    breakers = Breakers(store, listen=False)
    with pytest.raises(ValueError, match="invalid breaker name"):
        breakers.get(name)
    with pytest.raises(ValueError, match="invalid breaker name"):
        breakers.configure(name, open_seconds=5)


@pytest.mark.parametrize("name", [None, 5, b"pay"])
def test_names_must_be_str(store, name):
    with pytest.raises(TypeError, match=f"invalid breaker name .*{type(name).__name__}"):
        Breakers(store, listen=False).get(name)


def test_bad_prefix_and_policy_are_refused(store):
    with pytest.raises(ValueError, match="key prefix"):
        Breakers(store, prefix="my app")
    with pytest.raises(ValueError, match="on_store_error"):
        Breakers(store, on_store_error="retry")


def test_one_name_one_config(make_breakers):
    breakers = make_breakers()
    first = breakers.get("pay", BreakerConfig(failure_threshold=3))
    assert breakers.get("pay") is first
    assert breakers.get("pay", BreakerConfig(failure_threshold=3)) is first
    with pytest.raises(ValueError, match="another config"):
        breakers.get("pay", BreakerConfig(failure_threshold=4))


def test_from_url_builds_a_client_that_fails_fast():
    breakers = Breakers.from_url("redis://127.0.0.1:1/0")
    kwargs = breakers.client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] < 1 and kwargs["socket_connect_timeout"] < 1
    assert kwargs["retry"]._retries == 0  # get_retries() came with redis-py 6.0; the pins allow 5.0
    with pytest.raises(ValueError, match="unsupported Redis URL"):
        Breakers.from_url("http://127.0.0.1:6379")


# -- live config, listing, key layout ------------------------------------------------------


def test_live_config_applies_at_the_next_call(make_breakers):
    breakers = make_breakers()
    b = breakers.get("pay", BreakerConfig(trip="consecutive", failure_threshold=5))
    assert breakers.configure("pay", failure_threshold=2) == {"failure_threshold": "2"}
    b.acquire().failure()
    b.acquire().failure()
    assert b.state is State.OPEN
    assert b.snapshot()["overrides"] == {"failure_threshold": "2"}
    assert breakers.configure("pay", failure_threshold=None) == {}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"failure_threshold": "two"}, "failure_threshold"),
        ({"open_seconds": -1}, "open_seconds"),
        ({"colour": 1}, "unknown config field"),
        ({"colour": None}, "unknown config field 'colour'"),  # a removal: the name is checked too
        ({"colour": ""}, "unknown config field 'colour'"),
        ({"trip": "sometimes"}, "trip"),
    ],
)
def test_live_config_refuses_bad_values(make_breakers, store, overrides, message):
    breakers = make_breakers()
    with pytest.raises(ValueError, match=message):
        breakers.configure("pay", **overrides)
    assert store.keys("*") == []  # refused before anything reached Redis


def test_names_lists_breakers_used_by_any_worker(make_breakers):
    worker_a, worker_b = make_breakers(), make_breakers()
    worker_a.get("pay").acquire().success()
    worker_b.get("cart").acquire().success()
    assert worker_a.names() == ["cart", "pay"]
    worker_b.get("maintenance").force_open()  # only ever forced, never called
    worker_b.configure("search", failure_threshold=3)  # only ever configured
    assert worker_a.names() == ["cart", "maintenance", "pay", "search"]


def test_key_prefix(make_breakers, store):
    make_breakers(prefix="shop").get("pay").acquire().success()
    assert store.hget("shop:{pay}:state", "state") == b"closed"
    assert not store.exists("breaker:{pay}:state")


def test_redis_cli_reads_the_state_and_no_key_has_a_ttl(redis_server):
    """No TTL: under a volatile-* maxmemory-policy Redis evicts only keys with one,
    so the breakers' keys are never evicted there (idle ones are swept instead)."""
    client = redis_server.client()
    client.flushall()
    client.set("breaker:{pay}:state", "x", ex=3600)  # left with a TTL by an older version:
    client.delete("breaker:{pay}:state")  # (recreated below without one)
    breakers = Breakers.from_url(redis_server.url, listen=False)
    try:
        pay = breakers.get(
            "pay", BreakerConfig(trip="consecutive", failure_threshold=2, max_concurrent_calls=5)
        )
        breakers.configure("pay", open_seconds=20)
        pay.acquire().failure()
        leased = pay.acquire()  # keeps a bulkhead lease so the leases key exists
        pay.acquire().failure()  # trips: the events list gets an entry

        def cli(*args: str) -> str:
            out = subprocess.run(
                ["redis-cli", "-p", str(redis_server.port), *args], check=True, capture_output=True, text=True
            )
            return out.stdout.strip()

        assert cli("HGET", "breaker:{pay}:state", "state") == "open"
        for suffix in ("state", "window", "leases", "config", "stats", "events", "cfg"):
            assert cli("TYPE", f"breaker:{{pay}}:{suffix}") != "none", suffix
            assert int(cli("TTL", f"breaker:{{pay}}:{suffix}")) == -1, suffix
        assert int(cli("TTL", "breaker:names")) == -1
        leased.ignore()
    finally:
        breakers.close()


# -- batched successes (the real clock: batching is on) ----------------------------------------


@pytest.fixture
def realtime(store):
    breakers = Breakers(store)
    assert breakers.batch_successes
    yield breakers
    breakers.close()


def test_batched_successes_are_exact_across_threads(realtime):
    b = realtime.get("pay", BreakerConfig(trip="count", failure_threshold=100_000, window_seconds=600))
    start = threading.Barrier(8)

    def work(i: int) -> None:
        start.wait()
        for n in range(200):
            if (n + i) % 4:
                b.call(lambda: None)
            else:
                with pytest.raises(Upstream):
                    b.call(boom)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = b.snapshot()
    assert (snap["successes"], snap["failures"], snap["window_calls"], snap["window_failures"]) == (
        1200,
        400,
        1600,
        400,
    )


def test_batched_successes_reach_redis_by_themselves(realtime, store):
    b = realtime.get("pay")
    for _ in range(50):
        b.call(lambda: None)
    wait_until(
        lambda: int(store.hget("breaker:{pay}:stats", "successes") or 0) == 50,
        timeout=5,
        what="the recorder thread to send the batch",
    )
    assert int(store.hget("breaker:{pay}:window", "tc")) == 50


def test_snapshot_waits_for_the_batch_the_recorder_is_sending(realtime, monkeypatch):
    """The recorder thread has taken the batch and waits for Redis: a snapshot read
    now must show this worker's successes (it missed one in 1,600 under load)."""
    b = realtime.get("pay")
    runner = realtime.gate.remote
    real_run = runner.run
    entered = threading.Event()

    def slow_record(operation, *args):
        if operation == "record" and threading.current_thread().name == realtime.recorder.thread.name:
            entered.set()
            time.sleep(0.3)  # the send under way, as a busy Redis answers
        return real_run(operation, *args)

    monkeypatch.setattr(runner, "run", slow_record)
    for _ in range(5):
        b.call(lambda: None)
    wait_until(entered.is_set, timeout=5, what="the recorder thread's send")
    assert b.snapshot()["successes"] == 5


def test_close_waits_for_the_batch_the_recorder_is_sending(realtime, store, monkeypatch):
    """When Breakers.close() returns, no send is under way, so the app may close its
    client (one the recorder thread had under way was cut: 'could not record an
    outcome', Bad file descriptor, seen in bench/eviction.py)."""
    b = realtime.get("pay")
    runner = realtime.gate.remote
    real_run = runner.run
    entered, done = threading.Event(), threading.Event()

    def slow_record(operation, *args):
        if operation != "record" or threading.current_thread().name != realtime.recorder.thread.name:
            return real_run(operation, *args)
        entered.set()
        time.sleep(0.3)  # the send under way, as a busy Redis answers
        try:
            return real_run(operation, *args)
        finally:
            done.set()

    monkeypatch.setattr(runner, "run", slow_record)
    for _ in range(5):
        b.call(lambda: None)
    wait_until(entered.is_set, timeout=5, what="the recorder thread's send")
    realtime.close()
    assert done.is_set()
    assert int(store.hget("breaker:{pay}:stats", "successes")) == 5


def test_close_waits_for_the_batch_a_notice_is_sending(redis_server, monkeypatch):
    """A transition heard makes the listener thread send the batch; close() waits for
    that send too (the eviction bench logged it cut 8 times in one run)."""
    redis_server.client().flushall()
    worker = Breakers.from_url(redis_server.url, batch_successes=True)
    other = Breakers.from_url(redis_server.url, listen=False)
    try:
        b = worker.get("pay")
        b.call(lambda: None)
        subscribed([worker])
        # the batch stays in memory until the notice sends it
        worker.recorder.schedule = [].append  # type: ignore[method-assign]
        for _ in range(4):
            b.call(lambda: None)
        runner = worker.gate.remote
        real_run = runner.run
        entered, done = threading.Event(), threading.Event()

        def slow_record(operation, *args):
            if operation != "record" or threading.current_thread().name != worker.invalidator.thread.name:
                return real_run(operation, *args)
            entered.set()
            time.sleep(0.3)
            try:
                return real_run(operation, *args)
            finally:
                done.set()

        monkeypatch.setattr(runner, "run", slow_record)
        other.get("pay").force_open()  # its transition reaches the worker's listener
        wait_until(entered.is_set, timeout=5, what="the listener thread's send")
        worker.close()
        assert done.is_set()
        assert int(redis_server.client().hget("breaker:{pay}:stats", "successes")) == 5
    finally:
        worker.close()
        other.close()


def test_a_failure_carries_the_batch_so_redis_sees_the_order(realtime):
    b = realtime.get("pay", BreakerConfig(trip="consecutive", failure_threshold=3))
    # no thread sends the batch: only the failure can carry it
    realtime.recorder.schedule = [].append  # type: ignore[method-assign]
    for outcome in ("failure", "failure", "success", "failure", "failure"):
        b.acquire().record(outcome)
    snap = b.snapshot()
    assert (snap["state"], snap["consecutive_failures"], snap["successes"]) == ("closed", 2, 1)


def test_slow_successes_are_not_batched(store, clock):
    breakers = Breakers(store, clock=clock, batch_successes=True, listen=False)
    try:
        cfg = BreakerConfig(
            trip="consecutive",
            failure_threshold=99,
            slow_call_seconds=1.0,
            slow_call_rate=0.5,
            minimum_calls=2,
        )
        b = breakers.get("pay", cfg)
        b.acquire().success()  # learns slow_call_seconds from the reply; this one is batched
        permit = b.acquire()
        clock.advance(1000)
        permit.success()  # slow: sent at once, with the batch ahead of it, and trips
        assert b.state is State.OPEN
        assert b.snapshot()["slow"] == 1
    finally:
        breakers.close()


def test_a_batch_that_trips_counts_its_later_successes_as_stale(store, clock):
    breakers = Breakers(store, clock=clock, batch_successes=True, listen=False)
    try:
        b = breakers.get("pay", BreakerConfig(trip="rate", minimum_calls=3, failure_rate=0.5))
        breakers.recorder.schedule = [].append  # type: ignore[method-assign]  # snapshot() sends the batch
        b.acquire().failure()
        b.acquire().failure()
        first, second = b.acquire(), b.acquire()
        first.success()
        second.success()
        snap = b.snapshot()  # one batch of two: the first reaches minimum_calls and trips
        assert (snap["state"], snap["window_calls"], snap["successes"], snap["stale"]) == ("open", 3, 2, 1)
    finally:
        breakers.close()


def test_trip_opens_for_open_seconds_and_half_open_makes_the_next_call_a_probe(make_breakers, clock):
    """The admin operations pybreaker's open() and half_open() map to (breaker_redis.compat)."""
    breakers, seen, actions = make_breakers(), [], []
    breakers.on_transition(seen.append)
    breakers.on_operator_action(actions.append)
    b = breakers.get(
        "pay", BreakerConfig(trip="consecutive", failure_threshold=3, open_seconds=10, half_open_max_calls=1)
    )
    b.force_open()
    b.trip()  # clears the force: an open period that ends by itself
    with pytest.raises(BreakerOpen) as refused:
        b.acquire()
    assert (refused.value.reason, refused.value.retry_after) == ("open", 10.0)
    clock.advance(10_000)
    probe = b.acquire()
    assert probe.probe
    probe.success()
    assert b.snapshot()["state"] == "closed"
    b.half_open()
    assert b.snapshot()["state"] == "half_open"
    assert b.acquire().probe
    with pytest.raises(BreakerOpen) as refused:
        b.acquire()
    assert refused.value.reason == "half_open_full"
    assert [(t.new, t.cause) for t in seen] == [  # trip() of a forced-open breaker: open stays open
        ("open", "forced_open"),
        ("half_open", "open_elapsed"),
        ("closed", "probes_succeeded"),
        ("half_open", "half_opened"),
    ]
    assert [(t.old, t.new, t.cause) for t in actions] == [
        ("closed", "open", "forced_open"),
        ("open", "open", "opened"),
        ("closed", "half_open", "half_opened"),
    ]


def _broken_predicate(exc: BaseException) -> bool:
    raise KeyError("a bug in the app's predicate")


@pytest.mark.parametrize("how", ["call", "with"])
def test_a_predicate_that_raises_counts_a_failure_and_frees_the_probe(make_breakers, how):
    b = make_breakers().get(
        "pay", BreakerConfig(failure_threshold=2, half_open_max_calls=1, predicate=_broken_predicate)
    )
    b.half_open()  # the next call is the only probe
    with pytest.raises(Upstream):  # the call's own exception, not the predicate's
        if how == "call":
            b.call(boom)
        else:
            with b:
                boom()
    snap = b.snapshot()
    assert (snap["state"], snap["probes_in_flight"], snap["failures"]) == ("open", 0, 1)
