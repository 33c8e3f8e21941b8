"""A pure-Python reference model of ONE breaker's state machine.

Written from docs/design.md section 2 and the comments of lua/*.lua, to be compared
with the real thing by tests/engine/test_model.py. Time is an integer number of
milliseconds given to every call; nothing happens between calls (every
transition is lazy, made by the acquire or record that notices it).

Not modelled: the bulkhead (max_concurrent_calls), live config overrides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from breaker_redis import BreakerConfig

STATS = ("calls", "successes", "failures", "ignored", "slow", "rejected", "would_reject", "trips", "stale")


def ms(seconds: float) -> int:
    """Seconds to whole milliseconds, rounded (0.3 s is 300 ms, not 300.00000000000006)."""
    return round(seconds * 1000)


@dataclass
class ModelPermit:
    epoch: int
    started: int
    lease: int | None = None  # the probe lease, when admitted as a half_open probe


@dataclass
class Decision:
    """What acquire answered: a permit (allowed), or a refusal with its reason."""

    permit: ModelPermit | None
    reason: str = ""  # '' | open | half_open_full | forced_open (also set when observe admits anyway)
    retry_after: float | None = None  # seconds, for reason 'open'


class Window:
    """window_seconds split into buckets of bucket_ms; the live bucket ids are
    (head - buckets, head], where head is the newest bucket written."""

    def __init__(self, window_seconds: float, buckets: int) -> None:
        self.buckets = buckets
        self.bucket_ms = max(1, ms(window_seconds) // buckets)
        self.head: int | None = None
        self.counts: dict[int, list[int]] = {}  # bucket id -> [calls, failures, slow]

    def _current(self, now: int) -> int:
        cur = now // self.bucket_ms
        if self.head is not None and cur < self.head:
            cur = self.head  # a clock step back counts into the newest bucket
        return cur

    def totals(self, now: int) -> tuple[int, int, int]:
        cur = self._current(now)
        live = [c for bucket, c in self.counts.items() if cur - self.buckets < bucket <= cur]
        return sum(c[0] for c in live), sum(c[1] for c in live), sum(c[2] for c in live)

    def add(self, now: int, failed: bool, slow: bool) -> None:
        cur = self._current(now)
        self.counts = {b: c for b, c in self.counts.items() if b > cur - self.buckets}
        bucket = self.counts.setdefault(cur, [0, 0, 0])
        bucket[0] += 1
        bucket[1] += failed
        bucket[2] += slow
        self.head = cur

    def clear(self) -> None:
        self.head, self.counts = None, {}


@dataclass
class BreakerModel:
    config: BreakerConfig
    state: str = "closed"
    forced: str = ""  # '' | open | closed
    # a fresh breaker's epoch is the Redis time in ms of the first script that
    # writes its state (epochs never go backwards, even when keys vanish)
    epoch: int = 0
    open_until: int = 0
    last_open_ms: int = 0  # the base of the last open period (0: no backoff pending)
    consec: int = 0
    ho_ok: int = 0
    leases: dict[int, int] = field(default_factory=dict)  # probe lease id -> expiry ms
    next_lease: int = 0
    stats: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATS, 0))

    def __post_init__(self) -> None:
        c = self.config
        self.window = Window(c.window_seconds, c.window_buckets)
        self.open_ms = ms(c.open_seconds)
        self.max_open_ms = max(ms(c.max_open_seconds), self.open_ms)
        self.probe_ms = max(1, ms(c.probe_timeout_seconds))
        self.slow_ms = 0 if c.slow_call_seconds is None else ms(c.slow_call_seconds)
        self.observe = c.mode == "observe"

    # -- the shared steps ------------------------------------------------------

    def _transition(self, to: str) -> None:
        """Every transition: epoch+1. Probe leases live only within one half_open."""
        self.state = to
        self.epoch += 1
        self.leases.clear()

    def _trip(self, now: int, after_half_open: bool) -> None:
        if after_half_open:  # backoff from the last period, capped, plus up to 10 % jitter
            base = min(
                math.floor(max(self.last_open_ms, self.open_ms) * self.config.open_backoff), self.max_open_ms
            )
            spread = ((now % 997) * 31 + self.epoch * 17) % 100  # the epoch before the transition
            duration = base + base * spread // 1000
        else:  # the first trip: exactly open_seconds
            base = duration = self.open_ms
        self.last_open_ms, self.open_until = base, now + duration
        self.consec = self.ho_ok = 0
        self._transition("open")
        self.stats["trips"] += 1

    def _close(self) -> None:
        self.consec = self.last_open_ms = self.ho_ok = self.open_until = 0
        self.window.clear()
        self._transition("closed")

    def _reap(self, now: int) -> bool:
        """Drop expired probe leases (expiry <= now); True when there was one."""
        expired = [lease for lease, expiry in self.leases.items() if expiry <= now]
        for lease in expired:
            del self.leases[lease]
        return bool(expired)

    def _trip_rule_holds(self, now: int) -> bool:
        c = self.config
        calls, failures, slow = self.window.totals(now)
        if c.trip == "consecutive" and self.consec >= c.failure_threshold:
            return True
        if c.trip == "count" and failures >= c.failure_threshold:
            return True
        if c.trip == "rate" and calls >= c.minimum_calls and failures / calls >= c.failure_rate:
            return True
        return bool(self.slow_ms and calls >= c.minimum_calls and slow / calls >= c.slow_call_rate)

    def _refuse(self, reason: str, now: int) -> Decision:
        if self.observe and reason != "forced_open":  # observe: count it, let it through
            self.stats["would_reject"] += 1
            return Decision(ModelPermit(self.epoch, now), reason)
        self.stats["rejected"] += 1
        retry_after = (self.open_until - now) / 1000 if reason == "open" else None
        return Decision(None, reason, retry_after)

    # -- the operations ----------------------------------------------------------

    def seed(self, now: int) -> None:
        """Called before every step that writes the state: the first one creates it."""
        if not self.epoch:
            self.epoch = now

    def acquire(self, now: int) -> Decision:
        self.seed(now)
        if self.forced == "open":
            return self._refuse("forced_open", now)
        if self.forced == "closed":
            return Decision(ModelPermit(self.epoch, now))
        if self.state == "open" and now >= self.open_until:
            self.ho_ok = 0
            self._transition("half_open")
        if self.state == "half_open":
            if self._reap(now):
                self._trip(now, after_half_open=True)  # a probe died or hung: it failed
            elif len(self.leases) < self.config.half_open_max_calls:
                self.next_lease += 1
                self.leases[self.next_lease] = now + self.probe_ms
                return Decision(ModelPermit(self.epoch, now, self.next_lease))
            else:
                return self._refuse("half_open_full", now)
        if self.state == "open":
            return self._refuse("open", now)
        return Decision(ModelPermit(self.epoch, now))

    def record(self, permit: ModelPermit, outcome: str, now: int) -> None:
        self.seed(now)
        duration = max(0, now - permit.started)
        expiry = self.leases.get(permit.lease) if permit.lease is not None else None
        probe = expiry is not None and expiry > now  # still holds a live probe lease
        if probe:
            del self.leases[permit.lease]  # released; an expired one stays, to be reaped as failed

        failed = outcome == "failure"
        slow = outcome != "ignored" and self.slow_ms > 0 and duration >= self.slow_ms
        self.stats["calls"] += 1
        self.stats[{"success": "successes", "failure": "failures"}.get(outcome, "ignored")] += 1
        self.stats["slow"] += slow

        if permit.epoch != self.epoch:
            self.stats["stale"] += 1  # admitted before a transition: decides nothing
            return
        if self.state == "half_open" and not self.forced and self._reap(now):
            # a probe that overran its lease (this one or another) failed, whatever came back
            self._trip(now, after_half_open=True)
            return
        if outcome == "ignored":
            return
        if self.state == "closed":
            self.window.add(now, failed, slow)
            self.consec = self.consec + 1 if failed else 0
            if not self.forced and self._trip_rule_holds(now):
                self._trip(now, after_half_open=False)
        elif self.state == "half_open" and not self.forced:
            if probe and failed:
                self._trip(now, after_half_open=True)
            elif probe:
                self.ho_ok += 1
                if self.ho_ok >= self.config.half_open_successes:
                    self._close()
            # a result without a probe lease (observe mode) does not decide half_open

    def force_open(self) -> None:
        self.forced, self.open_until, self.ho_ok = "open", 0, 0
        self._transition("open")

    def force_closed(self) -> None:
        self.forced, self.open_until, self.ho_ok = "closed", 0, 0
        self._transition("closed")

    def clear_force(self) -> None:
        if self.forced:
            self.reset()

    def reset(self) -> None:
        """Closed, clean window, no backoff, no leases, no force; cumulative stats kept."""
        self.forced = ""
        self._close()

    def snapshot(self, now: int) -> dict[str, object]:
        calls, failures, slow = self.window.totals(now)
        retry_after = None
        if self.state == "open" and not self.forced:
            retry_after = max(0, self.open_until - now) / 1000
        return {
            "state": self.state,
            "forced": self.forced or None,
            "epoch": self.epoch or now,  # read before any write: as if created now
            "retry_after": retry_after,
            "window_calls": calls,
            "window_failures": failures,
            "window_slow": slow,
            "consecutive_failures": self.consec,
            "half_open_successes": self.ho_ok,
            **self.stats,
        }
