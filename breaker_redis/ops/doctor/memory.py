"""The doctor's memory check: the server's eviction policy and how full it is.

Whether a policy may evict a breaker's state is ``storage.eviction``'s
judgement, which the workers' start-up log shares.
"""

from __future__ import annotations

from breaker_redis.ops.doctor.checkup import OK, PROBLEM, SKIP, WARN, Checkup, Lines
from breaker_redis.storage.eviction import eviction_problem, size
from breaker_redis.storage.scripts import text

FULL_SHARE = 0.9  # used / maxmemory above this: Redis may soon refuse writes


def check_memory(up: Checkup) -> Lines:
    lines: Lines = []
    for server in up.servers:
        where = f"{server.label}: " if len(up.servers) > 1 else ""
        if "maxmemory_policy" not in server.info:
            lines.append(
                (
                    SKIP,
                    f"{where}user {up.who} may not run INFO, so the maxmemory-policy is unknown "
                    "(the workers skip their start-up check too); check it as an admin: "
                    "redis-cli INFO memory | grep maxmemory",
                )
            )
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
                lines.append(
                    (
                        WARN,
                        f"{line}: when it is full Redis refuses the breakers' writes (each "
                        "worker then decides alone, by on_store_error); raise maxmemory or free "
                        "memory",
                    )
                )
            elif policy == "noeviction":
                lines.append((OK, f"{line}: nothing is evicted"))
            else:
                lines.append(
                    (OK, f"{line}: it evicts only keys with a TTL, and the breakers' keys carry none")
                )
    return lines
