"""A daemon thread that each process starts at its first use.

The event listener (invalidation.py) and the Sentinel follower (failover.py)
both run one: started by whichever call comes first, whatever the concurrency
of first calls, and again in a forked child, which inherits no thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class ProcessThread:
    def __init__(self, target: Callable[[], None], name: str) -> None:
        self._target = target
        self._name = name
        self._start_lock = threading.Lock()
        # True from the start of the thread until its target returns: checked at
        # every call, where Thread.is_alive() would cost a lock
        self._running = False
        self.stop = threading.Event()  # set by close(); the target's loop watches it

    def ensure_running(self) -> None:
        if self._running:
            return
        with self._start_lock:
            if not self._running:
                self.stop.clear()
                self._running = True
                threading.Thread(target=self._run, name=self._name, daemon=True).start()

    def _run(self) -> None:
        try:
            self._target()
        finally:
            self._running = False

    def after_fork(self) -> None:
        """The child starts with no thread of its own (and no lock held by one)."""
        self._start_lock = threading.Lock()
        self._running = False

    def close(self) -> None:
        self.stop.set()
