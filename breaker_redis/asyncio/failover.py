"""Follows Sentinel's ``+switch-master`` in an asyncio worker (see breaker_redis/storage/failover.py).

The same reasons and the same steps as the sync side's thread, as a task of
the worker's event loop: one sentinel's ``+switch-master`` channel (the next
sentinel when that one fails); on a switch of our service the pool asks the
sentinels for the master now, so the next command of every task goes to the
new master, and the event subscription is left and taken again there
(``AsyncInvalidator.resubscribe``); until then workers ask Redis at every call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import redis.asyncio.sentinel

from breaker_redis.base.background import LoopTask
from breaker_redis.storage.failover import CHANNEL, RETRY_SECONDS, Follower
from breaker_redis.storage.scripts import text


class AsyncSentinelFollower(Follower):
    """One task per event loop, started at the first call (after any fork)."""

    pool_class = redis.asyncio.sentinel.SentinelConnectionPool

    def __init__(self, pool: Any, on_switch: Callable[[], None]) -> None:
        super().__init__(pool, on_switch)
        self.task = LoopTask(self._follow)

    def ensure_running(self) -> None:
        self.task.start()

    def reset(self) -> None:
        """A new event loop or process: the old task went with the old loop."""
        self.task.forget()

    async def close(self) -> None:
        await self.task.stop()

    async def _follow(self) -> None:
        turn = 0
        while True:
            sentinel = self.sentinel(turn)
            pubsub = sentinel.pubsub()
            try:
                await pubsub.subscribe(CHANNEL)
                while True:
                    message = await pubsub.get_message(timeout=RETRY_SECONDS)
                    if message is not None and text(message.get("type")) == "message":
                        await self.switched(sentinel, text(message.get("data")))
            except asyncio.CancelledError:
                raise
            except Exception:  # that sentinel is gone: listen to the next one
                turn += 1
                await asyncio.sleep(RETRY_SECONDS)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def switched(self, sentinel: Any, data: str) -> None:
        if not self.announced(sentinel, data):
            return
        with contextlib.suppress(Exception):  # the pool learns the new address (see failover.py)
            await self._pool.get_master_address()
        self._on_switch()
