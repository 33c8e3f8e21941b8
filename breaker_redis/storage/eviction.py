"""Whether the server may evict a breaker's state.

The breakers' keys carry no TTL, so ``noeviction`` and every ``volatile-*``
policy never evict them; an ``allkeys-*`` policy may, and a breaker that was
open then reads closed again for every worker that did not know it (those
that did restore it: lua/_lib.lua, restore_lost). ``eviction_problem`` is
the judgement as text, for the workers' start-up log (scripts.py) and for
``breaker-redis doctor`` (ops/doctor/memory.py), which stands above the
stores and reads it from here (docs/design.md, section 1).
"""

from __future__ import annotations


def size(count: float) -> str:
    """Bytes for a person: 850 bytes, 1.2 KB, 2.0 MB."""
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count:.0f} bytes"


def eviction_problem(policy: str, maxmemory: int) -> str | None:
    """What ``maxmemory-policy`` and ``maxmemory`` (bytes, 0: no limit) mean for
    the breakers' state, as one line saying what to do; None when Redis never
    evicts a breaker's keys."""
    if maxmemory <= 0 or not policy.startswith("allkeys-"):
        return None
    return (
        f"maxmemory-policy {policy} (maxmemory {size(maxmemory)}) can evict a breaker's state, whose keys "
        "carry no TTL: an open breaker then reads closed again for every worker that did not know it "
        "open (those that did restore it); give the breakers a Redis whose maxmemory-policy is noeviction "
        "or volatile-* (a separate database is not enough: the policy is per server)"
    )
