"""CircuitBreakerError: what a refused call, or the call that tripped the breaker, raises."""

from __future__ import annotations

# What a refused call says, by BreakerOpen.reason (pybreaker has only the first).
_REFUSALS = {
    "open": "Timeout not elapsed yet, circuit breaker still open",
    "half_open_full": "Trial call in progress, circuit breaker half-open",
    "forced_open": "Circuit breaker forced open",
    "bulkhead": "Too many calls in flight, circuit breaker refused the call",
}


class CircuitBreakerError(Exception):
    """The call was refused (the breaker is open), or its failure opened the breaker.

    Beyond pybreaker's: ``reason`` is BreakerOpen's reason for a refusal
    (``open``, ``half_open_full``, ``forced_open``, ``bulkhead``) or
    ``tripped`` for the call whose failure opened the breaker, and
    ``retry_after`` the seconds until the open period ends (None when unknown).
    """

    reason: str = ""
    retry_after: float | None = None


def _error(message: str, reason: str, retry_after: float | None = None) -> CircuitBreakerError:
    error = CircuitBreakerError(message)
    error.reason, error.retry_after = reason, retry_after
    return error
