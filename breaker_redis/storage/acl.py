"""The Redis ACL the engine needs, and what a permission error means.

A Redis user that may not run a command the breakers need is a configuration
error, not an outage: the breakers keep protecting (``on_store_error``), but
the log must say which permission is missing and the line that grants it,
once, rather than a vague "Redis unavailable". The least-privilege user is
``setuser_line()``: the commands the scripts call (read from lua/*.lua, so
the list cannot drift from them) and the ones breaker_redis sends itself, on
the prefix's keys (``~breaker:*``) and channel (``&breaker:*``) only.
"""

from __future__ import annotations

import hashlib
import logging
import re
from functools import cache
from typing import Any

from breaker_redis.storage.lua_source import OPERATIONS, library, script_source

log = logging.getLogger("breaker_redis")

# Sent by breaker_redis itself (not from a script): the scripts (FCALL and
# FUNCTION LOAD on Redis 7, EVALSHA and EVAL otherwise; SCRIPT LOAD before the
# readers' pipelines), the barrier (PING),
# the event subscription, the names set, dropping a corrupted breaker, the
# start-up check of maxmemory-policy (INFO), the readers of the CLI, metrics
# and dashboard (GET, HMGET, HGETALL, LRANGE, EXISTS, TIME), and the Flask
# extension's shared response cache (HSET, PEXPIRE).
CLIENT_COMMANDS = (
    "fcall", "function|load", "evalsha", "eval", "script|load", "ping", "subscribe", "unsubscribe",
    "sadd", "srem", "smembers", "srandmember", "exists", "del", "info",
    "get", "hmget", "hgetall", "hset", "pexpire", "persist", "lrange", "time", "select",
)  # fmt: skip
# What redis-py's cluster client sends to find the slots and the keys of a command,
# and the sharded event subscription of a cluster worker (breaker_redis/storage/sharded.py:
# SSUBSCRIBE, then ROLE to check that the node confirming it is a master).
CLUSTER_COMMANDS = ("cluster|slots", "cluster|shards", "command", "ssubscribe", "role")
FUNCTION_COMMANDS = ("fcall", "function|load")  # without them the scripts run with EVALSHA
OPTIONAL = {
    "info": "the start-up check of maxmemory-policy is skipped",
    "function|load": "the scripts run with EVALSHA instead of FCALL",
    "fcall": "the scripts run with EVALSHA instead of FCALL",
}
_CALL = re.compile(r"redis\.p?call\('([A-Z]+)'")


@cache
def script_commands() -> tuple[str, ...]:
    """Every command a script calls, lower case, from lua/*.lua itself."""
    found: set[str] = set()
    for operation in OPERATIONS:
        found.update(name.lower() for name in _CALL.findall(script_source(operation)))
    return tuple(sorted(found))


def required_commands(functions: bool = True, cluster: bool = False) -> list[str]:
    commands = {*CLIENT_COMMANDS, *script_commands(), *(CLUSTER_COMMANDS if cluster else ())}
    if not functions:
        commands -= set(FUNCTION_COMMANDS)
    return sorted(commands)


def setuser_line(
    prefix: str = "breaker", user: str = "breaker", *, functions: bool = True, cluster: bool = False
) -> str:
    """``ACL SETUSER`` for a user that can do everything breaker_redis does under
    ``prefix`` and nothing else (``functions=False``: no FCALL / FUNCTION LOAD;
    ``cluster=True``: what a Redis Cluster client needs besides)."""
    granted = " ".join(f"+{command}" for command in required_commands(functions, cluster))
    return f"ACL SETUSER {user} on >PASSWORD ~{prefix}:* &{prefix}:* -@all {granted}"


def missing_rule(exc: BaseException, prefix: str = "breaker") -> str | None:
    """The ACL rule whose absence ``exc`` reports (``+time``, ``~breaker:*``,
    ``&breaker:*``; "" when it names none); None when it is no permission error."""
    missing = _missing(exc)
    if missing is None:
        return None
    return {"keys": f"~{prefix}:*", "channel": f"&{prefix}:*"}.get(missing, missing)


def explain(exc: BaseException, prefix: str = "breaker", user: str | None = None) -> str | None:
    """What a permission error says is missing and how to grant it; None if
    ``exc`` is not a permission error."""
    rule = missing_rule(exc, prefix)
    if rule is None:
        return None
    who = user or "default"
    everything = setuser_line(prefix, who)
    if not rule:
        return f"Redis user {who!r} lacks a permission breaker_redis needs ({exc}); grant: {everything}"
    kinds = {"~": "the keys", "&": "the channel", "+": "the command"}
    what = f"{kinds[rule[0]]} {rule[1:]}"
    return (
        f"Redis user {who!r} may not use {what} ({exc}). Grant it with: ACL SETUSER {who} {rule} "
        f"(everything breaker_redis needs: {everything})"
    )


def _missing(exc: BaseException) -> str | None:
    """What ``exc`` reports missing: "+command", "keys", "channel", or "" when it
    is a permission error that names nothing; None when it is not one. An error
    that wraps one (redis-py's cluster client reports a refused CLUSTER SLOTS as
    "cannot connect") is judged by the one it wraps."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found = _missing_in(current)
        if found is not None:
            return found
        current = current.__cause__ or current.__context__
    return None


def _missing_in(exc: BaseException) -> str | None:
    message = str(exc)
    lowered = message.lower()
    direct = lowered.startswith("noperm") or type(exc).__name__ == "NoPermissionError"
    in_script = "the user executing the script can't" in lowered or "acl failure in script" in lowered
    if not (direct or in_script):
        return None
    named = re.search(r"'([a-z_|]+)' command", lowered)
    if named:
        return "+" + named.group(1)
    if "key" in lowered:
        return "keys"
    if "channel" in lowered:
        return "channel"
    line_command = _script_line_command(message)
    return "+" + line_command if line_command else ""


def _script_line_command(message: str) -> str | None:
    """The command on the script line an error points at ('... on @user_script:57.'
    or '@user_function:58'), read from the script's own source."""
    where = re.search(r"script: (\S+), on @user_(script|function):(\d+)", message)
    if not where:
        return None
    ident, kind, line = where.group(1), where.group(2), int(where.group(3))
    source: str | None = None
    if kind == "function":
        source = library()[0]
    else:
        for operation in OPERATIONS:
            text = script_source(operation)
            if hashlib.sha1(text.encode("utf-8")).hexdigest() == ident:
                source = text
                break
    if source is None:
        return None
    lines = source.splitlines()
    if not 1 <= line <= len(lines):
        return None
    # the line itself, or, for an error re-raised after a redis.pcall (error(n)), the call above it
    for text in reversed(lines[max(0, line - 6) : line]):
        found = _CALL.search(text)
        if found:
            return found.group(1).lower()
    return None


class PermissionLog:
    """Logs each permission error of one part of the engine as an ERROR, once
    per distinct missing permission (a retry loop must not repeat it)."""

    def __init__(self, client: Any, prefix: str, what: str, said: set[str] | None = None) -> None:
        """``said``: the rules said already, when they outlive this object (a collector
        built per scrape)."""
        self._client, self._prefix, self._what = client, prefix, what
        self._said: set[str] = set() if said is None else said

    def note(self, exc: BaseException) -> str | None:
        """The explanation of exc if it is a permission error (logged the first time)."""
        rule = missing_rule(exc, self._prefix)
        if rule is None:
            return None
        problem = explain(exc, self._prefix, user_of(self._client))
        said = rule or problem or ""  # the same rule refused by another script: said already
        if said not in self._said:
            self._said.add(said)
            log.error("%s: %s", self._what, problem)
        return problem


def user_of(client: Any) -> str | None:
    """The ACL user a redis-py client logs in as (None: the default user, or unknown).
    Reads only what the client already holds: a cluster client that has not
    connected yet must not connect here."""
    own = getattr(client, "__dict__", {})
    holder = own.get("connection_pool") or own.get("nodes_manager")
    # _kwargs: a urls.LazyCluster that has not connected yet
    kwargs = getattr(holder, "connection_kwargs", None) or own.get("_kwargs") or {}
    username = kwargs.get("username")
    return str(username) if username else None
