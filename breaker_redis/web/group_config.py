"""What a breaker group is, apart from any worker's I/O: its members and
fraction (checked), its members' config (which names the group, for the
scripts), its cap, the digest that names a config in lua/group.lua, and its
status as readers show it.

groups.py's workers act on a group; the ops readers (the CLI, the metrics, the
dashboard) only read one and learn a member's config from Redis: both need
this, and the readers need nothing else of groups.py.

The decision is Redis's, like every other (docs/http-clients.md, "Pools of
replicas", says why it takes two steps): a member's breaker opens only while
it holds one of the group's grants (lua/includes/grants.lua ``group_holds_back``);
lua/group.lua hands grants out in the group's own slot, never more than the
cap at a time, and forgets one only after it was revoked in the member's
slot, which happens only as the member closes (or is closed for it). So on a
single Redis and on Redis Cluster alike, the members that are open hold
grants the group lists, and the group lists at most the cap. The group's
members and cap are those of the newest config that joined it (group.lua),
so a deploy that changes the member list wins over the workers of the
previous one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from breaker_redis.base.config import BreakerConfig
from breaker_redis.base.names import validate_name
from breaker_redis.storage.scripts import text
from breaker_redis.web.hosts import member_name

__all__ = [
    "MemberConfig",
    "cap_of",
    "config_digest",
    "config_from_lua",
    "fraction_of",
    "group_status",
    "member_config",
    "member_of",
    "members_of",
]


@dataclass(frozen=True)
class MemberConfig(BreakerConfig):
    """The config of a group member: a BreakerConfig whose scripts' config also
    names the group, so that the scripts hold back a trip the group did not grant."""

    group: str = ""

    def to_lua(self) -> bytes:
        values = json.loads(super().to_lua())
        values["group"] = self.group
        return json.dumps(values, separators=(",", ":")).encode()


def member_config(config: BreakerConfig, group: str) -> MemberConfig:
    """``config`` as the config of a member of ``group`` (unset open periods stay derived)."""
    fields = {field.name: getattr(config, field.name) for field in dataclasses.fields(BreakerConfig)}
    return MemberConfig(**fields, group=group)


def config_from_lua(raw: str | bytes) -> BreakerConfig:
    """``BreakerConfig.from_lua``, a member's config (its JSON names a group) as a MemberConfig."""
    config = BreakerConfig.from_lua(raw)
    group = json.loads(raw).get("group")
    return member_config(config, group) if isinstance(group, str) and group else config


def member_of(where: str, member: Any) -> str:
    """A member's breaker name, from a host URL or a breaker name (the error names ``where``)."""
    try:
        return member_name(member) if isinstance(member, str) else validate_name(member)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}: member {member!r}: {exc}") from None


def members_of(where: str, members: Any) -> tuple[str, ...]:
    """A group's members as breaker names: at least one, none given twice."""
    if isinstance(members, str) or not isinstance(members, Iterable):
        why = "must be a list of host URLs or breaker names"
        raise TypeError(f"{where}: members {why} (got {members!r})")
    names: list[str] = []
    for member in members:
        found = member_of(where, member)
        if found in names:
            raise ValueError(f"{where}: member {found!r} is given twice")
        names.append(found)
    if not names:
        raise ValueError(f"{where}: needs at least one member")
    return tuple(names)


def fraction_of(where: str, value: Any) -> float:
    """A group's max_open_fraction, checked: > 0 and <= 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{where}: max_open_fraction must be > 0 and <= 1 (got {value!r})")
    return float(value)


def cap_of(fraction: float, size: int) -> int:
    """How many of ``size`` members may be open at once: floor(fraction x size), at
    least one (as Envoy ejects one host even where the share is less than one)."""
    return max(1, math.floor(fraction * size + 1e-9))


def config_digest(max_open_fraction: float, members: tuple[str, ...]) -> str:
    """What names a group config in lua/group.lua: its fraction and member list, hashed."""
    return hashlib.sha1(f"{max_open_fraction!r} {' '.join(members)}".encode()).hexdigest()


def group_status(
    name: str,
    raw: Any,
    states: dict[str, str],
    *,
    members: tuple[str, ...] | None = None,
    cap: int | None = None,
    fraction: float | None = None,
) -> dict[str, Any]:
    """A group as readers show it: group.lua read's hash and each member's state.

    ``members``, ``cap`` and ``fraction`` are the caller's own (an app's group);
    without them, what the last worker joining wrote (the CLI)."""
    fields = {text(raw[i]): text(raw[i + 1]) for i in range(0, len(raw) - 1, 2)}
    if members is None:
        members = tuple(fields.get("members", "").split())
    granted = {key[2:] for key in fields if key.startswith("h:")}
    holders = [m for m in members if m in granted] + sorted(granted.difference(members))
    open_now = [m for m in members if states.get(m, "closed") != "closed"]
    return {
        "name": name,
        "members": list(members),
        "max_open_fraction": fraction if fraction is not None else float(fields.get("fraction") or 0),
        "cap": cap if cap is not None else int(fields.get("cap") or 0),
        "open": open_now,
        "holders": holders,
        "states": {m: states.get(m, "closed") for m in members},
        "grants": int(fields.get("grants") or 0),
        "held": int(fields.get("held") or 0),
    }
