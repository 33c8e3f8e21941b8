"""breaker_redis: one circuit breaker shared by every worker, its state in Redis.

The public names are imported at their first use (PEP 562), not by ``import
breaker_redis`` itself: pytest imports this package in every run where the
product is installed, to load the testing kit's plugin (its pytest11 entry
point), and a suite that never uses a breaker should not pay for redis-py and
the engine (about 0.3 s a run). ``from breaker_redis import Breakers`` works
as before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from breaker_redis.base.config import BreakerConfig
    from breaker_redis.base.errors import BreakerOpen
    from breaker_redis.engine.breaker import Breaker, State
    from breaker_redis.engine.breakers import Breakers
    from breaker_redis.engine.permit import Permit
    from breaker_redis.engine.transitions import Transition

__all__ = ["Breaker", "BreakerConfig", "BreakerOpen", "Breakers", "Permit", "State", "Transition"]
__version__ = "0.1.0"

# Each public name -> the module that defines it (the imports above, for the type checker).
_DEFINED_IN = {
    "BreakerConfig": "breaker_redis.base.config",
    "BreakerOpen": "breaker_redis.base.errors",
    "Breaker": "breaker_redis.engine.breaker",
    "State": "breaker_redis.engine.breaker",
    "Breakers": "breaker_redis.engine.breakers",
    "Permit": "breaker_redis.engine.permit",
    "Transition": "breaker_redis.engine.transitions",
}


def __getattr__(name: str) -> Any:
    module = _DEFINED_IN.get(name)
    if module is None:
        raise AttributeError(f"module 'breaker_redis' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # imported once: later reads find it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
