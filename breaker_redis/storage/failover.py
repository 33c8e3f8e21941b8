"""Follows Sentinel's ``+switch-master``, so a worker leaves a demoted master at once.

redis-py asks the sentinels where the master is only when it opens a
connection. After a ``SENTINEL FAILOVER`` a worker would keep writing to the
old master over its pooled connections, and keep its event subscription
there, until Sentinel demotes it about 10 s after the switch: what it
counted meanwhile is lost when the old master resyncs from the new one, and
workers that happened to open a connection early are split from the others
for those seconds (measured in tests/system/test_sentinel_gunicorn.py).

So each process with a Sentinel-managed client subscribes to one sentinel's
``+switch-master`` channel (any other sentinel when that one fails). When
the message names our service, it moves that sentinel to the front of the
list redis-py asks (it already knows the new master; another may lag a
moment) and has the pool ask for the master now: redis-py then closes the
idle connections and closes each busy one when its thread releases it, so
the next command of every thread reaches the new master, and no socket is
closed under a thread reading it. The event subscription is left and taken
again on the new master (``Invalidator.resubscribe``); until then workers
ask Redis at every call.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import redis.sentinel

from breaker_redis.base.background import BackgroundThread
from breaker_redis.storage.internals import connection_socket, prefer_sentinel, sentinel_list
from breaker_redis.storage.invalidation import shut_down
from breaker_redis.storage.scripts import text

log = logging.getLogger("breaker_redis")

CHANNEL = "+switch-master"
RETRY_SECONDS = 1.0


F = TypeVar("F", bound="Follower")


class Follower:
    """What the two followers share: the pool, its service, the sentinels it asks, and
    what a ``+switch-master`` message means. ``SentinelFollower`` here listens in a
    thread, ``AsyncSentinelFollower`` (breaker_redis/asyncio/failover.py) in a task."""

    pool_class: ClassVar[type[Any]]  # the Sentinel-managed pool of the follower's side

    def __init__(self, pool: Any, on_switch: Callable[[], None]) -> None:
        self._pool = pool
        self._service = str(pool.service_name)
        self._sentinels = sentinel_list(pool)
        self._on_switch = on_switch

    @classmethod
    def for_client(cls: type[F], client: Any, on_switch: Callable[[], None]) -> F | None:
        """A follower when client's pool is Sentinel-managed, else None (not for a cluster client)."""
        pool = getattr(client, "connection_pool", None)
        return cls(pool, on_switch) if isinstance(pool, cls.pool_class) else None

    def sentinel(self, turn: int) -> Any:
        """The sentinel to listen to after ``turn`` failures: each in turn."""
        return self._sentinels[turn % len(self._sentinels)]

    def announced(self, sentinel: Any, data: str) -> bool:
        """Whether a ``+switch-master`` message (``<service> <old ip> <old port> <new ip>
        <new port>``) from ``sentinel`` is about our service; if so the sentinel that
        announced it is asked first from now on (it already knows the new master) and
        the switch is logged."""
        parts = data.split()
        if len(parts) != 5 or parts[0] != self._service:
            return False
        prefer_sentinel(self._sentinels, sentinel)
        log.warning("Sentinel moved master %r from %s:%s to %s:%s; reconnecting to the new master", *parts)
        return True


class SentinelFollower(Follower):
    """One thread per process, started at its first call (after any fork)."""

    pool_class = redis.sentinel.SentinelConnectionPool

    def __init__(self, pool: Any, on_switch: Callable[[], None]) -> None:
        super().__init__(pool, on_switch)
        self._pubsub: Any = None  # the subscription being read, shut down by close() to wake the thread
        self.thread = BackgroundThread(self._loop, "breaker-redis-sentinel", wake=self._interrupt)

    def ensure_running(self) -> None:
        self.thread.start()

    def after_fork(self) -> None:
        self.thread.after_fork()
        self._pubsub = None  # the parent's

    def _interrupt(self) -> None:
        pubsub = self._pubsub
        if pubsub is not None:
            shut_down(connection_socket(pubsub.connection))

    def _loop(self) -> None:
        thread = self.thread
        turn = 0
        while not thread.stopped():
            sentinel = self.sentinel(turn)
            pubsub = None
            try:
                pubsub = self._pubsub = sentinel.pubsub()
                pubsub.subscribe(CHANNEL)
                while not thread.stopped():
                    message = pubsub.get_message(timeout=RETRY_SECONDS)
                    if message is not None and text(message.get("type")) == "message":
                        self.switched(sentinel, text(message.get("data")))
            except Exception:  # that sentinel is gone (or close() woke us): listen to the next one
                turn += 1
                thread.wait(RETRY_SECONDS)
            finally:
                self._pubsub = None
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        pubsub.close()

    def switched(self, sentinel: Any, data: str) -> None:
        """``<service> <old ip> <old port> <new ip> <new port>`` from ``sentinel``."""
        if not self.announced(sentinel, data):
            return
        # Asks the sentinels now: the pool learns the new address and closes its
        # idle connections; one in use is closed when its thread releases it (the
        # pool no longer owns a connection to another address). Never closed
        # under a thread reading it.
        with contextlib.suppress(Exception):
            self._pool.get_master_address()
        self._on_switch()

