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

The sync Breaker is this one class, so that a reader sees its state machine
from one file, as in pybreaker or Resilience4j: the public surface (acquire,
call, guard, ``with``, the function ``@breaker`` returns, state, snapshot) and
the healthy call (steps 1 to 3 from memory), written out here because it is
the hot path. Under it is only what the asyncio Breaker shares, written once
for both: core.py's ``BreakerCore`` (the decisions and counts made without
I/O, what a fallback answers, the decorator) and steps.py's ``BreakerSteps``
(each sequence around a script call, and the operator's actions); the
layout: docs/design.md, section 12.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine
from enum import Enum
from typing import Any, Protocol, TypeVar, cast

from breaker_redis.base.blocking import run_sync
from breaker_redis.base.config import BreakerConfig
from breaker_redis.base.errors import BreakerOpen
from breaker_redis.engine import steps
from breaker_redis.engine.core import MISSING, _fall_back
from breaker_redis.engine.knowledge import Knowledge, Memory, Reply
from breaker_redis.engine.observers import tell_called, tell_refused
from breaker_redis.engine.permit import Permit, from_memory
from breaker_redis.engine.recorder import Recorder
from breaker_redis.engine.snapshot import Snapshot
from breaker_redis.engine.steps import BreakerSteps
from breaker_redis.storage.notices import Notice
from breaker_redis.storage.store import StoreGate

T = TypeVar("T")


class State(str, Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    def __str__(self) -> str:
        return self.value


class Listener(steps.Listening, Protocol):
    """A breaker's event subscription: the process's one (invalidation.Invalidator) or,
    on Redis Cluster, its channel on its master (sharded.Channel)."""

    def drain(self) -> None: ...


class Shared(steps.Shared, Protocol):
    """The per-process machinery a breaker uses (``Breakers`` provides it): the
    steps' (steps.py), and this side's I/O."""

    recorder: Recorder

    def gate_for(self, name: str) -> StoreGate: ...
    def listener(self, name: str) -> Listener | None: ...
    def ensure_process(self) -> None: ...
    def register_name(self, name: str) -> None: ...
    def barrier(self, name: str, ack: str) -> None: ...
    def give_back_grant(self, name: str, upto: int) -> None: ...


class Breaker(BreakerSteps[Permit, None]):
    """One named breaker, shared by every thread of this process and, through
    Redis, by every worker of every host using the same key prefix. What it
    decides and counts without I/O is breaker_redis/engine/core.py's, done here under
    ``_lock``; its calls to Redis are steps.py's, run with blocking I/O."""

    _permit = Permit
    _shared: Shared
    _gate: StoreGate

    def __init__(self, shared: Shared, name: str, config: BreakerConfig) -> None:
        self._shared = shared
        # told the events of every reply of the store in use (a breaker group's hook, groups.py)
        self.on_events: Callable[[Breaker, str], None] | None = None
        super().__init__(name, config)
        self.now_ms = shared.now_ms  # type: ignore[method-assign]  # one call less per permit
        self._reporter = shared.reporter
        self._gate = shared.gate_for(name)  # on a cluster, its master's (masters.MasterGates)
        self._listener = shared.listener(name)
        self.after_fork()

    def after_fork(self) -> None:
        """Start afresh in this process: the parent's knowledge, counts and batch are the parent's."""
        self._lock = threading.Lock()  # the counts kept in memory and the batch
        self._send_lock = threading.Lock()  # one record call at a time: outcomes in order
        self._memory = Memory()
        self._forget_counts()

    # -- the steps' I/O (steps.py): blocking calls, 'async' in form only, run by run_sync

    async def _remote(self, operation: str, args: list[Any]) -> Any:
        return self._gate.run_remote(operation, self.name, self._shared.clock_ms(), args)

    async def _register(self) -> None:
        self._shared.register_name(self.name)

    async def _barrier(self, ack: str) -> None:
        self._shared.barrier(self.name, ack)

    async def _give_back(self, upto: int) -> None:
        self._shared.give_back_grant(self.name, upto)

    def _finish(self, step: Coroutine[Any, Any, None]) -> None:
        run_sync(step)

    # -- 1. admission -------------------------------------------------------

    def acquire(self) -> Permit:
        """A Permit for one call, or BreakerOpen. Decides from memory when it can."""
        self._shared.ensure_process()
        listener = self._listener
        if listener is not None:
            listener.drain()
        known = self._memory.known
        if known is not None and known.admits and self._trusted(known):
            # the healthy call, as in _admit, without one more call on every request
            return from_memory(Permit, self, known.epoch, known.generation, known.calm, known.slow_ms != 0)
        return self._admit(known)

    def _admit(self, known: Knowledge | None) -> Permit:
        """acquire() once the notices received were delivered; known: what memory held then."""
        if known is not None and known.admits and self._trusted(known):
            # the healthy call: admitted from memory, nothing counted (core.py _from_memory)
            return from_memory(Permit, self, known.epoch, known.generation, known.calm, known.slow_ms != 0)
        try:
            ramped = False  # (the ramp after a close decided from memory: core.py _from_memory)
            if known is not None and self._trusted(known):
                with self._lock:
                    decided = self._from_memory(known)
                if not isinstance(decided, bool):
                    return decided
                ramped = decided
            return run_sync(self._acquiring(ramped))
        except BreakerOpen as refusal:
            observers = self._shared.call_observers
            if observers:
                tell_refused(observers, refusal)
            raise

    def call(self, fn: Callable[..., T], /, *args: Any, fallback: Any = MISSING, **kwargs: Any) -> T:
        """Run fn behind the breaker.

        With ``fallback`` (a value, or a callable given the BreakerOpen or the
        exception), a refused call or a call that failed returns the fallback
        instead of raising; ignored exceptions are always re-raised.
        """
        return self.guard(fn, args, kwargs, fallback=fallback)

    def guard(
        self,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        fallback: Any = MISSING,
        failed: Callable[[T], BaseException | None] | None = None,
    ) -> T:
        """``call`` with one more rule: ``failed(result)`` returning an exception
        marks a returned result as a failure (the fallback gets that exception).

        The healthy call is written out here: admitted from calm, trusted
        knowledge and returning, it makes no Permit and joins the batch
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
        if shared.call_observers:
            tell_called(shared.call_observers, self.name, "success")
        if not self._batched(known.epoch, known.generation, duration_ms):
            self._send(known.epoch, "success", max(0, duration_ms), "", known.generation)
        return result

    def _run_admitted(
        self,
        permit: Permit,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        fallback: Any,
        failed: Callable[[T], BaseException | None] | None,
    ) -> T:
        """Run an admitted call and record its outcome."""
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            return cast(T, self._settle_raised(permit, exc, fallback))
        cause = failed(result) if failed is not None else None
        if cause is None:
            permit.success()
            return result
        return self._settle_failed_result(permit, result, cause, fallback)

    def _settle_raised(self, permit: Permit, exc: BaseException, fallback: Any) -> Any:
        """Record a call that raised: the fallback's answer to a failure, else exc raised again."""
        outcome = self.classify(exc)
        permit.record(outcome)
        return self._answer_raised(outcome, exc, fallback)

    @staticmethod
    def _settle_failed_result(permit: Permit, result: T, cause: BaseException, fallback: Any) -> T:
        """Record a call whose result ``failed()`` judged a failure: the result, or the fallback's answer."""
        permit.failure()
        return result if fallback is MISSING else cast(T, _fall_back(fallback, cause))

    def _permit_since(self, known: Knowledge, started: int) -> Permit:
        """The permit guard()'s healthy path did without, for an outcome it does not handle."""
        permit = Permit(self, known.epoch, "", known.generation, known.calm)
        if started:  # (0: not timed, no slow-call rule; the permit's own start stands)
            permit.started = started
        return permit

    def _wrapper(self, fn: Callable[..., Any], fallback: Any) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:  # (the asyncio side's is a coroutine function)
            return self.call(fn, *args, fallback=fallback, **kwargs)

        return wrapper

    def __enter__(self) -> Permit:
        return self._hold(self.acquire())

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._release().__exit__(exc_type, exc, tb)

    def _trusted(self, known: Knowledge) -> bool:
        """Whether memory may decide (knowledge.py). Call after the listener's drain()."""
        listener = self._listener
        return known.trusted(self._gate, listener.trust_until if listener is not None else 0.0)

    # -- 3. outcomes --------------------------------------------------------

    def _record(self, permit: Permit, outcome: str, duration_ms: int) -> None:
        """Count one outcome: in memory if it decides nothing now, else sent at once.

        Never raises into the caller: a lost record must not fail the call.
        """
        shared = self._shared
        if shared.call_observers:
            tell_called(shared.call_observers, self.name, outcome)
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
        (the recorder thread, an arming notice, snapshot, close and exit).

        Takes the send lock even when nothing is held: the recorder thread may
        have taken the batch and be waiting for Redis's answer, and a snapshot
        read before that answer would miss this worker's own successes."""
        with self._send_lock:
            if self.holds_counts:
                run_sync(self._sending(0, "", 0, "", -1))

    def _send(self, epoch: int, outcome: str, duration_ms: int, lease: str, generation: int = -1) -> None:
        """steps.py _sending, under this side's send lock (a thread lock)."""
        with self._send_lock:
            run_sync(self._sending(epoch, outcome, duration_ms, lease, generation))

    def hint(self, notice: Notice) -> bool:
        """A pushed message about this breaker: if it is news, the next call asks Redis;
        True when, besides, a batch waits, which the caller sends at once (the breaker
        may no longer be calm), once the message is acknowledged. Ignored while its
        store is the local one: nothing known there came from Redis."""
        if self._about_another_reporter(notice):
            return False
        return self._gate.healthy and self._memory.hint(notice) and self.holds_counts

    # -- reading and administration (the actions: steps.py) -------------------

    @property
    def state(self) -> State:
        """The state as Redis has it now (one script call)."""
        return State(self.snapshot()["state"])

    def snapshot(self) -> Snapshot:
        self.flush_batch()  # this worker's own successes and counts show at once
        return run_sync(self._snapshotting())

    def run_script(self, operation: str, args: list[Any]) -> Reply | None:
        """Run one of this breaker's scripts that answer with the common reply (hold,
        member) with this worker's config, and learn from the reply; None when Redis
        is down and the policy is allow or deny."""
        return run_sync(self._scripting(operation, args))

    def __repr__(self) -> str:
        return f"<Breaker {self.name!r}>"
