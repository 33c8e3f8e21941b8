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

from breaker_redis.storage.failover import CHANNEL, RETRY_SECONDS, announces_switch
from breaker_redis.storage.scripts import text


class AsyncSentinelFollower:
    """One task per event loop, started at the first call (after any fork)."""

    def __init__(self, pool: Any, on_switch: Callable[[], None]) -> None:
        self._pool = pool
        self._service = str(pool.service_name)
        self._sentinels: list[Any] = pool.sentinel_manager.sentinels
        self._on_switch = on_switch
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def for_client(cls, client: Any, on_switch: Callable[[], None]) -> AsyncSentinelFollower | None:
        """A follower when client's pool is Sentinel-managed, else None."""
        from redis.asyncio.sentinel import SentinelConnectionPool

        pool = getattr(client, "connection_pool", None)
        return cls(pool, on_switch) if isinstance(pool, SentinelConnectionPool) else None

    def ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._follow())

    def reset(self) -> None:
        """A new event loop or process: the old task went with the old loop."""
        self._task = None

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def _follow(self) -> None:
        turn = 0
        while True:
            sentinel = self._sentinels[turn % len(self._sentinels)]
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
        if not announces_switch(self._service, self._sentinels, sentinel, data):
            return
        with contextlib.suppress(Exception):  # the pool learns the new address (see failover.py)
            await self._pool.get_master_address()
        self._on_switch()
