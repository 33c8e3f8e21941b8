"""close() and aclose() end every background wait at once (breaker_redis/base/background.py).

What close() joins (the event listener, the recorder, the store prober, the Sentinel
follower; on asyncio their tasks) is woken from whatever it waits on: a subscription's
socket, an in-process connection, a backoff, a batch's delay. None is sat out.

Each test makes the wait long (LONG seconds, through the module interval or the gate
backoff that sets it), puts the thread or task in it, and asserts that close() returns
in well under that with everything ended. No test times milliseconds: a busy machine
stalls for a second now and then, never for PROMPT seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import fakeredis
import pytest

import breaker_redis.asyncio.breakers as async_breakers
from breaker_redis import Breakers
from breaker_redis.asyncio import Breakers as AsyncBreakers
from breaker_redis.base.background import cancelled
from breaker_redis.engine import recorder
from breaker_redis.storage import acks, failover, invalidation
from breaker_redis.storage.invalidation import Link
from breaker_redis.storage.sharded import ShardedInvalidator
from breaker_redis.urls import async_client_from_url, client_from_url
from tests.support.redis_server import free_port, wait_until
from tests.support.topologies import SentinelGroup, started
from tests.support.workers import subscribed

LONG = 30.0  # each wait that close() could sit through lasts this long here
PROMPT = 5.0  # close() must return in less: it takes milliseconds


class Store:
    """One store, and clients on it: sync and asyncio."""

    def __init__(self, kind: str, make: Callable[[], Any], make_async: Callable[[], Any]) -> None:
        self.kind = kind
        self.client = make
        self.async_client = make_async


@pytest.fixture(params=["fake", "embedded", "real", "cluster"])
def store(request: pytest.FixtureRequest) -> Store:
    return make_store(request.param, request)


def make_store(kind: str, request: pytest.FixtureRequest) -> Store:
    """fakeredis in process, the embedded server, the session's redis-server or its Redis
    Cluster, emptied."""
    if kind == "fake":
        server = fakeredis.FakeServer()
        return Store(
            kind, lambda: fakeredis.FakeRedis(server=server), lambda: fakeredis.FakeAsyncRedis(server=server)
        )
    if kind == "cluster":
        group = request.getfixturevalue("cluster")
        group.flushall()
        url = group.url
    else:
        url = request.getfixturevalue("embedded" if kind == "embedded" else "redis_server").url
        client_from_url(url).flushall()
    return Store(kind, lambda: client_from_url(url), lambda: async_client_from_url(url))


@pytest.fixture
def long_waits(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Every listener waits LONG seconds on its subscriptions; the event is set when one
    starts such a wait (a thread in it now or in a moment: either way close() must end it).
    Pings for the subscriptions' leases are as far apart."""
    monkeypatch.setattr(invalidation, "WAIT_SECONDS", LONG)
    monkeypatch.setattr(acks, "PING_SECONDS", LONG)  # the lease's PINGs would end the wait sooner
    waiting = threading.Event()
    attach = Link.attach

    def spied_attach(link: Link) -> None:
        attach(link)
        readable = link.readable

        def spied(timeout: float) -> Any:
            if timeout >= LONG - 1:  # (the next PING due a moment sooner)
                waiting.set()
            return readable(timeout)

        link.readable = spied

    sharded_wait = ShardedInvalidator._wait

    def spied_wait(self: ShardedInvalidator) -> None:
        waiting.set()
        sharded_wait(self)

    monkeypatch.setattr(Link, "attach", spied_attach)
    monkeypatch.setattr(ShardedInvalidator, "_wait", spied_wait)
    return waiting


def closed_promptly(breakers: Breakers) -> None:
    """close() returns in well under LONG, every background thread ended (not left
    running past background.STOP_SECONDS)."""
    threads = breakers.threads()
    started = time.monotonic()
    breakers.close()
    took = time.monotonic() - started
    assert [t.name for t in threads if t.running] == []
    assert took < PROMPT, f"close() took {took:.1f}s"


def unreachable(down: str, asyncio_side: bool = False) -> Any:
    """A client of a Redis that does not answer: an in-process fakeredis marked down, or a
    URL's client of a port nobody serves."""
    if down == "fake":
        server = fakeredis.FakeServer()
        server.connected = False
        return (fakeredis.FakeAsyncRedis if asyncio_side else fakeredis.FakeRedis)(server=server)
    url = f"redis://127.0.0.1:{free_port()}/0"
    return async_client_from_url(url) if asyncio_side else client_from_url(url)


def successes(store: Store, name: str = "pay") -> int:
    client = store.client()
    try:
        return int(client.hget(f"breaker:{{{name}}}:stats", "successes") or 0)
    finally:
        client.close()


# -- the sync side ---------------------------------------------------------------------------


def test_close_wakes_the_listener_waiting_on_its_subscription(store, long_waits):
    """On fakeredis in process the listener's wait could not be interrupted: close()
    sat out its poll (a second; LONG here)."""
    breakers = Breakers(store.client())
    breakers.get("pay").call(lambda: None)
    subscribed([breakers])
    assert long_waits.wait(PROMPT)
    closed_promptly(breakers)


@pytest.mark.parametrize("kind", ["fake", "embedded", "real"])
def test_close_right_after_a_master_switch_wakes_the_listener(kind, request, long_waits):
    """Sentinel named another master (failover.py): the subscription is left while the
    listener waits on it. close() then found no subscription to interrupt and the
    listener sat out its wait on the old one."""
    breakers = Breakers(make_store(kind, request).client())
    breakers.get("pay").call(lambda: None)
    subscribed([breakers])
    assert long_waits.wait(PROMPT)
    assert isinstance(breakers.invalidator, invalidation.Invalidator)
    breakers.invalidator.resubscribe()
    closed_promptly(breakers)


@pytest.mark.parametrize("kind", ["fake", "embedded", "real"])
def test_a_master_switch_wakes_the_listener_to_subscribe_again(kind, request, long_waits):
    """The listener leaves the old subscription and subscribes again at once, not when
    its wait on the old one ends."""
    breakers = Breakers(make_store(kind, request).client())
    try:
        breakers.get("pay").call(lambda: None)
        subscribed([breakers])
        assert long_waits.wait(PROMPT)
        invalidator = breakers.invalidator
        assert isinstance(invalidator, invalidation.Invalidator)
        invalidator.resubscribe()
        assert not invalidator.healthy
        wait_until(lambda: invalidator.healthy, timeout=PROMPT, what="the subscription again")
    finally:
        breakers.close()


class Quiet:
    """A link's owner that is told nothing here."""

    def handle(self, link: Link, message: dict[str, Any]) -> None:
        raise AssertionError(message)

    def refused(self, link: Link, exc: BaseException) -> bool:
        return False

    def reconnected(self, link: Link) -> None:
        pass

    def lost(self, link: Link, exc: BaseException | None) -> None:
        link.close()


@pytest.mark.parametrize("kind", ["fake", "real"])
def test_an_interrupted_subscription_answers_at_once(kind, request):
    """A listener that looked readable() up just as close() interrupted the link calls
    what replaced it: that answers at once (it slept the whole timeout)."""
    pubsub = make_store(kind, request).client().pubsub()
    link = Link(pubsub, Quiet(), threading.Lock())
    with link.lock:
        pubsub.subscribe("close-test")
        link.attach()
    link.interrupt()
    started = time.monotonic()
    assert not link.readable(LONG)
    assert time.monotonic() - started < PROMPT
    link.close()


def test_close_sends_the_batch_the_recorder_is_holding(store, monkeypatch):
    """The recorder waits BATCH_SECONDS (LONG here) for successes to share a record call:
    close() ends that wait, and the batch reaches Redis before it returns."""
    monkeypatch.setattr(recorder, "BATCH_SECONDS", LONG)
    breakers = Breakers(store.client())
    pay = breakers.get("pay")
    for _ in range(20):
        pay.call(lambda: None)
    wait_until(lambda: breakers.recorder.thread.running, timeout=PROMPT, what="the recorder thread")
    closed_promptly(breakers)
    assert successes(store) == 20


@pytest.mark.parametrize("down", ["fake", "no server"])
def test_close_wakes_the_store_prober_from_its_backoff(down):
    """Redis is down: the gate's prober waits its backoff (LONG here) between probes."""
    breakers = Breakers(unreachable(down), listen=False)
    gate = breakers.gate
    gate._min_backoff = gate._max_backoff = LONG  # type: ignore[union-attr]
    breakers.get("pay").call(lambda: None)  # fails on Redis: answered by the local store
    assert not breakers.store_healthy
    wait_until(lambda: gate.thread.running, timeout=PROMPT, what="the prober")  # type: ignore[union-attr]
    closed_promptly(breakers)


# -- the asyncio side --------------------------------------------------------------------------


def test_aclose_ends_every_task_and_sends_the_batch(store, monkeypatch):
    """The subscription's keeper (none on fakeredis in process: it cannot be listened
    to), the batch sender waiting BATCH_SECONDS (LONG here): cancelled at once."""
    monkeypatch.setattr(async_breakers, "BATCH_SECONDS", LONG)

    async def main() -> None:
        breakers = AsyncBreakers(store.async_client())
        pay = breakers.get("pay")
        for _ in range(20):
            await pay.call(lambda: None)
        if store.kind != "fake":
            await _subscribed(breakers)
        before = asyncio.all_tasks()
        started = time.monotonic()
        await breakers.aclose()
        took = time.monotonic() - started
        assert took < PROMPT, f"aclose() took {took:.1f}s"
        assert [t for t in before if t is not asyncio.current_task() and not t.done()] == []

    asyncio.run(main())
    assert successes(store) == 20


@pytest.mark.parametrize("down", ["fake", "no server"])
def test_aclose_ends_the_store_prober_in_its_backoff(down):
    async def main() -> None:
        breakers = AsyncBreakers(unreachable(down, asyncio_side=True), listen=False)
        gate = breakers.gate
        gate._min_backoff = gate._max_backoff = LONG  # type: ignore[union-attr]
        await breakers.get("pay").call(lambda: None)
        assert not breakers.store_healthy
        prober = gate._prober  # type: ignore[union-attr]
        assert prober is not None and not prober.done()
        started = time.monotonic()
        await breakers.aclose()
        assert time.monotonic() - started < PROMPT
        assert prober.done()

    asyncio.run(main())


def test_aclose_ends_the_cluster_keeper_woken_in_its_backoff(cluster):
    """The cluster's subscription keeper waits for a wake-up with a timeout while it
    backs off. asyncio.wait_for (before Python 3.12) returned the wake-up instead of
    the cancellation when both came together: the keeper went on, and aclose()
    waited for it for ever."""
    url = cluster.url

    async def main() -> None:
        breakers = AsyncBreakers(async_client_from_url(url))
        await breakers.get("pay").call(lambda: None)
        await _subscribed(breakers)
        keeper = breakers.invalidator
        assert keeper is not None

        async def refused() -> None:
            raise ConnectionError("no master answers")

        keeper._subscribe_wanted = refused  # type: ignore[method-assign]
        keeper.listener("another")  # a breaker to subscribe: the keeper tries, fails and backs off
        await asyncio.sleep(0.2)
        task = keeper._task
        assert task is not None and not task.done()
        keeper.listener("a third")  # wakes it, as aclose() cancels it
        started = time.monotonic()
        await asyncio.wait_for(breakers.aclose(), 2 * PROMPT)
        assert time.monotonic() - started < PROMPT
        assert task.done()

    asyncio.run(main())


def test_a_task_that_swallows_its_cancellation_is_waited_for_no_longer_than_the_timeout():
    """As a thread past STOP_SECONDS: aclose() returns, the task is left to end alone."""

    async def main() -> None:
        going = True

        async def stubborn() -> None:
            while going:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0.01)

        task = asyncio.get_running_loop().create_task(stubborn())
        await asyncio.sleep(0)
        assert await cancelled(task, timeout=0.2) is False
        assert not task.done()
        going = False
        assert await cancelled(task) is True

    asyncio.run(main())


# -- Sentinel --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sentinels() -> Iterator[SentinelGroup]:
    with started(SentinelGroup()) as group:
        yield group


@pytest.mark.processes
def test_close_wakes_the_sentinel_follower(sentinels, monkeypatch):
    """The follower waits RETRY_SECONDS (LONG here) on the sentinel's +switch-master."""
    monkeypatch.setattr(failover, "RETRY_SECONDS", LONG)
    breakers = Breakers.from_url(sentinels.url())
    breakers.get("pay").call(lambda: None)
    subscribed([breakers])
    follower = breakers.follower
    assert follower is not None
    wait_until(
        lambda: follower._pubsub is not None and follower._pubsub.subscribed,
        timeout=PROMPT,
        what="the follower's subscription",
    )
    closed_promptly(breakers)


@pytest.mark.processes
def test_aclose_ends_the_sentinel_follower(sentinels, monkeypatch):
    import breaker_redis.asyncio.failover as async_failover

    monkeypatch.setattr(async_failover, "RETRY_SECONDS", LONG)

    async def main() -> None:
        breakers = AsyncBreakers.from_url(sentinels.url())
        await breakers.get("pay").call(lambda: None)
        await _subscribed(breakers)
        follower = breakers.follower
        assert follower is not None
        task = follower.task._task
        assert task is not None and not task.done()
        await asyncio.sleep(0.2)
        started = time.monotonic()
        await breakers.aclose()
        assert time.monotonic() - started < PROMPT
        assert task.done()

    asyncio.run(main())


# -- helpers -----------------------------------------------------------------------------------


async def _subscribed(breakers: AsyncBreakers) -> None:
    breakers.ensure_loop()
    deadline = time.monotonic() + 10
    while breakers.invalidator is not None and not breakers.invalidator.healthy:
        assert time.monotonic() < deadline, "the subscription did not come up within 10 s"
        await asyncio.sleep(0.005)
