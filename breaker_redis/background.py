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
        self._thread: threading.Thread | None = None
        self.stop = threading.Event()  # set by close(); the target's loop watches it

    def ensure_running(self) -> None:
        thread = self._thread
        if thread is not None and thread.is_alive():
            return
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self.stop.clear()
                self._thread = threading.Thread(target=self._target, name=self._name, daemon=True)
                self._thread.start()

    def after_fork(self) -> None:
        """The child starts with no thread of its own (and no lock held by one)."""
        self._start_lock = threading.Lock()
        self._thread = None

    def close(self) -> None:
        self.stop.set()
