"""Where a breaker lives in Redis: its keys, built from the key prefix and its name.

Every key of a breaker carries its name as a hash tag (``prefix:{NAME}:suffix``),
so that they share one Redis Cluster slot and one script can touch them all
(docs/design.md, section 3). The scripts' runner (scripts.py) and the readers
(ops/, compat/) build them here, the scripts in lua/_lib.lua the same way.
"""

from __future__ import annotations

KEY_SUFFIXES = ("state", "window", "leases", "config", "stats", "events", "cfg")
# A breaker's keys the scripts touch without declaring them: '<prefix>:{NAME}:reporters' only
# with min_reporters above 1 (lua/includes/reporters.lua rep_key), '<prefix>:{NAME}:acks' only
# when a script publishes a notice (notify), '<prefix>:{NAME}:ring' and ':arrivals' only with
# window_calls (lua/includes/ring.lua; arrivals only while failures arrived lately). Each
# carries the breaker's hash tag, so it is in the slot of the declared keys (on Redis Cluster
# too); declared, each would cost every call one more key, for something most calls never
# touch.
UNDECLARED_SUFFIXES = ("reporters", "acks", "ring", "arrivals")


def breaker_keys(prefix: str, name: str) -> list[str]:
    """The seven keys of one breaker, in the order the scripts expect (KEYS[1..7])."""
    return [f"{prefix}:{{{name}}}:{suffix}" for suffix in KEY_SUFFIXES]


def undeclared_keys(prefix: str, name: str) -> list[str]:
    """The keys of one breaker the scripts touch undeclared (UNDECLARED_SUFFIXES)."""
    return [f"{prefix}:{{{name}}}:{suffix}" for suffix in UNDECLARED_SUFFIXES]


def group_key(prefix: str, group: str) -> str:
    """The hash of a breaker group (lua/group.lua): in the slot of its own hash tag."""
    return f"{prefix}:group:{{{group}}}"
