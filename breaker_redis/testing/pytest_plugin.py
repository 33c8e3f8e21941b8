"""breaker_redis's pytest plugin: the fixtures ``breaker_clock`` and ``memory_breakers``.

Installing the product registers it under pytest's ``pytest11`` entry point,
named as this module, so that ``-p breaker_redis.testing.pytest_plugin`` (or
``pytest_plugins = [...]``) names the same plugin and never registers it
twice; ``-p no:breaker_redis.testing.pytest_plugin`` turns it off. It only
defines fixtures, and imports the engine only when a test asks for one: a run
that never does pays for this module alone (breaker_redis/__init__.py imports
its public names at their first use for the same reason).
Each test gets its own clock and its own store, and the Breakers is closed
after the test, so nothing a test does reaches the next one (docs/testing.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from breaker_redis.testing.clock import ManualClock

if TYPE_CHECKING:
    from breaker_redis.engine.breakers import Breakers


@pytest.fixture
def breaker_clock() -> ManualClock:
    """A ManualClock of this test's own: ``breaker_clock.advance(seconds)`` moves the breakers' time."""
    return ManualClock()


@pytest.fixture
def memory_breakers(breaker_clock: ManualClock) -> Iterator[Breakers]:
    """A Breakers on a fresh in-process store (``memory://``), on ``breaker_clock``, closed after the test."""
    from breaker_redis.engine.breakers import Breakers  # here: a run that never asks pays nothing for it

    breakers = Breakers.from_url("memory://", clock=breaker_clock)
    yield breakers
    breakers.close()
