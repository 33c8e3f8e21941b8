"""Breaker: one named breaker in one process, and when it asks Redis.

One call, in four steps:

1. ``acquire``: deliver the notices already received (``drain``); if what this
   worker knows is trusted, admit or deny from memory (knowledge.py has the
   rules); otherwise run the acquire script and learn from its reply.
2. the protected call runs.
3. ``Permit.success()`` / ``failure()`` -> ``_record``: a plain success of a
   call admitted from calm knowledge joins this worker's batch, which the
   recorder thread sends within 50 ms; every other outcome goes to the record
   script at once, carrying the batch ahead of it.
4. every reply is learned (``knowledge.Memory``); one that made a transition, or armed the breaker,
   is followed by ``barrier()``, so the change's message is in every other
   worker's socket before this call returns.

Sends are serialised per breaker (``_send_lock``), so Redis sees this
worker's outcomes in the order they happened, whichever thread sends them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from enum import Enum
from typing import Any, Protocol, TypeVar, cast

from breaker_redis.engine.config import BreakerConfig
from breaker_redis.engine.core import BreakerCore
from breaker_redis.engine.errors import BreakerOpen
from breaker_redis.engine.knowledge import Knowledge, Memory, Reply
from breaker_redis.engine.permit import Permit
from breaker_redis.engine.recorder import Recorder
from breaker_redis.engine.snapshot import snapshot_dict
from breaker_redis.engine.wrappers import MISSING, Protects
from breaker_redis.storage.store import StoreGate, StoreUnavailable

log = logging.getLogger("breaker_redis")
T = TypeVar("T")


class State(str, Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    def __str__(self) -> str:
        return self.value


class Listener(Protocol):
    """A breaker's event subscription: the process's one (invalidation.Invalidator) or,
    on Redis Cluster, its channel on its master (sharded.Channel)."""

    healthy: bool

    def drain(self) -> None: ...


class Shared(Protocol):
    """The per-process machinery a breaker uses (``Breakers`` provides it)."""

    recorder: Recorder
    batch_successes: bool
    pid: int
    reporter: str

    def gate_for(self, name: str) -> StoreGate: ...
    def listener(self, name: str) -> Listener | None: ...
    def clock_ms(self) -> int | None: ...
    def now_ms(self) -> int: ...
    def observe_clock(self, redis_now_ms: int) -> None: ...
    def ensure_process(self) -> None: ...
    def register_name(self, name: str) -> None: ...
    def barrier(self, name: str) -> None: ...
    def transitioned(self, name: str, events: str, epoch: int, at_ms: int) -> None: ...


class Breaker(BreakerCore[Permit], Protects):
    """One named breaker, shared by every thread of this process and, through
    Redis, by every worker of every host using the same key prefix. What it
    decides and counts without I/O is breaker_redis/engine/core.py's, done here under
    ``_lock``."""

    _permit = Permit
    _shared: Shared

    def __init__(self, shared: Shared, name: str, config: BreakerConfig) -> None:
        self._shared = shared
        # told the events of every reply of the store in use (a breaker group's hook, groups.py)
        self.on_events: Callable[[Breaker, str], None] | None = None
        super().__init__(name, config)
        self.now_ms = shared.now_ms  # type: ignore[method-assign]  # one call less per permit
        self._reporter = shared.reporter
        self._gate = shared.gate_for(name)  # on a cluster, its master's (store.MasterGates)
        self._listener = shared.listener(name)
        self.after_fork()

    def after_fork(self) -> None:
        """Start afresh in this process: the parent's knowledge, counts and batch are the parent's."""
        self._lock = threading.Lock()  # the counts kept in memory and the batch
        self._send_lock = threading.Lock()  # one record call at a time: outcomes in order
        self._memory = Memory()
        self._forget_counts()
        self._local_permits = threading.local()

    # -- 1. admission -------------------------------------------------------

    def acquire(self) -> Permit:
        """A Permit for one call, or BreakerOpen. Decides from memory when it can."""
        self._shared.ensure_process()
        listener = self._listener
        if listener is not None:
            listener.drain()
        return self._admit(self._memory.known)

    def _admit(self, known: Knowledge | None) -> Permit:
        """acquire() once the notices received were delivered; known: what memory held then."""
        if known is not None and known.admits and self._trusted(known):
            # the healthy call: admitted from memory, nothing counted (core.py _from_memory)
            return Permit(self, known.epoch, "", known.generation, known.calm, timed=known.slow_ms != 0)
        with self._lock:
            if known is not None and self._trusted(known):
                permit = self._from_memory(known)
                if permit is not None:
                    return permit
            pending = self._take_pending()
        try:
            reply, generation, stamp = self._run("acquire", self._acquire_args(pending))
        except StoreUnavailable:
            self._restore_pending(pending)
            if self._gate.policy == "allow":
                return Permit(self, -1, "", -1)  # detached: records nothing
            raise BreakerOpen(None, self.name, "open") from None
        except Exception:
            self._restore_pending(pending)
            raise
        return self._from_reply(reply, generation, self._learn(reply, generation, stamp))

    def guard(
        self,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        fallback: Any = MISSING,
        failed: Callable[[T], BaseException | None] | None = None,
    ) -> T:
        """Protects.guard with the healthy call written out: admitted from calm,
        trusted knowledge and returning, it makes no Permit and joins the batch
        directly (about a third of the breaker's own time per call). The same
        steps as acquire() and _record(); anything else takes the general path."""
        shared = self._shared
        shared.ensure_process()
        listener = self._listener
        if listener is not None:
            listener.drain()
        known = self._memory.known
        healthy = known is not None and known.admits and known.calm and shared.batch_successes
        if known is None or not (healthy and self._trusted(known)):
            try:
                permit = self._admit(known)
            except BreakerOpen as refused:
                return cast(T, self._answer_refusal(refused, fallback))
            return self._run_admitted(permit, fn, args, kwargs, fallback, failed)
        timed = known.slow_ms != 0  # a duration matters only to the slow-call rule
        started = shared.now_ms() if timed else 0
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            return cast(T, self._settle_raised(self._permit_since(known, started), exc, fallback))
        cause = failed(result) if failed is not None else None
        if cause is not None:
            return self._settle_failed_result(self._permit_since(known, started), result, cause, fallback)
        duration_ms = shared.now_ms() - started if timed else 0
        if not self._batched(known.epoch, known.generation, duration_ms):
            self._send(known.epoch, "success", max(0, duration_ms), "", known.generation)
        return result

    def _permit_since(self, known: Knowledge, started: int) -> Permit:
        """The permit guard()'s healthy path did without, for an outcome it does not handle."""
        permit = Permit(self, known.epoch, "", known.generation, known.calm)
        if started:  # (0: not timed, no slow-call rule; the permit's own start stands)
            permit.started = started
        return permit

    def _drain(self) -> None:
        listener = self._listener
        if listener is not None:
            listener.drain()

    def _trusted(self, known: Knowledge) -> bool:
        """Whether memory may decide (knowledge.py). Call after _drain()."""
        listener = self._listener
        return known.trusted(self._gate, listener is not None and listener.healthy)

    def _restore_pending(self, pending: list[int], batch: list[int] | None = None) -> None:
        """Put back what a script call that failed did not deliver."""
        with self._lock:
            self._put_back(pending, batch)

    # -- 3. outcomes --------------------------------------------------------

    def _record(self, permit: Permit, outcome: str, duration_ms: int) -> None:
        """Count one outcome: in memory if it decides nothing now, else sent at once.

        Never raises into the caller: a lost record must not fail the call.
        """
        shared = self._shared
        gate = self._gate
        if permit.generation != gate.generation and not gate.live(permit.generation):
            return  # admitted by a store that is no longer in use
        if permit.observing:
            with self._lock:
                if self._observed(permit, outcome, duration_ms):
                    return
        batchable = outcome == "success" and permit.batchable and shared.batch_successes
        if batchable and self._batched(permit.epoch, permit.generation, duration_ms):
            return
        self._send(permit.epoch, outcome, max(0, duration_ms), permit.lease, permit.generation)

    def _batched(self, epoch: int, generation: int, duration_ms: int) -> bool:
        """A plain success of a call admitted from calm knowledge joins this
        worker's batch if the breaker is still calm (an arming heard first)."""
        listener = self._listener
        if listener is not None:
            listener.drain()
        known = self._memory.known
        trusted = known is not None and self._trusted(known)
        with self._lock:
            joins = self._join_batch(epoch, generation, duration_ms, trusted)
        if joins:
            self._shared.recorder.schedule(self)
        return joins

    def flush_batch(self) -> None:
        """Send the batched successes and the counts kept in memory, if any
        (the recorder thread, an arming notice, snapshot, close and exit)."""
        if self.holds_counts:
            self._send(0, "", 0, "")

    def _send(self, epoch: int, outcome: str, duration_ms: int, lease: str, generation: int = -1) -> None:
        """Run the record script with this outcome ('' for none) and the batch held.

        ``generation``: the store generation the outcome's permit came from. The
        store may have switched while this waited for the send lock: then the
        outcome belongs to a store no longer in use and is dropped, as the
        batch is (its epoch and lease mean nothing to the other store)."""
        with self._send_lock:
            with self._lock:
                pending, batch = self._take_for_send(self._gate.live)
            if outcome and not self._gate.live(generation):
                outcome = ""
            if not outcome and not batch[1] and not any(pending):
                return
            try:
                reply, generation, stamp = self._run(
                    "record",
                    self._record_args(epoch, outcome, duration_ms, lease, pending, batch),
                    fallback=False,
                )
            except StoreUnavailable:
                return
            except Exception:
                self._restore_pending(pending, batch)
                log.exception("could not record an outcome of breaker %r", self.name)
                return
            self._learn(reply, generation, stamp)

    # -- 4. learning ----------------------------------------------------------

    def _run(self, operation: str, args: list[Any], *, fallback: bool = True) -> tuple[Reply, int, int]:
        """(reply, store generation, the invalidation count when it was sent)."""
        shared = self._shared
        stamp = self._memory.stamp()
        raw, generation = self._gate.run(
            operation,
            self.name,
            shared.clock_ms(),
            self._script_args(args),
            fallback=fallback,
        )
        return Reply.decode(raw), generation, stamp

    def _learn(self, reply: Reply, generation: int, stamp: int) -> Knowledge:
        """Learn from a reply (knowledge.Memory); after a change, the barrier."""
        shared = self._shared
        shared.observe_clock(reply.now)
        gate = self._gate
        current = gate.shared(generation)
        known = self._learn_reply(reply, generation, stamp, current)
        if current and self._listing_due(shared.pid, gate.remote.ttl_ms):
            shared.register_name(self.name)
        if reply.events and current:
            shared.barrier(self.name)
            shared.transitioned(self.name, reply.events, reply.epoch, reply.now)
        if reply.events and self.on_events is not None and self._gate.live(generation):
            self.on_events(self, reply.events)
        return known

    def _key_prefix(self) -> str:
        return self._gate.remote.prefix

    @property
    def store_healthy(self) -> bool:
        """Whether this breaker's scripts run on Redis now (on a cluster: on its master)."""
        return self._gate.healthy

    def hint(self, payload: dict[str, Any]) -> None:
        """A pushed message about this breaker: if it is news, the next call asks
        Redis, and the batch goes now (the breaker may no longer be calm). Ignored
        while its store is the local one: nothing known there came from Redis."""
        if self._about_another_reporter(payload):
            return
        if self._gate.healthy and self._memory.hint(payload):
            self.flush_batch()

    # -- reading and administration -----------------------------------------

    @property
    def state(self) -> State:
        """The state as Redis has it now (one script call)."""
        return State(self.snapshot()["state"])

    def snapshot(self) -> dict[str, Any]:
        self.flush_batch()  # this worker's own successes and counts show at once
        with self._lock:
            pending = self._take_pending()
        shared = self._shared
        try:
            args = self._script_args(pending)
            raw, _ = self._gate.run("snapshot", self.name, shared.clock_ms(), args)
        except StoreUnavailable:
            self._restore_pending(pending)
            raise
        return snapshot_dict(self.name, raw, self._gate.kind)

    def force_open(self) -> None:
        self._admin("force_open")

    def force_closed(self) -> None:
        self._admin("force_closed")

    def clear_force(self) -> None:
        self._admin("clear_force")

    def reset(self) -> None:
        self._admin("reset")

    def trip(self) -> None:
        """Open now for this worker's open_seconds, then half_open as after any trip
        (pybreaker's open(); unlike force_open it ends by itself)."""
        self._admin("trip", self._lua_config)

    def half_open(self) -> None:
        """half_open now: the next call is a probe."""
        self._admin("half_open")

    def hold_open(self, seconds: float) -> None:
        """If the breaker is open, keep it open at least ``seconds`` from now, for
        every worker (lua/hold.lua; capped at max_open_seconds): a service's own
        Retry-After, honoured by the HTTP client integrations. Never shortens it."""
        self.run_script("hold", [max(0, round(seconds * 1000))])

    def run_script(self, operation: str, args: list[Any]) -> Reply | None:
        """Run one of this breaker's scripts that answer with the common reply (hold,
        member) with this worker's config, and learn from the reply; None when Redis
        is down and the policy is allow or deny."""
        try:
            reply, generation, stamp = self._run(operation, args)
        except StoreUnavailable:
            return None
        self._learn(reply, generation, stamp)
        return reply

    def _admin(self, op: str, config: bytes | str = "") -> None:
        self._shared.register_name(self.name)  # a breaker only ever forced is listed too
        gate, stamp = self._gate, self._memory.stamp()
        args = [config, self._memory.epoch_seen, op]
        raw = gate.run_remote("admin", self.name, self._shared.clock_ms(), args)
        self._learn(Reply.decode(raw), gate.generation, stamp)

    def __repr__(self) -> str:
        return f"<Breaker {self.name!r}>"
