"""The ways to protect a call, written once on top of acquire() and a Permit."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

from breaker_redis.engine.errors import BreakerOpen
from breaker_redis.engine.permit import Permit

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

MISSING: Any = object()  # no fallback given


class Protects:
    """call(), @decorator and ``with``: a mixin for anything with acquire() and classify()."""

    _local_permits: threading.local

    def acquire(self) -> Permit:
        raise NotImplementedError

    def classify(self, exc: BaseException) -> str:
        raise NotImplementedError

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
        marks a returned result as a failure (the fallback gets that exception)."""
        try:
            permit = self.acquire()
        except BreakerOpen as refused:
            return cast(T, self._answer_refusal(refused, fallback))
        return self._run_admitted(permit, fn, args, kwargs, fallback, failed)

    @staticmethod
    def _answer_refusal(refused: BreakerOpen, fallback: Any) -> Any:
        """The fallback's answer to a refused call, or the refusal raised."""
        if fallback is MISSING:
            raise refused
        return _fall_back(fallback, refused)

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
        if outcome == "failure" and fallback is not MISSING:
            return _fall_back(fallback, exc)
        raise exc

    @staticmethod
    def _settle_failed_result(permit: Permit, result: T, cause: BaseException, fallback: Any) -> T:
        """Record a call whose result ``failed()`` judged a failure: the result, or the fallback's answer."""
        permit.failure()
        return result if fallback is MISSING else cast(T, _fall_back(fallback, cause))

    def decorate(self, fallback: Any = MISSING) -> Callable[[F], F]:
        """``@breaker.decorate(fallback=...)``; plain ``@breaker`` has no fallback."""

        def wrap(fn: F) -> F:
            @functools.wraps(fn)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return self.call(fn, *args, fallback=fallback, **kwargs)

            return cast(F, wrapper)

        return wrap

    def __call__(self, fn: F) -> F:
        return self.decorate()(fn)

    def __enter__(self) -> Permit:
        permit = self.acquire()
        stack = getattr(self._local_permits, "stack", None)
        if stack is None:
            stack = self._local_permits.stack = []
        stack.append(permit)
        return permit

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        permit: Permit = self._local_permits.stack.pop()
        permit.__exit__(exc_type, exc, tb)


def _fall_back(fallback: Any, cause: BaseException) -> Any:
    """A callable fallback is given the cause; any other value is the answer."""
    return fallback(cause) if callable(fallback) else fallback
