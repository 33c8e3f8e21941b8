"""breaker_redis: one circuit breaker shared by every worker, its state in Redis."""

from __future__ import annotations

from .breaker import Breaker, Breakers, Permit, State
from .config import BreakerConfig
from .errors import BreakerOpen

__all__ = ["Breaker", "BreakerConfig", "BreakerOpen", "Breakers", "Permit", "State"]
__version__ = "0.1.0"
