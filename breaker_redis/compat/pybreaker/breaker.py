"""CircuitBreaker: pybreaker's arguments and calls over a breaker_redis breaker.

What it knows of its breaker (binding, state, listeners, exclusions) is in
tracking.py; the asyncio and tornado paths, which record off the event loop, in
awaiting.py.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import types
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Any, TypeVar, cast

from breaker_redis.base.errors import BreakerOpen
from breaker_redis.compat.pybreaker.awaiting import call_tornado, settled_when_awaited
from breaker_redis.compat.pybreaker.errors import _REFUSALS, _error
from breaker_redis.compat.pybreaker.fail_counter import _fail_counter_op
from breaker_redis.compat.pybreaker.patched import package
from breaker_redis.compat.pybreaker.registry import _Capture
from breaker_redis.compat.pybreaker.settings import _OPTIONS, _config, _run_op, _Setting
from breaker_redis.compat.pybreaker.states import STATE_CLOSED
from breaker_redis.compat.pybreaker.storages import (
    CircuitBreakerStorage,
    CircuitMemoryStorage,
    _BreakersStorage,
    _DefaultStorage,
)
from breaker_redis.compat.pybreaker.stores import _redis_configured, _warn_once
from breaker_redis.compat.pybreaker.tracking import _Listener, _Tracking
from breaker_redis.engine.breakers import Breakers
from breaker_redis.engine.permit import Permit
from breaker_redis.engine.transitions import Transition

T = TypeVar("T")


def _calling_block() -> None:
    """The body of ``with cb.calling():``, as listeners' before_call receive it."""


class CircuitBreaker(_Tracking):
    """pybreaker's CircuitBreaker over a breaker_redis breaker.

    The name picks the breaker: CircuitBreakers of the same name on the same
    store are one breaker, in one process or in many. Without a
    ``state_storage``, a named breaker lives in the Redis of ``configure()`` /
    ``BREAKER_REDIS_URL`` (this process when neither is set) and an unnamed
    one in this process, like pybreaker's default memory storage.

    Beyond pybreaker's arguments: ``breakers=`` (a Breakers to live in) and any
    BreakerConfig field not set from pybreaker's own (``probe_timeout_seconds``,
    ``open_backoff``, ``half_open_max_calls``, ``slow_call_seconds``, ``mode`` ...).
    Calls are not serialised (pybreaker holds a lock around each call); the
    listeners of one CircuitBreaker are called one at a time, as pybreaker's are.
    """

    def __init__(
        self,
        fail_max: int = 5,
        reset_timeout: float = 60,
        success_threshold: int = 1,
        exclude: Iterable[type[BaseException] | Callable[[Any], bool]] | None = None,
        listeners: Sequence[_Listener] | None = None,
        state_storage: CircuitBreakerStorage | None = None,
        name: str | None = None,
        throw_new_error_on_trip: bool = True,
        *,
        breakers: Breakers | None = None,
        **options: Any,
    ) -> None:
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise TypeError(
                f"CircuitBreaker() got unexpected keyword argument(s) {', '.join(unknown)} "
                f"(BreakerConfig fields it accepts: {', '.join(sorted(_OPTIONS))})"
            )
        if breakers is not None and state_storage is not None:
            raise TypeError("CircuitBreaker() takes state_storage= or breakers=, not both")
        self._lock = threading.RLock()
        self._fail_max = fail_max
        self._reset_timeout = reset_timeout
        self._success_threshold = success_threshold
        self._options = dict(options)
        _config(fail_max, reset_timeout, success_threshold, self._options)
        self._excluded_exceptions = list(exclude or [])
        self._listeners = list(listeners or [])
        self._name = name
        self._label = name or None  # picks the breaker; the name setter does not move it
        self._throw_new_error_on_trip = throw_new_error_on_trip
        if state_storage is None:
            if breakers is not None:
                state_storage = _BreakersStorage(breakers)
            elif self._label is not None:
                state_storage = _DefaultStorage()
            else:
                if _redis_configured():
                    _warn_once(
                        "unnamed",
                        "a CircuitBreaker without a name keeps its "
                        "state in this process; give it name= to share it through Redis",
                    )
                state_storage = CircuitMemoryStorage(STATE_CLOSED)
        if not isinstance(state_storage, CircuitBreakerStorage):
            raise TypeError(
                f"state_storage must be a breaker_redis.compat.pybreaker storage (got {state_storage!r}): "
                "pybreaker's own storage objects keep pybreaker's keys, which breaker_redis does not read"
            )
        self._state_storage = state_storage
        self._binding = None
        self._state = None
        self._seen_epoch = 0
        self._incarnation = None
        if state_storage._eager:
            self._bind()

    # -- settings ---------------------------------------------------------------

    fail_max = _Setting[int](
        "Applies to this process's breaker of that name (each worker applies its own "
        "threshold to the shared state, as in breaker_redis)."
    )
    reset_timeout = _Setting[float]("Applies from the next time the breaker opens.")
    success_threshold = _Setting[int]("Trial calls that must succeed in a row to close it.")

    @property
    def name(self) -> str | None:
        return self._name

    @name.setter
    def name(self, name: str) -> None:
        """A label, as in pybreaker: the breaker chosen by the name given when built stays."""
        self._name = name

    # -- calls ----------------------------------------------------------------

    def call(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call func behind the breaker. A generator's outcome is recorded when it
        finishes, a coroutine's when it is awaited to the end."""
        permit = self._admit(func, args, kwargs)
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            self._settle(permit, exc)
            raise
        if isinstance(result, types.GeneratorType):
            return cast(T, self._generator(permit, result))
        if inspect.iscoroutine(result):
            return cast(T, settled_when_awaited(self, permit, result))
        self._settle(permit)
        return result

    def _admit(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Permit:
        """A permit for one call, or CircuitBreakerError; then the before_call listeners."""
        binding = self._bind()
        permit: Permit | None = None
        refused: BreakerOpen | None = None
        with _Capture(binding.key) as transitions:
            try:
                permit = binding.breaker.acquire()
            except BreakerOpen as exc:
                refused = exc
        try:
            self._after(binding, transitions)
            self._notice(binding, permit)
            if permit is not None:
                self._dispatch("before_call", func, *args, **kwargs)
        except BaseException:
            if permit is not None:
                permit.ignore()
            raise
        if permit is None:
            assert refused is not None
            message = _REFUSALS.get(refused.reason, _REFUSALS["open"])
            raise _error(message, refused.reason, refused.retry_after)
        return permit

    def _settle(self, permit: Permit, exc: BaseException | None = None) -> None:
        """Record a call's outcome (exc: what it raised, None for a return) and tell
        the listeners, all in the calling thread (a coroutine's: off the event loop,
        awaiting.settle_off_loop). Raises the CircuitBreakerError of the call that
        tripped the breaker."""
        outcome = self._outcome(exc)
        self._tell(outcome, exc, self._record(permit, outcome))

    def _outcome(self, exc: BaseException | None) -> str:
        """An excluded exception is a success, as in pybreaker. A BaseException that
        is not an Exception (KeyboardInterrupt, GeneratorExit, cancellation) is
        neither: it says nothing about the service."""
        if exc is None:
            return "success"
        if not isinstance(exc, Exception):
            return "ignored"
        return "failure" if self.is_system_error(exc) else "success"

    def _record(self, permit: Permit, outcome: str) -> list[Transition]:
        """Record the permit's outcome (the script call, and pybreaker's failure count
        after a trial call): the transitions it made, for the listeners."""
        if outcome == "ignored":
            permit.ignore()
            return []
        binding = self._bind()
        with _Capture(binding.key) as transitions:
            permit.record(outcome)
        if outcome == "success" and permit.probe:
            _fail_counter_op(binding, "set", 0)  # pybreaker: a success resets the failure count
        return transitions

    def _tell(self, outcome: str, exc: BaseException | None, transitions: list[Transition]) -> None:
        """The listeners hear of a recorded outcome in pybreaker's order; then the
        call that tripped the breaker raises CircuitBreakerError, caused by exc."""
        if outcome == "ignored":
            return
        binding = self._bind()
        if outcome == "success":
            self._after(binding, transitions)
            self._dispatch("success")
            return
        self._dispatch("failure", exc)
        self._after(binding, transitions)
        tripped = next((t for t in transitions if t.new == "open" and t.old in ("closed", "half_open")), None)
        if tripped is None or not self._throw_new_error_on_trip or exc is None:
            return
        if tripped.old == "closed":
            error = _error("Failures threshold reached, circuit breaker opened", "tripped")
        else:
            error = _error("Trial call failed, circuit breaker opened", "tripped")
        raise error.with_traceback(exc.__traceback__) from exc

    @contextlib.contextmanager
    def _settling(self, permit: Permit) -> Iterator[None]:
        """The block is the permit's call: its outcome is recorded when it ends."""
        try:
            yield
        except BaseException as exc:
            self._settle(permit, exc)
            raise
        self._settle(permit)

    def _generator(self, permit: Permit, generator: Generator[Any, Any, Any]) -> Generator[Any, Any, Any]:
        with self._settling(permit):
            return (yield from generator)

    @contextlib.contextmanager
    def calling(self) -> Iterator[None]:
        """``with cb.calling(): ...``: the block is the protected call."""
        with self._settling(self._admit(_calling_block, (), {})):
            yield

    def call_async(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call a tornado coroutine behind the breaker (pybreaker's; a tornado Future).

        The decision may ask Redis synchronously, as pybreaker's storage does; the
        outcome is recorded off the event loop (awaiting.settle_off_loop). asyncio code
        has breaker_redis.asyncio.
        """
        if not package().HAS_TORNADO_SUPPORT:  # the package's: tests patch it there
            raise ImportError("No module named tornado")
        return call_tornado(self, func, args, kwargs)

    def __call__(self, *call_args: Any, **call_kwargs: bool) -> Callable[..., Any]:
        """``@cb`` (or ``@cb(__pybreaker_call_async=True)`` for tornado coroutines).
        An ``async def`` function stays one, its outcome recorded when awaited."""
        call_async = call_kwargs.pop("__pybreaker_call_async", False)
        if call_async and not package().HAS_TORNADO_SUPPORT:
            raise ImportError("No module named tornado")

        def outer(func: Callable[..., Any]) -> Callable[..., Any]:
            if inspect.iscoroutinefunction(func) and not call_async:

                @functools.wraps(func)
                async def protected(*args: Any, **kwargs: Any) -> Any:
                    return await self.call(func, *args, **kwargs)

                return protected

            @functools.wraps(func)
            def inner(*args: Any, **kwargs: Any) -> Any:
                if call_async:
                    return self.call_async(func, *args, **kwargs)
                return self.call(func, *args, **kwargs)

            return inner

        if call_args:
            return outer(*call_args)
        return outer

    # -- by hand ----------------------------------------------------------------

    def open(self) -> bool:
        """Open the breaker for ``reset_timeout`` (every process sees it), then half-open.
        Returns ``throw_new_error_on_trip``, as pybreaker's."""
        self._by_hand("open")
        return self._throw_new_error_on_trip

    def half_open(self) -> None:
        """Half-open the breaker: the next call is a trial call."""
        self._by_hand("half_open")

    def close(self) -> None:
        """Close the breaker (breaker_redis's reset: a clean window, no backoff, no force)."""
        binding = self._bind()
        with _Capture(binding.key) as transitions:
            binding.breaker.reset()
        self._after(binding, transitions)

    def _by_hand(self, op: str) -> None:
        binding = self._bind()
        snapshot = binding.breaker.snapshot()
        if snapshot["state"] == "closed":  # pybreaker keeps the failure count across open()
            _fail_counter_op(binding, "set", int(snapshot["consecutive_failures"]))
        with _Capture(binding.key) as transitions:
            _run_op(binding, op)
        self._after(binding, transitions)

    def __repr__(self) -> str:
        return f"<CircuitBreaker {self._name!r}>"
