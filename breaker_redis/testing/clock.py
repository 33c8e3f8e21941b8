"""ManualClock: the time a test gives its breakers, moved only by the test."""

from __future__ import annotations

import math
import threading
import time


class ManualClock:
    """A breaker's clock that stands still until ``advance`` moves it: ``Breakers(..., clock=clock)``.

    The breakers pass ``clock()`` (milliseconds) to every script as ``now_ms``
    and decide from memory by it, so ``advance(open_seconds)`` is all it takes
    for the next call to be the half-open probe: nothing sleeps. It starts at
    the wall-clock time it was made (or ``start_ms``), so the times it gives
    read as the present, as Redis's own would. It never goes back: Redis's time
    does not, and a breaker's open periods and epochs are reckoned on that.
    """

    def __init__(self, start_ms: int | None = None) -> None:
        if start_ms is None:
            start_ms = int(time.time() * 1000)
        elif isinstance(start_ms, bool) or not isinstance(start_ms, int) or start_ms < 0:
            raise ValueError(f"start_ms must be an int of milliseconds >= 0 (got {start_ms!r})")
        self._now_ms = start_ms
        self._lock = threading.Lock()  # a test may advance it while a worker thread reads it

    def __call__(self) -> int:
        """The time now, in milliseconds: what a Breakers calls its clock for."""
        return self._now_ms

    @property
    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, seconds: float) -> int:
        """Move the time on by ``seconds`` (a float, rounded to the millisecond); the new now_ms."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"advance() takes a number of seconds (got {seconds!r})")
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(
                f"advance() takes seconds >= 0: a breaker's clock never goes back (got {seconds!r})"
            )
        with self._lock:
            self._now_ms += round(seconds * 1000)
            return self._now_ms

    def __repr__(self) -> str:
        return f"ManualClock(now_ms={self._now_ms})"
