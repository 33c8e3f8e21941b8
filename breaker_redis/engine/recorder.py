"""Sends batched successes to Redis from a background thread.

While a breaker is closed, the outcome of a healthy call needs to reach Redis
exactly, but not before the call returns: a success cannot reopen anything
the caller is waiting for. So a plain success (no lease, not slow) only bumps
a per-breaker counter, and this thread sends the count as one record call
within BATCH_SECONDS (50 ms); all the successes of that moment share it.
Failures, slow calls and probe results are recorded synchronously, and each
synchronous record carries the batch with it, so Redis sees one worker's
outcomes in the order they happened.
"""

from __future__ import annotations

import threading
from typing import Protocol

from breaker_redis.base.background import BackgroundThread

# How long a first success waits for others to share its record call. A sync
# gunicorn worker sees requests milliseconds apart; sending each success alone
# would cost a record call per request after all.
BATCH_SECONDS = 0.05


class Batched(Protocol):
    def flush_batch(self) -> None: ...


class Recorder:
    """The thread and the due list. Breakers.close() stops the thread and waits for a
    send it has under way (it took the due list, so close()'s own flush would find
    nothing to wait for and the caller could close the client under that send)."""

    _due: dict[int, Batched]

    def __init__(self, name: str = "breaker-redis-recorder") -> None:
        self.thread = BackgroundThread(self._loop, name, wake=self._rouse)
        self.after_fork()

    def schedule(self, breaker: Batched) -> None:
        # Already due: the flush that sends it reads the breaker's count after
        # taking the due list, so it carries this success too (the count was
        # raised before this call). Checked without the lock: every success of
        # a batch but the first costs a dict lookup, not a lock and an Event.set.
        if id(breaker) not in self._due:
            with self._lock:
                self._due[id(breaker)] = breaker
                self.thread.start()
            self._wake.set()

    def flush(self) -> None:
        """Send every pending batch now (at exit, and from tests)."""
        with self._lock:
            due, self._due = list(self._due.values()), {}
        for breaker in due:
            breaker.flush_batch()

    def _loop(self) -> None:
        thread = self.thread
        while not thread.stopped():
            self._wake.wait(1.0)
            thread.wait(BATCH_SECONDS)  # let the next few successes join this batch (ends if told to stop)
            self._wake.clear()
            self.flush()

    def _rouse(self) -> None:
        """Told to stop: the first wait ends at once, the second is the thread's own
        (the loop's last round sends what is due)."""
        self._wake.set()

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._due = {}
        self.thread.after_fork()
