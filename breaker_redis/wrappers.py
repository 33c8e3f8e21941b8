"""The ways to protect a call, written once on top of acquire() and a Permit."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

from .errors import BreakerOpen
from .permit import Permit

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

_MISSING: Any = object()


class Protects:
    """call(), @decorator and ``with``: a mixin for anything with acquire() and classify()."""

    _local_permits: threading.local

    def acquire(self) -> Permit:
        raise NotImplementedError

    def classify(self, exc: BaseException) -> str:
        raise NotImplementedError

    def call(self, fn: Callable[..., T], /, *args: Any, fallback: Any = _MISSING, **kwargs: Any) -> T:
        """Run fn behind the breaker.

        With ``fallback`` (a value, or a callable given the BreakerOpen or the
        exception), a refused call or a call that failed returns the fallback
        instead of raising; ignored exceptions are always re-raised.
        """
        try:
            permit = self.acquire()
        except BreakerOpen as refused:
            if fallback is _MISSING:
                raise
            return cast(T, fallback(refused) if callable(fallback) else fallback)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            outcome = self.classify(exc)
            permit.record(outcome)
            if outcome == "failure" and fallback is not _MISSING:
                return cast(T, fallback(exc) if callable(fallback) else fallback)
            raise
        permit.success()
        return result

    def decorate(self, fallback: Any = _MISSING) -> Callable[[F], F]:
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
