"""Breakers for asyncio: the breakers of one app on one Redis, and what they
share in one process: the store gate, the event subscription and the task
that sends batched successes (see breaker_redis/engine/breakers.py for the sync side).

Built without I/O, so a module can create it at import time, before gunicorn
forks its uvicorn workers: each worker binds it to its own event loop at its
first call. A process that moves to another loop (a forked child, tests that
run one loop per test) starts afresh there: the old loop's tasks and
connections cannot be used from a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Coroutine
from typing import Any

from breaker_redis.asyncio.breaker import Breaker
from breaker_redis.asyncio.failover import AsyncSentinelFollower
from breaker_redis.asyncio.invalidation import AsyncInvalidator, can_listen
from breaker_redis.asyncio.sharded import AsyncShardedInvalidator
from breaker_redis.asyncio.store import AsyncScriptRunner, AsyncStoreGate
from breaker_redis.base.background import cancelled
from breaker_redis.engine.breakers_core import BreakersCore, Parts, configured
from breaker_redis.engine.recorder import BATCH_SECONDS
from breaker_redis.storage import acks
from breaker_redis.storage.acks import acks_key, parse_ack
from breaker_redis.storage.cluster import notices_channel
from breaker_redis.storage.internals import forget_node_connections
from breaker_redis.storage.scripts import text

log = logging.getLogger("breaker_redis")


class Breakers(BreakersCore[Breaker, AsyncStoreGate, AsyncScriptRunner]):
    """The breakers of one app on one Redis, under one key prefix, for asyncio code.

    ``client`` is a ``redis.asyncio`` client (``from_url`` builds one with the
    sync side's sub-second timeouts and no retry loop). Use it from one event
    loop at a time; call ``await breakers.aclose()`` at shutdown (a lifespan
    handler) to send what is batched.
    """

    parts = Parts(
        runner=AsyncScriptRunner,
        breaker=Breaker,
        gate=AsyncStoreGate,
        invalidator=AsyncInvalidator,
        sharded=AsyncShardedInvalidator,
        follower=AsyncSentinelFollower,
    )
    invalidator: AsyncInvalidator | AsyncShardedInvalidator | None
    follower: AsyncSentinelFollower | None

    def _watch_server(self, listen: bool) -> None:
        # a client whose connections this process cannot watch (an in-process fake)
        # gets no subscription, nor a follower to take it again: every call asks Redis
        if listen and can_listen(self.client):
            super()._watch_server(listen)

    def _started(self) -> None:
        self._lock = contextlib.nullcontext()  # one event loop runs it
        self._due: dict[int, Breaker] = {}
        self._flusher: asyncio.Task[None] | None = None
        # sends started in the background: aclose waits for them before it closes
        # the client, or a send in flight fails on a connection closed under it
        self._sends: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_url(cls, url: str, prefix: str = "breaker", **kwargs: Any) -> Breakers:
        """Breakers on an asyncio client with sub-second timeouts and no retry loop (see urls.py)."""
        from breaker_redis.urls import async_client_from_url

        return cls(async_client_from_url(url), prefix, **kwargs)

    async def names(self) -> list[str]:
        """Every breaker name known to Redis under this prefix (from any worker, sync or async)."""
        return sorted(text(n) for n in await self.client.smembers(self._runner.names_key))

    async def configure(self, name: str, **overrides: Any) -> dict[str, str]:
        """Write live overrides for a breaker; None removes one. Validated first."""
        args = self._configure_args(name, overrides)
        self.ensure_loop()
        await self.register_name(name)
        overrides, ack = configured(await self.gate.run_remote("configure", name, self.clock_ms(), args))
        await self.barrier(name, ack)
        return overrides

    # -- the loop and the process ----------------------------------------------

    def ensure_loop(self) -> None:
        """Bind to the running loop at the first call; start afresh on another loop or in a child."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop or os.getpid() != self.pid:
            self._restart(loop)
        self.ensure_process()

    def _restart(self, loop: asyncio.AbstractEventLoop) -> None:
        forked = os.getpid() != self.pid
        if self._loop is not None or forked:
            _drop_connections(self.client)  # they belong to the old loop, or to the parent
        self._loop = loop
        self.pid = os.getpid()
        self._due, self._flusher, self._sends = {}, None, set()
        for gate in self._gates():
            gate.reset()
        if self.invalidator is not None:
            self.invalidator.reset()
        if self.follower is not None:
            self.follower.reset()
        for breaker in self._breakers.values():
            breaker.reset_process(forked=forked)
            if breaker.holds_counts:
                self.schedule(breaker)

    def schedule(self, breaker: Breaker) -> None:
        """A breaker has successes batched: send them within BATCH_SECONDS (see recorder.py)."""
        self._due[id(breaker)] = breaker
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        # successes batched while a pass was sending are due again: another pass
        while self._due:
            await asyncio.sleep(BATCH_SECONDS)
            # shielded: aclose cancels this task while it sleeps, never a send half done
            await asyncio.shield(self._start_send(self._flush_due()))

    def _start_send(self, send: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(send)
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)
        return task

    async def _flush_due(self) -> None:
        due, self._due = list(self._due.values()), {}
        for breaker in due:
            await breaker.flush_batch()

    async def register_name(self, name: str) -> None:
        with contextlib.suppress(Exception):  # listing is best effort; the gate notices outages
            await self._runner.register_name(name, self.clock_ms())

    async def barrier(self, name: str, ack: str = "") -> None:
        """As Breakers.barrier on the sync side: the event loop runs on while it waits."""
        slots = self._runner.slots
        if slots is not None:
            with contextlib.suppress(Exception):
                await slots.abarrier(self._runner.route_key(name), notices_channel(self.prefix, name), name)
        wanted = parse_ack(ack)
        if wanted is not None:
            await acks.await_acks(self.client, acks_key(self.prefix, name), *wanted)

    def _acknowledge(self, key: str, token: str) -> None:
        self._start_send(acks.aacknowledge(self.client, key, token))

    async def give_back_grant(self, name: str, upto: int) -> None:
        """As Breakers.give_back_grant on the sync side, awaited."""
        try:
            groups = await self.client.smembers(self._runner.groups_key)
            for group, now_ms, args in self._group_releases(groups, name, upto):
                await self.gate.run_remote("group", group, now_ms, args)
        except Exception as exc:  # an outage, a permission: the reclaim covers it
            log.warning("breaker %r gave its group grant back; a group could not be told (%s)", name, exc)

    def _send_batch(self, breaker: Breaker) -> None:
        self._start_send(breaker.flush_batch())

    async def flush(self) -> None:
        """Send every breaker's batched successes and counts kept in memory now."""
        if self._loop is None:
            return
        self._due = {}
        for breaker in list(self._breakers.values()):
            if breaker.store_healthy:  # what was counted under Redis cannot be replayed elsewhere
                await breaker.flush_batch()

    async def aclose(self) -> None:
        """Send what is batched, stop this loop's tasks and close the client's connections.
        Each task is cancelled, which ends its wait at once, and waited for (up to
        background.STOP_SECONDS, as the sync side's threads): when it returns no notice
        is being handled and no batch is being sent."""
        loop = asyncio.get_running_loop()
        if self._loop is not None and (loop is not self._loop or os.getpid() != self.pid):
            self._restart(loop)  # what the old loop held went with it
        if self.invalidator is not None:
            await self.invalidator.close()  # no more notices, so no more sends they start
        if self.follower is not None:
            await self.follower.close()
        flusher, self._flusher = self._flusher, None
        await cancelled(flusher)
        if self._sends:  # sends in flight finish on open connections
            await asyncio.gather(*list(self._sends), return_exceptions=True)
        await self.flush()
        for gate in self._gates():
            await gate.close()
        self._loop = None
        with contextlib.suppress(Exception):
            await self.client.aclose()


def _drop_connections(client: Any) -> None:
    """Forget a client's pooled connections without closing them: closing would
    need the loop that opened them (gone, or the parent's). A cluster client
    keeps a pool per node."""
    pools = [getattr(client, "connection_pool", None)]
    with contextlib.suppress(Exception):
        pools += [getattr(node, "connection_pool", None) for node in client.get_nodes()]
    for pool in pools:
        reset = getattr(pool, "reset", None)
        if callable(reset):
            reset()
    with contextlib.suppress(Exception):
        for node in client.get_nodes():  # redis.asyncio.cluster.ClusterNode: its own list
            forget_node_connections(node)
