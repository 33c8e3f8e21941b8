"""Where an asyncio worker's scripts run: Redis while it answers, an
in-process store when not (the asyncio twin of breaker_redis/storage/store.py).

The same scripts, keys and SHA1s as the sync side, sent with redis-py's
asyncio client, so a sync worker and an async worker of one deployment share
one breaker. The rules are the sync gate's: after the first failed command
no call waits on Redis again; the ``on_store_error`` policy answers (``local``
runs the same scripts on an embedded server, in this process: CPU only,
never I/O, so it is called from the event loop directly); a task re-probes
Redis with backoff, and a change of health is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import redis

from breaker_redis.storage.scripts import SWEEP_PICKS, Scripts, text
from breaker_redis.storage.store import (
    _UNAVAILABLE,
    GateHealth,
    MasterGates,
    StoreUnavailable,
    _make_local_runner,
)

log = logging.getLogger("breaker_redis")

__all__ = ["AsyncClusterStoreGate", "AsyncScriptRunner", "AsyncStoreGate", "StoreUnavailable"]


async def _evalsha(target: Any, sha: str, source: str, keys: list[str], argv: list[Any]) -> Any:
    """On a cluster: EVALSHA on the breaker's master (a ClusterNode) or through the
    cluster client (both take execute_command); EVAL on NOSCRIPT, as ScriptRunner.run."""
    try:
        return await target.execute_command("EVALSHA", sha, len(keys), *keys, *argv)
    except redis.exceptions.NoScriptError:
        return await target.execute_command("EVAL", source, len(keys), *keys, *argv)


class AsyncScriptRunner(Scripts):
    """The scripts on one asyncio client, run against one key prefix (see scripts.ScriptRunner)."""

    async def run(self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]) -> Any:
        sha, source, keys, argv = self.call(operation, name, now_ms, args)
        if self.slots is not None:  # straight to the breaker's master (breaker_redis/storage/cluster.py)
            return await self.slots.acall(keys[0], lambda target: _evalsha(target, sha, source, keys, argv))
        if self.use_functions:  # as ScriptRunner.run
            function = self.function_names[operation]
            for attempt in (1, 2):
                try:
                    return await self.client.fcall(function, len(keys), *keys, *argv)
                except redis.exceptions.ResponseError as exc:
                    if not self.fcall_failed(exc, attempt):
                        break
                try:
                    await self.client.function_load(self.library)
                except redis.exceptions.ResponseError as exc:
                    self.load_failed(exc)
        try:
            return await self.client.evalsha(sha, len(keys), *keys, *argv)
        except redis.exceptions.NoScriptError:
            return await self.client.eval(source, len(keys), *keys, *argv)  # as ScriptRunner.run

    async def run_repairing(self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]) -> Any:
        """run(), a key of the wrong type dropped and the call made again (as ScriptRunner.run_repairing)."""
        try:
            return await self.run(operation, name, now_ms, args)
        except redis.exceptions.ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            log.warning("breaker %r had a corrupted key (%s); its keys were reset", name, exc)
            await self.drop_keys(name, operation)
            return await self.run(operation, name, now_ms, args)

    async def drop_keys(self, name: str, operation: str = "acquire") -> None:
        await self.client.delete(*self.keys_to_drop(operation, name))

    async def register_name(self, name: str, now_ms: int | None = None) -> None:
        pipe = self.client.pipeline(transaction=False)  # as ScriptRunner.register_name
        pipe.sadd(self.names_key, name)
        pipe.persist(self.names_key)
        await pipe.execute()
        check, sweep = self.chores_due()
        if check:
            with contextlib.suppress(Exception):  # as ScriptRunner.register_name
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

    def __init__(
        self,
        remote: AsyncScriptRunner,
        policy: str = "local",
        *,
        min_backoff: float = 0.25,
        max_backoff: float = 2.0,
        on_switch: Callable[[], None] | None = None,
        per_master: bool = False,
    ) -> None:
        self.remote = remote
        self._init_health(policy, min_backoff, max_backoff, per_master)
        self._on_switch = on_switch
        self._prober: asyncio.Task[None] | None = None

    async def run(
        self, operation: str, name: str, now_ms: int | None, args: Sequence[Any], *, fallback: bool = True
    ) -> tuple[Any, int]:
        """(reply, generation) of the store that ran it; StoreUnavailable as in store.StoreGate.run."""
        if self._down_since is None:
            generation = self.generation
            try:
                return await self.remote.run_repairing(operation, name, now_ms, args), generation
            except _UNAVAILABLE as exc:
                if self.per_master:
                    self.probe_name = name
                self._mark_down(exc, generation)
                if not fallback:
                    raise StoreUnavailable(self.policy) from exc
        if self.policy != "local":
            raise StoreUnavailable(self.policy)
        if self._local is None:
            self._local = _make_local_runner(self.remote.prefix, self.remote.ttl_ms)
        return self._local.run(operation, name, now_ms, args), self.generation

    async def run_remote(self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]) -> Any:
        """Admin operations go to Redis only: a force must not land in one process."""
        return await self.remote.run_repairing(operation, name, now_ms, args)

    def _mark_down(self, exc: BaseException, seen_generation: int) -> None:
        if not self._went_down(exc, seen_generation):
            return
        if self._prober is None or self._prober.done():
            self._prober = asyncio.get_running_loop().create_task(self._probe_loop())
        if self._on_switch:
            self._on_switch()

    async def _probe(self) -> None:
        if self.per_master and self.remote.slots is not None:  # as StoreGate._probe
            await self.remote.slots.cluster().nodes_manager.initialize()
        await self.remote.run("health", self.probe_name, None, ())

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self._delay)
            try:
                await self._probe()
            except Exception as exc:
                self._probe_failed(exc)
                continue
            self._came_back()
            if self._on_switch:
                self._on_switch()
            return

    def reset(self) -> None:
        """A new event loop (or a forked child): the old loop's prober is gone with it."""
        self._prober = None
        self._local = None
        if self._down_since is not None:
            self._prober = asyncio.get_running_loop().create_task(self._probe_loop())

    async def close(self) -> None:
        prober, self._prober = self._prober, None
        if prober is not None and not prober.done():
            prober.cancel()
            with contextlib.suppress(BaseException):
                await prober


class AsyncClusterStoreGate(MasterGates[AsyncStoreGate]):
    """MasterGates of AsyncStoreGate (breaker_redis/storage/store.py): the asyncio side's."""

    def reset(self) -> None:
        for gate in self.gates():
            gate.reset()

    async def close(self) -> None:
        for gate in self.gates():
            await gate.close()
