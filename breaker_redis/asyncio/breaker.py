"""Breaker and Permit for asyncio: the sync Breaker's four steps, awaited.

The same rules as breaker_redis/engine/breaker.py, and the same code for them,
in the two classes under both Breakers: core.py's decides and counts without
I/O and answers a refused or failed call with its fallback, steps.py's holds
every sequence around a script call (this side awaits them); permit.py holds
the Permit's rules. So a sync worker and an async worker of one deployment
share one breaker and one boundary, and a reader of either reads its own file
and those two. What differs is only how a step waits:

- deciding from memory never awaits (no I/O), and is trusted only when the
  subscription has nothing unread (``AsyncInvalidator.pending``), which
  stands in for the sync side's ``drain``;
- script calls are awaited on redis-py's asyncio client; one record call at
  a time per breaker (an ``asyncio.Lock``), so Redis sees this worker's
  outcomes in the order they happened;
- batched successes are sent by a task of ``Breakers``, within 50 ms;
- a script call runs to its end even when the awaiting task is cancelled
  (a server giving up on a request, a timeout around the call): the caller
  sees the CancelledError at once, while a probe slot or bulkhead lease the
  acquire script granted is handed back when its reply arrives, and an
  outcome on its way to Redis gets there (``_shielded``). Decisions from
  memory and batched successes never await, so they need no task.

One event loop runs all of it, so the counts kept in memory need no lock:
nothing between two awaits can interleave.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import sys
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, Protocol, TypeVar, cast

from breaker_redis.asyncio.store import AsyncStoreGate
from breaker_redis.base.config import BreakerConfig
from breaker_redis.base.errors import BreakerOpen
from breaker_redis.engine import steps
from breaker_redis.engine.breaker import State
from breaker_redis.engine.core import MISSING
from breaker_redis.engine.knowledge import Knowledge, Memory, Reply
from breaker_redis.engine.observers import tell_called, tell_refused
from breaker_redis.engine.permit import Recording
from breaker_redis.engine.snapshot import Snapshot
from breaker_redis.engine.steps import BreakerSteps
from breaker_redis.storage.notices import Notice

log = logging.getLogger("breaker_redis")

T = TypeVar("T")


class Listener(steps.Listening, Protocol):
    """A breaker's event subscription: the process's one (AsyncInvalidator) or, on Redis
    Cluster, its channel on its master (breaker_redis/asyncio/sharded.py)."""

    def pending(self) -> bool: ...


class Shared(steps.Shared, Protocol):
    """The per-process machinery a breaker uses (``breaker_redis.asyncio.Breakers``):
    the steps' (steps.py), and this side's I/O, awaited."""

    def gate_for(self, name: str) -> AsyncStoreGate: ...
    def listener(self, name: str) -> Listener | None: ...
    def ensure_loop(self) -> None: ...
    def schedule(self, breaker: Breaker) -> None: ...
    async def register_name(self, name: str) -> None: ...
    async def barrier(self, name: str, ack: str) -> None: ...
    async def give_back_grant(self, name: str, upto: int) -> None: ...


class _Done:
    """An awaitable that is done at once: what a second record of a permit returns."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        yield from ()


class Permit(Recording[Awaitable[None]]):
    """One admitted call. Await ``success()``, ``failure()`` or ``ignore()``
    exactly once (later ones are no-ops); or use it as an async context manager.
    The rules are the sync Permit's (engine/permit.py); its records are awaited."""

    __slots__ = ()
    _nothing = _Done()

    async def __aenter__(self) -> Permit:
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        await self._exit(exc)


class Breaker(BreakerSteps[Permit, Awaitable[None]]):
    """One named breaker in this process, shared through Redis with every
    worker, sync or async, that uses the same key prefix. What it decides and
    counts without I/O is breaker_redis/engine/core.py's, and its calls to Redis
    are steps.py's, as on the sync side."""

    _permit = Permit
    _shared: Shared
    _gate: AsyncStoreGate
    _lock = contextlib.nullcontext()  # one event loop: nothing to guard (module doc)

    def __init__(self, shared: Shared, name: str, config: BreakerConfig) -> None:
        self._shared = shared
        self._reporter = shared.reporter
        # told the events of every reply of the store in use (a breaker group's hook, groups.py)
        self.on_events: Callable[[Breaker, str], None] | None = None
        super().__init__(name, config)
        self._gate = shared.gate_for(name)  # on a cluster, its master's (masters.MasterGates)
        self._listener = shared.listener(name)
        self.reset_process()

    def reset_process(self, *, forked: bool = True) -> None:
        """Start afresh on a new event loop: what was known came through the old
        loop's subscription, so it is forgotten. The counts kept in memory and
        the batch are this process's own and go with the next call, unless the
        process is a forked child: then they are the parent's."""
        self._send_lock = asyncio.Lock()
        if forked:
            self._memory = Memory()
            self._forget_counts()
        else:
            self._memory.forget()

    # -- the steps' I/O (steps.py), awaited on redis-py's asyncio client -----------

    async def _remote(self, operation: str, args: list[Any]) -> Any:
        return await self._gate.run_remote(operation, self.name, self._shared.clock_ms(), args)

    async def _register(self) -> None:
        await self._shared.register_name(self.name)

    async def _barrier(self, ack: str) -> None:
        await self._shared.barrier(self.name, ack)

    async def _give_back(self, upto: int) -> None:
        await self._shared.give_back_grant(self.name, upto)

    async def _finish(self, step: Coroutine[Any, Any, None]) -> None:
        self._shared.ensure_loop()
        await step

    # -- admission -----------------------------------------------------------

    async def acquire(self) -> Permit:
        """A Permit for one call, or BreakerOpen. Decides from memory when it can."""
        shared = self._shared
        shared.ensure_loop()
        known = self._memory.known
        try:
            ramped = False  # (the ramp after a close decided from memory: core.py _from_memory)
            if known is not None and self._trusted(known):
                decided = self._from_memory(known)
                if not isinstance(decided, bool):
                    return decided
                ramped = decided
            return await _shielded(self._acquiring(ramped), _hand_back)
        except BreakerOpen as refusal:
            if shared.call_observers:
                tell_refused(shared.call_observers, refusal)
            raise

    def _trusted(self, known: Knowledge) -> bool:
        listener = self._listener
        subscribed = listener is not None and not listener.pending()
        return known.trusted(self._gate, listener.trust_until if listener is not None and subscribed else 0.0)

    # -- outcomes --------------------------------------------------------------

    async def _record(self, permit: Permit, outcome: str, duration_ms: int) -> None:
        """Count one outcome: in memory if it decides nothing now, else sent at once.
        Never raises into the caller: a lost record must not fail the call."""
        shared = self._shared
        if shared.call_observers:
            tell_called(shared.call_observers, self.name, outcome)
        gate = self._gate
        if permit.generation != gate.generation and not gate.live(permit.generation):
            return
        if permit.observing and self._observed(permit, outcome, duration_ms):
            return
        if outcome == "success" and permit.batchable and shared.batch_successes:
            known = self._memory.known
            # an unread notice may be an arming: then the success is sent at once
            if self._join_batch(
                permit.epoch, permit.generation, duration_ms, known is not None and self._trusted(known)
            ):
                shared.schedule(self)
                return
        sending = self._send(permit.epoch, outcome, max(0, duration_ms), permit.lease, permit.generation)
        await _shielded(sending, _keep)

    async def flush_batch(self) -> None:
        """Send the batched successes and the counts kept in memory, if any;
        waits for a send under way even when nothing is held (as the sync side)."""
        async with self._send_lock:
            if self.holds_counts:
                await self._sending(0, "", 0, "", -1)

    async def _send(
        self, epoch: int, outcome: str, duration_ms: int, lease: str, generation: int = -1
    ) -> None:
        """steps.py _sending, under this side's send lock (awaited: an asyncio.Lock)."""
        async with self._send_lock:
            await self._sending(epoch, outcome, duration_ms, lease, generation)

    def hint(self, notice: Notice) -> bool:
        """A pushed message about this breaker; True when it was news and a batch is
        waiting. Ignored while its store is the local one (as on the sync side)."""
        if self._about_another_reporter(notice):
            return False
        return self._gate.healthy and self._memory.hint(notice) and self.holds_counts

    # -- the ways to protect a call (what they share: core.py) ---------------------

    async def call(
        self, fn: Callable[..., Awaitable[T] | T], /, *args: Any, fallback: Any = MISSING, **kwargs: Any
    ) -> T:
        """Await fn(*args, **kwargs) behind the breaker (fn may also be a plain function).

        With ``fallback`` (a value, or a callable given the BreakerOpen or the
        exception, whose result is awaited if it is awaitable), a refused call
        or a call that failed returns the fallback instead of raising; ignored
        exceptions (and cancellation) are always re-raised.
        """
        try:
            permit = await self.acquire()
        except BreakerOpen as refused:
            return cast(T, await _resolved(self._answer_refusal(refused, fallback)))
        try:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        except BaseException as exc:
            outcome = self.classify(exc)
            await permit.record(outcome)
            return cast(T, await _resolved(self._answer_raised(outcome, exc, fallback)))
        await permit.success()
        return cast(T, result)

    def _wrapper(self, fn: Callable[..., Any], fallback: Any) -> Callable[..., Any]:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:  # a coroutine function, as fn is
            return await self.call(fn, *args, fallback=fallback, **kwargs)

        return wrapper

    async def __aenter__(self) -> Permit:
        return self._hold(await self.acquire())

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        await self._release().__aexit__(exc_type, exc, tb)

    # -- reading and administration (the actions: steps.py) -------------------------

    async def state(self) -> State:
        """The state as Redis has it now (one script call)."""
        return State((await self.snapshot())["state"])

    async def snapshot(self) -> Snapshot:
        self._shared.ensure_loop()
        await self.flush_batch()  # this worker's own successes and counts show at once
        return await self._snapshotting()

    async def run_script(self, operation: str, args: list[Any]) -> Reply | None:
        """As the sync Breaker.run_script, awaited."""
        self._shared.ensure_loop()
        return await self._scripting(operation, args)

    def __repr__(self) -> str:
        return f"<breaker_redis.asyncio.Breaker {self.name!r}>"


async def _resolved(answer: Any) -> Any:
    """A fallback's answer, awaited if it is awaitable."""
    return await answer if inspect.isawaitable(answer) else answer


# -- running a script call to its end --------------------------------------------------------

_left_running: set[asyncio.Future[Any]] = set()

# Python 3.12+ starts a task eagerly: its first step runs at once, so a call
# that does not suspend costs no scheduling.
_EAGER: dict[str, Any] = {"eager_start": True} if sys.version_info >= (3, 12) else {}


async def _shielded(coro: Coroutine[Any, Any, T], on_cancel: Callable[[asyncio.Future[T]], None]) -> T:
    """Run coro to its end in a task of its own, even if the awaiting task is
    cancelled meanwhile: the caller sees the CancelledError at once, and
    ``on_cancel(task)`` decides what happens to the task's result."""
    task: asyncio.Task[T] = asyncio.Task(coro, loop=asyncio.get_running_loop(), **_EAGER)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        on_cancel(task)
        raise


def _keep(task: asyncio.Future[Any]) -> None:
    """Hold a task a cancelled caller left running until it ends, and read its end."""
    _left_running.add(task)
    task.add_done_callback(_left_running.discard)
    task.add_done_callback(_ended)


def _ended(task: asyncio.Future[Any]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None and not isinstance(exc, BreakerOpen):
        log.warning("a breaker call left running by a cancelled caller failed: %r", exc)


def _hand_back(task: asyncio.Future[Permit]) -> None:
    """The caller of acquire() was cancelled: a permit granted after all is
    nobody's, so it is recorded as ignored (its lease, if any, is released)."""

    def release(done: asyncio.Future[Permit]) -> None:
        if not done.cancelled() and done.exception() is None:
            _keep(asyncio.ensure_future(done.result().ignore()))

    task.add_done_callback(release)
    _keep(task)
