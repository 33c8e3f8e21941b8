"""Follows Sentinel's ``+switch-master`` in an asyncio worker (see breaker_redis/storage/failover.py).

The same reasons and the same steps as the sync side's thread, written once
there (``Follower._following``) and awaited here, in a task of the worker's
event loop: one sentinel's ``+switch-master`` channel (the next sentinel
when that one fails); on a switch of our service the pool asks the
sentinels for the master now, so the next command of every task goes to the
new master, and the event subscription is left and taken again there
(``AsyncInvalidator.resubscribe``); until then workers ask Redis at every call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import redis.asyncio.sentinel

from breaker_redis.base.background import LoopTask
from breaker_redis.base.blocking import awaited
from breaker_redis.storage.failover import RETRY_SECONDS, Follower


class AsyncSentinelFollower(Follower):
    """One task per event loop, started at the first call (after any fork)."""

    pool_class = redis.asyncio.sentinel.SentinelConnectionPool
    _io = staticmethod(awaited)

    def __init__(self, pool: Any, on_switch: Callable[[], None]) -> None:
        super().__init__(pool, on_switch)
        self.task = LoopTask(self._following)

    def ensure_running(self) -> None:
        self.task.start()

    def reset(self) -> None:
        """A new event loop or process: the old task went with the old loop."""
        self.task.forget()

    async def close(self) -> None:
        await self.task.stop()

    # -- the I/O, awaited -------------------------------------------------------------

    async def _paused(self) -> None:
        await asyncio.sleep(RETRY_SECONDS)

    async def _close(self, pubsub: Any) -> None:
        await pubsub.aclose()
