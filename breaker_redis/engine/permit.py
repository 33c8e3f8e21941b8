"""Permit: one admitted call, whose outcome is recorded exactly once."""

from __future__ import annotations

from typing import Any, Protocol


class Settles(Protocol):
    """What a permit needs from the breaker that issued it."""

    def now_ms(self) -> int: ...
    def classify(self, exc: BaseException) -> str: ...
    def _record(self, permit: Permit, outcome: str, duration_ms: int) -> None: ...


class Permit:
    """One admitted call. Record its outcome exactly once (later calls are no-ops).

    Usable as a context manager: an exception is classified by the breaker's
    config, a normal exit is a success.
    """

    __slots__ = (
        "_breaker",
        "_unrecorded",
        "batchable",
        "epoch",
        "generation",
        "lease",
        "observing",
        "probe",
        "started",
    )

    def __init__(
        self,
        breaker: Settles,
        epoch: int,
        lease: str,
        generation: int,
        batchable: bool = False,
        *,
        observing: bool = False,
        timed: bool = True,
    ) -> None:
        self._breaker = breaker
        self.epoch = epoch
        self.lease = lease
        self.generation = generation
        self.probe = lease.startswith("p:")
        # admitted from calm knowledge without a lease: a plain success may go in a batch
        self.batchable = batchable
        # admitted in observe mode while known open: the outcome only feeds the counters
        self.observing = observing
        # timed=False: admitted under no slow-call rule, so the call's duration
        # matters to nothing (lua/record.lua reads it only for that rule) and the
        # clock is not read; 0 then stands for 'not timed'
        self.started = breaker.now_ms() if timed else 0
        # emptied by the first record(): list.pop is atomic, so exactly one of
        # several threads recording at once goes on, without a lock per permit
        self._unrecorded = [True]

    def success(self) -> None:
        self.record("success")

    def failure(self) -> None:
        self.record("failure")

    def ignore(self) -> None:
        self.record("ignored")

    def record(self, outcome: str) -> None:
        if outcome not in ("success", "failure", "ignored"):
            raise ValueError(f"outcome must be success, failure or ignored (got {outcome!r})")
        try:
            self._unrecorded.pop()
        except IndexError:
            return  # recorded already
        breaker = self._breaker
        started = self.started
        breaker._record(self, outcome, breaker.now_ms() - started if started else 0)

    @property
    def recorded(self) -> bool:
        return not self._unrecorded

    def __enter__(self) -> Permit:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.success()
        else:
            self.record(self._breaker.classify(exc))
