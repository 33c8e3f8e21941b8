"""Breaker: what a worker knows about one breaker and when it asks Redis.

A worker keeps, per breaker, the last state it learned (``_Knowledge``): from
every script reply and from the pub/sub invalidations. With it, a closed
breaker admits a call with no Redis command at all (its outcome goes to the
record script afterwards, a plain success in a batch) and an open breaker
denies with none until the known ``open_until``. Redis is asked only when memory cannot decide: first
use, the open period over, half_open (probe leases are handed out by Redis
alone), a bulkhead slot, or knowledge older than it may be trusted. Counts
stay exact because every outcome is recorded by the script, which drops
results carrying an old epoch.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar, cast

from .config import BreakerConfig
from .errors import BreakerOpen
from .permit import Permit
from .scripts import text
from .snapshot import snapshot_dict
from .store import StoreUnavailable

if TYPE_CHECKING:
    from .breakers import Breakers

log = logging.getLogger("breaker_redis")

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

_MISSING: Any = object()
# How long knowledge is trusted without hearing from Redis: while the event
# subscription is up, changes are pushed and this is only a backstop.
TRUST_SUBSCRIBED_SECONDS = 30.0
TRUST_UNSUBSCRIBED_SECONDS = 1.0
# Rejections decided from memory are sent to Redis at most this often.
FLUSH_SECONDS = 1.0


class State(str, Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    def __str__(self) -> str:
        return self.value


@dataclass
class _Knowledge:
    state: str
    epoch: int
    open_until: int
    forced: str
    mode: str
    max_concurrent: int
    slow_ms: int
    learned_at: float  # time.monotonic()
    generation: int


class Breaker:
    """One named breaker, shared by every thread of this process and, through
    Redis, by every worker of every host using the same key prefix."""

    def __init__(self, breakers: Breakers, name: str, config: BreakerConfig) -> None:
        self._breakers = breakers
        self.name = name
        self.config = config
        self._lua_config = config.to_lua()
        self._config_slow_ms = round((config.slow_call_seconds or 0) * 1000)
        self._lock = threading.Lock()
        self._known: _Knowledge | None = None
        self._pending_rejected = 0
        self._pending_would_reject = 0
        self._last_flush = time.monotonic()
        self._registered_pid = 0
        self._batch_epoch = 0
        self._batch_count = 0
        self._batch_generation = 0
        self._flush_lock = threading.Lock()
        self._local_permits = threading.local()

    # -- admission ---------------------------------------------------------

    def acquire(self) -> Permit:
        """A Permit for one call, or BreakerOpen. Decides from memory when it can."""
        breakers = self._breakers
        breakers._ensure_process()
        invalidator = breakers.invalidator
        if invalidator is not None:
            invalidator.settle()
        with self._lock:
            known = self._known
            if known is not None and self._trusted(known):
                decided = self._decide_locally(known, breakers.now_ms())
                if decided is not None:
                    return decided
            pending = self._take_pending()
        if self._registered_pid != breakers.pid and breakers.gate.healthy:
            self._registered_pid = breakers.pid
            breakers._register_name(self.name)
        try:
            reply, generation = breakers.gate.run(
                "acquire", self.name, breakers.clock_ms(), [self._lua_config, *pending]
            )
        except StoreUnavailable:
            self._restore_pending(pending)
            return self._store_unavailable()
        except Exception:
            self._restore_pending(pending)
            raise
        allowed, reason, epoch, lease, retry_after = self._learn(reply, generation)
        if allowed:
            batchable = allowed == 1 and not lease and text(reply[2]) == "closed"
            return Permit(self, epoch, lease, generation, batchable=batchable)
        raise BreakerOpen(retry_after, self.name, reason)

    def _trusted(self, known: _Knowledge) -> bool:
        breakers = self._breakers
        if known.generation != breakers.gate.generation:
            return False
        age = time.monotonic() - known.learned_at
        subscribed = (
            breakers.gate.healthy and breakers.invalidator is not None and breakers.invalidator.healthy
        )
        return age < (TRUST_SUBSCRIBED_SECONDS if subscribed else TRUST_UNSUBSCRIBED_SECONDS)

    def _decide_locally(self, known: _Knowledge, now: int) -> Permit | None:
        """Admit or deny from memory; None means Redis must be asked. Holds _lock.

        A denial from memory is counted here and flushed in batches; once per
        FLUSH_SECONDS the call goes to the acquire script instead, which counts
        it, takes the batch and refreshes what this worker knows.
        """
        if known.forced == "open":
            if self._flush_due():
                return None
            self._pending_rejected += 1
            raise BreakerOpen(None, self.name, "forced_open")
        if known.forced == "closed":
            return Permit(self, known.epoch, "", known.generation, batchable=True)
        if known.max_concurrent:
            return None  # a bulkhead slot is a lease only Redis can hand out
        if known.state == "closed":
            return Permit(self, known.epoch, "", known.generation, batchable=True)
        if known.state == "open" and now < known.open_until and not self._flush_due():
            if known.mode == "observe":
                self._pending_would_reject += 1
                return Permit(self, known.epoch, "", known.generation)
            self._pending_rejected += 1
            raise BreakerOpen((known.open_until - now) / 1000.0, self.name, "open")
        return None

    def _flush_due(self) -> bool:
        return time.monotonic() - self._last_flush >= FLUSH_SECONDS

    def _take_pending(self) -> list[int]:
        """The rejection counts to send with the next script call. Holds _lock."""
        pending = [self._pending_rejected, self._pending_would_reject]
        self._pending_rejected = self._pending_would_reject = 0
        self._last_flush = time.monotonic()
        return pending

    def _restore_pending(self, pending: list[int]) -> None:
        with self._lock:
            self._pending_rejected += pending[0]
            self._pending_would_reject += pending[1]

    def _store_unavailable(self) -> Permit:
        if self._breakers.gate.policy == "allow":
            return Permit(self, -1, "", -1)  # detached: records nothing
        raise BreakerOpen(None, self.name, "open")

    # -- outcomes ----------------------------------------------------------

    def _record(self, permit: Permit, outcome: str, duration_ms: int) -> None:
        """Count one outcome: batched if it is a plain success, else sent now.

        Never raises into the caller: a lost record must not fail the call.
        """
        breakers = self._breakers
        if permit.generation != breakers.gate.generation:
            return  # admitted by a store that is no longer in use
        if outcome == "success" and permit.batchable and breakers.batch_successes:
            known = self._known
            slow_ms = known.slow_ms if known is not None else self._config_slow_ms
            if not (slow_ms and duration_ms >= slow_ms):
                with self._lock:
                    joins = self._batch_count == 0 or (
                        self._batch_epoch == permit.epoch and self._batch_generation == permit.generation
                    )
                    if joins:
                        self._batch_epoch, self._batch_generation = permit.epoch, permit.generation
                        self._batch_count += 1
                if joins:
                    breakers.recorder.schedule(self)
                    return
        self._send(permit.epoch, outcome, max(0, duration_ms), permit.lease)

    def flush_batch(self) -> None:
        """Send the batched successes and rejection counts, if any (the recorder
        thread, snapshot, close and exit).

        Serialised, so a snapshot waits for a batch the recorder is sending.
        """
        with self._flush_lock:
            if self._batch_count or self._pending_rejected or self._pending_would_reject:
                self._send(0, "", 0, "")

    def _send(self, epoch: int, outcome: str, duration_ms: int, lease: str) -> None:
        """Run the record script with this outcome ('' for none) and the batch held."""
        breakers = self._breakers
        with self._lock:
            pending = self._take_pending()
            batch = [self._batch_epoch, self._batch_count]
            if self._batch_generation != breakers.gate.generation:
                batch[1] = 0  # counted under a store no longer in use
            self._batch_count = 0
        if not outcome and not batch[1] and not any(pending):
            return
        args = [self._lua_config, epoch, outcome, duration_ms, lease, *pending, *batch]
        try:
            reply, generation = breakers.gate.run(
                "record", self.name, breakers.clock_ms(), args, fallback=False
            )
        except StoreUnavailable:
            return
        except Exception:
            self._restore_pending(pending)
            log.exception("breaker_redis: could not record an outcome of breaker %r", self.name)
            return
        self._learn(reply, generation)

    def classify(self, exc: BaseException) -> str:
        if not isinstance(exc, Exception):
            return "ignored"  # KeyboardInterrupt, SystemExit, GeneratorExit
        return self.config.classify(exc)

    # -- knowledge ---------------------------------------------------------

    def _learn(self, reply: Any, generation: int) -> tuple[int, str, int, str, float | None]:
        """Update what this worker knows from a script reply.

        Returns (allowed, reason, epoch, lease, retry_after seconds or None).
        """
        allowed, reason, state = int(reply[0]), text(reply[1]), text(reply[2])
        epoch, open_until, forced = int(reply[3]), int(reply[4]), text(reply[5])
        lease, now, mode, max_concurrent = text(reply[6]), int(reply[7]), text(reply[8]), int(reply[9])
        slow_ms = int(reply[11])
        self._breakers._observe_clock(now)
        with self._lock:
            current = self._known
            if not mode:  # admin replies carry no config: keep what the last config-bearing reply said
                if current is None or current.generation != generation:
                    mode, slow_ms = self.config.mode, self._config_slow_ms
                    max_concurrent = self.config.max_concurrent_calls or 0
                else:
                    mode, max_concurrent, slow_ms = current.mode, current.max_concurrent, current.slow_ms
            known = _Knowledge(
                state, epoch, open_until, forced, mode, max_concurrent, slow_ms, time.monotonic(), generation
            )
            if current is None or current.generation != generation or current.epoch <= epoch:
                self._known = known
        retry_after = None
        if reason == "open" and open_until:
            retry_after = max(0, open_until - now) / 1000.0
        return allowed, reason, epoch, lease, retry_after

    def _on_event(self, payload: dict[str, Any]) -> None:
        kind = payload.get("kind")
        with self._lock:
            current = self._known
            if current is None:
                return
            if kind != "transition":
                self._known = None  # live config or unknown: re-learn at the next call
                return
            epoch = int(payload.get("epoch", 0))
            if epoch < current.epoch:
                return
            self._known = replace(
                current,
                state=str(payload.get("to", "closed")),
                epoch=epoch,
                open_until=int(payload.get("open_until", 0)),
                forced=str(payload.get("forced", "")),
                learned_at=time.monotonic(),
            )

    def _forget(self) -> None:
        with self._lock:
            self._known = None

    # -- the ways to protect a call ----------------------------------------

    def call(self, fn: Callable[..., T], /, *args: Any, fallback: Any = _MISSING, **kwargs: Any) -> T:
        """Run fn behind the breaker.

        With ``fallback`` (a value, or a callable given the BreakerOpen or the
        exception), a refused call or a call that failed returns the fallback
        instead of raising; ignored exceptions are always re-raised.
        """
        try:
            permit = self.acquire()
        except BreakerOpen as refused:
            if fallback is _MISSING:
                raise
            return cast(T, fallback(refused) if callable(fallback) else fallback)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            outcome = self.classify(exc)
            permit.record(outcome)
            if outcome == "failure" and fallback is not _MISSING:
                return cast(T, fallback(exc) if callable(fallback) else fallback)
            raise
        permit.success()
        return result

    def decorate(self, fallback: Any = _MISSING) -> Callable[[F], F]:
        """``@breaker.decorate(fallback=...)``; plain ``@breaker`` has no fallback."""

        def wrap(fn: F) -> F:
            @functools.wraps(fn)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return self.call(fn, *args, fallback=fallback, **kwargs)

            return cast(F, wrapper)

        return wrap

    def __call__(self, fn: F) -> F:
        return self.decorate()(fn)

    def __enter__(self) -> Permit:
        permit = self.acquire()
        stack = getattr(self._local_permits, "stack", None)
        if stack is None:
            stack = self._local_permits.stack = []
        stack.append(permit)
        return permit

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        permit: Permit = self._local_permits.stack.pop()
        permit.__exit__(exc_type, exc, tb)

    # -- reading and administration -----------------------------------------

    @property
    def state(self) -> State:
        """The state as Redis has it now (one script call)."""
        return State(self.snapshot()["state"])

    def snapshot(self) -> dict[str, Any]:
        breakers = self._breakers
        self.flush_batch()  # this worker's own successes show at once
        with self._lock:
            pending = self._take_pending()
        try:
            raw, _ = breakers.gate.run(
                "snapshot", self.name, breakers.clock_ms(), [self._lua_config, *pending]
            )
        except StoreUnavailable:
            self._restore_pending(pending)
            raise
        return snapshot_dict(self.name, raw, breakers.gate.kind)

    def force_open(self) -> None:
        self._admin("force_open")

    def force_closed(self) -> None:
        self._admin("force_closed")

    def clear_force(self) -> None:
        self._admin("clear_force")

    def reset(self) -> None:
        self._admin("reset")

    def _admin(self, op: str) -> None:
        breakers = self._breakers
        reply = breakers.gate.run_remote("admin", self.name, breakers.clock_ms(), ["", op])
        self._learn(reply, breakers.gate.generation)

    def __repr__(self) -> str:
        return f"<Breaker {self.name!r}>"
