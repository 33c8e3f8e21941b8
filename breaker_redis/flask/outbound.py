"""Outbound calls behind a breaker: ``FlaskBreakers.call`` and ``.outbound``.

This is ``Breaker.call`` plus one rule (``Breaker.guard``'s ``failed``): a
result with a ``status_code`` in 500-599 (a ``requests.Response`` from a
failing service) is a failure even though nothing was raised. It is not a
wrapper raising for such results, because an exception is classified by the
breaker's config (``predicate``, ``ignore_exceptions``,
``record_exceptions``): with ``record_exceptions=(requests.RequestException,)``
a 503 would count as ignored rather than as a failure, and a predicate would
be handed an exception the caller never raised. A failed result is always a
failure, whatever the config says about exceptions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from breaker_redis.engine.breaker import Breaker
from breaker_redis.engine.core import MISSING
from breaker_redis.flask.routes import DEFAULT_FAILURE_STATUSES

T = TypeVar("T")


class CallFailed(Exception):
    """Handed to an outbound call's fallback when the call returned a failed
    result (e.g. a 503 ``requests.Response``) instead of raising."""

    def __init__(self, breaker: str, result: Any) -> None:
        self.breaker = breaker
        self.result = result
        super().__init__(f"call protected by breaker {breaker!r} returned a failed result")


def guarded_call(
    breaker: Breaker, fn: Callable[..., T], /, *args: Any, fallback: Any = MISSING, **kwargs: Any
) -> T:
    """Run fn behind breaker; see ``FlaskBreakers.call``."""

    def failed(result: object) -> BaseException | None:
        status = getattr(result, "status_code", None)
        if isinstance(status, int) and status in DEFAULT_FAILURE_STATUSES:
            return CallFailed(breaker.name, result)
        return None

    return breaker.guard(fn, args, kwargs, fallback=fallback, failed=failed)
