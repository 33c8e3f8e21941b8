"""Each script's own arguments (ARGV 7 on), named once, as the scripts name them.

A dataclass per script (``<Script>Args``; ``Group<Op>Args`` for group.lua's
ops), whose fields are in ARGV order (a field ``counts`` is the six of COUNTS,
in place): ``argv()`` is the list a worker sends after ARGV 1-6 (the common
ones: name, channel, now and key TTL from Scripts.prepared, config and epoch
floor from the caller). Each script
(lua/<script>.lua) reads the same positions once, into a table of the same
names (``local a = {epoch = ARGV[7], outcome = ARGV[8], ...}``, then
``a.outcome``), and tests/storage/test_args.py reads both and fails when a name or
a position differs, so the two cannot drift.
The positions and values are the wire protocol a worker of the previous
release shares during a rolling deploy (docs/boundary.md; docs/wire.md lists
them): a new field goes at the end, never between two.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, NamedTuple

# What a worker counted in memory since its last flush, in the order acquire, record and
# snapshot read them: their dataclasses' one field ``counts``, sent as these six ARGV.
COUNTS = ("rejected", "would_reject", "successes", "failures", "ignored", "slow")


def argv_names(cls: type) -> tuple[str, ...]:
    """The names a script reads a dataclass's fields by, in ARGV order (a base class's
    fields first; ``counts`` stands for COUNTS)."""
    return tuple(name for f in fields(cls) for name in (COUNTS if f.name == "counts" else (f.name,)))


def _getter(cls: type) -> Callable[[Any], list[Any]]:
    """What reads a dataclass's fields in order, in one call (``counts`` spread)."""
    names = tuple(f.name for f in fields(cls))
    get = attrgetter(*names)
    if "counts" in names:
        at = names.index("counts")
        one = len(names) == 1

        def spread(instance: Any) -> list[Any]:
            values = [get(instance)] if one else list(get(instance))
            values[at : at + 1] = values[at]
            return values

        return spread
    if len(names) == 1:
        return lambda instance: [get(instance)]
    return lambda instance: list(get(instance))


# each class's getter, made at its first argv(): acquire's and record's arguments are
# built for most calls a worker makes
_GETTERS: dict[type, Callable[[Any], list[Any]]] = {}


class ScriptArgs:
    """What every script's arguments share: their list, in field order."""

    __slots__ = ()

    def argv(self) -> list[Any]:
        """ARGV 7 on, in the order the script reads them."""
        get = _GETTERS.get(type(self))
        if get is None:
            get = _GETTERS[type(self)] = _getter(type(self))
        return get(self)


@dataclass(slots=True)
class SnapshotArgs(ScriptArgs):
    """snapshot.lua: what the worker counted in memory, flushed so it shows at once."""

    counts: Sequence[int]  # COUNTS, in order


@dataclass(slots=True)
class AcquireArgs(SnapshotArgs):
    """acquire.lua: what the worker counted in memory since its last flush, then its
    reporter (read only with min_reporters > 1), then whether it decided the ramp after
    a close from memory ('1'; '': with a bulkhead, the script decides it before the
    slot, docs/recovery.md)."""

    reporter: str
    ramped: str = ""


@dataclass(slots=True)
class RecordArgs(ScriptArgs):
    """record.lua: one outcome (or '' for a batch alone), the counts kept in memory,
    the batched successes (their epoch, how many), the reporter, and when the batched
    successes ended (read by a count window only: lua/includes/ring.lua)."""

    epoch: int  # the epoch the permit was issued under
    outcome: str  # success | failure | ignored, or '' for a batch alone
    duration_ms: int
    lease: str  # '' or the lease ids acquire.lua handed out, space-separated
    counts: Sequence[int]  # COUNTS, in order
    batch_epoch: int
    batch: int
    reporter: str
    # '' or the worker's clock at the send, the first end time, then each next one as a
    # difference (us, sorted): engine/core.py batch_times
    batch_times: str


class Batch(NamedTuple):
    """The successes a record call carries: their epoch, how many, and when each ended
    (us; empty unless the breaker has a count window)."""

    epoch: int
    size: int
    times: list[int]


def batch_times(sent_us: int, times: list[int]) -> str:
    """RecordArgs.batch_times (docs/wire.md, "Hash records"): the clock at the send,
    the first end time, then each next one as a difference. A count window places
    each success by its time (lua/includes/ring.lua), as if it had been sent at once."""
    if not times:
        return ""
    ordered = sorted(times)
    steps = [str(later - earlier) for earlier, later in itertools.pairwise(ordered)]
    return " ".join([str(sent_us), str(ordered[0]), *steps])


@dataclass(slots=True)
class AdminArgs(ScriptArgs):
    """admin.lua: an operator's op (force_open, force_closed, clear_force, trip, half_open, reset)."""

    op: str


@dataclass(slots=True)
class ConfigureArgs(ScriptArgs):
    """configure.lua: field, value pairs ('' removes the override), ARGV 7 to the end."""

    changes: tuple[str, ...]

    def argv(self) -> list[Any]:
        return list(self.changes)


@dataclass(slots=True)
class HoldArgs(ScriptArgs):
    """hold.lua: how long from now an open breaker stays open at least, in ms."""

    ms: int


@dataclass(slots=True)
class MemberArgs(ScriptArgs):
    """member.lua: grant, revoke or release a group member's grant (token; release's cause)."""

    op: str
    token: str
    cause: str = ""


@dataclass(slots=True)
class ReadArgs(ScriptArgs):
    """read.lua: '1' to leave the config in force out when no override changes it,
    'encode' to reply only the config in force of ARGV 5."""

    fields: str


@dataclass(slots=True)
class GroupReadArgs(ScriptArgs):
    """group.lua read (the group's hash), and the other ops' base: op is ARGV 7."""

    op: str = field(default="read", init=False)


@dataclass(slots=True)
class GroupJoinArgs(GroupReadArgs):
    """group.lua join: this worker's config of the group (members space-separated;
    digest: the config's, hex), seen now."""

    op: str = field(default="join", init=False)
    fraction: str
    cap: str
    members: str
    digest: str


@dataclass(slots=True)
class GroupAskArgs(GroupReadArgs):
    """group.lua ask: a grant for a member (cap: the asker's, when no config is known)."""

    op: str = field(default="ask", init=False)
    member: str
    cap: str


@dataclass(slots=True)
class GroupReleaseArgs(GroupReadArgs):
    """group.lua release: forget a member's grant up to a token (member.lua revoked it)."""

    op: str = field(default="release", init=False)
    member: str
    token: str


GROUP_OPS: dict[str, type[ScriptArgs]] = {
    "join": GroupJoinArgs,
    "ask": GroupAskArgs,
    "release": GroupReleaseArgs,
    "read": GroupReadArgs,
}
ALL: tuple[type[ScriptArgs], ...] = (
    AcquireArgs,
    RecordArgs,
    SnapshotArgs,
    AdminArgs,
    ConfigureArgs,
    HoldArgs,
    MemberArgs,
    ReadArgs,
    *GROUP_OPS.values(),
)


def group_args(op: str, *rest: Any) -> list[Any]:
    """group.lua's ARGV 7 on for ``op`` and its own arguments, in the op's field order."""
    return GROUP_OPS[op](*rest).argv()
