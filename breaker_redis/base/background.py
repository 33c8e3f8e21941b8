"""What a process runs besides its callers' threads: the background threads of
every Breakers, and what happens once per process at fork and at exit.

Threads: the event listener (invalidation.py, sharded.py), the Sentinel
follower (failover.py), the success recorder (recorder.py) and the store
prober (store.py) each run in a ``BackgroundThread``: started by whichever
call needs it first, whatever the concurrency of first calls, started again
in a forked child (which inherits no thread), and stopped by ``close()``,
which wakes it from its wait and joins it within a deadline. Each is named
after the Breakers it serves, so a thread dump says whose it is.

Hooks: one at-fork hook (in the child) and one at-exit hook for the whole
process (``process_hooks``), registered when the first owner needs them.
Owners are held by weak reference and leave when closed, so a long-running
process that builds and closes Breakers (a CLI, a dashboard) neither piles
up hooks nor keeps closed Breakers alive.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

log = logging.getLogger("breaker_redis")

# How long close() waits for its threads to end. Each is woken at once and ends
# within milliseconds unless a Redis command of its own is under way (bounded by
# the client's socket timeout); past this, a daemon thread is left to end alone.
STOP_SECONDS = 5.0


class BackgroundThread:
    """A daemon thread of one owner: ``start()`` (any number of times, from any
    thread), ``stop(timeout)``, ``after_fork()``.

    ``target`` runs the thread's loop and returns once ``stopped()``; it waits
    with ``wait(seconds)``, which returns early when the thread is told to stop.
    ``wake`` interrupts whatever else it may be waiting on (a socket, an Event).
    """

    _start_lock: threading.Lock
    _stopping: threading.Event
    _running: bool
    _thread: threading.Thread | None

    def __init__(
        self, target: Callable[[], None], name: str, *, wake: Callable[[], None] | None = None
    ) -> None:
        self.name = name
        self._target = target
        self._wake = wake
        self.after_fork()

    def start(self) -> None:
        """Start the thread unless it runs: checked at every call, so the common case
        reads one attribute (Thread.is_alive() would cost a lock)."""
        if self._running:
            return
        with self._start_lock:
            if self._running:
                return
            self._stopping.clear()
            self._running = True
            thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            try:
                thread.start()
            except BaseException:  # no thread (interpreter shutting down): the next call tries again
                self._running = False
                raise
            self._thread = thread

    @property
    def running(self) -> bool:
        """True from start() until the target returns."""
        return self._running

    def stopped(self) -> bool:
        """Whether the thread was told to stop (its loop checks it)."""
        return self._stopping.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to seconds; True (at once) if the thread is told to stop."""
        return self._stopping.wait(seconds)

    def stop(self, timeout: float = 0.0) -> bool:
        """Tell the thread to stop and wake it; then join it for up to timeout seconds.
        Whether it has ended."""
        self._stopping.set()
        if self._wake is not None:
            try:
                self._wake()
            except Exception:  # a wake-up that failed: the thread ends at its next timeout
                log.debug("waking %s failed", self.name, exc_info=True)
        return self.join(timeout)

    def join(self, timeout: float) -> bool:
        """Wait up to timeout seconds for the thread to end (never for the calling
        thread itself). Whether it has ended."""
        thread = self._thread
        if thread is None:
            return True
        if timeout > 0 and thread is not threading.current_thread():
            thread.join(timeout)
        return not thread.is_alive()

    def _run(self) -> None:
        try:
            self._target()
        finally:
            self._running = False

    def after_fork(self) -> None:
        """The child starts with no thread of its own (and no lock or Event held by one)."""
        self._start_lock = threading.Lock()
        self._stopping = threading.Event()
        self._running = False
        self._thread = None


class LoopTask:
    """The asyncio side's BackgroundThread: one owner's task on the running event loop
    (the event subscription's keeper, the Sentinel follower). ``start()`` creates it
    unless it runs; ``forget()`` lets go of it untouched (a new loop or a forked child:
    it went with the old loop); ``stop()`` cancels it and waits until it is done."""

    def __init__(self, target: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._target = target
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._target())

    def forget(self) -> None:
        self._task = None

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancelled(task)


async def cancelled(task: asyncio.Task[Any] | None, timeout: float = STOP_SECONDS) -> bool:
    """Cancel an event loop's background task (the asyncio side's prober, subscription
    keeper, batch sender) and wait until it has ended, whatever it raised, for timeout
    seconds at most: a task that swallowed its cancellation is left to end alone, as a
    thread is past STOP_SECONDS. Whether it has ended. A cancellation of the caller
    itself is not swallowed here: it ends the wait and reaches the caller."""
    if task is None or task.done():
        return True
    task.cancel()
    await asyncio.wait([task], timeout=timeout)
    if not task.done():
        log.warning("%r did not end within %.1fs of its cancellation; left to end alone", task, timeout)
        return False
    if not task.cancelled():
        task.exception()  # retrieved: asyncio does not log it as never retrieved
    return True


def stop_all(threads: Iterable[BackgroundThread], timeout: float = STOP_SECONDS) -> bool:
    """Stop every thread, waiting for them together up to timeout seconds in all
    (all are told first, so each ends while the others are waited for). Whether all ended."""
    threads = list(threads)
    for thread in threads:
        thread.stop()
    deadline = time.monotonic() + timeout
    return all([thread.join(max(0.0, deadline - time.monotonic())) for thread in threads])


def thread_name(job: str, prefix: str, where: str) -> str:
    """``breaker-redis-<job> '<prefix>' at <where>``: whose a thread is, in a thread dump."""
    return f"breaker-redis-{job} {prefix!r} at {where}"


class _Owner:
    """One registered owner: its weak reference and the hooks it asked for, as the
    functions behind its bound methods (a WeakMethod per hook would do the same,
    but its own callback fails with AttributeError, printed at interpreter exit,
    when the WeakMethod goes before its owner, as a closed owner's entry does)."""

    __slots__ = ("after_fork", "at_exit", "ref")

    def __init__(
        self,
        ref: weakref.ReferenceType[Any],
        after_fork: Callable[[Any], None] | None,
        at_exit: Callable[[Any], None] | None,
    ) -> None:
        self.ref = ref
        self.after_fork = after_fork
        self.at_exit = at_exit


class ProcessHooks:
    """The owners (Breakers, breaker groups) whose state a forked child must reset and
    whose batched counts must reach Redis at exit, under one at-fork and one at-exit
    hook for the process.

    ``add(owner, after_fork=owner.m, at_exit=owner.n)`` takes bound methods of the
    owner and keeps them without keeping the owner alive; ``discard(owner)`` (its
    close) removes it. The hooks call each owner's method in the order owners were
    added; one that raises is logged and the others still run.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owners: dict[int, _Owner] = {}
        self._installed = False

    def add(
        self,
        owner: object,
        *,
        after_fork: Callable[[], None] | None = None,
        at_exit: Callable[[], None] | None = None,
    ) -> None:
        key = id(owner)

        def gone(ref: weakref.ReferenceType[Any], owners: dict[int, _Owner] = self._owners) -> None:
            held = owners.get(key)
            if held is not None and held.ref is ref:
                owners.pop(key, None)

        entry = _Owner(weakref.ref(owner, gone), _unbound(owner, after_fork), _unbound(owner, at_exit))
        with self._lock:
            self._owners[key] = entry
            if not self._installed:
                self._installed = True
                os.register_at_fork(after_in_child=self._after_fork_in_child)
                atexit.register(self._at_exit)

    def discard(self, owner: object) -> None:
        with self._lock:
            held = self._owners.get(id(owner))
            if held is not None and held.ref() is owner:
                del self._owners[id(owner)]

    def __contains__(self, owner: object) -> bool:
        held = self._owners.get(id(owner))
        return held is not None and held.ref() is owner

    def __len__(self) -> int:
        """The live owners (a test's view: closed and collected ones are not counted)."""
        return sum(1 for held in self._held() if held.ref() is not None)

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # another thread of the parent may have held it
        self._call("after_fork")

    def _at_exit(self) -> None:
        self._call("at_exit")

    def _held(self) -> list[_Owner]:
        """The entries, copied in one step: a collected owner's weakref callback may
        remove its entry at any allocation, which would break an iteration."""
        return list(self._owners.copy().values())

    def _call(self, hook: str) -> None:
        for held in self._held():
            function, owner = getattr(held, hook), held.ref()
            if function is None or owner is None:
                continue
            try:
                function(owner)
            except Exception:
                log.exception("the %s hook of %r failed", hook, owner)


def _unbound(owner: object, method: Callable[[], None] | None) -> Callable[[Any], None] | None:
    """The function behind a bound method of owner (kept without keeping owner alive)."""
    if method is None:
        return None
    if getattr(method, "__self__", None) is not owner:
        raise TypeError(f"process_hooks.add takes bound methods of the owner, got {method!r}")
    function: Callable[[Any], None] = method.__func__  # type: ignore[attr-defined]
    return function


process_hooks = ProcessHooks()
