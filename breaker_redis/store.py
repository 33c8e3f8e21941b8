"""Where scripts run: Redis while it answers, an in-process store when not.

The store-health gate is what keeps a Redis outage from becoming an outage of
the app: after the first failed command it stops sending commands to Redis at
all (no call waits on a dead or hung server), answers from the fallback chosen
by ``on_store_error``, and lets a background thread re-probe Redis with
backoff. Changes are logged once each, never once per call.

The ``local`` fallback runs the very same Lua scripts on an embedded fakeredis
server, so a worker keeps a full breaker of the same config while Redis is
away; its state is per process and is dropped when Redis is back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from .scripts import ScriptRunner

log = logging.getLogger("breaker_redis")

POLICIES = ("local", "allow", "deny")

# Errors that say "the store cannot answer now": connection refused or reset,
# timeouts, a replica that cannot write, a server still loading, OOM.
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.ClusterError,
    redis.exceptions.TryAgainError,
    redis.exceptions.MasterDownError,
    redis.exceptions.OutOfMemoryError,
    OSError,
)


class StoreUnavailable(Exception):
    """Redis is down and the policy is ``allow`` or ``deny``: nothing ran."""


def _make_local_runner(prefix: str, ttl_ms: int) -> ScriptRunner:
    import fakeredis  # imported only when a process first needs it

    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    return ScriptRunner(client, prefix, ttl_ms)


class StoreGate:
    """Runs a script on Redis, or on the fallback while Redis is unavailable.

    ``generation`` changes each time the gate switches store, so that what a
    worker learned from one store is never trusted for the other.
    """

    def __init__(
        self,
        remote: ScriptRunner,
        policy: str = "local",
        *,
        min_backoff: float = 0.25,
        max_backoff: float = 5.0,
        on_switch: Callable[[], None] | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"on_store_error must be one of {', '.join(POLICIES)} (got {policy!r})")
        self.remote = remote
        self.policy = policy
        self.generation = 0
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._on_switch = on_switch
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._local: ScriptRunner | None = None
        self._prober: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def healthy(self) -> bool:
        return self._down_since is None

    @property
    def kind(self) -> str:
        return "redis" if self.healthy else self.policy

    def run(
        self, operation: str, name: str, now_ms: int | None, args: Sequence[Any], *, fallback: bool = True
    ) -> tuple[Any, int]:
        """(reply, generation) of the store that ran it.

        StoreUnavailable when Redis is down and the policy is allow or deny, or
        when ``fallback`` is False: a result admitted by Redis is not replayed
        on the local store, whose epochs mean something else.
        """
        if self._down_since is None:
            generation = self.generation
            try:
                return self._run_remote_repairing(operation, name, now_ms, args), generation
            except _UNAVAILABLE as exc:
                self._mark_down(exc, generation)
                if not fallback:
                    raise StoreUnavailable(self.policy) from exc
        if self.policy != "local":
            raise StoreUnavailable(self.policy)
        with self._lock:
            if self._local is None:
                self._local = _make_local_runner(self.remote.prefix, self.remote.ttl_ms)
            local, generation = self._local, self.generation
        return local.run(operation, name, now_ms, args), generation

    def run_remote(self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]) -> Any:
        """Admin operations go to Redis only: a force must not land in one process."""
        return self._run_remote_repairing(operation, name, now_ms, args)

    def _run_remote_repairing(
        self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]
    ) -> Any:
        """A key of the wrong type (written by hand, or by another program) would
        fail every call for good; drop the breaker's keys, say so, and go on closed."""
        try:
            return self.remote.run(operation, name, now_ms, args)
        except redis.exceptions.ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            log.warning("breaker_redis: breaker %r had a corrupted key (%s); its keys were reset", name, exc)
            self.remote.drop_keys(name)
            return self.remote.run(operation, name, now_ms, args)

    def _mark_down(self, exc: BaseException, seen_generation: int) -> None:
        with self._lock:
            if self._down_since is not None or self.generation != seen_generation:
                return
            self._down_since = time.monotonic()
            self.generation += 1
            self._local = None
            log.warning(
                "breaker_redis: Redis unavailable (%s: %s); on_store_error=%s until it answers again",
                type(exc).__name__,
                exc,
                self.policy,
            )
            self._start_prober()
        if self._on_switch:
            self._on_switch()

    def _start_prober(self) -> None:
        if self._prober is not None and self._prober.is_alive():
            return
        self._prober = threading.Thread(target=self._probe_loop, name="breaker-redis-probe", daemon=True)
        self._prober.start()

    def _probe_loop(self) -> None:
        delay = self._min_backoff
        while not self._stop.wait(delay):
            try:
                self.remote.client.ping()
            except Exception:
                delay = min(delay * 2, self._max_backoff)
                continue
            with self._lock:
                down_for = time.monotonic() - (self._down_since or time.monotonic())
                self._down_since = None
                self.generation += 1
                self._local = None
            log.warning("breaker_redis: Redis answers again after %.1fs; back to shared state", down_for)
            if self._on_switch:
                self._on_switch()
            return

    def after_fork(self) -> None:
        """A child process starts with no thread and no local store of its own."""
        self._lock = threading.Lock()
        self._prober = None
        self._local = None
        if self._down_since is not None:
            self._start_prober()

    def close(self) -> None:
        self._stop.set()
