"""The outcome of a coroutine (asyncio's, or tornado's through ``call_async``),
recorded when it is awaited to the end, without blocking the event loop.

The record may wait on Redis, so it runs in a worker thread; the exclusions and
the listeners run in the loop's thread, as a sync call's run in its caller's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Protocol, TypeVar

from breaker_redis.engine.permit import Permit
from breaker_redis.engine.transitions import Transition

T = TypeVar("T")


class _Calls(Protocol):
    """What the coroutines' paths use of a CircuitBreaker (breaker.py, which imports this module)."""

    def _admit(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Permit: ...
    def _outcome(self, exc: BaseException | None) -> str: ...
    def _record(self, permit: Permit, outcome: str) -> list[Transition]: ...
    def _tell(self, outcome: str, exc: BaseException | None, transitions: list[Transition]) -> None: ...


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def settle_off_loop(cb: _Calls, permit: Permit, exc: BaseException | None) -> None:
    """CircuitBreaker._settle for a coroutine, the record in a worker thread. Recorded
    in the loop's thread instead: a GeneratorExit (the coroutine closed unfinished:
    it cannot wait), a KeyboardInterrupt or SystemExit (the process is going away),
    and a coroutine not run by asyncio (no loop to hand the thread's result back to)."""
    outcome = cb._outcome(exc)
    if (exc is None or isinstance(exc, (Exception, asyncio.CancelledError))) and _on_asyncio():
        transitions = await asyncio.to_thread(cb._record, permit, outcome)
    else:
        transitions = cb._record(permit, outcome)
    cb._tell(outcome, exc, transitions)


async def settled_when_awaited(cb: _Calls, permit: Permit, awaitable: Awaitable[T]) -> T:
    """The awaitable's result; its outcome recorded for the permit when it ends."""
    try:
        result = await awaitable
    except BaseException as exc:
        await settle_off_loop(cb, permit, exc)
        raise
    await settle_off_loop(cb, permit, None)
    return result


def call_tornado(cb: _Calls, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """CircuitBreaker.call_async: admitted (or refused) at once, as pybreaker's
    tornado coroutine is; the call and its record run as an asyncio task, which
    tornado's runner awaits."""
    from tornado import gen

    async def calling() -> Any:
        return await func(*args, **kwargs)

    def wrapped() -> Generator[Any, Any, Any]:
        permit = cb._admit(func, args, kwargs)
        return (yield settled_when_awaited(cb, permit, calling()))

    return gen.coroutine(wrapped)()
