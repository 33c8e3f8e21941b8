"""A CircuitBreaker's breaker (``_Binding``): what the modules here pass around
to reach it. Its own module, below the others, so that each can name it
without importing the registry or the tracking that hold bindings.
"""

from __future__ import annotations

from dataclasses import dataclass

from breaker_redis.engine.breaker import Breaker
from breaker_redis.engine.breakers import Breakers


@dataclass(frozen=True)
class _Binding:
    """A CircuitBreaker's breaker: the Breakers it lives in, and the breaker."""

    breakers: Breakers
    breaker: Breaker

    @property
    def key(self) -> tuple[int, str]:
        return (id(self.breakers), self.breaker.name)
