"""Where an asyncio worker's scripts run: Redis while it answers, an
in-process store when not (the asyncio side of breaker_redis/storage/store.py).

The same scripts, keys and SHA1s as the sync side, sent with redis-py's
asyncio client, so a sync worker and an async worker of one deployment share
one breaker. The rules are the sync gate's, and so is their code
(``Scripts``, ``GateHealth``, ``masters.MasterGates``): after the first failed
command no call waits on Redis again; the ``on_store_error`` policy answers
(``local`` runs the same scripts on an embedded server, in this process: CPU
only, never I/O, so it is called from the event loop directly); a task
re-probes Redis with backoff, and a change of health is logged once. The
gate's sequences (a script call, the probe loop) are GateHealth's, written
once in engine/steps.py's way: what is written here is their I/O, awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import redis

from breaker_redis.base.background import cancelled
from breaker_redis.base.blocking import awaited
from breaker_redis.storage.scripts import SWEEP_PICKS, Scripts, text
from breaker_redis.storage.store import GateHealth, StoreUnavailable

__all__ = ["AsyncScriptRunner", "AsyncStoreGate", "StoreUnavailable"]


class _ByCommand:
    """A node of redis.asyncio's cluster client (or the client) as AsyncScriptRunner.send
    sends to it: they take commands by name only (no evalsha())."""

    __slots__ = ("target",)

    def __init__(self, target: Any) -> None:
        self.target = target

    def evalsha(self, *args: Any) -> Any:
        return self.target.execute_command("EVALSHA", *args)

    def eval(self, *args: Any) -> Any:
        return self.target.execute_command("EVAL", *args)


class AsyncScriptRunner(Scripts):
    """The scripts on one asyncio client, run against one key prefix (see scripts.ScriptRunner)."""

    async def run(self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]) -> Any:
        heads, tail = self.prepared(operation, name, now_ms, args)
        if self.slots is None:
            return await self.send(self.client, heads, tail)
        # straight to the breaker's master (breaker_redis/storage/cluster.py)
        return await self.slots.acall(tail[1], lambda node: self.send(_ByCommand(node), heads, tail))

    async def send(self, target: Any, heads: tuple[str, ...], tail: list[Any]) -> Any:
        """One script call's steps on target (Scripts.steps), each awaited."""
        return await self.steps(awaited, target, heads, tail)

    async def run_repairing(self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]) -> Any:
        """run(), a breaker with a corrupted key reset and the call made again (Scripts.corrupted)."""
        try:
            return await self.run(operation, name, now_ms, args)
        except redis.exceptions.ResponseError as exc:
            if not self.corrupted(name, exc):
                raise
        await self.client.delete(*self.keys_to_drop(operation, name))
        return await self.run(operation, name, now_ms, args)

    async def register_name(self, name: str, now_ms: int | None = None) -> None:
        """scripts.ScriptRunner.register_name, awaited (on a cluster, no answer to the
        listing has the slot map read again: cluster.Slots.afollowing)."""
        async with self.slots.afollowing() if self.slots is not None else contextlib.nullcontext():
            await self.listing(name).execute()
        check, sweep = self.chores_due()
        if check:
            with contextlib.suppress(Exception):  # INFO refused (an ACL without it): no check
                self.check_memory_policy(await self.client.info("memory"))
        if sweep:
            await self.sweep(now_ms)

    async def sweep(self, now_ms: int | None = None) -> list[str]:
        picked = [text(name) for name in await self.client.srandmember(self.names_key, SWEEP_PICKS)]
        gone = [name for name in picked if await self.run("sweep", name, now_ms, ()) == 1]
        if gone:
            await self.client.srem(self.names_key, *gone)
        return gone


class AsyncStoreGate(GateHealth):
    """Runs a script on Redis, or on the fallback while Redis is unavailable.

    ``generation`` changes at each switch of store, as in store.StoreGate.
    """

    remote: AsyncScriptRunner

    def _started(self) -> None:
        self._lock = contextlib.nullcontext()  # one event loop runs all of it
        self._prober: asyncio.Task[None] | None = None

    def _start_probing(self) -> None:
        if self._prober is None or self._prober.done():
            self._prober = asyncio.get_running_loop().create_task(self._probe_loop())

    run = GateHealth.running  # the same sequence, awaited

    async def run_remote(self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]) -> Any:
        """Admin operations go to Redis only: a force must not land in one process."""
        return await self.remote.run_repairing(operation, name, now_ms, args)

    # -- the I/O, awaited -----------------------------------------------------------------

    _remote_run = run_remote

    async def _probe(self) -> None:
        if self.per_master and self.remote.slots is not None:  # the map read again first
            await self.remote.slots.cluster().nodes_manager.initialize()
        await self.remote.run("health", self.probe_name, None, ())

    async def _paused(self) -> bool:
        await asyncio.sleep(self._delay)
        return True

    def reset(self) -> None:
        """A new event loop (or a forked child): the old loop's prober is gone with it."""
        self._prober = None
        self._new_process()

    async def close(self) -> None:
        prober, self._prober = self._prober, None
        await cancelled(prober)
