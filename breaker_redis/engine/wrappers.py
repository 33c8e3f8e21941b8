"""The ways to protect a call (call, @decorator, ``with``), on top of acquire() and a Permit.

``Wraps`` holds what the sync and the asyncio Breaker share: what a refusal
or a failure answers with a fallback, the decorator, the permits of open
``with`` blocks. ``Protects`` adds the sync side's running of the call; the
asyncio Breaker's awaits the call, its fallback and the permit's record, so
it writes those few lines again with ``await`` (asyncio/breaker.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar, cast

from breaker_redis.base.errors import BreakerOpen
from breaker_redis.engine.permit import Permit

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
H = TypeVar("H")

MISSING: Any = object()  # no fallback given

# (breaker, permit) of each open ``with`` / ``async with`` block, innermost last: a
# context variable, so each thread and each task has its own
_HELD: ContextVar[tuple[tuple[object, Any], ...]] = ContextVar("breaker_redis_held", default=())


class Wraps:
    """What both sides' call(), @decorator and ``with`` share."""

    def classify(self, exc: BaseException) -> str:
        raise NotImplementedError

    @staticmethod
    def _answer_refusal(refused: BreakerOpen, fallback: Any) -> Any:
        """The fallback's answer to a refused call, or the refusal raised."""
        if fallback is MISSING:
            raise refused
        return _fall_back(fallback, refused)

    @staticmethod
    def _answer_raised(outcome: str, exc: BaseException, fallback: Any) -> Any:
        """After a call that raised was recorded as ``outcome``: the fallback's answer
        to a failure, else exc raised again (ignored exceptions always are)."""
        if outcome == "failure" and fallback is not MISSING:
            return _fall_back(fallback, exc)
        raise exc

    def _wrapper(self, fn: Callable[..., Any], fallback: Any) -> Callable[..., Any]:
        """fn behind the breaker, as the decorator returns it (each side's)."""
        raise NotImplementedError

    def decorate(self, fallback: Any = MISSING) -> Callable[[F], F]:
        """``@breaker.decorate(fallback=...)``; plain ``@breaker`` has no fallback."""

        def wrap(fn: F) -> F:
            return cast(F, functools.wraps(fn)(self._wrapper(fn, fallback)))

        return wrap

    def __call__(self, fn: F) -> F:
        return self.decorate()(fn)

    def _hold(self, permit: H) -> H:
        """Entering a ``with`` block: its permit, until _release()."""
        _HELD.set((*_HELD.get(), (self, permit)))
        return permit

    def _release(self) -> Any:
        """Leaving a ``with`` block: the permit of this breaker's innermost one."""
        held = _HELD.get()
        at = max(i for i, (breaker, _) in enumerate(held) if breaker is self)
        _HELD.set(held[:at] + held[at + 1 :])
        return held[at][1]


class Protects(Wraps):
    """call(), @decorator and ``with`` on the sync side: a mixin for anything with
    acquire(), classify() and call()."""

    def acquire(self) -> Permit:
        raise NotImplementedError

    def call(self, fn: Callable[..., T], /, *args: Any, fallback: Any = MISSING, **kwargs: Any) -> T:
        raise NotImplementedError

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

    def _wrapper(self, fn: Callable[..., Any], fallback: Any) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:  # (the asyncio side's is a coroutine function)
            return self.call(fn, *args, fallback=fallback, **kwargs)

        return wrapper

    def __enter__(self) -> Permit:
        return self._hold(self.acquire())

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        permit: Permit = self._release()
        permit.__exit__(exc_type, exc, tb)


def _fall_back(fallback: Any, cause: BaseException) -> Any:
    """A callable fallback is given the cause; any other value is the answer."""
    return fallback(cause) if callable(fallback) else fallback
