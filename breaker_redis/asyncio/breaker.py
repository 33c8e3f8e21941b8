"""Breaker and Permit for asyncio: the sync Breaker's four steps, awaited.

The same rules as breaker_redis/engine/breaker.py, and the same modules for them:
the replies are decoded and kept by ``knowledge.Memory``, memory decides by
``Knowledge.decide``, and the scripts are the same files with the same
arguments, so a sync worker and an async worker of one deployment share one
breaker and one boundary. What differs is only how a step waits:

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
import contextvars
import functools
import inspect
import logging
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar, cast

from breaker_redis.asyncio.store import AsyncStoreGate, StoreUnavailable
from breaker_redis.engine.breaker import State
from breaker_redis.engine.config import BreakerConfig
from breaker_redis.engine.core import BreakerCore
from breaker_redis.engine.errors import BreakerOpen
from breaker_redis.engine.knowledge import Knowledge, Memory, Reply
from breaker_redis.engine.snapshot import snapshot_dict

log = logging.getLogger("breaker_redis")

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
MISSING: Any = object()


class Listener(Protocol):
    """A breaker's event subscription: the process's one (AsyncInvalidator) or, on Redis
    Cluster, its channel on its master (breaker_redis/asyncio/sharded.py)."""

    healthy: bool

    def pending(self) -> bool: ...


class Shared(Protocol):
    """The per-process machinery a breaker uses (``breaker_redis.asyncio.Breakers``)."""

    batch_successes: bool
    pid: int
    reporter: str

    def gate_for(self, name: str) -> AsyncStoreGate: ...
    def listener(self, name: str) -> Listener | None: ...

    def clock_ms(self) -> int | None: ...
    def now_ms(self) -> int: ...
    def observe_clock(self, redis_now_ms: int) -> None: ...
    def ensure_loop(self) -> None: ...
    def schedule(self, breaker: Breaker) -> None: ...
    async def register_name(self, name: str) -> None: ...
    async def barrier(self, name: str) -> None: ...
    def transitioned(self, name: str, events: str, epoch: int, at_ms: int) -> None: ...


class Permit:
    """One admitted call. Await ``success()``, ``failure()`` or ``ignore()``
    exactly once (later ones are no-ops); or use it as an async context manager."""

    __slots__ = ("_breaker", "_done", "batchable", "epoch", "generation", "lease", "observing", "probe",
                 "started")

    def __init__(
        self,
        breaker: Breaker,
        epoch: int,
        lease: str,
        generation: int,
        *,
        batchable: bool = False,
        observing: bool = False,
    ) -> None:
        self._breaker = breaker
        self.epoch = epoch
        self.lease = lease
        self.generation = generation
        self.probe = lease.startswith("p:")
        self.batchable = batchable
        self.observing = observing
        self.started = breaker.now_ms()
        self._done = False

    async def success(self) -> None:
        await self.record("success")

    async def failure(self) -> None:
        await self.record("failure")

    async def ignore(self) -> None:
        await self.record("ignored")

    async def record(self, outcome: str) -> None:
        if outcome not in ("success", "failure", "ignored"):
            raise ValueError(f"outcome must be success, failure or ignored (got {outcome!r})")
        if self._done:
            return
        self._done = True
        await self._breaker._record(self, outcome, self._breaker.now_ms() - self.started)

    @property
    def recorded(self) -> bool:
        return self._done

    async def __aenter__(self) -> Permit:
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            await self.success()
        else:
            await self.record(self._breaker.classify(exc))


class Breaker(BreakerCore[Permit]):
    """One named breaker in this process, shared through Redis with every
    worker, sync or async, that uses the same key prefix. What it decides and
    counts without I/O is breaker_redis/engine/core.py's, as on the sync side."""

    _permit = Permit
    _shared: Shared

    def __init__(self, shared: Shared, name: str, config: BreakerConfig) -> None:
        self._shared = shared
        self._reporter = shared.reporter
        # told the events of every reply of the store in use (a breaker group's hook, groups.py)
        self.on_events: Callable[[Breaker, str], None] | None = None
        super().__init__(name, config)
        self._permits: contextvars.ContextVar[tuple[Permit, ...]] = contextvars.ContextVar(
            f"breaker_redis:{name}", default=()
        )
        self._gate = shared.gate_for(name)  # on a cluster, its master's (store.MasterGates)
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

    # -- admission -----------------------------------------------------------

    async def acquire(self) -> Permit:
        """A Permit for one call, or BreakerOpen. Decides from memory when it can."""
        shared = self._shared
        shared.ensure_loop()
        known = self._memory.known
        if known is not None and self._trusted(known):
            permit = self._from_memory(known)
            if permit is not None:
                return permit
        return await _shielded(self._acquire_from_redis(), _hand_back)

    async def _acquire_from_redis(self) -> Permit:
        pending = self._take_pending()
        try:
            reply, generation, stamp = await self._run("acquire", self._acquire_args(pending))
        except StoreUnavailable:
            self._put_back(pending)
            if self._gate.policy == "allow":
                return Permit(self, -1, "", -1)
            raise BreakerOpen(None, self.name, "open") from None
        except BaseException:
            self._put_back(pending)
            raise
        return self._from_reply(reply, generation, await self._learn(reply, generation, stamp))

    def _trusted(self, known: Knowledge) -> bool:
        listener = self._listener
        subscribed = listener is not None and listener.healthy and not listener.pending()
        return known.trusted(self._gate, subscribed)

    # -- outcomes --------------------------------------------------------------

    async def _record(self, permit: Permit, outcome: str, duration_ms: int) -> None:
        """Count one outcome: in memory if it decides nothing now, else sent at once.
        Never raises into the caller: a lost record must not fail the call."""
        shared = self._shared
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
        """Send the batched successes and the counts kept in memory, if any."""
        if self.holds_counts:
            await self._send(0, "", 0, "")

    async def _send(
        self, epoch: int, outcome: str, duration_ms: int, lease: str, generation: int = -1
    ) -> None:
        """As the sync Breaker._send: an outcome whose store was switched while it
        waited for the send lock is dropped."""
        async with self._send_lock:
            pending, batch = self._take_for_send(self._gate.live)
            if outcome and not self._gate.live(generation):
                outcome = ""
            if not outcome and not batch[1] and not any(pending):
                return
            try:
                reply, generation, stamp = await self._run(
                    "record",
                    self._record_args(epoch, outcome, duration_ms, lease, pending, batch),
                    fallback=False,
                )
            except StoreUnavailable:
                return
            except Exception:
                self._put_back(pending, batch)
                log.exception("could not record an outcome of breaker %r", self.name)
                return
            await self._learn(reply, generation, stamp)

    # -- learning ----------------------------------------------------------------

    async def _run(self, operation: str, args: list[Any], *, fallback: bool = True) -> tuple[Reply, int, int]:
        shared = self._shared
        stamp = self._memory.stamp()
        raw, generation = await self._gate.run(
            operation,
            self.name,
            shared.clock_ms(),
            self._script_args(args),
            fallback=fallback,
        )
        return Reply.decode(raw), generation, stamp

    async def _learn(self, reply: Reply, generation: int, stamp: int) -> Knowledge:
        shared = self._shared
        shared.observe_clock(reply.now)
        current = self._gate.shared(generation)
        known = self._learn_reply(reply, generation, stamp, current)
        if current:
            if self._listing_due(shared.pid, self._gate.remote.ttl_ms):
                await shared.register_name(self.name)
            if reply.events:
                await shared.barrier(self.name)
                shared.transitioned(self.name, reply.events, reply.epoch, reply.now)
        if reply.events and self.on_events is not None and self._gate.live(generation):
            self.on_events(self, reply.events)
        return known

    def _key_prefix(self) -> str:
        return self._gate.remote.prefix

    def hint(self, payload: dict[str, Any]) -> bool:
        """A pushed message about this breaker; True when it was news and a batch is
        waiting. Ignored while its store is the local one (as on the sync side)."""
        if self._about_another_reporter(payload):
            return False
        return self._gate.healthy and self._memory.hint(payload) and self.holds_counts

    @property
    def store_healthy(self) -> bool:
        """Whether this breaker's scripts run on Redis now (on a cluster: on its master)."""
        return self._gate.healthy

    # -- the ways to protect a call ----------------------------------------------

    async def call(self, fn: Callable[..., Awaitable[T] | T], /, *args: Any, fallback: Any = MISSING,
                   **kwargs: Any) -> T:
        """Await fn(*args, **kwargs) behind the breaker (fn may also be a plain function).

        With ``fallback`` (a value, or a callable given the BreakerOpen or the
        exception, whose result is awaited if it is awaitable), a refused call
        or a call that failed returns the fallback instead of raising; ignored
        exceptions (and cancellation) are always re-raised.
        """
        try:
            permit = await self.acquire()
        except BreakerOpen as refused:
            if fallback is MISSING:
                raise
            return cast(T, await _fall_back(fallback, refused))
        try:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        except BaseException as exc:
            outcome = self.classify(exc)
            await permit.record(outcome)
            if outcome == "failure" and fallback is not MISSING:
                return cast(T, await _fall_back(fallback, exc))
            raise
        await permit.success()
        return cast(T, result)

    def decorate(self, fallback: Any = MISSING) -> Callable[[F], F]:
        """``@breaker.decorate(fallback=...)`` on an async function; plain ``@breaker`` has no fallback."""

        def wrap(fn: F) -> F:
            @functools.wraps(fn)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                return await self.call(fn, *args, fallback=fallback, **kwargs)

            return cast(F, wrapper)

        return wrap

    def __call__(self, fn: F) -> F:
        return self.decorate()(fn)

    async def __aenter__(self) -> Permit:
        permit = await self.acquire()
        self._permits.set((*self._permits.get(), permit))
        return permit

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        *rest, permit = self._permits.get()
        self._permits.set(tuple(rest))
        await permit.__aexit__(exc_type, exc, tb)

    # -- reading and administration ----------------------------------------------

    async def state(self) -> State:
        """The state as Redis has it now (one script call)."""
        return State((await self.snapshot())["state"])

    async def snapshot(self) -> dict[str, Any]:
        self._shared.ensure_loop()
        await self.flush_batch()
        pending = self._take_pending()
        shared = self._shared
        try:
            args = self._script_args(pending)
            raw, _ = await self._gate.run("snapshot", self.name, shared.clock_ms(), args)
        except StoreUnavailable:
            self._put_back(pending)
            raise
        return snapshot_dict(self.name, raw, self._gate.kind)

    async def force_open(self) -> None:
        await self._admin("force_open")

    async def force_closed(self) -> None:
        await self._admin("force_closed")

    async def clear_force(self) -> None:
        await self._admin("clear_force")

    async def reset(self) -> None:
        await self._admin("reset")

    async def trip(self) -> None:
        """Open now for this worker's open_seconds, then half_open as after any trip."""
        await self._admin("trip", self._lua_config)

    async def half_open(self) -> None:
        """half_open now: the next call is a probe."""
        await self._admin("half_open")

    async def hold_open(self, seconds: float) -> None:
        """As the sync Breaker.hold_open: if open, keep it open at least ``seconds``
        from now, for every worker (a service's Retry-After)."""
        await self.run_script("hold", [max(0, round(seconds * 1000))])

    async def run_script(self, operation: str, args: list[Any]) -> Reply | None:
        """As the sync Breaker.run_script, awaited."""
        self._shared.ensure_loop()
        try:
            reply, generation, stamp = await self._run(operation, args)
        except StoreUnavailable:
            return None
        await self._learn(reply, generation, stamp)
        return reply

    async def _admin(self, op: str, config: bytes | str = "") -> None:
        shared = self._shared
        shared.ensure_loop()
        await shared.register_name(self.name)
        gate, stamp = self._gate, self._memory.stamp()
        args = [config, self._memory.epoch_seen, op]
        raw = await gate.run_remote("admin", self.name, shared.clock_ms(), args)
        await self._learn(Reply.decode(raw), gate.generation, stamp)

    def __repr__(self) -> str:
        return f"<breaker_redis.asyncio.Breaker {self.name!r}>"


async def _fall_back(fallback: Any, cause: BaseException) -> Any:
    """A callable fallback is given the cause (and awaited if it returns an awaitable)."""
    if not callable(fallback):
        return fallback
    result = fallback(cause)
    return await result if inspect.isawaitable(result) else result


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

