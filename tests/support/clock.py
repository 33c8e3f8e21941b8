"""The test clock the scripts and the workers decide by (a fixture in tests/conftest.py)."""

from __future__ import annotations


class Clock:
    """A test clock in milliseconds: scripts get it as now_ms, workers decide by it."""

    def __init__(self, start: int = 1_700_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms
