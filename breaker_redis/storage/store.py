"""Where scripts run: Redis while it answers, an in-process store when not.

The store-health gate is what keeps a Redis outage from becoming an outage of
the app: after the first failed command it stops sending commands to Redis at
all (no call waits on a dead or hung server), answers from the fallback chosen
by ``on_store_error``, and lets a background thread re-probe Redis with
backoff. Changes are logged once each, never once per call.

The ``local`` fallback runs the very same Lua scripts on an embedded fakeredis
server, so a worker keeps a full breaker of the same config while Redis is
away; its state is per process and is dropped when Redis is back.

"Back" means Redis runs a script that writes, not merely that it answers
PING: a server out of memory, a replica left read-only after a failover or
one busy with a long script answers PING but refuses the breaker's scripts.
A Redis that comes back only briefly (it failed again within
``STEADY_SECONDS``) finds the same local store and the same probe backoff as
before, so a flapping server neither resets the local breakers nor turns
into a warning per switch: after the first round trip, one line per change
of health, at most one a minute while it flaps.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis

from breaker_redis.base.background import BackgroundThread
from breaker_redis.base.blocking import run_sync
from breaker_redis.storage import acl
from breaker_redis.storage.scripts import ScriptRunner, Scripts

log = logging.getLogger("breaker_redis")

POLICIES = ("local", "allow", "deny")

# Errors that say "the store cannot run the scripts now": connection refused
# or reset, timeouts, a replica that cannot write, a server still loading, out
# of memory or busy with a script, a cluster in trouble, and any other error
# reply a script gets (after the WRONGTYPE repair below). Whatever Redis
# answers, the caller gets a decision from the fallback, never the error.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    redis.exceptions.RedisError,
    redis.exceptions.RedisClusterException,  # not a RedisError: "Cluster down", no slot map
    OSError,
)


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"on_store_error must be one of {', '.join(POLICIES)} (got {policy!r})")
    return policy


class StoreUnavailable(Exception):
    """Redis is down and the policy is ``allow`` or ``deny``: nothing ran."""


STEADY_SECONDS = 60.0  # Redis healthy this long: the next outage starts afresh
# Each gate's generation is taken from one counter per process: on a cluster, a
# breaker whose slot moved to another master's gate never finds the number it knew.
_GENERATIONS = itertools.count()


class GateHealth:
    """What both store gates (StoreGate here, AsyncStoreGate in breaker_redis/asyncio/store.py)
    share, all but sending and waiting: what they keep about Redis's health (down or up
    since when, the probe backoff, the returns that did not last) and the log line of each
    change, the fallback's decisions, the local store, and the two sequences (a script
    call, the probe loop) written once over each side's I/O. ``_lock`` guards it: a
    threading.Lock on the sync side, a null context on an event loop, which runs it all."""

    _local: ScriptRunner | None

    def __init__(
        self,
        remote: Scripts,
        policy: str = "local",
        *,
        min_backoff: float = 0.25,
        max_backoff: float = 2.0,
        on_switch: Callable[[], None] | None = None,
        per_master: bool = False,
    ) -> None:
        self.remote = remote
        self.policy = check_policy(policy)
        self.generation = next(_GENERATIONS)
        # On Redis Cluster (masters.MasterGates) the probe runs the health script in the slot of
        # the breaker whose call failed, so it reaches that breaker's master, after
        # reading the slot map again (a failover may have moved the slot).
        self.per_master = per_master
        self.probe_name = "health"
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._on_switch = on_switch
        self._down_since: float | None = None
        self._up_since: float | None = None  # when Redis last came back
        self._delay = min_backoff  # the probe backoff, kept while Redis flaps
        self._flaps = 0  # switches back to Redis that did not last STEADY_SECONDS
        self._last_flap_log = -1e18
        self._local = None
        self.problem: str | None = None  # a permission Redis refuses, while it does (acl.explain)
        what = f"the breakers' scripts (on_store_error={policy} until granted)"
        self._permission = acl.PermissionLog(remote.client, remote.prefix, what)
        self._lock: Any = threading.Lock()
        self._started()

    def _started(self) -> None:
        """The side's own state: how it probes Redis while it is down."""

    def _start_probing(self) -> None:
        """Redis went down: re-probe it in the background (under _lock)."""

    def _failed_remote(self, exc: BaseException, name: str, generation: int, fallback: bool) -> None:
        """A script call on Redis failed with exc (one of UNAVAILABLE): Redis is down.
        StoreUnavailable unless the call may fall back (see StoreGate.run)."""
        if self.per_master:
            self.probe_name = name
        self._mark_down(exc, generation)
        if not fallback:
            raise StoreUnavailable(self.policy) from exc

    # -- the sequences, written once (engine/steps.py's way; the I/O below is each side's) --

    async def running(
        self, operation: str, name: str, now_ms: int | None, args: Sequence[Any], *, fallback: bool = True
    ) -> tuple[Any, int]:
        """(reply, generation) of the store that ran it: the step a breaker awaits
        (engine/steps.py); each side's ``run`` is it, for its other callers.

        StoreUnavailable when Redis is down and the policy is allow or deny, or
        when ``fallback`` is False: a result admitted by Redis is not replayed
        on the local store, whose epochs mean something else.
        """
        if self._down_since is None:
            generation = self.generation
            try:
                return await self._remote_run(operation, name, now_ms, args), generation
            except UNAVAILABLE as exc:
                self._failed_remote(exc, name, generation, fallback)
        return self.run_local(operation, name, now_ms, args)

    async def _probe_loop(self) -> None:
        """While Redis is down: probe it after each backoff until it is back (or the side
        stops probing: a closed process)."""
        while await self._paused():
            with self._probing():
                await self._probe()
            if self.healthy:
                return

    async def _remote_run(self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]) -> Any:
        """The reply of a script run on Redis (Scripts.run_repairing)."""
        raise NotImplementedError

    async def _probe(self) -> None:
        """Raises unless Redis runs a script that writes and calls every command the
        breakers' scripts call (lua/health.lua; see the module's docstring)."""
        raise NotImplementedError

    async def _paused(self) -> bool:
        """After the probe backoff (``_delay``); False when probing stops."""
        raise NotImplementedError

    def run_local(
        self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]
    ) -> tuple[Any, int]:
        """The fallback's answer while Redis is down: the local store's (CPU only, never
        I/O, so the asyncio gate calls it from its loop too); StoreUnavailable for allow
        and deny."""
        if self.policy != "local":
            raise StoreUnavailable(self.policy)
        with self._lock:
            if self._local is None:
                import fakeredis  # imported only when a process first needs it

                client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
                # the embedded store keeps EVALSHA
                self._local = ScriptRunner(client, self.remote.prefix, self.remote.ttl_ms, functions=False)
            local, generation = self._local, self.generation
        return local.run(operation, name, now_ms, args), generation

    def _mark_down(self, exc: BaseException, seen_generation: int) -> None:
        with self._lock:
            if not self._went_down(exc, seen_generation):
                return
            self._start_probing()
        if self._on_switch:
            self._on_switch()

    @contextlib.contextmanager
    def _probing(self) -> Iterator[None]:
        """Around one probe of Redis (each side's ``_probe``): a failure, whatever it is,
        grows the backoff; a success is the switch back to Redis."""
        try:
            yield
        except Exception as exc:
            self._probe_failed(exc)
            return
        with self._lock:
            self._came_back()
        if self._on_switch:
            self._on_switch()

    def _new_process(self) -> None:
        """A forked child, or (asyncio) a new event loop: no local store of its own yet,
        and its own probe if Redis is down."""
        self._local = None
        if self._down_since is not None:
            self._start_probing()

    @property
    def healthy(self) -> bool:
        return self._down_since is None

    @property
    def kind(self) -> str:
        return "redis" if self.healthy else self.policy

    def live(self, generation: int) -> bool:
        """Whether what was admitted or counted under generation may still be sent
        (to the store it came from)."""
        return generation == self.generation

    def shared(self, generation: int) -> bool:
        """Whether generation is Redis's, in use now: its replies are shared state."""
        return generation == self.generation and self._down_since is None

    def _went_down(self, exc: BaseException, seen_generation: int) -> bool:
        """Mark Redis down after exc; False if that was already done (or it came
        back) since seen_generation. A fresh outage gets a fresh local store and
        backoff; a return that did not last keeps both."""
        if self._down_since is not None or self.generation != seen_generation:
            return False
        now = time.monotonic()
        flapping = self._up_since is not None and now - self._up_since < STEADY_SECONDS
        self._down_since = now
        self.generation = next(_GENERATIONS)
        self._noted_permission(exc)
        if not flapping:
            self._local, self._delay, self._flaps = None, self._min_backoff, 0
            if self.problem is not None:
                return True  # said once as an error (_noted_permission), not as an outage
            log.warning(
                "Redis unavailable (%s: %s); on_store_error=%s until it runs a script again",
                type(exc).__name__,
                exc,
                self.policy,
            )
        else:
            self._flaps += 1
            if now - self._last_flap_log >= STEADY_SECONDS:
                self._last_flap_log = now
                log.warning(
                    "Redis failed again (%s: %s) %.1fs after it came back; keeping "
                    "on_store_error=%s and its local state (%d such returns; this is logged once "
                    "a minute while it lasts)",
                    type(exc).__name__,
                    exc,
                    now - (self._up_since or now),
                    self.policy,
                    self._flaps,
                )
        return True

    def _noted_permission(self, exc: BaseException) -> None:
        """A permission Redis refuses is a configuration error, not an outage: say
        which one and the ACL line that grants it, once per process and permission."""
        self.problem = self._permission.note(exc)

    def _probe_failed(self, exc: BaseException) -> None:
        self._delay = min(self._delay * 2, self._max_backoff)
        self._noted_permission(exc)

    def _came_back(self) -> None:
        now = time.monotonic()
        down_for = now - (self._down_since or now)
        # Said, and the problem cleared, before ``healthy`` turns true: whoever sees the
        # gate healthy (the dashboard, doctor, a test) finds the line logged and no problem.
        if not self._flaps:
            log.warning("Redis answers again after %.1fs; back to shared state", down_for)
        self.problem = None
        self._down_since = None
        self._up_since = now
        self.generation = next(_GENERATIONS)


class StoreGate(GateHealth):
    """Runs a script on Redis, or on the fallback while Redis is unavailable.

    ``generation`` changes each time the gate switches store, so that what a
    worker learned from one store is never trusted for the other.
    """

    remote: ScriptRunner

    def _started(self) -> None:
        self.thread = BackgroundThread(self._prober, "breaker-redis-probe")  # while Redis is down

    def _start_probing(self) -> None:
        self.thread.start()

    def _prober(self) -> None:
        run_sync(self._probe_loop())

    def run(
        self, operation: str, name: str, now_ms: int | None, args: Sequence[Any], *, fallback: bool = True
    ) -> tuple[Any, int]:
        """GateHealth.running, run to its end."""
        return run_sync(self.running(operation, name, now_ms, args, fallback=fallback))

    def run_remote(self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]) -> Any:
        """Admin operations go to Redis only: a force must not land in one process."""
        return self.remote.run_repairing(operation, name, now_ms, args)

    # -- the I/O, blocking ('async' in form only: base/blocking.py) ----------------------

    async def _remote_run(self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]) -> Any:
        return self.remote.run_repairing(operation, name, now_ms, args)

    async def _probe(self) -> None:
        if self.per_master and self.remote.slots is not None:  # the map read again first
            self.remote.slots.cluster().nodes_manager.initialize()
        self.remote.run("health", self.probe_name, None, ())

    async def _paused(self) -> bool:
        return not self.thread.wait(self._delay)

    def after_fork(self) -> None:
        """A child process starts with no thread and no local store of its own."""
        self._lock = threading.Lock()
        self.thread.after_fork()
        self._new_process()
