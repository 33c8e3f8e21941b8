"""The breaker's calls to Redis, each written once for the sync Breaker and the asyncio one.

A step is the sequence around one script call: acquire from Redis, send the
outcomes and counts, learn a reply (the listing, the barrier, the transition
callbacks), snapshot, an operator's action, any other script. Each is an
``async def`` here, and its I/O goes through small methods each side
provides: ``_remote``, ``_register``, ``_barrier``, ``_give_back``, and the
store gate's ``running`` (storage/store.py: a script call, on Redis or the
fallback, is itself a sequence written once). The asyncio Breaker awaits
the steps, and its methods await redis-py's asyncio client. The sync
Breaker's are ``async`` in form only: they make the blocking call and
return, never suspending, so ``run_sync`` (base/blocking.py: the stores
write their sequences this way too) runs a whole step with one
``send(None)`` (a step that suspended there would be a bug, and run_sync
says so).

Why this and not the other ways: a base class with sync and async twins of
each sequence would keep the try/except around each script call, the counts
put back, the barrier after a change written twice, differing by ``await``;
generating the sync file from the async one (httpcore's unasync) adds a build
step and two files kept in step by a tool. Here each step is one piece of
code, typed and tested on both paths. The cost, a coroutine per step, falls
only on calls that go to Redis anyway: the healthy call, decided from memory
and batched, runs none of this (breaker.py and asyncio/breaker.py write it
out). The counts kept in memory are guarded by ``_lock``: a thread lock on
the sync side, a no-op on the asyncio one, where one event loop runs
everything and nothing between two awaits can interleave.

``BreakerSteps`` stands on core.py's ``BreakerCore`` and under both Breakers,
so a reader of either reads its own file, then these two. They stay two
modules along the seam of I/O (nothing in core.py waits, every step here
does): as one, they would be some 600 lines.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractContextManager
from typing import Any, Generic, Protocol, TypeVar

from breaker_redis.base.errors import BreakerOpen
from breaker_redis.engine.core import BreakerCore, Clock, P
from breaker_redis.engine.knowledge import Knowledge, Reply
from breaker_redis.engine.observers import CallObserver
from breaker_redis.engine.snapshot import Snapshot, snapshot_dict
from breaker_redis.engine.transitions import released_upto
from breaker_redis.storage.args import AdminArgs, Batch, HoldArgs, SnapshotArgs
from breaker_redis.storage.store import StoreUnavailable

log = logging.getLogger("breaker_redis")
D = TypeVar("D")  # what an operator's action returns: None (sync) or an awaitable (asyncio)


class Shared(Clock, Protocol):
    """What the steps use of the per-process machinery (``Breakers``); each side's
    Shared adds its I/O."""

    batch_successes: bool
    call_observers: tuple[CallObserver, ...]
    pid: int
    reporter: str

    def clock_ms(self) -> int | None: ...
    def observe_clock(self, redis_now_ms: int) -> None: ...
    def transitioned(self, name: str, events: str, epoch: int, at_ms: int) -> None: ...


class Listening(Protocol):
    """What either side reads of a breaker's event subscription; each side's
    Listener adds how its notices are delivered."""

    healthy: bool

    @property
    def trust_until(self) -> float: ...


class Remote(Protocol):
    @property
    def prefix(self) -> str: ...
    @property
    def ttl_ms(self) -> int: ...


class Gate(Protocol):
    """What the steps read of a store gate (storage/store.py, asyncio/store.py)."""

    generation: int
    policy: str

    @property
    def remote(self) -> Remote: ...
    @property
    def healthy(self) -> bool: ...
    @property
    def kind(self) -> str: ...
    def live(self, generation: int) -> bool: ...
    def shared(self, generation: int) -> bool: ...
    async def running(
        self, operation: str, name: str, now_ms: int | None, args: Sequence[Any], *, fallback: bool = True
    ) -> tuple[Any, int]: ...


class BreakerSteps(BreakerCore[P], Generic[P, D]):
    """The steps, and the operator's actions made of them, for both sides."""

    _shared: Shared
    _gate: Gate
    _lock: AbstractContextManager[Any]  # the counts kept in memory (module doc)
    on_events: Callable[[Any, str], None] | None

    # -- the I/O: each side's ----------------------------------------------------

    async def _remote(self, operation: str, args: list[Any]) -> Any:
        """The raw reply of a script run on Redis only (an operator's action)."""
        raise NotImplementedError

    async def _register(self) -> None:
        """List this breaker's name (Breakers.register_name)."""
        raise NotImplementedError

    async def _barrier(self, ack: str) -> None:
        """Breakers.barrier: every listening worker applied the change's notice (``ack``:
        the reply's '<token> <workers>', storage/acks.py)."""
        raise NotImplementedError

    async def _give_back(self, upto: int) -> None:
        """Breakers.give_back_grant: the breaker groups forget this member's grant."""
        raise NotImplementedError

    def _finish(self, step: Coroutine[Any, Any, None]) -> D:
        """Run an operator's step: to its end (sync), or as the awaitable returned (asyncio)."""
        raise NotImplementedError

    # -- the steps -------------------------------------------------------------------

    async def _run(self, operation: str, args: list[Any], *, fallback: bool = True) -> tuple[Reply, int, int]:
        """(reply, store generation, the invalidation count when it was sent)."""
        stamp = self._memory.stamp()
        sent = self._script_args(args)
        now_ms = self._shared.clock_ms()
        raw, generation = await self._gate.running(operation, self.name, now_ms, sent, fallback=fallback)
        return Reply.decode(raw), generation, stamp

    async def _learn(self, reply: Reply, generation: int, stamp: int, *, operator: bool = False) -> Knowledge:
        """Learn from a reply (knowledge.Memory); after a change, the barrier. A reply that
        says a group member gave its grant back as it closed (``released:<token>``): the
        groups forget it, here unless a group of this process takes it (``on_events``, at its
        next settle()); an operator's action (``operator``), here at once, whatever else."""
        shared = self._shared
        shared.observe_clock(reply.now)
        gate = self._gate
        current = gate.shared(generation)
        known = self._learn_reply(reply, generation, stamp, current)
        if current and self._listing_due(shared.pid, gate.remote.ttl_ms):
            await self._register()
        if reply.events and current:
            await self._barrier(reply.ack)
            shared.transitioned(self.name, reply.events, reply.epoch, reply.now)
        hooked = self.on_events is not None and gate.live(generation)
        if reply.events and self.on_events is not None and hooked:
            self.on_events(self, reply.events)
        if reply.events and current and (operator or not hooked):
            upto = released_upto(reply.events)
            if upto:
                await self._give_back(upto)
        return known

    def _restore_pending(self, pending: list[int], batch: Batch | None = None) -> None:
        """Put back what a script call that failed did not deliver."""
        with self._lock:
            self._put_back(pending, batch)

    async def _acquiring(self, ramped: bool = False) -> P:
        """Run the acquire script with the counts kept in memory: the permit its reply
        grants, or BreakerOpen (also while Redis is down under the deny policy).
        ``ramped``: the ramp after a close was decided from memory (core.py _from_memory)."""
        with self._lock:
            pending = self._take_pending()
        try:
            reply, generation, stamp = await self._run("acquire", self._acquire_args(pending, ramped))
        except StoreUnavailable:
            self._restore_pending(pending)
            if self._gate.policy == "allow":
                return self._permit(self, -1, "", -1)  # detached: records nothing
            raise BreakerOpen(None, self.name, "open") from None
        except BaseException:
            self._restore_pending(pending)
            raise
        known = await self._learn(reply, generation, stamp)
        with self._lock:
            return self._from_reply(reply, generation, known)

    async def _sending(self, epoch: int, outcome: str, duration_ms: int, lease: str, generation: int) -> None:
        """Run the record script with this outcome ('' for none) and the counts and
        batch held; each side runs it under its send lock (one at a time, so Redis
        sees this worker's outcomes in the order they happened).

        ``generation``: the store generation the outcome's permit came from. The
        store may have switched while this waited for the send lock: then the
        outcome belongs to a store no longer in use and is dropped, as the
        batch is (its epoch and lease mean nothing to the other store). Never
        raises: a lost record must not fail the call."""
        with self._lock:
            pending, batch = self._take_for_send(self._gate.live)
        if outcome and not self._gate.live(generation):
            outcome = ""
        if not outcome and not batch.size and not any(pending):
            return
        args = self._record_args(epoch, outcome, duration_ms, lease, pending, batch)
        try:
            reply, generation, stamp = await self._run("record", args, fallback=False)
        except StoreUnavailable:
            return
        except Exception:
            self._restore_pending(pending, batch)
            log.exception("could not record an outcome of breaker %r", self.name)
            return
        await self._learn(reply, generation, stamp)

    async def _snapshotting(self) -> Snapshot:
        """The snapshot script (carrying the counts kept in memory): the breaker as Redis has it."""
        with self._lock:
            pending = self._take_pending()
        try:
            sent = self._script_args(SnapshotArgs(pending).argv())
            raw, _ = await self._gate.running("snapshot", self.name, self._shared.clock_ms(), sent)
        except StoreUnavailable:
            self._restore_pending(pending)
            raise
        return snapshot_dict(self.name, raw, self._gate.kind)

    async def _scripting(self, operation: str, args: list[Any]) -> Reply | None:
        """run_script: the reply, learned from; None when Redis is down and the policy is allow or deny."""
        try:
            reply, generation, stamp = await self._run(operation, args)
        except StoreUnavailable:
            return None
        await self._learn(reply, generation, stamp)
        return reply

    async def _administering(self, op: str, config: bytes | str) -> None:
        await self._register()  # a breaker only ever forced is listed too
        stamp = self._memory.stamp()
        raw = await self._remote("admin", [config, self._memory.epoch_seen, *AdminArgs(op).argv()])
        await self._learn(Reply.decode(raw), self._gate.generation, stamp, operator=True)

    async def _holding(self, hold_ms: int) -> None:
        await self._scripting("hold", HoldArgs(hold_ms).argv())

    # -- the operator's actions (lua/admin.lua), on Redis only ---------------------------

    def force_open(self) -> D:
        """Open for every worker until a clear_force() or reset(), whatever the calls do."""
        return self._admin("force_open")

    def force_closed(self) -> D:
        """Closed for every worker, admitting every call and counting, never tripping,
        until a clear_force() or reset()."""
        return self._admin("force_closed")

    def clear_force(self) -> D:
        """End a force (nothing without one): closed with a clean window."""
        return self._admin("clear_force")

    def reset(self) -> D:
        """Closed, a clean window, no force, no backoff, no leases."""
        return self._admin("reset")

    def trip(self) -> D:
        """Open now for this worker's open_seconds, then half_open as after any trip
        (pybreaker's open(); unlike force_open it ends by itself)."""
        return self._admin("trip", self._lua_config)

    def half_open(self) -> D:
        """half_open now: the next call is a probe."""
        return self._admin("half_open")

    def hold_open(self, seconds: float) -> D:
        """If the breaker is open, keep it open at least ``seconds`` from now, for
        every worker (lua/hold.lua; capped at max_open_seconds): a service's own
        Retry-After, honoured by the HTTP client integrations. Never shortens it."""
        return self._finish(self._holding(max(0, round(seconds * 1000))))

    def _admin(self, op: str, config: bytes | str = "") -> D:
        return self._finish(self._administering(op, config))

    # -- reading ------------------------------------------------------------------------

    def _key_prefix(self) -> str:
        return self._gate.remote.prefix

    @property
    def store_healthy(self) -> bool:
        """Whether this breaker's scripts run on Redis now (on a cluster: on its master)."""
        return self._gate.healthy
