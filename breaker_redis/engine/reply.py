"""A script's reply as a worker reads it: its fields, decoded once.

Every script that changes or admits replies with the breaker's state (lua/includes/reply.lua);
docs/wire.md, "The common reply", has the fields in their order, and this dataclass
is that order (tests/storage/test_args.py keeps the two in step). Apart from
knowledge.py, which keeps the newest reply as what a worker knows, so that a
reader of either finds one job in it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from breaker_redis.storage.scripts import text


@dataclass(frozen=True)
class Reply:
    """One script reply, decoded (its fields: docs/wire.md, "The common reply")."""

    allowed: int
    reason: str
    state: str
    epoch: int
    open_until: int
    forced: str
    lease: str
    now: int
    mode: str  # '' for admin replies, which carry no config
    max_concurrent: int
    events: str  # transitions (and arming) this call made, '' for none
    slow_ms: int
    armed: bool
    arms: int
    born: int  # the epoch the state hash was created with: one per incarnation of the keys
    repaired: str = ""  # keys of the breaker this call found corrupted and repaired ("stats,window")
    # Redis had lost the breaker's state (lua/includes/restore.lua restore_lost): 'restored' from what this
    # worker knew, 'restored_events' from the last transition, 'lost' (it knew it closed), or ''
    lost: str = ""
    # min_reporters > 1: until when (Redis ms) the calling worker's reporter is isolated, 0 if not
    isolated_until: int = 0
    # the notices this call published: '<token> <workers>' (storage/acks.py), '' for none
    ack: str = ""
    # the ramp after a close (lua/includes/ramp.lua): until when (Redis ms; 0: none), and the
    # config's ramp_seconds (ms; 0 in admin replies, which carry no config) and ramp_from
    # (0.0: the default, or no config)
    ramp_until: int = 0
    ramp_ms: int = 0
    ramp_from: float = 0.0
    # the config's window_calls (0: none, or no config): while set, a worker's batch says
    # when each of its successes ended, and the count window places them by it
    window_calls: int = 0

    @classmethod
    def decode(cls, raw: Any) -> Reply:
        """The reply's fields in their order (docs/wire.md, "The common reply"); a shorter
        reply (an older script's) leaves the trailing ones at their defaults."""
        return cls(*[convert(value) for convert, value in zip(_DECODERS, raw, strict=False)])


def _flag(value: Any) -> bool:
    return bool(int(value))


def _ratio(value: Any) -> float:
    return float(value) if value else 0.0  # (a Lua number in a reply would be cut to an integer)


_CONVERTERS: dict[str, Callable[[Any], Any]] = {"int": int, "str": text, "bool": _flag, "float": _ratio}
# Reply's fields' converters, in order, from its annotations: the layout is written once
_DECODERS = tuple(_CONVERTERS[str(f.type)] for f in fields(Reply))
