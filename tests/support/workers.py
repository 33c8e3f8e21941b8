"""Helpers shared by the tests that run several workers (each its own Breakers)."""

from __future__ import annotations

import inspect
from typing import Any

from breaker_redis import BreakerConfig, BreakerOpen, Breakers
from tests.support.redis_server import wait_until

TRIP_AT_3 = BreakerConfig(trip="consecutive", failure_threshold=3, open_seconds=30)
TRIP_AT_5 = BreakerConfig(trip="consecutive", failure_threshold=5, open_seconds=30)
RATE = BreakerConfig(trip="rate", failure_rate=0.5, minimum_calls=20, window_seconds=60, open_seconds=30)


def subscribed(workers: list[Breakers]) -> None:
    """Start each worker's listener (it starts at first use) and wait until it listens."""
    for w in workers:
        w.ensure_process()
        wait_until(lambda w=w: w.invalidator is not None and w.invalidator.healthy, what="the subscription")


def admits(breaker: Any) -> bool:
    try:
        breaker.acquire().ignore()
        return True
    except BreakerOpen:
        return False


async def admitted(breaker: Any) -> bool:
    """admits() for an asyncio breaker."""
    try:
        await (await breaker.acquire()).ignore()
        return True
    except BreakerOpen:
        return False


def fail(breaker: Any, n: int = 1) -> None:
    for _ in range(n):
        breaker.acquire().failure()


def snapshot(url: str, name: str, config: BreakerConfig) -> dict[str, Any]:
    """A snapshot read by a process of its own (no batch, no subscription)."""
    breakers = Breakers.from_url(url, listen=False)
    try:
        return breakers.get(name, config).snapshot()
    finally:
        breakers.close()


def trips_at_3(breaker: Any) -> dict[str, Any]:
    """A success, then 3 failures trip a TRIP_AT_3 breaker: the next call is refused
    (reason open). Returns the snapshot after the trip."""
    import pytest

    breaker.acquire().success()
    fail(breaker, 3)
    with pytest.raises(BreakerOpen) as info:
        breaker.acquire()
    assert info.value.reason == "open"
    return dict(breaker.snapshot())


def counting(workers: list[Any]) -> list[dict[str, int]]:
    """Count each worker's script calls by script: its runner's ``run`` (sync, or asyncio's
    coroutine) wrapped once, the real call still made. On Redis Cluster every master's gate
    runs the Breakers' one runner, so every call is counted."""
    counts = []
    for w in workers:
        runner = w.gate.remote
        count: dict[str, int] | None = getattr(runner, "counted", None)
        if count is None:
            count = runner.counted = {"acquire": 0}
            real_run = runner.run
            if inspect.iscoroutinefunction(real_run):

                async def counted_async(
                    operation: str, *args: Any, count: dict[str, int] = count, real_run: Any = real_run
                ) -> Any:
                    count[operation] = count.get(operation, 0) + 1
                    return await real_run(operation, *args)

                runner.run = counted_async
            else:

                def counted(
                    operation: str, *args: Any, count: dict[str, int] = count, real_run: Any = real_run
                ) -> Any:
                    count[operation] = count.get(operation, 0) + 1
                    return real_run(operation, *args)

                runner.run = counted
        counts.append(count)
    return counts


def spent(counts: list[dict[str, int]], before: list[int], operation: str = "acquire") -> list[int]:
    """The calls of ``operation`` each worker made since ``before`` (its counts then)."""
    return [count[operation] - n for count, n in zip(counts, before, strict=True)]
