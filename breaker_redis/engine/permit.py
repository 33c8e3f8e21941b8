"""Permit: one admitted call, whose outcome is recorded exactly once.

One class of rules for both sides (``Recording``): a permit returns what its
breaker's ``_record`` returns, None on the sync side and an awaitable on the
asyncio side, so ``permit.success()`` and ``await permit.success()`` are the
same code. What stays twinned is the context manager: ``with`` and ``async
with`` are two protocols (``Permit`` here, ``breaker_redis.asyncio.Permit``).
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

D = TypeVar("D")  # what recording returns: None (sync) or an awaitable (asyncio)
R = TypeVar("R", bound="Recording[Any]")
D_co = TypeVar("D_co", covariant=True)
OUTCOMES = ("success", "failure", "ignored")


class Settles(Protocol[D_co]):
    """What a permit needs from the breaker that issued it."""

    def now_ms(self) -> int: ...
    def classify(self, exc: BaseException) -> str: ...
    def _record(self, permit: Any, outcome: str, duration_ms: int) -> D_co: ...


class Recording(Generic[D]):
    """One admitted call. Record its outcome exactly once (later calls are no-ops)."""

    __slots__ = (
        "_breaker",
        "_unrecorded",
        "batchable",
        "epoch",
        "generation",
        "lease",
        "observing",
        "started",
    )
    _nothing: D  # what a record after the first returns: None, or an awaitable that is done

    def __init__(
        self,
        breaker: Settles[D],
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

    def success(self) -> D:
        return self.record("success")

    def failure(self) -> D:
        return self.record("failure")

    def ignore(self) -> D:
        return self.record("ignored")

    def record(self, outcome: str, *, ended_ms: int | None = None) -> D:
        """Record the call's outcome. ``ended_ms``: when the call ended on the
        breaker's clock (``breaker.now_ms()``), if that was before now: an HTTP
        response is judged, and timed, at its headers, but its permit is settled
        once its body is read, and the time the caller took over the body is not
        the service's."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be success, failure or ignored (got {outcome!r})")
        try:
            self._unrecorded.pop()
        except IndexError:
            return self._nothing  # recorded already
        breaker = self._breaker
        started = self.started
        if not started:
            return breaker._record(self, outcome, 0)
        return breaker._record(self, outcome, (breaker.now_ms() if ended_ms is None else ended_ms) - started)

    @property
    def probe(self) -> bool:
        """Admitted as a half-open probe (read only where a probe is told apart)."""
        return self.lease.startswith("p:")

    @property
    def recorded(self) -> bool:
        return not self._unrecorded

    def _exit(self, exc: BaseException | None) -> D:
        """Leaving the permit's block: an exception is classified by the breaker's config,
        a normal exit is a success."""
        return self.success() if exc is None else self.record(self._breaker.classify(exc))


def from_memory(cls: type[R], breaker: Any, epoch: int, generation: int, calm: bool, timed: bool) -> R:
    """``cls(breaker, epoch, "", generation, calm, timed=timed)``, the permit of a call
    admitted from memory, made without running ``__init__``: a class whose
    ``__init__`` is Python code costs a frame of the interpreter's own to make,
    and this is the permit of every healthy request a web integration guards."""
    permit = object.__new__(cls)
    permit._breaker = breaker
    permit.epoch = epoch
    permit.lease = ""
    permit.generation = generation
    permit.batchable = calm
    permit.observing = False
    permit.started = breaker.now_ms() if timed else 0
    permit._unrecorded = [True]
    return permit


class Permit(Recording[None]):
    """One admitted call of a sync Breaker; usable as a context manager."""

    __slots__ = ()
    _nothing = None

    def __enter__(self) -> Permit:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._exit(exc)
