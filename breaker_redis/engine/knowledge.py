"""What a worker knows about one breaker, and the rules for using it.

Everything a worker decides without asking Redis follows from this module:

- **Replies are authoritative.** Every script replies with the breaker's state
  (``Reply``); the worker keeps the newest one as its ``Knowledge``. Newer means
  a higher (epoch, arms, calm) rank: epochs never go backwards, not even when
  a breaker's keys vanish (lua/_lib.lua seeds a new state above every epoch
  handed out before), so a reply that lost a race between two threads never
  overwrites a newer one.
- **Messages are hints.** A pub/sub message that may be news (``is_news``) makes
  the worker forget and ask Redis at its next call; it is never adopted as
  state, so a forged message costs one round trip and nothing more. A reply
  that was in flight meanwhile is kept only if it reflects what the message
  announced (``Memory``).
- **Trust.** Knowledge decides from memory only while the event subscription
  is up and drained up to this moment (see invalidation.py), or while the
  store is the in-process fallback, which no other process shares.
- **Calm and armed.** Closed knowledge is *calm* when no success reaching Redis
  late could change a decision, *armed* otherwise (lua/_lib.lua,
  update_armed). Calm workers batch their successes; armed ones send every
  outcome at once. Admission from memory is the same for both: the trip
  boundary comes from the ordered notice, not from arming.
- **The ramp.** Closed knowledge learned before the reply's ``ramp_until``
  (a close of a breaker with ``ramp_seconds``) does not admit whatever the
  time: until then the worker admits its share of the calls (``Verdict.RAMP``,
  ramp.py), by its estimate of the Redis time, with no round trip. With a
  bulkhead it then asks Redis for a slot, saying the ramp was decided; a call
  that asks for a slot otherwise has its ramp decided by the acquire script.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Protocol

from breaker_redis.engine.ramp import RAMP_FROM, ramp_share
from breaker_redis.engine.reply import Reply as Reply  # (what a worker learns from: reply.py)
from breaker_redis.storage.notices import Notice

# A backstop: knowledge is re-checked with Redis at least this often, even
# while the subscription reports no change.
TRUST_SECONDS = 30.0
# What a worker knows is offered for restoring a lost state this long after it
# was learned: knowledge in use is renewed at least every TRUST_SECONDS.
RESTORE_SECONDS = 2 * TRUST_SECONDS


class Gate(Protocol):
    """What trust reads of a store gate (store.py StoreGate, asyncio/store.py AsyncStoreGate)."""

    generation: int

    @property
    def healthy(self) -> bool: ...


class Verdict(Enum):
    ADMIT = "admit"  # closed (or forced closed): go ahead
    OBSERVE = "observe"  # open in observe mode: go ahead, counted as would_reject
    DENY = "deny"  # open before open_until, or forced open
    RAMP = "ramp"  # closed, ramping up after a close: this worker admits its share (ramp_share)
    ASK = "ask"  # memory cannot decide: run the acquire script


@dataclass(frozen=True)
class Knowledge:
    state: str
    epoch: int
    arms: int
    armed: bool
    born: int
    open_until: int
    forced: str
    mode: str
    max_concurrent: int
    slow_ms: int
    generation: int  # the store-gate generation it was learned under
    learned_at: float  # time.monotonic()
    isolated_until: int = 0  # this worker's reporter is isolated until then (Redis ms; 0: it is not)
    # the ramp after a close (Redis ms; 0: none, or over when learned, or not closed and unforced),
    # over ramp_ms from the share ramp_from (BreakerConfig.ramp_seconds, docs/recovery.md)
    ramp_until: int = 0
    ramp_ms: int = 0
    ramp_from: float = RAMP_FROM
    window_calls: int = 0  # the config's count window (0: none): batched successes carry their times
    # decide() admits whatever the time, with no counting: closed (or forced closed), no
    # bulkhead, no ramp running. Worked out once, so the healthy call checks one field
    admits: bool = field(init=False, compare=False)
    calm: bool = field(init=False, compare=False)
    stale_at: float = field(init=False, compare=False)  # learned_at + TRUST_SECONDS

    def __post_init__(self) -> None:
        forced, closed = self.forced, self.state == "closed"
        admits = not forced and not self.max_concurrent and closed and not self.isolated_until
        admits = admits and not self.ramp_until
        object.__setattr__(self, "admits", forced == "closed" or admits)
        # closed with nothing a late success could change: successes may be batched
        object.__setattr__(self, "calm", forced == "closed" or (closed and not forced and not self.armed))
        object.__setattr__(self, "stale_at", self.learned_at + TRUST_SECONDS)

    @classmethod
    def from_reply(
        cls,
        reply: Reply,
        generation: int,
        mode: str,
        max_concurrent: int,
        slow_ms: int,
        ramp_ms: int = 0,
        ramp_from: float = 0.0,
    ) -> Knowledge:
        # the ramp matters while closed, unforced and not over: else none, and the healthy
        # call's one test (admits) holds
        ramping = ramp_ms and reply.state == "closed" and not reply.forced and reply.now < reply.ramp_until
        return cls(
            reply.state,
            reply.epoch,
            reply.arms,
            reply.armed,
            reply.born,
            reply.open_until,
            reply.forced,
            mode,
            max_concurrent,
            slow_ms,
            generation,
            time.monotonic(),
            reply.isolated_until,
            reply.ramp_until if ramping else 0,
            ramp_ms,
            ramp_from or RAMP_FROM,
            reply.window_calls,
        )

    @property
    def rank(self) -> tuple[int, int, int]:
        # arming bumps `arms`; calming does not, so within one arms count calm is newer
        return (self.epoch, self.arms, 0 if self.armed else 1)

    def supersedes(self, other: Knowledge | None) -> bool:
        """Newer than other: a higher rank, or another store or incarnation of the keys."""
        if other is None or other.generation != self.generation or other.born != self.born:
            return True
        return self.rank >= other.rank

    def trusted(self, gate: Gate, lease_until: float) -> bool:
        """Whether memory may decide (after the notices received were delivered).

        Learned from the store the gate uses now; and that store is the
        in-process fallback, which no other process changes, or the
        subscription is up and its lease runs (``lease_until``, time.monotonic:
        storage/acks.py; 0.0 when it is down) and a reply came within
        TRUST_SECONDS.
        """
        if self.generation != gate.generation:
            return False
        if not gate.healthy:
            return True
        return time.monotonic() < (lease_until if lease_until < self.stale_at else self.stale_at)

    def slow(self, duration_ms: int) -> bool:
        """A call this long counts as slow (as lua/record.lua judges it)."""
        return bool(self.slow_ms) and duration_ms >= self.slow_ms

    def ramp_share(self, now_ms: int) -> float:
        """The share of calls admitted at now_ms (ramp.py)."""
        return ramp_share(self.ramp_until, self.ramp_ms, self.ramp_from, now_ms)

    def decide(self, now_ms: int) -> Verdict:
        if self.forced == "open":
            return Verdict.DENY
        if self.forced == "closed":
            return Verdict.ADMIT
        if self.max_concurrent and self.ramp_until > now_ms and not self.isolated_until:
            return Verdict.RAMP  # the ramp is decided here, the bulkhead slot then by Redis
        if self.max_concurrent:
            return Verdict.ASK  # a bulkhead slot is a lease only Redis hands out
        if self.state == "closed" and self.isolated_until:  # this reporter is isolated (lua/_lib.lua)
            if now_ms < self.isolated_until:
                return Verdict.OBSERVE if self.mode == "observe" else Verdict.DENY
            return Verdict.ASK  # its own probe is Redis's to hand out
        if self.state == "closed":
            return Verdict.RAMP if now_ms < self.ramp_until else Verdict.ADMIT
        if self.state == "open" and now_ms < self.open_until:
            return Verdict.OBSERVE if self.mode == "observe" else Verdict.DENY
        return Verdict.ASK  # the open period is over, or half_open: probes are Redis's to hand out


@dataclass(frozen=True)
class Announcement:
    """What a transition, arming or isolation message says: (born, epoch, arms)."""

    born: int
    epoch: int
    arms: int

    @classmethod
    def parse(cls, notice: Notice) -> Announcement | None:
        """What the notice announces; None when it announces nothing (another kind, or a
        field that does not hold what a script writes: storage/notices.py)."""
        if notice.kind not in ("transition", "armed", "isolation"):
            return None
        if notice.born is None or notice.epoch is None or notice.arms is None:
            return None
        return cls(notice.born, notice.epoch, notice.arms)

    def extends(self, earlier: Announcement | None) -> bool:
        """Same incarnation as an earlier announcement, or the first one."""
        return earlier is None or earlier.born == self.born

    def covered_by(self, reply: Reply) -> bool:
        """Whether the reply already reflects this announcement (or something later)."""
        return reply.born == self.born and (reply.epoch, reply.arms) >= (self.epoch, self.arms)


def is_news(known: Knowledge, notice: Notice) -> bool:
    """Whether a pushed message about a breaker may tell this worker something.

    A transition or arming message at or below what the worker knows, of the
    same incarnation of the keys (``born``), is old news (typically its own);
    anything else is news, a message from another incarnation included (its
    keys were recreated, perhaps by a worker that knew a lower epoch), and so
    are a config write and fields that do not parse: the worker asks Redis
    again at its next call. (A message that is not a JSON object names no
    breaker and is dropped by the listener.)
    """
    announced = Announcement.parse(notice)
    if announced is None:
        return True
    return announced.born != known.born or (announced.epoch, announced.arms) > (known.epoch, known.arms)


class Memory:
    """What one process knows about one breaker, and how that changes.

    A reply is kept when it is newer than what is known. A hint that is news
    makes the memory forget; a reply to a script that was in flight when the
    hint arrived is then kept only if it already reflects what the hint
    announced (a live-config write or a lost subscription announces nothing,
    so no such reply is kept): it may have been computed before the change.
    Thread safe; ``known`` is an immutable snapshot, read without the lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.known: Knowledge | None = None
        self.epoch_seen = 0  # the floor for a state hash created anew (lua/_lib.lua)
        self._invalidations = self._opaque_at = 0
        self._announced: Announcement | None = None
        # (state, epoch, born, open_until, forced) of the last transition message, when, and
        # whether it named its database; and of the last knowledge learned from Redis (not
        # from the local store), and when
        self._heard: tuple[_State, float, bool] | None = None
        self._remembered: tuple[_State, float] | None = None

    def floor_arg(self) -> str:
        """ARGV 6 of a script (format: docs/wire.md): the highest epoch seen and what this
        worker knows of the state now, which the scripts restore should Redis
        have lost it (keys evicted, flushed, deleted): what Redis last said,
        kept also once the worker forgot it (a store switch: a Redis restarted
        empty, or the local store while Redis is away, gets the open state
        back), or what a transition message announced since (a worker that
        heard of a trip and has not asked since knows the breaker is open), if
        it is about the incarnation Redis last told it of or, when the message
        names this worker's database, a later one (the keys were lost and
        created anew, and that incarnation tripped: on an evicting Redis the
        usual way a worker learns of a trip). The latter goes marked ' heard',
        and the scripts restore it only over a still later incarnation.
        Nothing older than RESTORE_SECONDS is offered: it may be what an idle
        breaker swept long ago was."""
        # the newer of the last thing Redis said and the last message heard: never what the
        # local store said (its state is this process's own, and a local trip must not
        # overwrite a breaker on Redis). A message about another incarnation than Redis's
        # last reply only if it names the database (Breakers._on_event dropped any naming
        # another: pub/sub ignores the database, and another database may have a breaker
        # of the same name) and is about a later one; one naming none is from an older
        # breaker_redis, or forged (the channel is not the keys)
        remembered, heard = self._remembered, self._heard
        later = False
        if heard is not None:
            born = heard[0][2]
            later = remembered is not None and heard[2] and born > remembered[0][2]
            if remembered is None or (born != remembered[0][2] and not later):
                heard = None
        offered = max((x for x in (remembered, heard) if x is not None), key=lambda x: x[1], default=None)
        if offered is None or time.monotonic() - offered[1] > RESTORE_SECONDS:
            return str(self.epoch_seen)
        state, tail = offered[0], " heard" if later and offered is heard else ""
        return f"{self.epoch_seen} {state[0]} {state[1]} {state[2]} {state[3]} {state[4] or '-'}{tail}"

    def stamp(self) -> int:
        """Taken before a script is sent, handed back to learn() with its reply."""
        return self._invalidations

    def learn(
        self, reply: Reply, generation: int, stamp: int, own: Config, shared: bool = False
    ) -> Knowledge:
        """Keep the reply if it is the newest news. ``own``: this worker's (mode,
        max_concurrent, slow_ms, ramp_ms, ramp_from), for admin replies, which carry no config;
        ``shared``: it came from Redis, not from the local store."""
        with self._lock:
            current = self.known
            config: Config
            if reply.mode:
                config = (reply.mode, reply.max_concurrent, reply.slow_ms, reply.ramp_ms, reply.ramp_from)
            elif current is not None and current.generation == generation:
                ramp = (current.ramp_ms, current.ramp_from)
                config = (current.mode, current.max_concurrent, current.slow_ms, *ramp)
            else:
                config = own
            known = Knowledge.from_reply(reply, generation, *config)
            if self._covers(reply, stamp) and known.supersedes(current):
                self.known = known
                if shared:
                    self._remembered = (_state_of(known), known.learned_at)
            self.epoch_seen = max(self.epoch_seen, reply.epoch)
        return known

    def _covers(self, reply: Reply, stamp: int) -> bool:
        """Whether the reply is at least as new as every hint since ``stamp``. Holds _lock."""
        if self._invalidations == stamp:
            return True
        announced = self._announced
        return self._opaque_at <= stamp and announced is not None and announced.covered_by(reply)

    def hint(self, notice: Notice) -> bool:
        """A pushed message; True if it was news (the memory forgot)."""
        with self._lock:
            if self.known is not None and not is_news(self.known, notice):
                return False
            self.known = None
            self._invalidations += 1
            announced = Announcement.parse(notice)
            if announced is None or not announced.extends(self._announced):
                self._opaque_at = self._invalidations
            self._announced = announced
            self._heard = _transition_heard(notice) or self._heard
            return True

    def ramp_over(self, known: Knowledge) -> None:
        """The ramp of what is known ended: the same knowledge without it, so that the
        healthy call takes its one-test path again before the next reply comes."""
        with self._lock:
            if self.known is known:
                self.known = replace(known, ramp_until=0)

    def forget(self) -> None:
        """Drop everything known (a new subscription, a store switch): nothing in flight is kept."""
        with self._lock:
            self.known = None
            self._invalidations += 1
            self._opaque_at = self._invalidations


_State = tuple[str, int, int, int, str]  # state, epoch, born, open_until, forced: ARGV 6 (docs/wire.md)
Config = tuple[str, int, int, int, float]  # what a reply's config says: Memory.learn's ``own``


def _state_of(known: Knowledge) -> _State:
    return (known.state, known.epoch, known.born, known.open_until, known.forced)


def about_another_database(notice: Notice, database: int) -> bool:
    """Whether a message names another database than ``database``, the worker's.
    Pub/sub ignores the database (SELECT), so a worker hears the breakers of its
    prefix on every database of the server: one of the same name on another
    database is another app's breaker, and its message is dropped. A message
    naming none (from an older breaker_redis) may be about either; one whose ``db`` is
    not a database number (storage/notices.py FOREIGN_DATABASE) names none of a worker's."""
    return notice.database is not None and notice.database != database


def _transition_heard(notice: Notice) -> tuple[_State, float, bool] | None:
    """What a transition message announced, for restoring a lost state (Memory.floor_arg);
    None unless every field it needs holds what a script writes (storage/notices.py)."""
    if notice.kind != "transition":
        return None
    state, epoch, born, open_until = notice.to, notice.epoch, notice.born, notice.open_until
    forced = notice.forced
    if state is None or epoch is None or born is None or open_until is None or forced is None:
        return None
    return (state, epoch, born, open_until, forced), time.monotonic(), notice.database is not None
