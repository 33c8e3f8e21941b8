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
import functools
import os
import time
from collections.abc import Callable, Coroutine
from typing import Any, cast

from breaker_redis.asyncio.breaker import Breaker
from breaker_redis.asyncio.failover import AsyncSentinelFollower
from breaker_redis.asyncio.invalidation import AsyncInvalidator, can_listen
from breaker_redis.asyncio.sharded import AsyncChannel, AsyncShardedInvalidator
from breaker_redis.asyncio.store import AsyncClusterStoreGate, AsyncScriptRunner, AsyncStoreGate
from breaker_redis.engine.breakers import DEFAULT_TTL_SECONDS, Forgetting
from breaker_redis.engine.config import BreakerConfig, checked_changes
from breaker_redis.engine.knowledge import about_another_database
from breaker_redis.engine.recorder import BATCH_SECONDS
from breaker_redis.engine.reporters import reporter_or_default
from breaker_redis.engine.transitions import TransitionCallback, TransitionHooks
from breaker_redis.storage.cluster import notices_channel
from breaker_redis.storage.scripts import flat_pairs, text, validate_name


class Breakers(Forgetting):
    """The breakers of one app on one Redis, under one key prefix, for asyncio code.

    ``client`` is a ``redis.asyncio`` client (``from_url`` builds one with the
    sync side's sub-second timeouts and no retry loop). Use it from one event
    loop at a time; call ``await breakers.aclose()`` at shutdown (a lifespan
    handler) to send what is batched.
    """

    def __init__(
        self,
        client: Any,
        prefix: str = "breaker",
        *,
        on_store_error: str = "local",
        key_ttl_seconds: float = DEFAULT_TTL_SECONDS,
        defaults: BreakerConfig | None = None,
        clock: Callable[[], int] | None = None,
        listen: bool = True,
        batch_successes: bool | None = None,
        reporter: str | None = None,
    ) -> None:
        if not (isinstance(key_ttl_seconds, (int, float)) and key_ttl_seconds >= 1):
            raise ValueError(f"key_ttl_seconds must be >= 1 (got {key_ttl_seconds!r})")
        # who this process's outcomes come from (min_reporters, README "One sick host"): the host
        self.reporter = reporter_or_default(reporter)
        self.client = client
        self.prefix = prefix
        self.defaults = defaults or BreakerConfig()
        self._clock = clock
        self.batch_successes = clock is None if batch_successes is None else batch_successes
        self._clock_offset_ms = 0.0
        self._runner = runner = AsyncScriptRunner(client, prefix, int(key_ttl_seconds * 1000))
        self._breakers: dict[str, Breaker] = {}
        self._hooks = TransitionHooks()
        # As on the sync side: one subscription, or on a cluster one per master; a
        # client whose connections this process cannot watch (an in-process fake)
        # gets none, and every call asks Redis.
        self.invalidator: AsyncInvalidator | AsyncShardedInvalidator | None = None
        self.follower: AsyncSentinelFollower | None = None
        self.gate: AsyncStoreGate | AsyncClusterStoreGate
        if runner.slots is None:
            self.gate = AsyncStoreGate(runner, on_store_error, on_switch=self._forget_all)
            if listen and can_listen(client):
                self.invalidator = AsyncInvalidator(client, runner.channel, self._on_event, self._forget_all)
                self.follower = AsyncSentinelFollower.for_client(client, self._master_moved)
        else:
            def master_gate(master: str) -> AsyncStoreGate:
                forget = functools.partial(self._forget_master, master)
                return AsyncStoreGate(runner, on_store_error, on_switch=forget, per_master=True)

            self.gate = AsyncClusterStoreGate(runner, on_store_error, master_gate)
            if listen:
                self.invalidator = AsyncShardedInvalidator(
                    client, runner.slots, prefix, runner.route_key, self._on_event, self._forget_names
                )
        self._due: dict[int, Breaker] = {}
        self._flusher: asyncio.Task[None] | None = None
        # sends started in the background: aclose waits for them before it closes
        # the client, or a send in flight fails on a connection closed under it
        self._sends: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.pid = os.getpid()

    @classmethod
    def from_url(cls, url: str, prefix: str = "breaker", **kwargs: Any) -> Breakers:
        """Breakers on an asyncio client with sub-second timeouts and no retry loop (see urls.py)."""
        from breaker_redis.urls import async_client_from_url

        return cls(async_client_from_url(url), prefix, **kwargs)

    def get(self, name: str, config: BreakerConfig | None = None) -> Breaker:
        """The breaker called name, created on first use (no I/O); another config for it is an error."""
        validate_name(name)
        if config is not None and not isinstance(config, BreakerConfig):
            raise TypeError(f"config must be a BreakerConfig (got {type(config).__name__})")
        breaker = self._breakers.get(name)
        if breaker is None:
            breaker = self._breakers[name] = Breaker(self, name, config or self.defaults)
        elif config is not None and config != breaker.config:
            raise ValueError(f"breaker {name!r} already exists with another config: {breaker.config}")
        return breaker

    def __contains__(self, name: object) -> bool:
        """Whether this process has built a breaker of that name."""
        return name in self._breakers

    def gate_for(self, name: str) -> AsyncStoreGate:
        """The store gate of a breaker: the process's, or on a cluster its master's."""
        gate = self.gate
        return gate if isinstance(gate, AsyncStoreGate) else cast(AsyncStoreGate, gate.for_name(name))

    def listener(self, name: str) -> AsyncInvalidator | AsyncChannel | None:
        """The subscription a breaker trusts (None when this process does not listen)."""
        return None if self.invalidator is None else self.invalidator.listener(name)

    @property
    def store_healthy(self) -> bool:
        return self.gate.healthy

    @property
    def channel(self) -> str:
        return self._runner.channel

    async def names(self) -> list[str]:
        """Every breaker name known to Redis under this prefix (from any worker, sync or async)."""
        return sorted(text(n) for n in await self.client.smembers(self._runner.names_key))

    async def configure(self, name: str, **overrides: Any) -> dict[str, str]:
        """Write live overrides for a breaker; None removes one. Validated first."""
        validate_name(name)
        self.ensure_loop()
        base = self._breakers[name].config if name in self._breakers else self.defaults
        as_text = checked_changes(base, overrides)
        args: list[str] = ["", "0"]
        for key, value in as_text.items():
            args += [key, value]
        await self.register_name(name)
        raw = await self.gate.run_remote("configure", name, self.clock_ms(), args)
        await self.barrier(name)
        return {key: text(value) for key, value in flat_pairs(raw).items()}

    # -- time ----------------------------------------------------------------

    def clock_ms(self) -> int | None:
        return None if self._clock is None else int(self._clock())

    def now_ms(self) -> int:
        if self._clock is not None:
            return int(self._clock())
        return int(time.monotonic() * 1000 + self._clock_offset_ms)

    def observe_clock(self, redis_now_ms: int) -> None:
        if self._clock is None:
            self._clock_offset_ms = redis_now_ms - time.monotonic() * 1000

    # -- the loop and the process ----------------------------------------------

    def ensure_loop(self) -> None:
        """Bind to the running loop at the first call; start afresh on another loop or in a child."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop or os.getpid() != self.pid:
            self._restart(loop)
        if self.invalidator is not None:
            self.invalidator.ensure_running()
        if self.follower is not None:
            self.follower.ensure_running()

    def _restart(self, loop: asyncio.AbstractEventLoop) -> None:
        forked = os.getpid() != self.pid
        if self._loop is not None or forked:
            _drop_connections(self.client)  # they belong to the old loop, or to the parent
        self._loop = loop
        self.pid = os.getpid()
        self._due, self._flusher, self._sends = {}, None, set()
        self.gate.reset()
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

    async def barrier(self, name: str) -> None:
        """One round trip after a reply that made a change (see Breakers.barrier on the sync
        side), on a cluster to the breaker's master."""
        with contextlib.suppress(Exception):
            slots = self._runner.slots
            if slots is None:
                await self.client.ping()
            else:
                await slots.abarrier(self._runner.route_key(name), notices_channel(self.prefix, name), name)

    def on_transition(self, callback: TransitionCallback) -> TransitionCallback:
        """Call ``callback(Transition)`` once per state change, in the process whose
        call made it (``t.operator`` for an operator's; see the sync side)."""
        return self._hooks.add(self._hooks.changes, callback, "on_transition")

    def on_operator_action(self, callback: TransitionCallback) -> TransitionCallback:
        """Call ``callback(Transition)`` for every operator action made in this
        process, whether it changed the state or not (see the sync side)."""
        return self._hooks.add(self._hooks.actions, callback, "on_operator_action")

    def transitioned(self, name: str, events: str, epoch: int, at_ms: int) -> None:
        self._hooks.report(name, events, epoch, at_ms)

    def _on_event(self, payload: dict[str, Any]) -> None:
        if about_another_database(payload, self._runner.database):
            return
        breaker = self._breakers.get(str(payload.get("name", "")))
        if breaker is not None and breaker.hint(payload):
            self._start_send(breaker.flush_batch())

    def _master_moved(self) -> None:
        """Sentinel named another master (failover.py): the subscription is taken again there."""
        if isinstance(self.invalidator, AsyncInvalidator):
            self.invalidator.resubscribe()
        else:
            self._forget_all()

    async def flush(self) -> None:
        """Send every breaker's batched successes and counts kept in memory now."""
        if self._loop is None:
            return
        self._due = {}
        for breaker in list(self._breakers.values()):
            if breaker.store_healthy:  # what was counted under Redis cannot be replayed elsewhere
                await breaker.flush_batch()

    async def aclose(self) -> None:
        """Send what is batched, stop this loop's tasks and close the client's connections."""
        loop = asyncio.get_running_loop()
        if self._loop is not None and (loop is not self._loop or os.getpid() != self.pid):
            self._restart(loop)  # what the old loop held went with it
        if self.invalidator is not None:
            await self.invalidator.close()  # no more notices, so no more sends they start
        if self.follower is not None:
            await self.follower.close()
        flusher, self._flusher = self._flusher, None
        if flusher is not None and not flusher.done():
            flusher.cancel()
            with contextlib.suppress(BaseException):
                await flusher
        if self._sends:  # sends in flight finish on open connections
            await asyncio.gather(*list(self._sends), return_exceptions=True)
        await self.flush()
        await self.gate.close()
        self._loop = None
        with contextlib.suppress(Exception):
            await self.client.aclose()


def _drop_connections(client: Any) -> None:
    """Forget a client's pooled connections without closing them: closing would
    need the loop that opened them (gone, or the parent's). A cluster client
    keeps a pool per node."""
    from breaker_redis.storage.internals import forget_node_connections

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

