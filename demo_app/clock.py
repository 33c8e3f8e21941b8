"""A breaker clock shared by processes: the test that starts the demo moves it, every worker reads it.

``DEMO_CLOCK_FILE`` names the file (demo_app/settings.py); without it the demo
keeps the breakers' own clock. A single-process test gives its breakers a
``breaker_redis.testing.ManualClock``; gunicorn's workers are other processes,
so the time they decide by is a file of one int64 of milliseconds (little
endian) that the test owns. It stands still until the test writes a later
time, so an open period lasts until the test ends it, however slow the machine.

The writer replaces the whole file (``os.replace``), and each reading opens
it anew: a reader sees the old time or the new one, never half of each.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from pathlib import Path

_FORMAT = struct.Struct("<q")


def _read(path: Path) -> int:
    raw = path.read_bytes()
    if len(raw) != _FORMAT.size:
        raise ValueError(f"{path}: a clock file holds {_FORMAT.size} bytes (found {len(raw)})")
    value: int = _FORMAT.unpack(raw)[0]
    return value


class FileClock:
    """The time in the clock file, in milliseconds: ``FlaskBreakers(app, clock=FileClock(path))``.

    Read on every call (a breaker reads its clock a few times a request), and
    never lower than a time this process read before: Redis's time does not
    go back, and a breaker's open periods and epochs are reckoned on it.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._last = _read(self.path)  # a missing or bad file fails at start-up, not at a request
        self._lock = threading.Lock()  # a gthread worker's threads read it together

    def __call__(self) -> int:
        with self._lock:
            self._last = max(self._last, _read(self.path))
            return self._last

    def __repr__(self) -> str:
        return f"FileClock({str(self.path)!r}, now_ms={self._last})"


class ClockWriter:
    """The test's side of a clock file: it starts at the wall-clock time (or
    ``start_ms``), as ManualClock does, so the times read as the present, and
    only goes forward."""

    def __init__(self, path: str | os.PathLike[str], start_ms: int | None = None) -> None:
        self.path = Path(path)
        self.now_ms = int(time.time() * 1000) if start_ms is None else start_ms
        self._write()

    def advance(self, seconds: float) -> int:
        """Move the time on by ``seconds`` (rounded to the millisecond); the new now_ms."""
        if not seconds >= 0:
            raise ValueError(f"advance() takes seconds >= 0: the clock never goes back (got {seconds!r})")
        return self.advance_to(self.now_ms + round(seconds * 1000))

    def advance_to(self, now_ms: int) -> int:
        """Move the time on to ``now_ms`` (an earlier time leaves it where it is); the new now_ms."""
        self.now_ms = max(self.now_ms, now_ms)
        self._write()
        return self.now_ms

    def _write(self) -> None:
        spare = self.path.with_name(self.path.name + ".next")
        spare.write_bytes(_FORMAT.pack(self.now_ms))
        os.replace(spare, self.path)
