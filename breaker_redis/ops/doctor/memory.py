"""Whether the server may evict a breaker's state.

The breakers' keys carry no TTL, so ``noeviction`` and every ``volatile-*``
policy never evict them; an ``allkeys-*`` policy may, and a breaker that was
open then reads closed again for every worker that did not know it (those
that did restore it: lua/includes/restore.lua, restore_lost). ``eviction_problem`` is
the judgement as text, for the doctor and for the workers' start-up log.
"""

from __future__ import annotations

from breaker_redis.ops.doctor.checkup import OK, PROBLEM, SKIP, WARN, Checkup, Lines, size
from breaker_redis.storage.scripts import text

FULL_SHARE = 0.9  # used / maxmemory above this: Redis may soon refuse writes


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


def check_memory(up: Checkup) -> Lines:
    lines: Lines = []
    for server in up.servers:
        where = f"{server.label}: " if len(up.servers) > 1 else ""
        if "maxmemory_policy" not in server.info:
            lines.append((SKIP, f"{where}user {up.who} may not run INFO, so the maxmemory-policy is unknown "
                          "(the workers skip their start-up check too); check it as an admin: "
                          "redis-cli INFO memory | grep maxmemory"))
            continue
        policy = text(server.info["maxmemory_policy"])
        maxmemory = int(server.info.get("maxmemory", 0))
        problem = eviction_problem(policy, maxmemory)
        if problem is not None:
            lines.append((PROBLEM, where + problem))
        elif maxmemory <= 0:
            line = f"{where}maxmemory-policy {policy}, maxmemory 0: no limit, nothing is ever evicted"
            if eviction_problem(policy, 1) is not None:
                line += f" (with a limit, {policy} would evict breakers' state: prefer noeviction)"
            lines.append((OK, line))
        else:
            share = int(server.info.get("used_memory", 0)) / maxmemory
            line = f"{where}maxmemory-policy {policy}, maxmemory {size(maxmemory)}, {share:.0%} used"
            if share > FULL_SHARE:
                lines.append((WARN, f"{line}: when it is full Redis refuses the breakers' writes (each "
                              "worker then decides alone, by on_store_error); raise maxmemory or free "
                              "memory"))
            elif policy == "noeviction":
                lines.append((OK, f"{line}: nothing is evicted"))
            else:
                lines.append((OK, f"{line}: it evicts only keys with a TTL, and the breakers' keys carry "
                              "none"))
    return lines
