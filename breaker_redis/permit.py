"""Permit: one admitted call, whose outcome is recorded exactly once."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .breaker import Breaker


class Permit:
    """One admitted call. Record its outcome exactly once (later calls are no-ops).

    Usable as a context manager: an exception is classified by the breaker's
    config, a normal exit is a success.
    """

    __slots__ = (
        "_breaker",
        "_done",
        "_lock",
        "batchable",
        "epoch",
        "generation",
        "lease",
        "probe",
        "started",
    )

    def __init__(
        self, breaker: Breaker, epoch: int, lease: str, generation: int, *, batchable: bool = False
    ) -> None:
        self._breaker = breaker
        self.epoch = epoch
        self.lease = lease
        self.generation = generation
        self.probe = lease.startswith("p:")
        # admitted while closed without a lease: a plain success may go in a batch
        self.batchable = batchable
        self.started = breaker._breakers.now_ms()
        self._done = False
        self._lock = threading.Lock()

    def success(self) -> None:
        self.record("success")

    def failure(self) -> None:
        self.record("failure")

    def ignore(self) -> None:
        self.record("ignored")

    def record(self, outcome: str) -> None:
        if outcome not in ("success", "failure", "ignored"):
            raise ValueError(f"outcome must be success, failure or ignored (got {outcome!r})")
        with self._lock:
            if self._done:
                return
            self._done = True
        self._breaker._record(self, outcome, self._breaker._breakers.now_ms() - self.started)

    @property
    def recorded(self) -> bool:
        return self._done

    def __enter__(self) -> Permit:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.success()
        else:
            self.record(self._breaker.classify(exc))
