"""breaker_redis for asyncio: the same shared breakers, awaited.

Same keys, same scripts, same rules as the sync API (docs/design.md section 2), on
redis-py's asyncio client, so the sync workers and the async workers of one
deployment share each breaker::

    from breaker_redis.asyncio import Breakers, BreakerConfig, BreakerOpen

    breakers = Breakers.from_url("redis://127.0.0.1:6379/0")
    pay = breakers.get("pay", BreakerConfig(failure_threshold=5))   # no I/O
    await pay.call(charge, order)          # or: async with pay: ...
    permit = await pay.acquire(); await permit.success()
"""

from __future__ import annotations

from breaker_redis.asyncio.breaker import Breaker, Permit
from breaker_redis.asyncio.breakers import Breakers
from breaker_redis.base.config import BreakerConfig
from breaker_redis.base.errors import BreakerOpen
from breaker_redis.engine.breaker import State
from breaker_redis.engine.transitions import Transition

__all__ = ["Breaker", "BreakerConfig", "BreakerOpen", "Breakers", "Permit", "State", "Transition"]
