"""The ACL check: every command breaker_redis sends, sent once by the doctor.

Sending them, rather than reading ``ACL GETUSER`` (which needs admin
rights), finds what the workers would meet, key pattern and channel
included. The health script (lua/health.lua) calls every command the
breakers' scripts call, so one run of it covers those. Writes go only to
``<prefix>:health`` (the key the store gate's probe writes) and to the names
set, as a member no breaker can have; both are removed. The library of Redis
Functions is not loaded (that would leave this version's library on the
server): FCALL and FUNCTION LOAD are sent so that the server answers "not
found" and "missing metadata", which it does only once the ACL let them in.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import redis

from breaker_redis.ops.doctor.checkup import NOTE, OK, PROBLEM, Checkup, Lines
from breaker_redis.ops.doctor.server import FUNCTIONS_COST
from breaker_redis.storage import acl
from breaker_redis.storage.scripts import database_of, text

PROBE_MEMBER = "breaker-redis doctor"  # in the names set for a moment: no breaker name holds a space
WRITES = frozenset({"evalsha", "eval", "fcall", "function|load", "sadd", "srem", "hset", "pexpire",
                    "persist", "del"})  # fmt: skip
SCRIPT_CALLS = ("evalsha", "eval", "fcall")  # each runs lua/health.lua
CONFIRM_SECONDS = 2.0
_RULE_KINDS = {"~": "the keys", "&": "the channel", "+": "the command"}


def _tolerating(expected: str, call: Callable[[], Any]) -> Callable[[], Any]:
    """call, where an error reply starting with ``expected`` is an answer too: the
    server checks the ACL before it looks for a script, function, library or type."""

    def run() -> Any:
        try:
            return call()
        except redis.exceptions.ResponseError as exc:
            if acl.missing_rule(exc) is not None or not str(exc).startswith(expected):
                raise
            return None

    return run


def _read(call: Callable[[], Any]) -> Callable[[], Any]:
    """A command on a key that another write may have left of another type."""
    return _tolerating("WRONGTYPE", call)


def _select(client: Any) -> list[tuple[str, Callable[[], Any]]]:
    """SELECT of the database the client already uses (what redis-py sends on connect
    for a database other than 0); none on a cluster, which has only database 0."""
    if getattr(client, "connection_pool", None) is None:
        return []
    db = database_of(client)
    return [("select", lambda: client.execute_command("SELECT", db))]


def tries(up: Checkup, held: list[Any]) -> list[tuple[str, Callable[[], Any]]]:
    """(ACL command name, a harmless call of it), in the order they are sent;
    the subscription made goes in ``held``, for the caller to close."""
    client, scripts = up.client, up.scripts
    health, names = scripts.health_key, scripts.names_key
    sha, source, keys, argv = scripts.call("health", "health", None, ())
    args = (len(keys), *keys, *argv)

    channels = (scripts.workers_channel, scripts.channel)  # as a worker subscribes (invalidation.py)

    def subscribe() -> None:
        held.append(client.pubsub())
        held[-1].subscribe(*channels)
        for _ in channels:
            confirmed(held[-1], "subscribe")

    def unsubscribe() -> None:
        for pubsub in held:
            pubsub.unsubscribe(*channels)
            for _ in channels:
                confirmed(pubsub, "unsubscribe")

    found: list[tuple[str, Callable[[], Any]]] = [
        ("ping", client.ping),
        ("time", client.time),
        ("info", lambda: client.info("server")),
        ("evalsha", _tolerating("No matching script", lambda: client.evalsha(sha, *args))),
        ("eval", lambda: client.eval(source, *args)),
        ("script|load", lambda: client.script_load(source)),  # the readers' pipelines load it first
    ]
    if up.functions:
        function = scripts.function_names["health"]
        found += [
            ("fcall", _tolerating("Function not found", lambda: client.fcall(function, *args))),
            ("function|load", _tolerating("Missing library metadata", lambda: client.function_load(""))),
        ]
    return [
        *found,
        ("get", _read(lambda: client.get(health))),
        ("exists", lambda: client.exists(health)),
        ("del", lambda: client.delete(health)),
        ("lrange", _read(lambda: client.lrange(health, 0, 0))),
        ("hset", _read(lambda: client.hset(health, "doctor", 1))),
        ("pexpire", lambda: client.pexpire(health, 60_000)),
        ("persist", lambda: client.persist(health)),
        ("hmget", _read(lambda: client.hmget(health, "doctor"))),
        ("hgetall", _read(lambda: client.hgetall(health))),
        *_select(client),
        ("smembers", _read(lambda: client.smembers(names))),
        ("srandmember", _read(lambda: client.srandmember(names, 1))),
        ("sadd", _read(lambda: client.sadd(names, PROBE_MEMBER))),
        ("srem", _read(lambda: client.srem(names, PROBE_MEMBER))),
        ("subscribe", subscribe),
        ("unsubscribe", unsubscribe),
    ]


def confirmed(pubsub: Any, kind: str) -> None:
    """Wait for the server's confirmation of a (un)subscribe; an error reply raises."""
    deadline = time.monotonic() + CONFIRM_SECONDS
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.1)
        if message is not None and text(message.get("type")) == kind:
            return
    raise redis.exceptions.TimeoutError(f"no {kind} confirmation within {CONFIRM_SECONDS:g} s")


def _names(commands: list[str]) -> str:
    """Commands as a user writes them, the health script's runs said once."""
    scripts = [c.upper() for c in commands if c in SCRIPT_CALLS]
    shown = [f"the health script ({', '.join(scripts)})"] if scripts else []
    return ", ".join(shown + [c.replace("|", " ").upper() for c in commands if c not in SCRIPT_CALLS])


def check_permissions(up: Checkup) -> Lines:
    replica = up.cluster is None and up.servers[0].replica
    refused: dict[str, list[str]] = {}  # rule -> the commands refused for want of it
    optional: list[str] = []
    failed: dict[str, list[str]] = {}  # error -> the commands that met it
    held: list[Any] = []
    tried = 0
    try:
        for command, call in tries(up, held):
            if replica and command in WRITES:
                continue
            tried += 1
            try:
                call()
            except redis.exceptions.RedisError as exc:
                rule = acl.missing_rule(exc, up.prefix)
                if rule is None:
                    failed.setdefault(f"{type(exc).__name__}: {exc}", []).append(command)
                elif command in acl.OPTIONAL and rule == f"+{command}":
                    optional.append(command)
                else:
                    refused.setdefault(rule, []).append(command)
    finally:
        for pubsub in held:
            with contextlib.suppress(Exception):
                pubsub.close()
        if not replica:
            with contextlib.suppress(Exception):
                up.client.delete(up.scripts.health_key)
            with contextlib.suppress(Exception):
                up.client.srem(up.scripts.names_key, PROBE_MEMBER)
    user = up.user or "default"
    lines: Lines = []
    for rule, commands in refused.items():
        if rule:
            lines.append(
                (
                    PROBLEM,
                    f"user {up.who} may not use {_RULE_KINDS[rule[0]]} {rule[1:]} (refused: "
                    f"{_names(commands)}): add it with ACL SETUSER {user} {rule}",
                )
            )
        else:
            lines.append(
                (
                    PROBLEM,
                    f"user {up.who} lacks a permission ({_names(commands)} refused): grant "
                    "the least-privilege line below",
                )
            )
    for error, commands in failed.items():
        lines.append(
            (
                PROBLEM,
                f"{_names(commands)} failed ({error}): breaker_redis sends these, so every "
                "worker meets the same error",
            )
        )
    if optional:
        why = "; ".join(
            dict.fromkeys(FUNCTIONS_COST if c in acl.FUNCTION_COMMANDS else acl.OPTIONAL[c] for c in optional)
        )
        grant = " ".join(f"+{c}" for c in optional)
        lines.append(
            (
                NOTE,
                f"user {up.who} may not run {_names(optional)}: {why}; ACL SETUSER {user} {grant} allows it",
            )
        )
    if replica:
        lines.append((NOTE, "the write commands were not tried on a replica"))
    if not refused and not failed:
        what = f"the {len(acl.required_commands(up.functions)) - len(optional)} commands breaker_redis sends"
        if replica:
            what = f"the {tried - len(optional)} read commands breaker_redis sends"
        lines.insert(
            0,
            (
                OK,
                f"user {up.who}: {what} are allowed, on the keys {up.prefix}:* and the "
                f"channels {up.scripts.workers_channel} and {up.scripts.channel}",
            ),
        )
    return lines
