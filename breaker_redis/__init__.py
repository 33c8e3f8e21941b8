"""breaker_redis: one circuit breaker shared by every worker, its state in Redis."""

from __future__ import annotations

from breaker_redis.base.config import BreakerConfig
from breaker_redis.base.errors import BreakerOpen
from breaker_redis.engine.breaker import Breaker, State
from breaker_redis.engine.breakers import Breakers
from breaker_redis.engine.permit import Permit
from breaker_redis.engine.transitions import Transition

__all__ = ["Breaker", "BreakerConfig", "BreakerOpen", "Breakers", "Permit", "State", "Transition"]
__version__ = "0.1.0"
