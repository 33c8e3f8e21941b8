"""A flushed script cache, a Redis outage, a hung Redis, a restarted Redis and a
corrupted key: none may fail a call that the breaker would admit, nor leave a
breaker stuck."""

from __future__ import annotations

import logging
import os
import signal
import threading

import fakeredis
import pytest
import redis

from breaker_redis import BreakerOpen, Breakers, State
from breaker_redis.ops.reader import Reader
from tests.support.redis_server import RedisServer, wait_until
from tests.support.workers import TRIP_AT_3, admits, fail, subscribed


def test_script_flush_between_calls_changes_nothing(make_breakers, store):
    b = make_breakers().get("pay", TRIP_AT_3)
    fail(b, 2)
    store.script_flush()
    fail(b)
    store.script_flush()
    with pytest.raises(BreakerOpen):
        b.acquire()
    store.script_flush()
    snap = b.snapshot()
    assert (snap["state"], snap["failures"], snap["trips"]) == ("open", 3, 1)


def test_a_flush_between_script_load_and_evalsha_changes_nothing(make_breakers, store, monkeypatch):
    """Another SCRIPT FLUSH right after a reload (several under traffic): the call
    still runs on Redis, it neither fails nor sends the worker to its local store."""
    b = make_breakers().get("pay", TRIP_AT_3)
    fail(b, 2)
    real_load = store.script_load

    def load_then_flush(script):
        sha = real_load(script)
        store.script_flush()
        return sha

    monkeypatch.setattr(store, "script_load", load_then_flush)
    store.script_flush()
    fail(b)
    assert b.snapshot()["store"] == "redis"
    with pytest.raises(BreakerOpen):
        b.acquire()


def test_function_flush_between_calls_changes_nothing(make_breakers, store):
    b = make_breakers().get("pay", TRIP_AT_3)
    fail(b, 2)
    store.function_flush()
    fail(b)
    store.function_flush()
    with pytest.raises(BreakerOpen):
        b.acquire()
    store.function_flush()
    snap = b.snapshot()
    assert (snap["state"], snap["failures"], snap["trips"], snap["store"]) == ("open", 3, 1, "redis")


def test_a_flush_right_after_function_load_changes_nothing(make_breakers, store, monkeypatch):
    """FUNCTION FLUSH right after the library is loaded: that call runs by EVAL,
    the next one loads the library again; none fails or leaves Redis."""
    breakers = make_breakers()
    b = breakers.get("pay", TRIP_AT_3)
    fail(b, 2)
    client = breakers.gate.remote.client
    real_load = client.function_load
    loads = []

    def load_then_flush(code, replace=False):
        loads.append(1)
        reply = real_load(code, replace)
        if len(loads) == 1:
            store.function_flush()
        return reply

    monkeypatch.setattr(client, "function_load", load_then_flush)
    store.function_flush()
    fail(b)
    assert b.snapshot()["store"] == "redis"
    with pytest.raises(BreakerOpen):
        b.acquire()
    assert len(loads) == 2 and breakers.gate.remote.use_functions


class CountingRunner:
    """Wraps the remote script runner to count what the calls send to Redis (the gate's
    background probe, the health script, runs after its backoff whenever the machine
    lets it: not counted)."""

    def __init__(self, runner) -> None:
        self.runner, self.calls = runner, 0

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def run(self, operation, *args):
        self.calls += operation != "health"
        return self.runner.run(operation, *args)


def test_fakeredis_outage_falls_back_to_a_local_breaker_and_returns(clock):
    server = fakeredis.FakeServer()
    client = fakeredis.FakeRedis(server=server)
    breakers = Breakers(client, clock=clock, listen=False)
    counting = CountingRunner(breakers.gate.remote)
    breakers.gate.remote = counting
    try:
        b = breakers.get("pay", TRIP_AT_3)
        fail(b, 2)  # shared state in Redis: 2 consecutive failures
        server.connected = False
        fail(b)  # this acquire finds Redis gone: the local store admits it and counts its failure
        assert not breakers.gate.healthy
        reached = counting.calls
        fail(b)
        snap = b.snapshot()  # Redis's two failures are not replayed locally
        assert (snap["state"], snap["consecutive_failures"]) == ("closed", 2)
        fail(b)  # the local breaker counts on its own and trips
        with pytest.raises(BreakerOpen) as info:
            b.acquire()
        assert info.value.reason == "open"
        assert b.snapshot()["store"] == "local"
        assert counting.calls == reached  # nothing was sent to the dead store meanwhile
        server.connected = True
        wait_until(lambda: breakers.gate.healthy, timeout=10, what="the gate to re-probe Redis")
        snap = b.snapshot()  # Redis's own state again: still closed with 2 failures
        assert (snap["store"], snap["state"], snap["consecutive_failures"]) == ("redis", "closed", 2)
        fail(b)
        assert b.state is State.OPEN
    finally:
        breakers.close()


@pytest.mark.parametrize("policy", ["allow", "deny"])
def test_outage_policies_allow_and_deny(clock, policy):
    server = fakeredis.FakeServer()
    breakers = Breakers(fakeredis.FakeRedis(server=server), on_store_error=policy, clock=clock, listen=False)
    try:
        b = breakers.get("pay", TRIP_AT_3)
        b.acquire().success()
        server.connected = False  # the first acquire below finds Redis gone
        for _ in range(5):
            if policy == "allow":
                b.call(lambda: None)
                with pytest.raises(RuntimeError):
                    b.call(lambda: (_ for _ in ()).throw(RuntimeError()))
            else:
                with pytest.raises(BreakerOpen):
                    b.acquire()
        server.connected = True
        wait_until(lambda: breakers.gate.healthy, timeout=10, what="the gate to re-probe Redis")
        assert b.snapshot()["failures"] == 0  # nothing recorded while away
    finally:
        breakers.close()


@pytest.fixture
def own_server():
    """A redis-server this test may stop, hang and restart."""
    server = RedisServer().start()
    yield server
    if server.process is not None:
        os.kill(server.process.pid, signal.SIGCONT)
    server.stop()


@pytest.mark.processes
def test_real_redis_stopped_and_restarted(own_server):
    breakers = Breakers.from_url(own_server.url)
    try:
        b = breakers.get("pay", TRIP_AT_3)
        fail(b, 2)
        subscribed([breakers])
        own_server.stop()
        fail(b)  # discovers the outage: the local breaker admits it and counts from zero
        assert not breakers.gate.healthy
        fail(b, 2)  # and trips: protected while Redis is away
        with pytest.raises(BreakerOpen):
            b.acquire()
        own_server.start()  # same port, empty: Redis lost its state in the restart
        wait_until(lambda: breakers.gate.healthy, timeout=15, what="the gate to re-probe Redis")
        assert b.acquire() is not None  # back on Redis: a fresh closed breaker
        fail(b, 3)
        assert b.state is State.OPEN
        assert own_server.client().hget("breaker:{pay}:state", "state") == b"open"
    finally:
        breakers.close()


@pytest.mark.processes
def test_hung_redis_costs_one_timeout_then_no_waiting(own_server, caplog, monkeypatch):
    """Counted, not timed (a busy machine stalls a thread longer than a timeout, and the
    first call also builds the local store): the first call sends the hung server one
    command, which times out once (redis-py's defaults would wait 5 s and retry), and the
    next calls send it none, so none can wait on it. (The gate's probe, on a thread of its
    own, and the local store's in-process connections are not counted.)"""
    breakers = Breakers.from_url(own_server.url, listen=False)
    sent: list[object] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def counted(connection: object, *args: object, **kwargs: object) -> object:
        to_server = type(connection) is redis.connection.Connection
        if to_server and threading.current_thread() is threading.main_thread():
            sent.append(args[0])
        return send(connection, *args, **kwargs)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    caplog.set_level(logging.WARNING, logger="breaker_redis")
    try:
        b = breakers.get("pay", TRIP_AT_3)
        b.acquire().success()
        os.kill(own_server.process.pid, signal.SIGSTOP)
        sent.clear()
        b.acquire().failure()  # its acquire times out once (client timeout 0.25 s)
        assert len(sent) == 1, sent  # one try, no retry
        timeouts = [r.getMessage() for r in caplog.records if "TimeoutError" in r.getMessage()]
        assert len(timeouts) == 1, timeouts
        sent.clear()
        for _ in range(20):
            b.acquire().failure() if b.snapshot()["state"] == "closed" else None
        assert sent == []
        assert b.snapshot()["store"] == "local"
        os.kill(own_server.process.pid, signal.SIGCONT)
        wait_until(lambda: breakers.gate.healthy, timeout=15, what="the gate to re-probe Redis")
    finally:
        breakers.close()


def test_wrong_type_key_is_repaired(make_breakers, store):
    b = make_breakers().get("pay", TRIP_AT_3)
    fail(b, 2)
    store.delete("breaker:{pay}:state")
    store.set("breaker:{pay}:state", "garbage")
    b.forget()
    fail(b, 3)
    assert b.state is State.OPEN


def test_corrupted_fields_read_as_a_fresh_breaker(make_breakers, store):
    b = make_breakers().get("pay", TRIP_AT_3)
    fail(b)
    store.hset("breaker:{pay}:state", mapping={"state": "sideways", "epoch": "x", "open_until": "soon"})
    store.hset("breaker:{pay}:window", mapping={"tc": "-4", "head": "nope"})
    store.hset("breaker:{pay}:config", mapping={"failure_threshold": "many", "trip": "never"})
    b.forget()
    for _ in range(3):  # consec survived the corruption, so it may take fewer than three
        try:
            b.acquire().failure()
        except BreakerOpen:
            break
    snap = b.snapshot()
    assert (snap["state"], snap["window_calls"] >= 1) == ("open", True)


# -- invalidation: what one worker does reaches the others ---------------------------------


@pytest.fixture
def two_workers(store):
    """Two Breakers on one store, as two worker processes would have."""
    workers = [Breakers(store), Breakers(store)]
    yield workers
    for w in workers:
        w.close()


def test_a_trip_by_one_worker_reaches_the_other_before_its_next_call(two_workers):
    a, b = (w.get("pay", TRIP_AT_3) for w in two_workers)
    subscribed(two_workers)
    assert admits(b)  # b now knows 'closed' and will not ask Redis again by itself
    fail(a, 3)
    assert not admits(b)  # at once: the notice is drained before b decides


def test_force_and_clear_reach_a_worker_denying_from_memory(two_workers):
    a, b = (w.get("pay", TRIP_AT_3) for w in two_workers)
    subscribed(two_workers)
    fail(a, 3)
    assert not admits(b)  # at once: the notice is drained before b decides
    a.force_closed()
    assert admits(b)  # at once: the notice is drained before b decides
    a.force_open()
    assert not admits(b)  # at once: the notice is drained before b decides
    a.reset()
    assert admits(b)  # at once: the notice is drained before b decides


def test_without_the_subscription_workers_ask_redis_at_every_call(store):
    workers = [Breakers(store, listen=False), Breakers(store, listen=False)]
    try:
        a, b = (w.get("pay", TRIP_AT_3) for w in workers)
        assert admits(b)
        a.force_open()
        assert not admits(b)
    finally:
        for w in workers:
            w.close()


def test_live_config_reaches_other_workers_at_their_next_call(two_workers):
    _, b = (w.get("pay", TRIP_AT_3) for w in two_workers)
    subscribed(two_workers)
    assert admits(b)
    two_workers[0].configure("pay", mode="observe")
    fail(b, 3)
    assert b._memory.known is not None and b._memory.known.mode == "observe"
    assert admits(b)  # open, but observe mode never denies


@pytest.mark.parametrize("epoch", ["inf", "-inf", "nan", "1e999", "9007199254740993"])
def test_an_epoch_beyond_any_worker_is_repaired(make_breakers, store, epoch):
    """An epoch no worker wrote (not finite, or past 2**53) reads as a corrupted state:
    the breaker starts afresh with a real epoch and stays on Redis."""
    b = make_breakers().get("pay", TRIP_AT_3)
    b.acquire().success()
    store.hset("breaker:{pay}:state", "epoch", epoch)
    b.forget()
    fail(b, 3)
    assert b.state is State.OPEN
    assert b.snapshot()["store"] == "redis"
    assert 0 < int(store.hget("breaker:{pay}:state", "epoch")) < 2**53
    b.reset()
    assert b.state is State.CLOSED


@pytest.mark.parametrize("forged", ["stream", "garbage line"])
def test_an_events_key_written_by_hand_is_rebuilt_or_read_around(make_breakers, store, forged):
    """A stream where the events list belongs (another type: the key is started again,
    the trip is recorded) or a line no worker wrote (kept, and left out by readers)."""
    b = make_breakers().get("pay", TRIP_AT_3)
    b.acquire().success()
    store.delete("breaker:{pay}:events")
    if forged == "stream":
        store.xadd("breaker:{pay}:events", {"f": "v"}, id="18446744073709551615-18446744073709551615")
    else:
        store.lpush("breaker:{pay}:events", "not a transition")
    fail(b, 3)
    assert b.state is State.OPEN
    assert b.snapshot()["store"] == "redis"
    history = Reader(store, "breaker", owns_client=False).transitions("pay", 10)
    assert [(e["from"], e["to"], e["cause"]) for e in history] == [("closed", "open", "consecutive")]


@pytest.mark.parametrize("value", ["abc", "1.5", "1e999"])
def test_a_counter_that_is_no_integer_reads_as_zero_until_repaired(make_breakers, store, value):
    b = make_breakers().get("pay", TRIP_AT_3)
    b.acquire().success()
    store.hset("breaker:{pay}:stats", mapping={"trips": value, "stale": value})
    snap = b.snapshot()
    assert (snap["trips"], snap["stale"], snap["successes"]) == (0, 0, 1)
    fail(b, 3)  # the trip counts it again from the outcome being counted
    assert b.snapshot()["trips"] == 1


@pytest.mark.processes
def test_the_probe_backs_off_to_two_seconds_and_finds_redis_at_its_next_probe(own_server, monkeypatch):
    """While Redis is down the gate probes it after 0.25 s, doubling to at most 2 s, and the
    first probe after it returns brings the worker back: so a worker is back on Redis
    within one such wait of its return. Counted: the waits are recorded, not waited."""
    breakers = Breakers.from_url(own_server.url, listen=False)
    gate = breakers.gate
    waits: list[float] = []
    returned = threading.Event()

    def recorded(seconds: float) -> bool:
        waits.append(seconds)
        if len(waits) == 6:  # Redis returns during this wait
            assert returned.wait(30)
        return False  # not stopped: probe now

    monkeypatch.setattr(gate.thread, "wait", recorded)
    try:
        b = breakers.get("pay", TRIP_AT_3)
        assert admits(b)
        own_server.stop()
        assert admits(b)  # discovers the outage: the local breaker admits it
        assert not gate.healthy
        wait_until(lambda: len(waits) == 6, timeout=30, what="six probes that found Redis down")
        own_server.start()
        returned.set()
        wait_until(lambda: gate.healthy, timeout=30, what="the next probe to find Redis")
        assert waits == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]  # and no wait after the probe that found it
    finally:
        breakers.close()
