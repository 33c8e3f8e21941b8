"""The eviction tests' breaker and workers (tests/storage/test_eviction.py), and the scenario
of a breaker of the same name on another database, which tests/storage/test_failover.py runs
on a Sentinel-managed master too."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from breaker_redis import BreakerConfig, Breakers
from breaker_redis.asyncio import Breakers as AsyncBreakers
from breaker_redis.urls import client_from_url
from tests.support.redis_server import wait_until
from tests.support.workers import admits, admitted, fail

CONFIG = BreakerConfig(trip="consecutive", failure_threshold=5, open_seconds=30)
T = TypeVar("T")
STATE = "breaker:{pay}:state"


def subscribed(breakers: Breakers) -> Breakers:
    breakers.get("pay", CONFIG).acquire().ignore()  # first use: connects and subscribes
    wait_until(
        lambda: breakers.invalidator is not None and breakers.invalidator.healthy,
        timeout=10,
        what="the event subscription",
    )
    return breakers


class SyncWorker:
    """A worker with its event subscription, asking for one breaker ('pay')."""

    def __init__(self, url: str, clock: Any) -> None:
        self.breakers = subscribed(Breakers.from_url(url, clock=clock))

    def admits(self) -> bool:
        return admits(self.breakers.get("pay", CONFIG))

    def close(self) -> None:
        self.breakers.close()


class AsyncWorker:
    """The same on asyncio: an event loop of its own, run by the test's thread for each call."""

    def __init__(self, url: str, clock: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.breakers = AsyncBreakers.from_url(url, clock=clock)
        self.pay = self.breakers.get("pay", CONFIG)
        self._run(self._subscribe())

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(work, 10))

    async def _subscribe(self) -> None:
        await admitted(self.pay)
        while self.breakers.invalidator is None or not self.breakers.invalidator.healthy:
            await asyncio.sleep(0.005)

    def admits(self) -> bool:
        async def settled() -> bool:  # what was published before is delivered first
            while self.breakers.invalidator is not None and self.breakers.invalidator.pending():
                await asyncio.sleep(0.001)
            return await admitted(self.pay)

        return self._run(settled())

    def close(self) -> None:
        self._run(self.breakers.aclose())
        self.loop.close()


def never_restores_another_databases_breaker(ours: str, theirs: str, clock: Any, side: str = "sync") -> None:
    """Pub/sub ignores the database (SELECT): the app on one database hears every message
    of the app on another, whose breaker has the same name. Their trip, of an incarnation
    later than the one ours last heard of from Redis, makes ours neither refuse nor, once
    our keys are lost, restore their open state: the message names its database, and a
    worker drops those naming another (Breakers._on_event). ``ours``, ``theirs``: URLs of
    two databases of one server, empty."""
    admin, their_admin = client_from_url(ours), client_from_url(theirs)
    worker = (SyncWorker if side == "sync" else AsyncWorker)(ours, clock)
    other = Breakers.from_url(theirs, listen=False, clock=clock)
    try:
        born = int(admin.hget(STATE, "born"))
        clock.advance(1000)
        fail(other.get("pay", CONFIG), 5)  # their 'pay', created after ours, trips
        assert int(their_admin.hget(STATE, "born")) > born
        admin.delete(STATE, "breaker:{pay}:events")  # ours is lost before our next call
        clock.advance(1000)
        for _ in range(3):
            assert worker.admits()
        assert (admin.hget(STATE, "state"), admin.hget(STATE, "forced")) == (b"closed", b"")
        assert not admits(other.get("pay", CONFIG))  # theirs is open
    finally:
        worker.close()
        other.close()
        admin.close()
        their_admin.close()
