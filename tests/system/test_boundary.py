"""Exact at every boundary (docs/boundary.md; docs/design.md section 5, "What a worker knows").

Each "worker" here is its own Breakers, with its own subscription and
knowledge, as a gunicorn worker process has; tests/system/test_boundary_processes.py
repeats the main cases with real separate processes. Every boundary test
asserts exactly: 0 admitted, not "at most a few".
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator

import fakeredis
import pytest
from hypothesis import given
from hypothesis import strategies as st

from breaker_redis import BreakerConfig, Breakers, State
from breaker_redis.engine import knowledge
from breaker_redis.storage import acks
from breaker_redis.storage.notices import FOREIGN_DATABASE, parse_notice
from breaker_redis.urls import describe
from tests.support.hostile import hostile
from tests.support.redis_server import emptied, wait_until
from tests.support.replay import replayed
from tests.support.workers import RATE, TRIP_AT_3, TRIP_AT_5, admits, counting, fail, spent, subscribed


@pytest.fixture(params=["fake", "embedded", "real"])
def connect(request: pytest.FixtureRequest):
    """A factory of clients on one shared store: fakeredis in-process, the embedded
    server over TCP, or the session's real redis-server."""
    if request.param == "fake":
        server = fakeredis.FakeServer()
        yield lambda: fakeredis.FakeRedis(server=server)
        return
    if request.param == "embedded":
        url = request.getfixturevalue("embedded").url
    else:
        url = request.getfixturevalue("redis_server").url
    from breaker_redis.urls import client_from_url

    # the longest client timeout the product allows: a reply stalled past the default
    # 0.25 s on a busy machine sends a worker to its local store, which sees no trip
    url += ("&" if "?" in url else "?") + "socket_timeout=0.9&socket_connect_timeout=0.9"
    emptied(client_from_url(url))
    yield lambda: client_from_url(url)


@pytest.fixture
def workers(connect) -> Iterator[list[Breakers]]:
    made = [Breakers(connect()) for _ in range(2)]
    yield made
    for w in made:
        w.close()


@pytest.fixture
def steady_trust(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test that counts round trips, the two clocks of a worker's trust in its memory
    run for an hour: each subscription's lease (storage/acks.py; 2 s from its last PONG)
    and the age of the reply it learned from (knowledge.py TRUST_SECONDS, 30 s). Else a
    listener a busy machine leaves unscheduled for 2 s, or a hypothesis test running its
    examples for over 30 s, makes a worker ask Redis once more, as it must then."""
    monkeypatch.setattr(acks, "LEASE_SECONDS", 3600.0)
    monkeypatch.setattr(knowledge, "TRUST_SECONDS", 3600.0)


def hold_batches(breakers: Breakers) -> list[object]:
    """Keep the recorder thread from sending batches by itself: the test decides when."""
    scheduled: list[object] = []
    breakers.recorder.schedule = scheduled.append  # type: ignore[method-assign]
    return scheduled


# -- 1. the trip boundary ------------------------------------------------------------------


def test_the_call_right_after_a_trip_is_refused_by_every_other_worker(workers):
    a, b = (w.get("pay", TRIP_AT_3) for w in workers)
    subscribed(workers)
    admitted = 0
    for _ in range(100):
        a.reset()
        assert admits(b)  # the reset's notice is drained before b decides: no waiting
        fail(a, 3)
        admitted += admits(b)
    assert admitted == 0


def test_the_boundary_holds_while_the_subscription_is_down(connect):
    workers = [Breakers(connect(), listen=False) for _ in range(2)]
    try:
        a, b = (w.get("pay", TRIP_AT_3) for w in workers)
        admitted = 0
        for _ in range(50):
            a.reset()
            assert admits(b)
            fail(a, 3)
            admitted += admits(b)
        assert admitted == 0
    finally:
        for w in workers:
            w.close()


def test_a_lost_subscription_makes_workers_ask_redis_until_it_is_back(redis_server):
    redis_server.client().flushall()
    workers = [Breakers.from_url(redis_server.url) for _ in range(2)]
    try:
        a, b = (w.get("pay", TRIP_AT_3) for w in workers)
        subscribed(workers)
        assert admits(b)
        redis_server.client().client_kill_filter(_type="pubsub")
        fail(a, 3)  # b's notice is lost with its connection
        assert not admits(b)  # b finds its subscription gone and asks Redis
        wait_until(lambda: b._shared.invalidator.healthy, what="b to subscribe again")
        a.reset()
        assert admits(b)
    finally:
        for w in workers:
            w.close()


# -- 3. batching never changes a decision ---------------------------------------------------


def batching(workers: list[Breakers]) -> None:
    for w in workers:
        assert w.batch_successes


def test_rate_rule_late_batch_is_judged_whole(workers):
    """A makes 15 successes (batched), then B makes 10 failures: 40 % of 25 stays closed,
    whenever A's batch reaches Redis."""
    batching(workers)
    hold_batches(workers[0])
    a, b = (w.get("rate", RATE) for w in workers)
    subscribed(workers)
    for _ in range(15):
        a.acquire().success()
    with a._send_lock:  # a's batch can reach Redis only after all of b's failures
        fail(b, 10)
        assert b.snapshot()["window_calls"] == 10
    assert admits(b) and admits(a)  # ignored calls: counted in no window
    a.flush_batch()
    snap = b.snapshot()
    assert (snap["state"], snap["window_calls"], snap["window_failures"]) == ("closed", 25, 10)


def test_consecutive_rule_a_success_after_the_first_failure_resets_the_run(workers):
    """B fails, A succeeds, B fails 4 more times: 4 in a row, closed."""
    batching(workers)
    a, b = (w.get("consec", TRIP_AT_5) for w in workers)
    subscribed(workers)
    early = a.acquire()  # admitted while calm, finishes after B's first failure
    fail(b)
    early.success()
    fail(b, 4)
    assert admits(a) and admits(b)
    a.acquire().success()  # and again with a permit taken after the failure
    fail(b, 4)
    assert admits(b)
    snap = b.snapshot()
    assert (snap["state"], snap["consecutive_failures"]) == ("closed", 4)


def test_successes_batched_while_calm_do_not_reset_a_later_run(workers):
    """Batched successes all happened before the failure that armed the breaker:
    arriving after it, they do not break the run that follows."""
    batching(workers)
    hold_batches(workers[0])
    a, b = (w.get("run", TRIP_AT_5) for w in workers)
    subscribed(workers)
    for _ in range(10):
        a.acquire().success()
    with a._send_lock:  # the batch arrives after the four failures
        fail(b, 4)
    a.flush_batch()
    fail(b)
    assert not admits(a)
    assert b.snapshot()["state"] == "open"


def test_a_worker_that_hears_of_arming_sends_its_batch_at_once(workers):
    batching(workers)
    hold_batches(workers[0])
    a, b = (w.get("arm", TRIP_AT_5) for w in workers)
    subscribed(workers)
    for _ in range(7):
        a.acquire().success()
    assert a._batch_count == 7
    fail(b)
    a.acquire().ignore()  # a drains the arming notice first, and sends its batch
    assert a._batch_count == 0
    assert b.snapshot()["successes"] == 7


# -- 4. epochs never go backwards; messages are hints --------------------------------------


@pytest.mark.parametrize("how", ["delete", "flushdb", "repair"])
def test_keys_vanishing_under_running_workers_lose_no_failure(workers, connect, how):
    a, b = (w.get("pay", TRIP_AT_5) for w in workers)
    subscribed(workers)
    fail(a, 2)
    a.reset()
    a.force_closed()
    a.clear_force()  # several transitions: the epoch is well above its seed
    in_flight = b.acquire()
    epoch_before = a.snapshot()["epoch"]
    client = connect()
    if how == "delete":
        client.delete(*client.keys("breaker:{pay}:*"))
    elif how == "flushdb":
        client.flushdb()
    else:
        client.delete("breaker:{pay}:state")
        client.set("breaker:{pay}:state", "garbage")
    in_flight.failure()  # admitted before the keys vanished: it counts on the new breaker
    fail(a)
    fail(b)
    fail(a)
    assert admits(b)
    fail(b)  # the fifth
    assert not admits(a) and not admits(b)
    snap = a.snapshot()
    assert snap["state"] == "open"
    assert snap["epoch"] > epoch_before
    assert snap["stale"] == 0


def test_a_forged_message_costs_one_round_trip_and_refuses_nothing(workers, connect, steady_trust):
    counts = counting(workers)
    a, b = (w.get("pay", TRIP_AT_3) for w in workers)
    subscribed(workers)
    assert admits(a) and admits(b)
    before = [c["acquire"] for c in counts]
    forged = {
        "name": "pay",
        "kind": "transition",
        "from": "closed",
        "to": "open",
        "epoch": 10**15,
        "arms": 10**6,
        "open_until": 10**15,
        "forced": "open",
        "cause": "forged",
        "at": 0,
    }
    connect().publish("breaker:notices:0", json.dumps(forged))
    connect().publish("breaker:notices:0", "not json at all")
    for _ in range(20):
        assert admits(a) and admits(b)
    assert spent(counts, before) == [1, 1]
    fail(a, 3)  # later replies carry lower epochs than the forged one: still exact
    assert not admits(b)


@pytest.mark.parametrize(("token", "asks"), [("", 1), ("1700000000000-1", 0)])
def test_a_notice_on_the_legacy_channel_counts_only_without_a_token(
    workers, connect, token, asks, steady_trust
):
    """During a rolling deploy the workers of an earlier version publish their changes on
    <prefix>:events only, without a token: heard there (the worker asks Redis again). A
    notice with a token comes on the workers' channel too: there it is acted on, not here."""
    counts = counting(workers)
    a, b = (w.get("pay", TRIP_AT_3) for w in workers)
    subscribed(workers)
    assert admits(a) and admits(b)
    before = [c["acquire"] for c in counts]
    notice = {
        "name": "pay",
        "kind": "transition",
        "from": "closed",
        "to": "open",
        "epoch": 10**15,
        "arms": 0,
        "born": 1,
        "open_until": 10**15,
        "forced": "",
        "cause": "trip",
        "at": 0,
        "db": 0,
    }
    if token:
        notice["ack"] = token
    connect().publish("breaker:events", json.dumps(notice))
    for _ in range(5):
        assert admits(a) and admits(b)
    assert spent(counts, before) == [asks, asks]


@replayed(40)
@given(messages=st.lists(hostile("pay"), min_size=1, max_size=6))
def test_hostile_messages_cost_at_most_one_round_trip_and_never_end_the_subscription(
    workers, connect, caplog, steady_trust, messages
):
    """Forged messages no script writes ('born': Infinity, 'epoch': 1e999, NaN, integers of
    thousands of digits, strings, lists and objects where numbers are due, nesting past the
    decoder's recursion): each one naming the breaker is a plain hint (exactly one round trip
    per worker, nothing refused), every other one is dropped (none), the subscription stays
    the same connection, healthy, nothing logged about losing it, and the calls after the
    round trip are decided from memory again."""
    caplog.set_level(logging.INFO, logger="breaker_redis")
    counts = counting(workers)
    a, b = (w.get("pay", TRIP_AT_3) for w in workers)
    subscribed(workers)
    links = [(w.invalidator._link, w.invalidator._link.socket) for w in workers]
    assert admits(a) and admits(b)
    publisher = connect()
    try:
        for message, round_trips in messages:
            before = [c["acquire"] for c in counts]
            publisher.publish("breaker:notices:0", message)
            publisher.ping()  # then the message is in every subscriber's socket (Breakers.barrier)
            for _ in range(3):
                assert admits(a) and admits(b)
            assert spent(counts, before) == [round_trips] * 2, message[:300]
            assert [(w.invalidator._link, w.invalidator._link.socket) for w in workers] == links
            assert all(w.invalidator.healthy for w in workers)
    finally:
        publisher.close()
    assert "subscription lost" not in caplog.text
    fail(a, 3)  # and the boundary is exact after them
    assert not admits(b)
    a.reset()


@replayed(300, fixtures=False)
@given(
    data=st.one_of(
        hostile("pay").map(lambda case: case[0]),
        st.binary(max_size=64),
        st.text(max_size=64),
        st.sampled_from([None, 12, b"\xff\xfe", "{", "[]", "null"]),
    )
)
def test_the_one_reader_of_messages_never_raises_and_keeps_only_what_a_script_writes(data):
    """storage/notices.py parse_notice, alone: for any data a subscription can hand it, a
    Notice or None, never an exception; every number it keeps is an integer 0 to 2^53 - 1
    (or the foreign-database mark), every state and force one a script writes."""
    notice = parse_notice(data)
    if notice is None:
        return
    assert isinstance(notice.name, str) and isinstance(notice.kind, str)
    for value in (notice.born, notice.epoch, notice.arms, notice.open_until, notice.at):
        assert value is None or (type(value) is int and 0 <= value <= 2**53 - 1)
    assert notice.database is None or notice.database == FOREIGN_DATABASE or 0 <= notice.database <= 2**53 - 1
    assert notice.to in (None, "closed", "open", "half_open")
    assert notice.came_from in (None, "closed", "open", "half_open")
    assert notice.forced in (None, "", "open", "closed")


# -- 5. one listener per process; ordered sends ----------------------------------------------


def test_one_listener_per_process_whatever_the_concurrency_of_first_calls(connect):
    breakers = Breakers(connect(), "one-listener")
    try:
        b = breakers.get("pay", TRIP_AT_3)
        start = threading.Barrier(16)

        def first_call() -> None:
            start.wait()
            b.acquire().ignore()

        threads = [threading.Thread(target=first_call) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        name = f"breaker-redis-events 'one-listener' at {describe(breakers.client)}"
        listeners = [t for t in threading.enumerate() if t.name == name]
        assert len(listeners) == 1
    finally:
        breakers.close()
    assert not listeners[0].is_alive()  # close() woke it and waited for it


class WatchedLock:
    """A lock that tells when a thread found it held and has to wait."""

    def __init__(self, lock) -> None:
        self.lock, self.contended = lock, threading.Event()

    def __enter__(self) -> WatchedLock:
        if not self.lock.acquire(blocking=False):
            self.contended.set()
            self.lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_a_failure_never_overtakes_the_batch_being_sent(workers):
    hold_batches(workers[0])
    a = workers[0].get("order", TRIP_AT_5)
    subscribed(workers)
    runner = workers[0].gate.remote
    real_run = runner.run
    arrived: list[str] = []
    batch_inside, release = threading.Event(), threading.Event()

    def run(operation, name, now_ms, args):
        if operation == "record":
            outcome, batch = args[3], args[-3]  # (the reporter and the batch's times follow)
            arrived.append(f"{outcome or 'batch'}:{batch}")
            if not outcome:
                batch_inside.set()
                release.wait(10)
        return real_run(operation, name, now_ms, args)

    runner.run = run
    a._send_lock = watched = WatchedLock(a._send_lock)
    for _ in range(3):
        a.acquire().success()
    sender = threading.Thread(target=a.flush_batch)
    sender.start()
    assert batch_inside.wait(10)
    failing = threading.Thread(target=fail, args=(a,))
    failing.start()
    assert watched.contended.wait(10), "the failure did not wait for the batch being sent"
    assert arrived == ["batch:3"]
    release.set()
    sender.join(10)
    failing.join(10)
    assert arrived == ["batch:3", "failure:0"]


# -- 8. observe mode costs nothing while virtually open --------------------------------------


def test_observe_mode_counts_in_memory_while_open(workers, monkeypatch):
    monkeypatch.setattr("breaker_redis.engine.core.FLUSH_SECONDS", 3600.0)  # no periodic flush in the loop
    cfg = BreakerConfig(trip="consecutive", failure_threshold=2, open_seconds=30, mode="observe")
    w = workers[0]
    b = w.get("observe", cfg)
    subscribed(workers)
    fail(b, 2)
    assert b.snapshot()["state"] == "open"
    runner = w.gate.remote
    real_run = runner.run
    runs = []
    runner.run = lambda *args: (runs.append(args[0]), real_run(*args))[1]
    for i in range(30):
        permit = b.acquire()
        permit.failure() if i % 3 == 0 else permit.success()
    assert runs == []
    runner.run = real_run
    snap = b.snapshot()
    assert (snap["would_reject"], snap["failures"], snap["successes"], snap["state"]) == (30, 12, 20, "open")
    assert b.state is State.OPEN


# -- a reply that may predate a notice is never trusted -------------------------------------


def inject_after_script(breakers: Breakers, operation: str, action) -> None:
    """Run action() once, right after the next `operation` script of this worker ran
    and before its reply is learned: the reply then predates whatever action did."""
    runner = breakers.gate.remote
    real_run = runner.run
    pending = [action]

    def run(op, *args):
        reply = real_run(op, *args)
        if op == operation and pending:
            pending.pop()()
        return reply

    runner.run = run


def test_a_notice_delivered_while_a_reply_is_in_flight_wins(workers):
    a, b = (w.get("pay", TRIP_AT_3) for w in workers)
    subscribed(workers)
    assert admits(b)
    fail(b)  # b's record reply says closed...

    def trip_and_deliver() -> None:
        fail(a, 2)  # ...but meanwhile a trips it (3 in a row), and b hears of it before learning the reply
        workers[1].invalidator.drain()

    inject_after_script(workers[1], "record", trip_and_deliver)
    b.acquire().ignore()  # this call was admitted before the trip; its record reply is the stale one
    assert not admits(b)


def test_a_reply_computed_before_the_subscription_took_effect_is_not_trusted(connect):
    a_side, b_side = Breakers(connect()), Breakers(connect())
    try:
        a, b = a_side.get("pay", TRIP_AT_3), b_side.get("pay", TRIP_AT_3)
        subscribed([a_side])
        b_side.invalidator._read_lock.acquire()  # b's listener cannot subscribe yet

        def trip_then_let_b_subscribe() -> None:
            fail(a, 3)  # published while b is not subscribed: b never hears of it
            b_side.invalidator._read_lock.release()
            wait_until(lambda: b_side.invalidator.healthy, what="b's subscription")

        inject_after_script(b_side, "acquire", trip_then_let_b_subscribe)
        first = b.acquire()  # first call: asked Redis before the trip (still in flight)
        assert not admits(b)
        first.ignore()
    finally:
        a_side.close()
        b_side.close()
