"""Breaker groups: a pool of replica hosts serving one service, each with its
breaker, of which at most a share may be open at once (Envoy's
``max_ejection_percent``), however many workers and hosts share them.

A bad deploy that makes every replica fail must not eject them all: with
``max_open_fraction=0.5`` and 4 replicas, 2 open and the other 2 keep being
called (and keep counting), so the app still reaches the service, and when
an open replica recovers another may open.

What a group is (its members' config, its cap, its status, why Redis
decides) is web/group_config.py's; this module is what a worker does. A
grant is tied to the open state it was granted for: a member that closes
(its probes succeeded, an operator's reset, force_closed or clear_force)
gives it back in its own slot as it closes, and the reply says so
(``released:<token>``), for the group to forget it.

What a worker does (``settle``, after each request through a member): a
reply of a member's script that held a trip back asks the group for a grant
and, granted, trips the member (member.lua); a reply that gave a grant back
has the group forget it. Refused at the cap, the worker looks at most once a
second (``RECLAIM_MS`` of the Breakers' clock) at every holder: it joins
again (its config seen, the newest one learned), closes and takes back the
grant of a member the newest config no longer lists, and takes back the
grant of a member that is closed (a worker died between two steps) or open
and idle (no call has probed it for a minute after its open period: nobody
uses it any more). ``release(member)`` (and ``release_grant``, ``breaker-redis
release``) gives a grant back by hand.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Generator, Iterable
from typing import Any, NamedTuple

from breaker_redis.base.background import process_hooks
from breaker_redis.base.blocking import awaited, blocking, run_sync
from breaker_redis.base.config import BreakerConfig
from breaker_redis.base.names import validate_name
from breaker_redis.engine.knowledge import Reply
from breaker_redis.engine.transitions import released_upto
from breaker_redis.storage.args import GroupReadArgs, MemberArgs, group_args
from breaker_redis.storage.scripts import text
from breaker_redis.storage.store import StoreUnavailable
from breaker_redis.web.group_config import (
    MemberConfig,
    cap_of,
    config_digest,
    fraction_of,
    group_status,
    member_config,
    member_of,
    members_of,
)
from breaker_redis.web.hosts import member_name
from breaker_redis.web.http_policy import Warnings

__all__ = ["AsyncBreakerGroup", "BreakerGroup", "MemberConfig", "release_grant"]

RECLAIM_MS = 1000  # how often a worker refused at the cap checks the holders (the Breakers' clock)


# One step of ``_settle``, its I/O done by ``_run``:
# ("member", name, op, token, cause) -> the member script's Reply or None (Redis down);
# ("group", op, *args) -> the group script's raw answer or None; ("register",) -> None.
Step = tuple[str, ...]


_READ_GROUP = ["", "", *GroupReadArgs().argv()]  # ARGV 5-6 (not a group's), then read


class _Asked(NamedTuple):
    """group.lua ask's answer: granted or not, the grant's token, the holders when refused."""

    granted: bool
    token: str
    holders: list[tuple[str, str]]


class _Group:
    """What the sync and asyncio groups share: the options, checked when built,
    the member breakers, the marks their replies leave, and what to do about them."""

    _asynchronous = False  # on breaker_redis.asyncio's Breakers

    def __init__(
        self,
        breakers: Any,
        name: str,
        members: Iterable[str],
        *,
        max_open_fraction: float = 0.5,
        config: BreakerConfig | None = None,
    ) -> None:
        from breaker_redis.asyncio import Breakers as AsyncBreakers
        from breaker_redis.engine.breakers import Breakers

        kind = type(self).__name__
        wanted = AsyncBreakers if self._asynchronous else Breakers
        if not isinstance(breakers, wanted):
            label = "breaker_redis.asyncio.Breakers" if self._asynchronous else "breaker_redis.Breakers"
            raise TypeError(f"{kind}: breakers must be a {label} (got {breakers!r})")
        where = f"{kind} {name!r}"
        try:
            self.name = validate_name(name)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{type(self).__name__}: {exc}") from None
        names = members_of(where, members)
        fraction = fraction_of(where, max_open_fraction)
        if config is not None and not isinstance(config, BreakerConfig):
            raise TypeError(f"{where}: config must be a BreakerConfig (got {config!r})")
        self.breakers: Any = breakers
        self.members = names
        self.max_open_fraction = fraction
        self.cap = cap_of(self.max_open_fraction, len(names))
        self.config = member_config(config or breakers.defaults, self.name)
        self._breakers: dict[str, Any] = {}
        for member in names:
            current = breakers.get(member).config if member in breakers else None
            if isinstance(current, MemberConfig):
                raise ValueError(f"{where}: member {member!r} is already in group {current.group!r}")
            try:
                breaker = breakers.get(member, self.config)
            except ValueError as exc:
                raise ValueError(
                    f"{where}: member {member!r}: {exc} (build the group before anything "
                    "uses its members' breakers)"
                ) from None
            breaker.on_events = self._on_events
            self._breakers[member] = breaker
        self._digest = config_digest(self.max_open_fraction, self.members)
        self._lock = threading.Lock()
        process_hooks.add(self, after_fork=self._after_fork)
        # per member: (the highest token it gave back, for the group to forget; a trip held back)
        self._pending: dict[str, tuple[int, bool]] = {}
        self._pid = 0  # the process that joined the group in Redis
        self._reclaimed_at: int | None = None
        self._warnings = Warnings()
        self._io: Callable[..., Any] = awaited if self._asynchronous else blocking

    def __contains__(self, name: object) -> bool:
        return name in self._breakers

    def breaker(self, member: str) -> Any:
        """The breaker of a member (a host URL or its breaker name)."""
        return self._breakers[member_name(member)]

    def _on_events(self, breaker: Any, events: str) -> None:
        """A reply of a member's script: a trip held back, or a grant given back, is for settle()."""
        held, upto = "held" in events.split(","), released_upto(events)
        if held or upto:
            with self._lock:
                was_upto, was_held = self._pending.get(breaker.name, (0, False))
                self._pending[breaker.name] = (max(was_upto, upto), was_held or held)

    @property
    def due(self) -> bool:
        """Whether settle() has anything to do (no lock: a hint)."""
        return bool(self._pending) or self._pid != os.getpid()

    def _join_step(self) -> Step:
        """group.lua join: this worker's config (fraction, cap, members, digest)."""
        members = " ".join(self.members)
        return ("group", "join", repr(self.max_open_fraction), str(self.cap), members, self._digest)

    def _settle(self) -> Generator[Step, Any, None]:
        """What settle() does, as steps (``_drive`` runs them)."""
        pid = os.getpid()
        with self._lock:
            if self._pid != pid:
                if self._pid:
                    self._pending.clear()  # a forked child: the marks were its parent's
                self._pid = pid
                joining = True
            else:
                joining = False
            pending, self._pending = self._pending, {}
        if joining:
            yield ("register",)
            yield self._join_step()
        for name, (upto, held) in pending.items():
            if upto:  # given back in the member's slot: the group forgets it
                yield ("group", "release", name, str(upto))
            if held:
                yield from self._asking(name)

    def _asking(self, name: str) -> Generator[Step, Any, None]:
        """A trip of member ``name`` was held back: ask the group for a grant; refused at the
        cap, reclaim what no longer needs one (at most every RECLAIM_MS); granted, trip it."""
        asked = yield from self._ask(name)
        reclaim = asked is not None and not asked.granted and self._reclaim_due()
        if asked is not None and reclaim and (yield from self._reclaim(name, asked.holders)):
            asked = yield from self._ask(name)
        for _attempt in range(2):
            if asked is None or not asked.granted:
                return
            reply = yield ("member", name, "grant", asked.token, "")
            if reply is None or reply.allowed or not reply.lease:
                return
            # not kept: not needed any more (the group forgets it), or a token revoked before
            # that the group still listed (forgotten, and asked once more for a new one)
            yield ("group", "release", name, reply.lease)
            if reply.reason != "revoked":
                return
            asked = yield from self._ask(name)

    def _ask(self, name: str) -> Generator[Step, Any, _Asked | None]:
        """group.lua ask for member ``name``; None when Redis did not answer."""
        answer = yield ("group", "ask", name, str(self.cap))
        if answer is None:
            return None
        rest = [text(x) for x in answer[2:]]
        return _Asked(int(answer[0]) == 1, text(answer[1]), list(zip(rest[::2], rest[1::2], strict=True)))

    def _reclaim(self, name: str, holders: list[tuple[str, str]]) -> Generator[Step, Any, bool]:
        """Take back the grants of the holders (but ``name``) that no longer need one;
        whether any was."""
        newest = yield self._join_step()  # this config seen now; the newest one's members
        listed = set(text(newest[0]).split()) if newest else None
        freed = False
        for holder, held in holders:
            if holder == name:
                continue
            if listed is None or holder in listed:
                reply = yield ("member", holder, "revoke", held, "")  # closed, forced or idle only
            else:  # the newest config does not list it: closed, and its grant taken back
                reply = yield ("member", holder, "release", held, "not_listed")
            if reply is not None and reply.allowed and reply.lease:
                freed = (yield ("group", "release", holder, reply.lease)) == 1 or freed
        return freed

    async def _drive(self, steps: Generator[Step, Any, None]) -> None:
        """Run ``steps``, each one's I/O by ``_run``, each answer sent back. Never raises:
        a failure is logged. The sync side runs it with ``run_sync`` (its I/O never
        suspends: base/blocking.py)."""
        result: Any = None
        try:
            while True:
                result = await self._run(steps.send(result))
        except StopIteration:
            return
        except Exception:  # not an outage (the gate takes those): a bug must not fail the call
            self._warnings.warn(self.name, "settling breaker group %r failed")

    async def _run(self, step: Step) -> Any:
        """One step's I/O, written once: ``_io`` makes each call blocking or awaited."""
        io, breakers = self._io, self.breakers
        if step[0] == "member":
            breaker = self._breakers.get(step[1])
            if breaker is not None:
                return await io(breaker.run_script, "member", self._member_args(step))
            try:  # another config's member: its keys only (no config sent, nothing learned)
                args = ["", "", *self._member_args(step)]
                raw, _ = await io(
                    breakers.gate.run, "member", step[1], breakers.clock_ms(), args, fallback=False
                )
            except StoreUnavailable:
                return None
            reply = Reply.decode(raw)
            await io(breakers.barrier, step[1], reply.ack)  # a release may have closed it: every worker hears
            return reply
        gate = breakers.gate
        if step[0] == "register":
            with contextlib.suppress(Exception):  # listing is best effort; the gate notices outages
                await io(breakers.client.sadd, gate.remote.groups_key, self.name)
            return None
        try:
            raw, _ = await io(gate.run, "group", self.name, breakers.clock_ms(), self._group_args(step))
        except StoreUnavailable:
            return None
        return raw

    async def _read_status(self) -> dict[str, Any]:
        """status(), written once (``_io`` as in ``_run``)."""
        io, breakers = self._io, self.breakers
        raw, _ = await io(breakers.gate.run, "group", self.name, breakers.clock_ms(), _READ_GROUP)
        states = {m: (await io(b.snapshot))["state"] for m, b in self._breakers.items()}
        return group_status(
            self.name, raw, states, members=self.members, cap=self.cap, fraction=self.max_open_fraction
        )

    def _after_fork(self) -> None:
        """A forked child starts with a lock of its own (another thread of the parent may
        have held it at the fork) and without the parent's marks."""
        self._lock = threading.Lock()
        self._pending = {}

    def _reclaim_due(self) -> bool:
        """At most once every RECLAIM_MS of the Breakers' clock (a test's clock moves it)."""
        now = self.breakers.now_ms()
        with self._lock:
            if self._reclaimed_at is not None and 0 <= now - self._reclaimed_at < RECLAIM_MS:
                return False
            self._reclaimed_at = now
            return True

    def _group_args(self, step: Step) -> list[str]:
        return ["", "", *group_args(*step[1:])]  # ARGV 5 and 6 (config, epoch floor) are not a group's

    def _member_args(self, step: Step) -> list[str]:
        return MemberArgs(*step[2:]).argv()  # ARGV 7-9 (a breaker adds its config and floor)


class BreakerGroup(_Group):
    """A pool of replica hosts of one service, at most ``max_open_fraction`` of
    them open at once, for every worker that shares the Redis and key prefix.

    ``breakers``: a ``breaker_redis.Breakers``; ``name``: the group's (a breaker
    name's rules); ``members``: host URLs (``http://10.0.0.1:8000``, standing for
    their ``host:port`` breakers) or breaker names; ``config``: the members'
    BreakerConfig (default: the Breakers' defaults). Give it to the HTTP client
    integrations (``BreakerAdapter(breakers, groups=[pool])``), or protect calls
    with ``pool.breaker(member)`` and call ``pool.settle()`` after each outcome.
    Build it before anything else uses the members' breakers.
    """

    def settle(self) -> None:
        """Act on what the members' replies said since the last call (a trip held
        back at the cap, a grant given back). Never raises: a failure is logged."""
        if self.due:
            run_sync(self._drive(self._settle()))

    def release(self, member: str) -> bool:
        """Give ``member``'s grant back by hand (a host URL or a breaker name, listed or not):
        if it is open or half-open it is closed first (transition cause ``released``), its
        grant is revoked in its own slot, then the group forgets it. True if the group listed
        a grant for it. On Redis only, as an operator's switch: a Redis error raises."""
        return release_grant(self.breakers, self.name, member)

    def status(self) -> dict[str, Any]:
        """The group now: members, cap, which are open, which hold grants, counters."""
        return run_sync(self._read_status())


class AsyncBreakerGroup(_Group):
    """``BreakerGroup`` over the asyncio breakers (``breaker_redis.asyncio.Breakers``):
    ``await pool.settle()``, ``await pool.status()``; for ``AsyncBreakerTransport``."""

    _asynchronous = True

    async def settle(self) -> None:
        """As BreakerGroup.settle, awaited."""
        if self.due:
            await self._drive(self._settle())

    async def release(self, member: str) -> bool:
        """As BreakerGroup.release, awaited."""
        self.breakers.ensure_loop()
        return await _release(self.breakers, awaited, self.name, member)

    async def status(self) -> dict[str, Any]:
        """As BreakerGroup.status, awaited."""
        self.breakers.ensure_loop()
        return await self._read_status()


def release_grant(breakers: Any, group: str, member: str) -> bool:
    """Give ``member``'s grant in ``group`` back by hand, without building the group (the
    CLI's ``breaker-redis release GROUP MEMBER``): on a ``breaker_redis.Breakers``, as
    ``BreakerGroup.release``: the member's script first (it closes the member if it is open
    and revokes every token up to its grant, in its own slot), then the group's (it forgets
    the grant up to that token), both on Redis only. True if the group listed a grant."""
    validate_name(group)
    return run_sync(_release(breakers, blocking, group, member))


async def _release(breakers: Any, io: Callable[..., Any], group: str, member: str) -> bool:
    """release_grant and AsyncBreakerGroup.release, written once (``io``: base/blocking.py)."""
    name = member_of(f"breaker group {group!r}", member)
    clock = breakers.clock_ms()
    raw = await io(breakers.gate.run_remote, "member", name, clock, ["", "", "release", "", "released"])
    reply = Reply.decode(raw)
    await io(breakers.barrier, name, reply.ack)  # the member may have closed: every worker hears it first
    upto = reply.lease or "0"
    return (
        int(await io(breakers.gate.run_remote, "group", group, clock, ["", "", "release", name, upto])) == 1
    )
