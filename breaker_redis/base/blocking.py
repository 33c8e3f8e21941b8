"""``run_sync``: how the sync side runs a sequence written once for both sides.

The product's one way to share a sequence of calls between its sync and
asyncio sides (engine/steps.py says why this way): the sequence is an
``async def`` whose I/O goes through small methods each side provides. The
asyncio side awaits it; the sync side's methods are ``async`` in form only
(they make the blocking call and return, never suspending), and it runs the
whole sequence here with one ``send(None)``. It lives in the base layer:
the stores and the engine both write such sequences.

A sequence whose I/O is a plain call of the side's client (a function, not
a method of the side) takes it as ``io(function, *args)``: ``blocking`` on
the sync side, ``awaited`` on the asyncio one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar, cast

T = TypeVar("T")


def run_sync(step: Coroutine[Any, Any, T]) -> T:
    """Run a step whose I/O never suspends (the sync side's) to its end."""
    try:
        step.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    step.close()
    raise RuntimeError("a sync breaker step suspended: its I/O must not await")


async def blocking(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """The sync side's ``io``: the call made, never suspending."""
    return function(*args, **kwargs)


async def awaited(function: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """The asyncio side's ``io``: the call awaited."""
    return await function(*args, **kwargs)
