"""``breaker-redis doctor``: what in a Redis would let the breakers down, found
before the users find it.

Seven checks, each on its own (one that fails or cannot run never hides the
others): the server (version, Redis Functions, sharded pub/sub), the
topology, the eviction policy, the ACL permissions (by sending each
command), the pub/sub ordering the workers decide from memory by, the
round-trip latency, and the keys with their memory per breaker. A Redis that
cannot be reached, or that has no database of the URL's number, is one line:
nothing else could be checked.

What it writes is the health key the store gate's probe writes and a member
of the names set that cannot name a breaker, both removed before it ends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from breaker_redis.ops.doctor.checkup import (
    NOTE,
    OK,
    PROBLEM,
    SKIP,
    WARN,
    Checkup,
    Finding,
    Lines,
    MissingDatabase,
    count,
)
from breaker_redis.ops.doctor.keys import check_keys
from breaker_redis.ops.doctor.memory import check_memory
from breaker_redis.ops.doctor.permissions import check_permissions
from breaker_redis.ops.doctor.server import check_server, check_topology
from breaker_redis.ops.doctor.timing import check_latency, check_ordering
from breaker_redis.storage import acl
from breaker_redis.storage.eviction import eviction_problem

__all__ = ["NOTE", "OK", "PROBLEM", "SKIP", "WARN", "Diagnosis", "Finding", "diagnose", "eviction_problem"]

CHECKS: tuple[tuple[str, Callable[[Checkup], Lines]], ...] = (
    ("server", check_server),
    ("topology", check_topology),
    ("memory", check_memory),
    ("permissions", check_permissions),
    ("ordering", check_ordering),
    ("latency", check_latency),
    ("keys", check_keys),
)
_UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                redis.exceptions.RedisClusterException, OSError)  # fmt: skip


@dataclass
class Diagnosis:
    """The findings, and the lines that frame them."""

    findings: list[Finding]
    header: list[str] = field(default_factory=list)
    footer: list[str] = field(default_factory=list)

    @property
    def problems(self) -> int:
        return sum(f.status == PROBLEM for f in self.findings)

    def lines(self, paint: Callable[[str, str], str] | None = None) -> list[str]:
        """The report; ``paint(status, word)`` may colour each status word."""
        out = list(self.header)
        for finding in self.findings:
            status = finding.status.ljust(7)
            out.append(
                f"{paint(finding.status, status) if paint else status}  "
                f"{finding.check.ljust(11)}  {finding.text}"
            )
        return out + self.footer


def diagnose(client: Any, prefix: str, where: str) -> Diagnosis:
    """Every check on the Redis behind ``client`` for the breakers under ``prefix``
    (``where``: how to name that Redis in the report, never with its password)."""
    up = Checkup(client, prefix, where)
    try:
        up.connect()
    except _UNREACHABLE as exc:
        return Diagnosis([Finding(PROBLEM, "reach", _unreachable(where, exc))])
    except MissingDatabase as missing:
        return Diagnosis([Finding(PROBLEM, "reach", _missing_database(where, missing.index))])
    findings: list[Finding] = []
    for name, check in CHECKS:
        try:
            findings += [Finding(status, name, text) for status, text in check(up)]
        except Exception as exc:  # one check's failure is its own line, never the others' end
            if acl.missing_rule(exc, prefix) is not None:
                why = f"not checked: user {up.who} was refused ({exc}); see the permissions line"
                findings.append(Finding(SKIP, name, why))
            else:
                findings.append(Finding(PROBLEM, name, f"the check failed: {type(exc).__name__}: {exc}"))
    diagnosis = Diagnosis(findings, [f"breaker-redis doctor: {where}, prefix {prefix!r}, user {up.who}"])
    summary = f"{count(diagnosis.problems, 'problem')} found" if diagnosis.problems else "no problem found"
    warnings = sum(f.status == WARN for f in findings)
    if warnings:
        summary += f", {count(warnings, 'warning')}"
    diagnosis.footer = [
        f"least-privilege user for prefix {prefix!r}: {up.setuser_line()}",
        f"{summary} ({len(CHECKS)} checks: {', '.join(name for name, _ in CHECKS)})",
    ]
    return diagnosis


def _missing_database(where: str, index: int) -> str:
    return (
        f"database {index} does not exist on Redis at {where}: the server has fewer databases "
        f"(its `databases` setting, 16 by default); fix the number at the end of the URL"
    )


def _unreachable(where: str, exc: BaseException) -> str:
    if isinstance(exc, redis.exceptions.AuthenticationError):
        return f"Redis at {where} refused the login ({exc}): check the user name and password in the URL"
    return f"cannot reach Redis at {where} ({exc}): is it running, and is the URL right?"
