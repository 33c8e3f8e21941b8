"""Client-side helpers shared by the end-to-end tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def burst(pool: ThreadPoolExecutor, n: int, call: Callable[[], T]) -> list[T]:
    """n calls of call() on pool's threads, released together by a barrier
    (pool needs n free threads)."""
    barrier = threading.Barrier(n)

    def one(_: int) -> T:
        barrier.wait(10)
        return call()

    return list(pool.map(one, range(n)))
