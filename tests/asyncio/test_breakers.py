"""breaker_redis.asyncio: the same breakers, awaited (docs/design.md sections 2 and 8, docs/asyncio.md).

Each test runs its own event loop (``asyncio.run``) and builds its Breakers
inside it, as an app does in a uvicorn worker. The sync and async sides are
held to each other: the same random scenario gives the same decisions and
the same snapshot on both, and a sync worker and an async worker of one
deployment share one breaker and one trip boundary.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import fakeredis
import pytest
from hypothesis import given
from hypothesis import strategies as st

from breaker_redis import BreakerConfig, BreakerOpen, State
from breaker_redis import Breakers as SyncBreakers
from breaker_redis.asyncio import Breakers
from breaker_redis.urls import async_client_from_url, client_from_url
from tests.support.hostile import hostile
from tests.support.redis_server import RedisServer, wait_until
from tests.support.replay import replayed
from tests.support.workers import TRIP_AT_3, counting, spent
from tests.support.workers import fail as fail_sync

CONFIGS = {
    "consecutive": TRIP_AT_3,
    "count": BreakerConfig(
        trip="count",
        failure_threshold=4,
        window_seconds=10,
        open_seconds=5,
        half_open_max_calls=2,
        half_open_successes=2,
    ),
    "rate": BreakerConfig(
        trip="rate",
        failure_rate=0.5,
        minimum_calls=6,
        window_seconds=10,
        window_buckets=5,
        open_seconds=3,
        open_backoff=2,
        max_open_seconds=20,
    ),
}


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


@pytest.fixture(params=["fake", "embedded", "real"])
def connect(request: pytest.FixtureRequest) -> Iterator[Callable[[], Any]]:
    """A factory of asyncio clients on one shared store, emptied: fakeredis in
    process (no subscription: every call asks), the embedded server over TCP, or
    the session's real redis-server. Call it inside the test's event loop. Their
    timeouts only catch a hang: none of these tests is about an outage, and a busy
    machine can hold a reply past the product's 0.25 s (the embedded server answers
    from threads of this process), which would send a worker to its local store."""
    if request.param == "fake":
        server = fakeredis.FakeServer()
        yield lambda: fakeredis.FakeAsyncRedis(server=server)
        return
    fixture = "embedded" if request.param == "embedded" else "redis_server"
    url = request.getfixturevalue(fixture).url
    client_from_url(url).flushall()
    yield lambda: async_client_from_url(url, socket_timeout=10, socket_connect_timeout=10)


def patient(url: str, prefix: str = "breaker", **kwargs: Any) -> Breakers:
    """Breakers.from_url, with client timeouts that only catch a hang: for the tests on a
    server that stays up. A busy machine can stall the event loop past the product's 0.25 s
    while a reply waits (the timeout fires before the read resumes), which would send the
    worker to its local store and make its counts its own."""
    return Breakers(
        async_client_from_url(url, socket_timeout=10, socket_connect_timeout=10), prefix, **kwargs
    )


async def subscribed(*workers: Breakers) -> None:
    for w in workers:
        w.ensure_loop()
        if w.invalidator is None:
            continue
        deadline = time.monotonic() + 10
        while not w.invalidator.healthy:
            assert time.monotonic() < deadline, "the subscription did not come up within 10 s"
            await asyncio.sleep(0.005)


async def admits(breaker: Any) -> bool:
    try:
        await (await breaker.acquire()).ignore()
        return True
    except BreakerOpen:
        return False


async def fail(breaker: Any, n: int = 1) -> None:
    for _ in range(n):
        await (await breaker.acquire()).failure()


class Boom(Exception):
    pass


# -- the API -------------------------------------------------------------------------------


def test_from_url_memory_runs_the_scripts_in_this_process(clock):
    """Breakers.from_url("memory://"): a store of its own, driven by the test clock."""

    async def main() -> None:
        breakers = Breakers.from_url("memory://", clock=clock)
        pay = breakers.get("pay", TRIP_AT_3)
        await fail(pay, 3)
        assert not await admits(pay)
        clock.advance(TRIP_AT_3.open_seconds * 1000)
        assert await admits(pay)  # the probe
        assert await breakers.names() == ["pay"]
        await breakers.aclose()

    run(main())


def test_call_decorator_context_and_permit(connect, clock):
    async def main() -> None:
        breakers = Breakers(connect(), clock=clock)
        pay = breakers.get("pay", TRIP_AT_3)

        async def charge(amount: int) -> int:
            return amount * 2

        assert await pay.call(charge, 21) == 42
        assert await pay.call(lambda: "plain") == "plain"  # a plain function works too

        @pay
        async def decorated() -> str:
            return "ok"

        assert await decorated() == "ok"
        async with pay as permit:
            assert not permit.recorded
        assert permit.recorded
        permit = await pay.acquire()
        await permit.success()
        await permit.failure()  # recorded once: a no-op
        with pytest.raises(Boom):
            async with pay:
                raise Boom
        snap = await pay.snapshot()
        assert (snap["successes"], snap["failures"], snap["consecutive_failures"]) == (5, 1, 1)
        assert await pay.state() is State.CLOSED
        await breakers.aclose()

    run(main())


def test_failures_trip_and_refuse_without_calling(connect, clock):
    async def main() -> None:
        breakers = Breakers(connect(), clock=clock)
        pay = breakers.get("pay", TRIP_AT_3)
        calls = 0

        async def broken() -> None:
            nonlocal calls
            calls += 1
            raise Boom

        for _ in range(3):
            with pytest.raises(Boom):
                await pay.call(broken)
        with pytest.raises(BreakerOpen) as refused:
            await pay.call(broken)
        assert calls == 3
        assert refused.value.reason == "open" and refused.value.retry_after == 30.0
        clock.advance(30_000)
        assert await pay.call(lambda: "probe") == "probe"  # half-open's one probe closes it
        assert (await pay.snapshot())["state"] == "closed"
        await breakers.aclose()

    run(main())


def test_fallbacks_values_callables_and_coroutines(connect, clock):
    async def main() -> None:
        breakers = Breakers(connect(), clock=clock)
        pay = breakers.get("pay", TRIP_AT_3)

        async def broken() -> str:
            raise Boom("down")

        async def cached(cause: BaseException) -> str:
            return f"cached after {type(cause).__name__}"

        assert await pay.call(broken, fallback="static") == "static"
        assert await pay.call(broken, fallback=lambda exc: str(exc)) == "down"
        assert await pay.call(broken, fallback=cached) == "cached after Boom"
        assert await pay.call(broken, fallback=cached) == "cached after BreakerOpen"
        await breakers.aclose()

    run(main())


def test_ignored_exceptions_and_cancellation_count_nothing(connect, clock):
    async def main() -> None:
        breakers = Breakers(connect(), clock=clock)
        pay = breakers.get(
            "pay", BreakerConfig(trip="consecutive", failure_threshold=3, ignore_exceptions=(KeyError,))
        )
        with pytest.raises(KeyError):
            await pay.call(lambda: {}["missing"], fallback="never")
        started = asyncio.Event()

        async def hangs() -> None:
            started.set()
            await asyncio.sleep(3600)

        task = asyncio.ensure_future(pay.call(hangs))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        snap = await pay.snapshot()
        assert (snap["ignored"], snap["failures"], snap["calls"]) == (2, 0, 2)
        await breakers.aclose()

    run(main())


def test_admin_live_config_and_names(connect, clock):
    async def main() -> None:
        breakers = Breakers(connect(), clock=clock)
        pay = breakers.get("pay", TRIP_AT_3)
        await pay.force_open()
        with pytest.raises(BreakerOpen) as refused:
            await pay.acquire()
        assert refused.value.reason == "forced_open"
        await pay.clear_force()
        assert await admits(pay)
        assert await breakers.configure("pay", failure_threshold=1) == {"failure_threshold": "1"}
        await fail(pay)
        assert (await pay.snapshot())["state"] == "open"
        await pay.reset()
        assert await admits(pay)
        await pay.trip()
        assert not await admits(pay)
        await pay.half_open()
        assert (await pay.snapshot())["state"] == "half_open"
        await pay.reset()
        assert await breakers.names() == ["pay"]
        with pytest.raises(ValueError, match="failure_threshold"):
            await breakers.configure("pay", failure_threshold=0)
        with pytest.raises(ValueError, match="unknown config field 'colour'"):  # a removal's name too
            await breakers.configure("pay", colour=None)
        with pytest.raises(ValueError, match="already exists"):
            breakers.get("pay", BreakerConfig(failure_threshold=9))
        await breakers.aclose()

    run(main())


# -- the sync and async sides agree ----------------------------------------------------------


def _scenario(seed: int) -> list[tuple[str, Any]]:
    rng = random.Random(seed)
    steps: list[tuple[str, Any]] = []
    for _ in range(160):
        roll = rng.random()
        if roll < 0.55:
            steps.append(("call", rng.choice(["success", "success", "failure", "ignored"])))
        elif roll < 0.8:
            steps.append(("advance", rng.choice([50, 400, 1500, 3100, 5200])))
        elif roll < 0.9:
            steps.append(("hold", rng.choice(["success", "failure"])))  # a call still running
        elif roll < 0.95:
            steps.append(("settle", None))  # the oldest running call returns
        else:
            steps.append((rng.choice(["reset", "force_open", "clear_force"]), None))
    return steps


@pytest.mark.parametrize("trip", sorted(CONFIGS))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sync_and_async_decide_alike(trip, seed, redis_server, clock):
    """The same calls at the same (test) times give the same decision, reason
    and final snapshot on the sync API and on the async one, both deciding
    from memory with a subscription on the real redis-server."""
    config, steps = CONFIGS[trip], _scenario(seed)
    redis_server.client().flushall()

    def sync_side() -> tuple[list[Any], dict[str, Any]]:
        breakers = SyncBreakers.from_url(redis_server.url, "sync", clock=clock)
        breaker, held, decisions = breakers.get("pay", config), [], []
        for op, arg in steps:
            if op in ("call", "hold"):
                try:
                    permit = breaker.acquire()
                except BreakerOpen as refused:
                    decisions.append(refused.reason)
                    continue
                decisions.append("admitted")
                if op == "call":
                    permit.record(arg)
                else:
                    held.append((permit, arg))
            elif op == "settle" and held:
                permit, outcome = held.pop(0)
                permit.record(outcome)
            elif op == "advance":
                clock.advance(arg)
            elif op in ("reset", "force_open", "clear_force"):
                getattr(breaker, op)()
        snap = breaker.snapshot()
        breakers.close()
        return decisions, snap

    async def async_side() -> tuple[list[Any], dict[str, Any]]:
        breakers = patient(redis_server.url, "async", clock=clock)
        breaker, held, decisions = breakers.get("pay", config), [], []
        await subscribed(breakers)
        for op, arg in steps:
            if op in ("call", "hold"):
                try:
                    permit = await breaker.acquire()
                except BreakerOpen as refused:
                    decisions.append(refused.reason)
                    continue
                decisions.append("admitted")
                if op == "call":
                    await permit.record(arg)
                else:
                    held.append((permit, arg))
            elif op == "settle" and held:
                permit, outcome = held.pop(0)
                await permit.record(outcome)
            elif op == "advance":
                clock.advance(arg)
            elif op in ("reset", "force_open", "clear_force"):
                await getattr(breaker, op)()
        snap = await breaker.snapshot()
        await breakers.aclose()
        return decisions, snap

    start = clock.now
    sync_decisions, sync_snap = sync_side()
    clock.now = start
    async_decisions, async_snap = run(async_side())
    assert async_decisions == sync_decisions
    assert len(set(sync_decisions)) > 1, "the scenario never refused anything: it tests too little"
    for key in (
        "state",
        "forced",
        "epoch",
        "window_calls",
        "window_failures",
        "consecutive_failures",
        "calls",
        "successes",
        "failures",
        "ignored",
        "rejected",
        "trips",
        "retry_after",
    ):
        assert async_snap[key] == sync_snap[key], key


# -- one boundary for sync and async workers -----------------------------------------------


def test_the_call_right_after_a_trip_is_refused_by_every_other_async_worker(connect):
    async def main() -> None:
        workers = [Breakers(connect()) for _ in range(2)]
        a, b = (w.get("pay", TRIP_AT_3) for w in workers)
        await subscribed(*workers)
        admitted = 0
        for _ in range(100):
            await a.reset()
            assert await admits(b)
            await fail(a, 3)
            admitted += await admits(b)
        assert admitted == 0
        for w in workers:
            await w.aclose()

    run(main())


async def delivered(workers: list[Breakers], publisher: Any) -> None:
    """Every message published so far read and handled by each worker's subscription: one
    round trip of the publisher after its PUBLISH (then the message is in every subscriber's
    socket, as after a worker's barrier), then until nothing is left unread."""
    await publisher.ping()
    deadline = time.monotonic() + 10
    while any(w.invalidator is not None and w.invalidator.pending() for w in workers):
        assert time.monotonic() < deadline, "a published message was not read within 10 s"
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("connect", ["embedded", "real"], indirect=True)
@replayed(15)
@given(messages=st.lists(hostile("pay"), min_size=1, max_size=8))
def test_hostile_messages_cost_at_most_one_round_trip_and_never_end_an_async_subscription(
    connect, caplog, messages
):
    """tests/system/test_boundary.py's hostile messages, on the asyncio subscription, which reads them
    in the event loop's protocol callback: a plain hint costs each worker exactly one round
    trip, a message dropped none, the subscription stays the same connection and healthy,
    and neither breaker_redis nor asyncio logs a loss or a failed callback."""
    caplog.set_level(logging.INFO, logger="breaker_redis")

    async def main() -> None:
        workers = [Breakers(connect()) for _ in range(2)]
        publisher = connect()
        try:
            counts = counting(workers)
            a, b = (w.get("pay", TRIP_AT_3) for w in workers)
            await subscribed(*workers)
            held = [w.invalidator._subscription for w in workers]  # type: ignore[union-attr]
            assert await admits(a) and await admits(b)
            for message, round_trips in messages:
                before = [c["acquire"] for c in counts]
                await publisher.publish("breaker:notices:0", message)
                await delivered(workers, publisher)
                for _ in range(3):
                    assert await admits(a) and await admits(b)
                assert spent(counts, before) == [round_trips] * 2, message[:300]
                assert [w.invalidator._subscription for w in workers] == held  # type: ignore[union-attr]
                assert all(w.invalidator is not None and w.invalidator.healthy for w in workers)
            await fail(a, 3)  # and the boundary is exact after them
            assert not await admits(b)
            await a.reset()
        finally:
            # aclose came with redis-py 5.0.1; 5.0.0, the oldest supported, has close only
            await (getattr(publisher, "aclose", None) or publisher.close)()
            for w in workers:
                await w.aclose()

    run(main())
    assert "subscription lost" not in caplog.text
    assert "Fatal error" not in caplog.text


@pytest.mark.parametrize("tripper", ["sync", "async"])
def test_sync_and_async_workers_share_one_boundary(tripper, redis_server):
    """A trip made by either side is refused by the other on its very next call,
    deciding from memory up to that call (0 admitted in 100 rounds). The sync side's
    changes run in a thread, as blocking calls from async code should: one made on the
    loop's own thread would hold the async listener's acknowledgement, and so itself,
    until the listener's lease ran out (storage/acks.py)."""
    redis_server.client().flushall()
    sync_workers = SyncBreakers.from_url(redis_server.url)
    sync_pay = sync_workers.get("pay", TRIP_AT_3)

    def sync_admits() -> bool:
        try:
            sync_pay.acquire().ignore()
            return True
        except BreakerOpen:
            return False

    async def main() -> None:
        async_workers = patient(redis_server.url)
        async_pay = async_workers.get("pay", TRIP_AT_3)
        await subscribed(async_workers)
        sync_workers.ensure_process()
        wait_until(lambda: sync_workers.invalidator.healthy, what="the sync subscription")
        admitted = 0
        for _ in range(100):
            await asyncio.to_thread(sync_pay.reset)
            assert await admits(async_pay)
            assert sync_admits()
            if tripper == "sync":
                await asyncio.to_thread(fail_sync, sync_pay, 3)
                admitted += await admits(async_pay)
            else:
                await fail(async_pay, 3)
                admitted += sync_admits()
        assert admitted == 0
        snap = await async_pay.snapshot()
        assert snap["trips"] == 100
        await async_workers.aclose()

    try:
        run(main())
    finally:
        sync_workers.close()


def test_a_healthy_async_call_costs_no_redis_command(redis_server):
    """Calm and subscribed: admitted from memory, successes batched."""
    redis_server.client().flushall()

    async def main() -> tuple[int, int]:
        breakers = patient(redis_server.url)
        pay = breakers.get("pay", TRIP_AT_3)
        await subscribed(breakers)
        await pay.call(lambda: None)  # learn the state
        await breakers.flush()
        before = _commands(redis_server)
        for _ in range(2000):
            await pay.call(lambda: None)
        during = _commands(redis_server) - before
        await breakers.aclose()
        return during, (await _snapshot(redis_server.url, "pay"))["successes"]

    commands, successes = run(main())
    assert successes == 2001
    assert commands <= 2000 * 0.01, f"{commands} Redis commands for 2,000 healthy calls"


def test_an_async_call_admitted_from_memory_is_timed_under_a_slow_call_rule(redis_server, clock):
    """As on the sync side (test_api): a call admitted from memory reads the clock only
    when the knowledge it admits from has a slow-call rule. With one, a slow call is
    counted as slow, through call() and through a permit (this fails when they never
    time); without, the healthy call never reads the clock and a long call is a plain
    success."""
    redis_server.client().flushall()
    reads = [0]

    def counting_clock() -> int:
        reads[0] += 1
        return clock()

    async def main() -> tuple[int, int, int]:
        breakers = patient(redis_server.url, clock=counting_clock, batch_successes=True)
        slow_rule = BreakerConfig(
            trip="consecutive",
            failure_threshold=99,
            slow_call_seconds=1.0,
            slow_call_rate=0.9,
            minimum_calls=50,
        )
        timed, untimed = breakers.get("timed", slow_rule), breakers.get("untimed", BreakerConfig())
        await subscribed(breakers)
        for b in (timed, untimed):
            await b.call(lambda: None)  # learns the config from the reply
            assert b.known is not None and b.known.calm
            await b.call(clock.advance, 1500)
            permit = await b.acquire()  # the permit of a call admitted from memory, timed the same way
            clock.advance(1500)
            await permit.success()
        reads[0] = 0
        for _ in range(5):
            await untimed.call(lambda: None)
        untimed_reads = reads[0]
        slow = ((await timed.snapshot())["window_slow"], (await untimed.snapshot())["window_slow"])
        await breakers.aclose()
        return (*slow, untimed_reads)

    assert run(main()) == (2, 0, 0)


def _commands(server: RedisServer) -> int:
    stats = server.client().info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k not in ("cmdstat_info",))


async def _snapshot(url: str, name: str) -> dict[str, Any]:
    reader = patient(url, listen=False)
    try:
        return await reader.get(name, TRIP_AT_3).snapshot()
    finally:
        await reader.aclose()


def test_batched_successes_are_exact_across_tasks(redis_server):
    redis_server.client().flushall()

    async def main() -> dict[str, Any]:
        breakers = patient(redis_server.url)
        pay = breakers.get("pay", BreakerConfig(trip="rate", failure_rate=0.9, minimum_calls=10_000))
        await subscribed(breakers)

        async def worker(index: int) -> None:
            for i in range(100):
                if (index + i) % 4 == 0:
                    with pytest.raises(Boom):
                        await pay.call(_raise_boom)
                else:
                    await pay.call(asyncio.sleep, 0)

        await asyncio.gather(*(worker(index) for index in range(16)))
        await breakers.aclose()
        return await _snapshot(redis_server.url, "pay")

    snap = run(main())
    assert (snap["successes"], snap["failures"], snap["window_calls"]) == (1200, 400, 1600)


async def _raise_boom(*_: Any) -> None:
    raise Boom


# -- Redis away: the loop never waits on it --------------------------------------------------


@pytest.mark.parametrize(("policy", "admitted"), [("local", True), ("allow", True), ("deny", False)])
def test_on_store_error_with_redis_unreachable(policy, admitted):
    async def main() -> None:
        breakers = Breakers.from_url("redis://127.0.0.1:1/0", on_store_error=policy)
        pay = breakers.get("pay", TRIP_AT_3)
        assert await admits(pay) is admitted
        assert not breakers.store_healthy
        if policy == "local":  # a whole breaker in this process, same config
            await fail(pay, 3)
            assert not await admits(pay)
            assert (await pay.snapshot())["state"] == "open"
        await breakers.aclose()

    run(main())


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    if server.process is not None:
        os.kill(server.process.pid, signal.SIGCONT)
    server.stop()


class BlockingWaits:
    """Records every wait that would hold the event loop's thread: a socket operation on a
    blocking socket (a timeout other than 0, as a sync redis-py connection has; the loop's
    own sockets are non-blocking) and a time.sleep. Observed on the real objects, so what
    blocks the loop is seen however long it lasts, while a busy machine's stall is not."""

    METHODS = ("connect", "connect_ex", "recv", "recv_into", "recvfrom", "send", "sendall", "sendto")

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[str] = []
        self.thread: int | None = None
        for method in self.METHODS:
            monkeypatch.setattr(socket.socket, method, self._wrapped(method, getattr(socket.socket, method)))
        real_sleep = time.sleep

        def sleep(seconds: float) -> None:
            if seconds > 0 and threading.get_ident() == self.thread:
                self.seen.append(f"time.sleep({seconds})")
            real_sleep(seconds)

        monkeypatch.setattr(time, "sleep", sleep)

    def _wrapped(self, method: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(sock: socket.socket, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == self.thread and sock.gettimeout() != 0.0:
                self.seen.append(f"{method} on a socket with timeout {sock.gettimeout()}")
            return real(sock, *args, **kwargs)

        return wrapped


@pytest.mark.processes
def test_the_event_loop_never_blocks_while_redis_hangs(own_server, monkeypatch):
    """SIGSTOP: Redis accepts nothing and answers nothing. A blocking call would hold the
    loop for a whole socket timeout (250 ms); none is made on the loop's thread while calls
    keep being answered, first by Redis, then from the local store once the first call
    timed out. (The loop's longest gap is not measured: a busy machine stalls the thread
    for longer than a timeout without any blocking call.)"""
    blocking = BlockingWaits(monkeypatch)

    async def main() -> tuple[int, int]:
        blocking.thread = threading.get_ident()
        breakers = Breakers.from_url(own_server.url)
        pay = breakers.get("pay", TRIP_AT_3)
        await subscribed(breakers)
        await pay.call(lambda: None)
        assert own_server.process is not None
        os.kill(own_server.process.pid, signal.SIGSTOP)
        answered = refused = 0
        deadline = time.monotonic() + 10
        while not refused:
            assert time.monotonic() < deadline, f"not refused within 10 s ({answered} answered)"
            try:
                await pay.call(_raise_boom)
            except Boom:
                answered += 1
            except BreakerOpen:
                refused += 1
        os.kill(own_server.process.pid, signal.SIGCONT)
        await breakers.aclose()
        return answered, refused

    answered, refused = run(main())
    assert blocking.seen == []
    assert answered >= 3 and refused == 1  # answered until the local breaker tripped, then refused


# -- cancellation never leaks a lease nor loses an outcome on its way --------------------------


class HeldReplies:
    """An asyncio client whose script calls wait for the test while ``hold`` is
    "reply" (the script has run on Redis, its reply is held back) or "send"
    (the command is not sent yet), until ``release`` is set."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.hold = ""
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def evalsha(self, *args: Any) -> Any:
        if self.hold == "send":
            self.held.set()
            await self.release.wait()
        reply = await self._client.evalsha(*args)
        if self.hold == "reply":
            self.held.set()
            await self.release.wait()
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


async def _eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + 10
    while not await check():
        assert time.monotonic() < deadline, f"{what} did not happen within 10 s"
        await asyncio.sleep(0.01)


def test_a_probe_granted_to_a_cancelled_caller_is_handed_back(redis_server, clock):
    redis_server.client().flushall()

    async def main() -> None:
        client = HeldReplies(async_client_from_url(redis_server.url))
        breakers = Breakers(client, clock=clock)
        pay = breakers.get("pay", TRIP_AT_3)
        await fail(pay, 3)
        clock.advance(30_000)
        client.hold = "reply"
        caller = asyncio.ensure_future(pay.acquire())  # half-open: the script grants the probe
        await client.held.wait()
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        client.hold = ""
        client.release.set()

        async def released() -> bool:
            snap = await pay.snapshot()
            return snap["probes_in_flight"] == 0 and snap["ignored"] == 1

        await _eventually(released, "the probe's release")
        assert (await pay.snapshot())["state"] == "half_open"
        assert await admits(pay)  # the slot is free for the next caller
        await breakers.aclose()

    run(main())


def test_an_outcome_on_its_way_reaches_redis_when_its_caller_is_cancelled(redis_server, clock):
    redis_server.client().flushall()

    async def main() -> None:
        client = HeldReplies(async_client_from_url(redis_server.url))
        breakers = Breakers(client, clock=clock)
        pay = breakers.get("pay", TRIP_AT_3)
        await fail(pay, 3)
        clock.advance(30_000)
        probe = await pay.acquire()
        client.hold = "send"
        recording = asyncio.ensure_future(probe.failure())
        await client.held.wait()
        recording.cancel()
        with pytest.raises(asyncio.CancelledError):
            await recording
        client.hold = ""
        client.release.set()

        async def reopened() -> bool:
            snap = await pay.snapshot()
            return snap["state"] == "open" and snap["probes_in_flight"] == 0

        await _eventually(reopened, "the failed probe to reopen the breaker")
        assert (await pay.snapshot())["failures"] == 4
        await breakers.aclose()

    run(main())


def _broken_predicate(exc: BaseException) -> bool:
    raise KeyError("a bug in the app's predicate")


@pytest.mark.parametrize("how", ["call", "async_with"])
def test_a_predicate_that_raises_counts_a_failure_and_frees_the_probe(redis_server, how):
    redis_server.client().flushall()
    config = BreakerConfig(failure_threshold=2, half_open_max_calls=1, predicate=_broken_predicate)

    async def main() -> dict[str, Any]:
        breakers = patient(redis_server.url)
        pay = breakers.get("pay", config)
        await pay.half_open()  # the next call is the only probe
        with pytest.raises(Boom):  # the call's own exception, not the predicate's
            if how == "call":
                await pay.call(_raise_boom)
            else:
                async with pay:
                    await _raise_boom()
        snap = await pay.snapshot()
        await breakers.aclose()
        return snap

    snap = run(main())
    assert (snap["state"], snap["probes_in_flight"], snap["failures"]) == ("open", 0, 1)


def test_successes_batched_while_a_batch_is_sent_are_sent_too(redis_server):
    """The task that sends batches goes round again while successes wait."""
    redis_server.client().flushall()

    class SlowRecords(HeldReplies):
        async def evalsha(self, *args: Any) -> Any:
            await asyncio.sleep(0.05)
            return await self._client.evalsha(*args)

        async def fcall(self, *args: Any) -> Any:
            await asyncio.sleep(0.05)
            return await self._client.fcall(*args)

    async def main() -> int:
        breakers = Breakers(SlowRecords(async_client_from_url(redis_server.url)))
        pay = breakers.get("pay", TRIP_AT_3)
        await subscribed(breakers)
        await pay.call(lambda: None)  # learns the state; batched
        for _ in range(20):  # successes keep joining while batches are on their way
            await asyncio.sleep(0.02)
            await pay.call(lambda: None)

        async def all_sent() -> bool:
            return int(redis_server.client().hget("breaker:{pay}:stats", "successes") or 0) == 21

        await _eventually(all_sent, "every batched success to reach Redis")
        await breakers.aclose()
        return 21

    assert run(main()) == 21


def test_snapshot_waits_for_the_batch_being_sent(redis_server):
    """The task sending the batch has taken it and waits for Redis: a snapshot
    read now shows this worker's successes."""
    redis_server.client().flushall()
    sending = asyncio.Event()
    record: set[str] = set()

    class SlowRecords(HeldReplies):
        async def fcall(self, *args: Any) -> Any:
            await self._held(args)
            return await self._client.fcall(*args)

        async def evalsha(self, *args: Any) -> Any:
            await self._held(args)
            return await self._client.evalsha(*args)

        async def _held(self, args: tuple[Any, ...]) -> None:
            if args[0] in record:
                sending.set()
                await asyncio.sleep(0.3)  # the send under way, as a busy Redis answers

    async def main() -> dict[str, Any]:
        breakers = Breakers(SlowRecords(async_client_from_url(redis_server.url)))
        pay = breakers.get("pay", TRIP_AT_3)
        function, _, _, sha, _ = breakers.gate.remote.heads["record"]
        record.update((function, sha))
        await subscribed(breakers)
        await pay.call(lambda: None)  # learns the state
        for _ in range(4):
            await pay.call(lambda: None)
        await asyncio.wait_for(sending.wait(), timeout=5)
        snap = await pay.snapshot()
        await breakers.aclose()
        return snap

    assert run(main())["successes"] == 5


def test_a_new_event_loop_does_not_reuse_the_old_loops_connections(redis_server):
    """Tests, and a master that used the breakers before forking, move to another loop."""
    redis_server.client().flushall()
    breakers = patient(redis_server.url)
    pay = breakers.get("pay", TRIP_AT_3)

    async def calls() -> None:
        for _ in range(3):
            await pay.call(lambda: None)

    run(calls())
    run(calls())  # a RuntimeError (a future of another loop) escaped here before
    snap = run(pay.snapshot())
    run(breakers.aclose())
    assert snap["successes"] == 6


def test_an_outcome_waiting_while_the_store_switches_is_not_replayed_on_the_other(redis_server, clock):
    """Two failures admitted by Redis; the first is on its way, the second waits
    for the send lock; Redis is declared down meanwhile. The second must not run
    on the local store, whose epochs and leases mean something else."""
    redis_server.client().flushall()

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        client = HeldReplies(async_client_from_url(redis_server.url))
        breakers = Breakers(client, clock=clock)
        pay = breakers.get("pay", TRIP_AT_3)
        first, second = await pay.acquire(), await pay.acquire()
        client.hold = "send"
        sending = asyncio.ensure_future(first.failure())
        await client.held.wait()
        waiting = asyncio.ensure_future(second.failure())
        await asyncio.sleep(0)  # it reaches the send lock and waits there
        breakers.gate._mark_down(ConnectionError("declared down by the test"), breakers.gate.generation)
        client.hold = ""
        client.release.set()
        await asyncio.gather(sending, waiting)
        local = breakers.gate._local
        local_stats = {} if local is None else local.client.hgetall("breaker:{pay}:stats")
        await breakers.aclose()
        return local_stats, redis_server.client().hgetall("breaker:{pay}:stats")

    local_stats, redis_stats = run(main())
    assert local_stats == {}  # nothing recorded on the local store
    assert int(redis_stats.get(b"failures", 0)) <= 1  # only the failure already on its way


def test_aclose_right_after_admin_actions_loses_nothing_and_logs_nothing(redis_server, caplog):
    """The notices of an operator's actions start sends of the counts a worker
    holds; aclose must let them finish before it closes the client, or a send in
    flight fails on a connection closed under it (seen as "Redis unavailable ...
    Connection lost" at shutdown, and a lost refusal count)."""
    redis_server.client().flushall()
    # patient(): a reply stalled past the default 0.25 s on a busy machine sends the worker
    # to its local store, whose refusal count Redis never sees
    url = redis_server.url

    async def round_(index: int) -> int:
        breakers = patient(url, prefix=f"close{index}")
        pay = breakers.get("pay", TRIP_AT_3)
        await pay.call(asyncio.sleep, 0)
        await pay.force_open()
        with pytest.raises(BreakerOpen):
            await pay.call(asyncio.sleep, 0)
        await pay.force_closed()
        await pay.clear_force()
        await breakers.configure("pay", open_seconds=30)
        await breakers.aclose()
        reader = patient(url, prefix=f"close{index}", listen=False)
        try:
            return int((await reader.get("pay", TRIP_AT_3).snapshot())["rejected"])
        finally:
            await reader.aclose()

    caplog.set_level("INFO", logger="breaker_redis")
    rejected = [run(round_(index)) for index in range(60)]
    assert rejected == [1] * 60
    assert [r.getMessage() for r in caplog.records if r.levelname in ("WARNING", "ERROR")] == []


def test_asyncio_workers_of_an_isolated_reporter_refuse_the_call_right_after(connect):
    """min_reporters (docs/one-sick-host.md): a reporter's other worker refuses the
    call right after the failure that isolated it (from memory, once it heard the
    notice), 20 times over; another reporter's worker is admitted every time."""
    config = BreakerConfig(
        trip="count", failure_threshold=5, window_seconds=10, open_seconds=30, min_reporters=2
    )

    async def main() -> None:
        workers = [Breakers(connect(), reporter=name) for name in ("a", "a", "b")]
        a1, a2, b = (w.get("pay", config) for w in workers)
        await subscribed(*workers)
        refused = admitted = 0
        for _ in range(20):
            await a1.reset()
            assert await admits(a2)
            await fail(a1, 5)
            refused += not await admits(a2)
            admitted += await admits(b)
        assert (refused, admitted) == (20, 20)
        for w in workers:
            await w.aclose()

    run(main())
