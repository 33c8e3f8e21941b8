"""breaker_redis: one circuit breaker shared by every worker, its state in Redis."""

from __future__ import annotations

from .breaker import Breaker, State
from .breakers import Breakers
from .config import BreakerConfig
from .errors import BreakerOpen
from .permit import Permit
from .transitions import Transition

__all__ = ["Breaker", "BreakerConfig", "BreakerOpen", "Breakers", "Permit", "State", "Transition"]
__version__ = "0.1.0"
