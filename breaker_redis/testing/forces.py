"""A breaker forced open or closed for the span of a ``with`` block, and no longer.

A force is the operator's switch (docs/design.md, section 2, "States and
forces"): it holds for every worker until cleared, so a test that forces a
breaker and fails before clearing it would leave the force to the tests
after it on the same Redis. These helpers clear it however the block ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar


class Forceable(Protocol):
    """What of a Breaker these helpers use (breaker_redis.engine.steps)."""

    def force_open(self) -> Any: ...

    def force_closed(self) -> Any: ...

    def clear_force(self) -> Any: ...


B = TypeVar("B", bound=Forceable)


def forced_open(breaker: B) -> contextlib.AbstractContextManager[B]:
    """``with forced_open(pay):`` every call of ``pay`` is refused (reason ``forced_open``)
    in the block; after it, ``pay`` is closed with a clean window (``clear_force``)."""
    return _forced(breaker, breaker.force_open)


def forced_closed(breaker: B) -> contextlib.AbstractContextManager[B]:
    """``with forced_closed(pay):`` every call of ``pay`` is admitted and nothing trips it
    in the block; after it, ``pay`` is closed with a clean window (``clear_force``)."""
    return _forced(breaker, breaker.force_closed)


@contextlib.contextmanager
def _forced(breaker: B, force: Callable[[], Any]) -> Iterator[B]:
    force()
    try:
        yield breaker
    finally:
        breaker.clear_force()
