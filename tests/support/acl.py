"""ACL users made from the engine's own ``ACL SETUSER`` line (breaker_redis.storage.acl)."""

from __future__ import annotations


def rules_of(line: str, *, without: str = "", add: str = "") -> str:
    """The rules of an ``ACL SETUSER`` line with a password of ours, one rule left out."""
    rules = line.split(" ", 3)[3].replace(">PASSWORD", ">secret").split()
    return " ".join([rule for rule in rules if rule != without] + add.split())
