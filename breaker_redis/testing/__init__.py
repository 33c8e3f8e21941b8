"""A testing kit for code that uses breakers: a clock a test moves, an in-process store,
and a breaker forced open or closed for the span of a block (docs/testing.md).

A breaker's time is the Redis server's (``TIME`` inside every script), which
freezegun and the like cannot move. A ``Breakers`` given a clock passes its
reading to every script as ``now_ms`` instead, and decides from memory by it
too (docs/design.md, section 2, "Time and epochs"): ``ManualClock`` is such a
clock, moved only by ``advance``. ``Breakers.from_url("memory://")`` runs the
same Lua scripts on a fresh store inside the test's process.

The pytest fixtures ``breaker_clock`` and ``memory_breakers`` come from
``breaker_redis.testing.pytest_plugin``, which installing the product
registers with pytest; this package never imports pytest.
"""

from __future__ import annotations

from breaker_redis.testing.clock import ManualClock
from breaker_redis.testing.forces import forced_closed, forced_open

__all__ = ["ManualClock", "forced_closed", "forced_open"]
