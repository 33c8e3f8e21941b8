"""Breakers, Breaker, Permit: what a worker knows and when it asks Redis.

A worker keeps, per breaker, the last state it learned (``_Knowledge``): from
every script reply and from the pub/sub invalidations. With it, a closed
breaker admits a call with no Redis command at all (the only command is the
record script afterwards) and an open breaker denies with none until the
known ``open_until``. Redis is asked only when memory cannot decide: first
use, the open period over, half_open (probe leases are handed out by Redis
alone), a bulkhead slot, or knowledge older than it may be trusted. Counts
stay exact because every outcome is recorded by the script, which drops
results carrying an old epoch.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar, cast

from .config import BreakerConfig
from .errors import BreakerOpen
from .invalidation import Invalidator
from .recorder import Recorder
from .scripts import ScriptRunner, flat_pairs, text, validate_name
from .store import StoreGate, StoreUnavailable

log = logging.getLogger("breaker_redis")

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

_MISSING: Any = object()
DEFAULT_TTL_SECONDS = 7 * 24 * 3600
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
        """Send the batched successes, if any (the recorder thread, snapshot, exit)."""
        if self._batch_count:
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
                    mode, max_concurrent, slow_ms = self.config.mode, 0, self._config_slow_ms
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
            self._known = _Knowledge(
                str(payload.get("to", "closed")),
                epoch,
                int(payload.get("open_until", 0)),
                str(payload.get("forced", "")),
                current.mode,
                current.max_concurrent,
                current.slow_ms,
                time.monotonic(),
                current.generation,
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
        return _snapshot_dict(self.name, raw, breakers.gate.kind)

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


_INT_FIELDS = (
    "epoch",
    "open_until",
    "consec",
    "open_ms",
    "ho_ok",
    "window_calls",
    "window_failures",
    "window_slow",
    "probes",
    "slots",
    "now",
)
_STAT_FIELDS = (
    "calls",
    "successes",
    "failures",
    "ignored",
    "slow",
    "rejected",
    "would_reject",
    "trips",
    "stale",
)


def _snapshot_dict(name: str, raw: Any, store: str) -> dict[str, Any]:
    fields = flat_pairs(raw)
    values = {key: int(fields.get(key) or 0) for key in _INT_FIELDS}
    stats = {key: int(value) for key, value in flat_pairs(fields.get("stats") or []).items()}
    overrides = {key: text(value) for key, value in flat_pairs(fields.get("overrides") or []).items()}
    state = text(fields.get("state"))
    forced = text(fields.get("forced")) or None
    retry_after: float | None = None
    if state == "open" and forced is None:
        retry_after = max(0, values["open_until"] - values["now"]) / 1000.0
    snapshot: dict[str, Any] = {
        "name": name,
        "state": state,
        "forced": forced,
        "epoch": values["epoch"],
        "retry_after": retry_after,
        "open_until_ms": values["open_until"] or None,
        "window_calls": values["window_calls"],
        "window_failures": values["window_failures"],
        "window_slow": values["window_slow"],
        "consecutive_failures": values["consec"],
        "half_open_successes": values["ho_ok"],
        "probes_in_flight": values["probes"],
        "bulkhead_in_use": values["slots"],
        "mode": text(fields.get("mode")),
        "overrides": overrides,
        "store": store,
    }
    for key in _STAT_FIELDS:
        snapshot[key] = stats.get(key, 0)
    snapshot["calls"] = snapshot["successes"] + snapshot["failures"] + snapshot["ignored"]
    return snapshot


class Breakers:
    """The breakers of one app on one Redis, under one key prefix.

    Build one per process (or before the fork: nothing connects until first
    use, and a forked child drops its parent's threads and memory). Thread safe.
    """

    def __init__(
        self,
        client: Any,
        prefix: str = "breaker",
        *,
        on_store_error: str = "local",
        key_ttl_seconds: float = DEFAULT_TTL_SECONDS,
        defaults: BreakerConfig | None = None,
        clock: Callable[[], int] | None = None,
        listen: bool = True,
        batch_successes: bool | None = None,
    ) -> None:
        if not (isinstance(key_ttl_seconds, (int, float)) and key_ttl_seconds >= 1):
            raise ValueError(f"key_ttl_seconds must be >= 1 (got {key_ttl_seconds!r})")
        self.client = client
        self.prefix = prefix
        self.defaults = defaults or BreakerConfig()
        self._clock = clock
        # batches are stamped with the time they reach Redis: exact with the
        # real clock (a millisecond late at most), not with a test clock
        self.batch_successes = clock is None if batch_successes is None else batch_successes
        self.recorder = Recorder()
        self._clock_offset_ms = 0.0
        self._runner = ScriptRunner(client, prefix, int(key_ttl_seconds * 1000))
        self.gate = StoreGate(self._runner, on_store_error, on_switch=self._forget_all)
        self._breakers: dict[str, Breaker] = {}
        self._lock = threading.Lock()
        self._listen = listen
        self.invalidator: Invalidator | None = None
        if listen:
            self.invalidator = Invalidator(client, self._runner.channel, self._on_event, self._forget_all)
        self.pid = os.getpid()
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _after_fork(ref))
        atexit.register(_flush_at_exit, ref)

    @classmethod
    def from_url(cls, url: str, prefix: str = "breaker", **kwargs: Any) -> Breakers:
        """Breakers on a client with sub-second timeouts and no retry loop (see urls.py)."""
        from .urls import client_from_url

        return cls(client_from_url(url), prefix, **kwargs)

    def get(self, name: str, config: BreakerConfig | None = None) -> Breaker:
        """The breaker called name, created with config (or the defaults) on first use.

        Asking again with a different config is an error: two configs for one
        name in one process would make its state machine depend on who asked.
        """
        validate_name(name)
        if config is not None and not isinstance(config, BreakerConfig):
            raise TypeError(f"config must be a BreakerConfig (got {type(config).__name__})")
        with self._lock:
            breaker = self._breakers.get(name)
            if breaker is None:
                breaker = self._breakers[name] = Breaker(self, name, config or self.defaults)
            elif config is not None and config != breaker.config:
                raise ValueError(f"breaker {name!r} already exists with another config: {breaker.config}")
        return breaker

    @property
    def store_healthy(self) -> bool:
        """Whether scripts run on Redis now (False while on_store_error is in force)."""
        return self.gate.healthy

    def names(self) -> list[str]:
        """Every breaker name known to Redis under this prefix (from any worker)."""
        return sorted(text(n) for n in self.client.smembers(self._runner.names_key))

    def configure(self, name: str, **overrides: Any) -> dict[str, str]:
        """Write live overrides for a breaker; None removes one. Validated first."""
        from .config import parse_overrides

        validate_name(name)
        as_text = {key: "" if value is None else str(value) for key, value in overrides.items()}
        base = self._breakers[name].config if name in self._breakers else self.defaults
        setting = {key: value for key, value in as_text.items() if value != ""}
        parse_overrides({key: "1" for key in as_text if key not in setting})  # removals: names only
        base.with_overrides(setting)
        args: list[str] = [""]
        for key, value in as_text.items():
            args += [key, value]
        raw = self.gate.run_remote("configure", name, self.clock_ms(), args)
        return {key: text(value) for key, value in flat_pairs(raw).items()}

    # -- time ---------------------------------------------------------------

    def clock_ms(self) -> int | None:
        """The now_ms given to scripts: None (Redis TIME) unless a test clock is set."""
        return None if self._clock is None else int(self._clock())

    def now_ms(self) -> int:
        """This process's estimate of the Redis clock, for decisions made from memory."""
        if self._clock is not None:
            return int(self._clock())
        return int(time.monotonic() * 1000 + self._clock_offset_ms)

    def _observe_clock(self, redis_now_ms: int) -> None:
        if self._clock is None:
            self._clock_offset_ms = redis_now_ms - time.monotonic() * 1000

    # -- process life ---------------------------------------------------------

    def _ensure_process(self) -> None:
        if self.invalidator is not None:
            self.invalidator.ensure_running()

    def _register_name(self, name: str) -> None:
        with contextlib.suppress(Exception):  # listing is best effort; the gate notices outages
            self._runner.register_name(name)

    def _on_event(self, payload: dict[str, Any]) -> None:
        if not self.gate.healthy:
            return
        breaker = self._breakers.get(str(payload.get("name", "")))
        if breaker is not None:
            breaker._on_event(payload)

    def _forget_all(self) -> None:
        for breaker in list(self._breakers.values()):
            breaker._forget()

    def _after_fork(self) -> None:
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self.gate.after_fork()
        self.recorder.after_fork()
        if self.invalidator is not None:
            self.invalidator.after_fork()
        for breaker in self._breakers.values():
            breaker._lock = threading.Lock()
            breaker._known = None
            breaker._pending_rejected = breaker._pending_would_reject = 0
            breaker._batch_count = 0  # the parent's successes are the parent's to send
            breaker._local_permits = threading.local()

    def close(self) -> None:
        """Send pending batches and stop the background threads (a worker may simply exit)."""
        if self.gate.healthy:
            self.recorder.flush()
        self.recorder.close()
        self.gate.close()
        if self.invalidator is not None:
            self.invalidator.close()


def _flush_at_exit(ref: weakref.ReferenceType[Breakers]) -> None:
    breakers = ref()
    if breakers is not None and breakers.gate.healthy:
        breakers.recorder.flush()


def _after_fork(ref: weakref.ReferenceType[Breakers]) -> None:
    breakers = ref()
    if breakers is not None:
        breakers._after_fork()
