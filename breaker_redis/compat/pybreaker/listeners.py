"""CircuitBreakerListener: pybreaker's hooks into a CircuitBreaker's events."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from breaker_redis.compat.pybreaker.breaker import CircuitBreaker
    from breaker_redis.compat.pybreaker.states import CircuitBreakerState


class CircuitBreakerListener:
    """Plug code into a CircuitBreaker's events, as in pybreaker.

    ``state_change`` is called for every transition made by a call of this
    process (once, to every CircuitBreaker of that breaker here), and when a
    CircuitBreaker notices, at a call or a state read, a change made elsewhere.
    """

    def before_call(self, cb: CircuitBreaker, func: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Called before the circuit breaker ``cb`` calls ``func`` (not for a refused call)."""

    def failure(self, cb: CircuitBreaker, exc: BaseException) -> None:
        """Called when a function called by the circuit breaker ``cb`` fails."""

    def success(self, cb: CircuitBreaker) -> None:
        """Called when a function called by ``cb`` succeeds (or raises an excluded exception)."""

    def state_change(
        self, cb: CircuitBreaker, old_state: CircuitBreakerState | None, new_state: CircuitBreakerState
    ) -> None:
        """Called when the state of the circuit breaker ``cb`` changes."""
