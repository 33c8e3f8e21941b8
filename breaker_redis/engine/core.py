"""What the sync Breaker and the asyncio one share: everything they do without I/O.

The config as the scripts take it, the classification of an exception, the
decisions made from memory, the counts kept in memory and the batch, what
a reply teaches, and what call(), @decorator and ``with`` answer (a fallback,
the permits of open blocks). breaker_redis/engine/breaker.py and
breaker_redis/asyncio/breaker.py add only how they wait: the sync Breaker
calls the counting methods here under its lock (threads share it), the
asyncio one without (one event loop runs it, and nothing here awaits).

One class, the base of steps.py's: a reader of either Breaker reads its own
file, then this one and steps.py for what it shares (docs/design.md, section
12). The two stay apart along the one seam that matters to a reader, I/O:
nothing here waits, everything in steps.py does.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Generic, Protocol, TypeVar, cast

from breaker_redis.base.config import BreakerConfig
from breaker_redis.base.errors import BreakerOpen
from breaker_redis.engine.knowledge import Knowledge, Memory, Reply, Verdict
from breaker_redis.engine.ramp import RETRY_SECONDS, Credit
from breaker_redis.engine.snapshot import OUTCOME_COUNTERS
from breaker_redis.storage.args import COUNTS, AcquireArgs, Batch, RecordArgs, batch_times
from breaker_redis.storage.notices import Notice

log = logging.getLogger("breaker_redis")

# Counts kept in memory (rejections, observe-mode outcomes) are sent at least this often.
FLUSH_SECONDS = 1.0
LOST_LOG_SECONDS = 60.0  # a breaker's "Redis lost its state" is logged at most this often
F = TypeVar("F", bound=Callable[..., Any])

MISSING: Any = object()  # no fallback given

# (breaker, permit) of each open ``with`` / ``async with`` block, innermost last: a
# context variable, so each thread and each task has its own
_HELD: ContextVar[tuple[tuple[object, Any], ...]] = ContextVar("breaker_redis_held", default=())


class Admitted(Protocol):
    """What the core reads of a permit (breaker_redis.engine.permit.Permit or the asyncio one)."""

    epoch: int
    lease: str
    generation: int
    batchable: bool
    observing: bool


P = TypeVar("P", bound=Admitted)


class Clock(Protocol):
    def now_ms(self) -> int: ...
    def wall_us(self) -> int: ...


class BreakerCore(Generic[P]):
    name: str
    _shared: Clock  # the per-process machinery of the side; here only its clock
    _memory: Memory
    _pending: dict[str, int]
    _last_flush: float
    _batch_epoch: int
    _batch_count: int
    _batch_generation: int
    _batch_times: list[int]  # when each batched success ended (us), with a count window only
    _ramp_credit: Credit
    _listed_pid: int
    _listed_at: int  # ms, on the side's clock (Breakers.now_ms)
    _reporter: str  # who this worker reports as (reporters.py): the last argument of acquire and record
    # the permit class of the side (sync or asyncio): Permit(breaker, epoch, lease, generation, ...)
    _permit: Callable[..., P]

    def __init__(self, name: str, config: BreakerConfig) -> None:
        self.name = name
        self.reconfigure(config)
        self._listed_pid, self._listed_at = 0, 0
        self._losses, self._lost_logged_at = 0, -1e18

    def reconfigure(self, config: BreakerConfig) -> None:
        """This worker's config from its next script call on (each worker sends its
        own; live overrides in Redis, Breakers.configure, reach every worker)."""
        self.config = config
        self._lua_config = config.to_lua()
        self._config_slow_ms = round((config.slow_call_seconds or 0) * 1000)

    def _forget_counts(self) -> None:
        """No counts, no batch (a new breaker, a forked child)."""
        self._pending = dict.fromkeys(COUNTS, 0)
        self._last_flush = time.monotonic()
        self._batch_epoch, self._batch_count, self._batch_generation, self._batch_times = 0, 0, 0, []
        self._ramp_credit = Credit()  # this worker's in the ramp after a close (_ramp)

    def now_ms(self) -> int:
        return self._shared.now_ms()

    @property
    def known(self) -> Knowledge | None:
        """What this worker knows of the breaker now, without a command (None: nothing)."""
        return self._memory.known

    def forget(self) -> None:
        self._memory.forget()

    @property
    def holds_counts(self) -> bool:
        """Whether batched successes or counts kept in memory wait to be sent."""
        return bool(self._batch_count or any(self._pending.values()))

    def classify(self, exc: BaseException) -> str:
        """success / failure / ignored for an exception; a predicate that raises
        counts a failure (and is logged): the permit must be recorded either way,
        or a probe slot it holds would stay taken until its lease expires."""
        if not isinstance(exc, Exception):
            return "ignored"  # KeyboardInterrupt, SystemExit, GeneratorExit, CancelledError
        try:
            return self.config.classify(exc)
        except Exception:
            log.exception("classifying an exception for breaker %r raised; counted as a failure", self.name)
            return "failure"

    # -- what call(), @decorator and ``with`` share (each side runs the call) ----------

    @staticmethod
    def _answer_refusal(refused: BreakerOpen, fallback: Any) -> Any:
        """The fallback's answer to a refused call, or the refusal raised."""
        if fallback is MISSING:
            raise refused
        return _fall_back(fallback, refused)

    @staticmethod
    def _answer_raised(outcome: str, exc: BaseException, fallback: Any) -> Any:
        """After a call that raised was recorded as ``outcome``: the fallback's answer
        to a failure, else exc raised again (ignored exceptions always are)."""
        if outcome == "failure" and fallback is not MISSING:
            return _fall_back(fallback, exc)
        raise exc

    def _wrapper(self, fn: Callable[..., Any], fallback: Any) -> Callable[..., Any]:
        """fn behind the breaker, as the decorator returns it (each side's)."""
        raise NotImplementedError

    def decorate(self, fallback: Any = MISSING) -> Callable[[F], F]:
        """``@breaker.decorate(fallback=...)``; plain ``@breaker`` has no fallback."""

        def wrap(fn: F) -> F:
            return cast(F, functools.wraps(fn)(self._wrapper(fn, fallback)))

        return wrap

    def __call__(self, fn: F) -> F:
        return self.decorate()(fn)

    def _hold(self, permit: P) -> P:
        """Entering a ``with`` block: its permit, until _release()."""
        _HELD.set((*_HELD.get(), (self, permit)))
        return permit

    def _release(self) -> P:
        """Leaving a ``with`` block: the permit of this breaker's innermost one."""
        held = _HELD.get()
        at = max(i for i, (breaker, _) in enumerate(held) if breaker is self)
        _HELD.set(held[:at] + held[at + 1 :])
        return cast(P, held[at][1])

    # -- admission from memory (the sync side holds its lock) ----------------------

    def _from_memory(self, known: Knowledge) -> P | bool:
        """Admit or deny from what this worker knows; a bool: ask Redis, True when the
        ramp after a close was decided here (a bulkhead slot is Redis's to hand out: the
        acquire script then takes it without deciding the ramp again), False when it is
        decided by the reply, or by the script before a slot (docs/recovery.md).

        Counts kept in memory go to Redis with the next script call; once per
        FLUSH_SECONDS that call is this one.
        """
        if known.admits:  # what decide() admits, whatever the time: no clock read for it
            # timed: a duration matters only to the slow-call rule; untimed, the clock is not read
            return self._permit(
                self, known.epoch, "", known.generation, batchable=known.calm, timed=known.slow_ms != 0
            )
        now_ms = self._shared.now_ms()
        verdict = known.decide(now_ms)
        if verdict is Verdict.RAMP and known.max_concurrent:
            self._ramp(known, now_ms)  # the ramp decided here, the bulkhead slot by Redis
            return True
        if verdict is Verdict.ASK or time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            return False  # (ramping, the reply is ramped: _from_reply)
        if verdict is not Verdict.DENY and verdict is not Verdict.OBSERVE:
            if verdict is Verdict.RAMP:
                self._ramp(known, now_ms)
            else:  # the ramp is over since this was learned: the healthy call's path again
                self._memory.ramp_over(known)
            return self._permit(
                self, known.epoch, "", known.generation, batchable=known.calm, timed=known.slow_ms != 0
            )
        if verdict is Verdict.OBSERVE:
            self._pending["would_reject"] += 1
            # (an isolated reporter's call, in observe mode, is counted as any other)
            return self._permit(self, known.epoch, "", known.generation, observing=known.state != "closed")
        self._pending["rejected"] += 1
        if known.forced == "open":
            raise BreakerOpen(None, self.name, "forced_open")
        if known.state == "closed":  # (decide() denies a closed breaker only to an isolated reporter)
            raise BreakerOpen((known.isolated_until - self._shared.now_ms()) / 1000.0, self.name, "isolated")
        raise BreakerOpen((known.open_until - self._shared.now_ms()) / 1000.0, self.name, "open")

    def _ramp(self, known: Knowledge, now_ms: int) -> None:
        """Admit this call if this worker's credit in the ramp after a close has room for
        it (ramp.py), else count it and raise BreakerOpen, reason ``ramp`` (observe mode:
        counted as would_reject, admitted). Holds the sync side's lock."""
        if self._ramp_credit.admits(known.epoch, known.ramp_share(now_ms)):
            return
        if known.mode == "observe":
            self._pending["would_reject"] += 1
            return
        self._pending["rejected"] += 1
        raise BreakerOpen(min(RETRY_SECONDS, (known.ramp_until - now_ms) / 1000.0), self.name, "ramp")

    def _from_reply(self, reply: Reply, generation: int, known: Knowledge) -> P:
        """The permit an acquire reply grants, or BreakerOpen. Holds the sync side's lock.

        The ramp after a close: a call without a bulkhead slot is ramped here, by this
        worker's credit; with a slot, the ramp was decided before it was taken, from
        memory or by the script (which counted a call it refused)."""
        if reply.allowed == 1 and known.ramp_until and not reply.lease:
            self._ramp(known, reply.now)
        if reply.allowed:
            batchable = reply.allowed == 1 and not reply.lease and known.calm
            # observe mode while open: the outcome decides nothing (in half_open it may reap a probe)
            observing = reply.allowed == 2 and reply.state == "open"
            return self._permit(
                self, reply.epoch, reply.lease, generation, batchable=batchable, observing=observing
            )
        retry_after = None
        if reply.reason == "open" and reply.open_until:
            retry_after = max(0, reply.open_until - reply.now) / 1000.0
        elif reply.reason == "isolated":
            retry_after = max(0, reply.isolated_until - reply.now) / 1000.0
        elif reply.reason == "ramp":
            retry_after = min(RETRY_SECONDS, max(0, reply.ramp_until - reply.now) / 1000.0)
        raise BreakerOpen(retry_after, self.name, reply.reason)

    # -- counts kept in memory (the sync side holds its lock) --------------------------

    def _take_pending(self) -> list[int]:
        """The counts to send with the next script call."""
        pending = [self._pending[key] for key in COUNTS]
        self._pending = dict.fromkeys(COUNTS, 0)
        self._last_flush = time.monotonic()
        return pending

    def _put_back(self, pending: list[int], batch: Batch | None = None) -> None:
        """Put back what a script call that failed did not deliver."""
        for key, count in zip(COUNTS, pending, strict=True):
            self._pending[key] += count
        if batch and batch.size and (self._batch_count == 0 or self._batch_epoch == batch.epoch):
            self._batch_epoch, self._batch_count = batch.epoch, self._batch_count + batch.size
            self._batch_times[:0] = batch.times

    def _observed(self, permit: P, outcome: str, duration_ms: int) -> bool:
        """An outcome of a call admitted in observe mode while open only feeds the
        counters, in memory; False: the breaker moved on since (the record script
        counts it as stale)."""
        known = self._memory.known
        if known is None or known.epoch != permit.epoch:
            return False
        self._pending[OUTCOME_COUNTERS[outcome]] += 1
        self._pending["slow"] += outcome != "ignored" and known.slow(duration_ms)
        return True

    def _join_batch(self, epoch: int, generation: int, duration_ms: int, trusted: bool) -> bool:
        """A plain success of a call admitted from calm knowledge under (epoch,
        generation) joins the batch while the breaker is calm and this worker's
        knowledge is ``trusted`` (nothing unread could be an arming)."""
        known = self._memory.known
        if not (
            trusted
            and known is not None
            and known.calm
            and known.epoch == epoch
            and known.generation == generation
            and not known.slow(duration_ms)
            and (self._batch_count == 0 or self._batch_epoch == epoch)
        ):
            return False
        self._batch_epoch, self._batch_generation = epoch, generation
        self._batch_count += 1
        if known.window_calls:  # a count window places it by when it ended (RecordArgs.batch_times)
            self._batch_times.append(self._shared.wall_us())
        return True

    def _take_for_send(self, live: Callable[[int], bool]) -> tuple[list[int], Batch]:
        """(pending counts, the batch) for a record call; a batch counted under a
        store no longer in use (``live``: the gate's) is dropped."""
        pending = self._take_pending()
        count, times = self._batch_count, self._batch_times
        if count and not live(self._batch_generation):
            count, times = 0, []
        self._batch_count, self._batch_times = 0, []
        return pending, Batch(self._batch_epoch, count, times if len(times) == count else [])

    # -- learning --------------------------------------------------------------------

    def _learn_reply(self, reply: Reply, generation: int, stamp: int, shared: bool) -> Knowledge:
        """Keep what a reply teaches (knowledge.Memory); log a repair it reports."""
        if reply.repaired:
            prefix, name = self._key_prefix(), self.name
            names = ", ".join(f"{prefix}:{{{name}}}:{key}" for key in reply.repaired.split(","))
            log.warning(
                "breaker %r: corrupted %s repaired (a field that does not parse "
                "was reset; the breaker went on deciding)",
                name,
                names,
            )
        if reply.lost and shared:  # (on the local store a restore is the point: nothing to say)
            self._state_lost(reply)
        config = self.config
        ramp = (round(config.ramp_seconds * 1000), config.ramp_from)
        own = (config.mode, config.max_concurrent_calls or 0, self._config_slow_ms, *ramp)
        return self._memory.learn(reply, generation, stamp, own, shared)

    def _state_lost(self, reply: Reply) -> None:
        """Redis lost the state this worker knew: say so, at most once a minute per
        breaker (an evicting Redis can do it many times a second)."""
        self._losses += 1
        now = time.monotonic()
        if now - self._lost_logged_at < LOST_LOG_SECONDS:
            return
        self._lost_logged_at, losses, self._losses = now, self._losses, 0
        state = f"{self._key_prefix()}:{{{self.name}}}:state"
        if reply.lost.startswith("restored"):
            source = "this worker knew" if reply.lost == "restored" else "its last transition said"
            what = f"restored from what {source}: {reply.state}"
            if reply.forced:
                what += f", forced {reply.forced}"
            elif reply.state == "open":
                what += f" until {reply.open_until} (Redis time, ms)"
        else:
            what = "this worker knew it closed: it starts again closed with an empty window"
        log.warning(
            "breaker %r: Redis lost its state (%s is gone%s); %s. The likely cause is a maxmemory-policy "
            "that evicts keys without a TTL (allkeys-lru, allkeys-lfu, allkeys-random): give breaker_redis "
            "a Redis with noeviction or volatile-*, whose breaker keys are never evicted "
            "(docs/memory-and-permissions.md). Counted in stats as state_lost",
            self.name,
            state,
            f"; {losses} times since the last such line" if losses > 1 else "",
            what,
        )

    def _key_prefix(self) -> str:
        raise NotImplementedError

    def _listing_due(self, pid: int, ttl_ms: int) -> bool:
        """The names set (CLI, metrics, dashboard) keeps this breaker while it is
        in use: listed again every quarter of the key TTL, as the scripts renew
        the breaker's own keys, and once by each new process. Timed by the Breakers'
        clock: Redis time as this process estimates it, or the test clock."""
        now = self._shared.now_ms()
        if self._listed_pid == pid and now - self._listed_at < ttl_ms / 4:
            return False
        self._listed_pid, self._listed_at = pid, now
        return True

    def _script_args(self, args: list[Any]) -> list[Any]:
        return [self._lua_config, self._memory.floor_arg(), *args]

    def _acquire_args(self, pending: list[int], ramped: bool) -> list[Any]:
        """acquire.lua's ARGV 7-14: the counts kept in memory, the reporter, whether the
        ramp after a close was decided from memory (_from_memory)."""
        return AcquireArgs(pending, self._reporter, "1" if ramped else "").argv()

    def _record_args(
        self, epoch: int, outcome: str, duration_ms: int, lease: str, pending: list[int], batch: Batch
    ) -> list[Any]:
        """record.lua's ARGV 7-20: the outcome, the counts kept in memory, the batch, the
        reporter, when the batched successes ended."""
        times = batch_times(self._shared.wall_us(), batch.times) if batch.times else ""  # (a count window)
        return RecordArgs(
            epoch, outcome, duration_ms, lease, pending, batch.epoch, batch.size, self._reporter, times
        ).argv()

    def _about_another_reporter(self, notice: Notice) -> bool:
        """An isolation message about another reporter: nothing this worker decides changes."""
        return notice.kind == "isolation" and notice.reporter != self._reporter


def _fall_back(fallback: Any, cause: BaseException) -> Any:
    """A callable fallback is given the cause; any other value is the answer."""
    return fallback(cause) if callable(fallback) else fallback
