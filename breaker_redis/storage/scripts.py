"""Registers the scripts on a client and calls them (their text is lua_source.py's).

On Redis 7 (not a cluster), the scripts are one library of Redis Functions:
the shared prelude (``_lib.lua``) once, then each script's own file as a
function (``library``), run with FCALL. The prelude is loaded once rather
than run on every call, and the configs it decodes are kept between calls.
On FCALL's "Function not found" (a new, restarted or flushed server) the
library is loaded (FUNCTION LOAD) and the call sent again. Nothing is sent
before the first call.

Otherwise (a cluster, the embedded store, Redis < 7, a client that is not a
redis-py Redis), each script is sent as the prelude followed by the script's
own file, run with EVALSHA (the SHA1 of that text, computed here); on
NOSCRIPT the call is sent again as EVAL, which loads and runs the body in one
command: one extra round trip and nothing else, even when the cache is
flushed again meanwhile. The same text serves both: each script starts with
``begin(KEYS, ARGV)``.

That sequence is written once: a step is FCALL, FCALL_AGAIN, FUNCTION_LOAD,
EVALSHA or EVAL, ``Scripts.after`` says which follows one that failed, and
``Scripts.steps`` sends them, each through an ``io`` function: the sync runner
(``ScriptRunner.send``) runs it with ``run_sync``, the asyncio one
(breaker_redis/asyncio/store.py) awaits it (docs/design.md, section 12). On
the sync side that costs a coroutine per call that goes to Redis: about half a
microsecond beside a local round trip of some 80 (the healthy call sends nothing).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from typing import Any

import redis
import redis.asyncio

from breaker_redis.base.blocking import blocking, run_sync
from breaker_redis.base.names import validate_prefix
from breaker_redis.storage import batches
from breaker_redis.storage.batches import Call
from breaker_redis.storage.cluster import Slots, is_cluster, notices_channel
from breaker_redis.storage.eviction import eviction_problem
from breaker_redis.storage.keys import breaker_keys, group_key, undeclared_keys
from breaker_redis.storage.lua_source import library, script_source

log = logging.getLogger("breaker_redis")

# how a step is sent: base/blocking.py's blocking (the sync side) or awaited
IO = Callable[..., Awaitable[Any]]

SWEEP_PICKS = 3  # names a process sweeps at a time (lua/sweep.lua)

# The steps of one script call (the module's docstring; Scripts.after), and what sends each:
# a redis-py client's method, or the command's name for execute_command.
FCALL, FCALL_AGAIN, FUNCTION_LOAD, EVALSHA, EVAL = range(5)
METHODS = ("fcall", "fcall", "function_load", "evalsha", "eval")
COMMANDS = ("FCALL", "FCALL", "FUNCTION LOAD", "EVALSHA", "EVAL")


def text(value: Any) -> str:
    """Decode a reply element, whatever decode_responses the client was built with."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def flat_pairs(values: Sequence[Any]) -> dict[str, Any]:
    return {text(values[i]): values[i + 1] for i in range(0, len(values) - 1, 2)}


def database_of(client: Any) -> int:
    """The number of the database the client's connections SELECT: 0 on a cluster,
    which has only that one (asked without I/O: a LazyCluster connects at its first use)."""
    if is_cluster(client):
        return 0
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    return int(kwargs.get("db") or 0)


class Scripts:
    """The scripts and keys of one key prefix, and the arguments of a call:
    what the sync runner and the asyncio one (breaker_redis/asyncio/store.py) share."""

    def __init__(self, client: Any, prefix: str, ttl_ms: int, functions: bool | None = None) -> None:
        self.client = client
        self.prefix = validate_prefix(prefix)
        self.channel = f"{prefix}:events"
        # pub/sub ignores the database: every message names it (lua/_lib.lua ARGV 2), and a
        # worker drops those about another database's breakers (Breakers._on_event)
        self.database = database_of(client)
        self._publish_to = f"{self.channel} {self.database}"
        # what workers subscribe to on one server (on a cluster, each breaker's sharded channel):
        # only workers, so the scripts know how many to wait for (storage/acks.py)
        self.workers_channel = f"{prefix}:notices:{self.database}"
        self.names_key = f"{prefix}:names"
        self.health_key = f"{prefix}:health"  # lua/health.lua's, outside every breaker's hash tag
        self.groups_key = f"{prefix}:groups"  # the names of the breaker groups (breaker_redis/groups.py)
        self.ttl_ms = ttl_ms
        self._keys: dict[str, list[str]] = {}
        self._swept = (0, 0.0)  # (pid, when) of this process's last sweep
        # Redis Functions (FCALL) while the server takes them, EVALSHA on a server
        # without them (Redis < 7, an older fakeredis, an ACL without FCALL). Not
        # on a cluster: redis-py finds FCALL's keys with a COMMAND GETKEYS round
        # trip per call (EVALSHA's it reads itself).
        self.library, self.function_names = library()
        if functions is None:
            functions = isinstance(client, (redis.Redis, redis.asyncio.Redis))
        self.use_functions = functions and not is_cluster(client)
        self.heads: dict[str, tuple[str, ...]] = {}  # each step's first argument, by operation
        for op, function in self.function_names.items():
            source = script_source(op)
            sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
            self.heads[op] = (function, function, self.library, sha, source)
        # On Redis Cluster: where each breaker lives, and each call sent to its master
        # (breaker_redis/storage/cluster.py); the scripts also SPUBLISH on the breaker's own channel.
        self.slots: Slots | None = Slots(client) if is_cluster(client) else None
        self._argv2: dict[str, str] = {}

    async def steps(self, io: IO, target: Any, heads: tuple[str, ...], tail: list[Any]) -> Any:
        """One script call's steps (the module's docstring) on target, each sent through
        ``io``: run by ScriptRunner.send, awaited by AsyncScriptRunner.send."""
        step = FCALL if self.use_functions else EVALSHA
        while True:
            failure = None
            try:
                if step != FUNCTION_LOAD:
                    return await io(getattr(target, METHODS[step]), heads[step], *tail)
                await io(target.function_load, self.library)
            except redis.exceptions.ResponseError as exc:
                failure = exc
            step = self.after(step, failure)

    def after(self, step: int, failure: redis.exceptions.ResponseError | None) -> int:
        """The step to send after ``step`` failed with ``failure`` (None: a FUNCTION LOAD
        that succeeded); raises ``failure`` when it is the call's answer (the script's own
        error, or one no step can mend)."""
        if step == FUNCTION_LOAD:
            if failure is not None:
                self.load_failed(failure)
            return FCALL_AGAIN
        assert failure is not None
        if step >= EVALSHA:
            if step == EVALSHA and isinstance(failure, redis.exceptions.NoScriptError):
                # A flushed script cache or a restarted server: EVAL sends the body
                # and runs it in one command, so a second SCRIPT FLUSH landing
                # between a SCRIPT LOAD and the EVALSHA that follows (redis-py's
                # own retry) cannot fail the call. EVAL caches the script again.
                return EVAL
            raise failure
        message = str(failure)
        refused = isinstance(failure, redis.exceptions.NoPermissionError)
        if refused or message.lower().startswith("unknown command"):
            self.use_functions = False  # an ACL without FCALL, Redis < 7: EVALSHA from now on
            return EVALSHA
        if not message.startswith("Function not found"):
            raise failure  # the function's own error
        # not loaded there (a new, restarted or flushed server): loaded, and FCALL again;
        # loaded and gone again (a FUNCTION FLUSH right after the load): EVALSHA this time
        return FUNCTION_LOAD if step == FCALL else EVALSHA

    def corrupted(self, name: str, exc: redis.exceptions.ResponseError) -> bool:
        """Whether a call failed on a key of the wrong type (written by hand, or by another
        program), which would fail every call for good: the runners then drop the breaker's
        keys (keys_to_drop), say it once in the log, and make the call again."""
        if "WRONGTYPE" not in str(exc):
            return False
        log.warning("breaker %r had a corrupted key (%s); its keys were reset", name, exc)
        return True

    def load_failed(self, exc: redis.exceptions.ResponseError) -> None:
        if isinstance(exc, redis.exceptions.NoPermissionError):
            self.use_functions = False  # an ACL with FCALL but not FUNCTION LOAD: EVALSHA from now on
        elif "already exists" not in str(exc):  # not another worker's load meanwhile
            raise exc

    def chores_due(self) -> tuple[bool, bool]:
        """(check the server's maxmemory-policy, sweep) for a listing now: this
        process sweeps at its first listing, then every quarter of the key TTL,
        as the scripts stamp a breaker's use, and checks the policy at the first
        (once per process of each Breakers)."""
        now, pid = time.monotonic(), os.getpid()
        last_pid, last = self._swept
        if last_pid == pid and now - last < self.ttl_ms / 4000:
            return False, False
        self._swept = (pid, now)
        return last_pid != pid, True

    def listing(self, name: str) -> Any:
        """The pipeline that adds a name to the listing set (register_name sends it)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.sadd(self.names_key, name)
        pipe.persist(self.names_key)  # a TTL an older version gave it
        return pipe

    def check_memory_policy(self, info: dict[str, Any]) -> None:
        """A WARNING when the server may evict the breakers' keys (eviction.py says
        why); ``info`` is INFO memory, per node on a cluster."""
        nodes = list(info.values()) if info and all(isinstance(v, dict) for v in info.values()) else [info]
        for node in nodes:
            problem = eviction_problem(text(node.get("maxmemory_policy")), int(node.get("maxmemory") or 0))
            if problem is not None:
                log.warning(
                    "the breakers' Redis: %s (see docs/memory-and-permissions.md; "
                    "breaker-redis doctor checks it)",
                    problem,
                )
                return

    def prepared(
        self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]
    ) -> tuple[tuple[str, ...], list[Any]]:
        """One script call: (heads, tail), each step sent as (heads[step], *tail), where
        tail is the number of keys, the keys, then ARGV (FUNCTION LOAD excepted): 1-4 from
        here, 5 on the caller's ``args`` (docs/wire.md, "Script arguments")."""
        keys = self.script_keys(operation, name)
        channel = self._publish_to
        if self.slots is not None:  # ARGV 2: '<prefix>:events 0 <sharded channel>' (lua/_lib.lua)
            channel = self._argv2.get(keys[0]) or self._argv2.setdefault(keys[0], self.argv2(keys[0], name))
        now = "" if now_ms is None else int(now_ms)
        return self.heads[operation], [len(keys), *keys, name, channel, now, self.ttl_ms, *args]

    def call(
        self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]
    ) -> tuple[str, str, list[str], list[Any]]:
        """(sha, source, keys, argv) of one script call."""
        heads, tail = self.prepared(operation, name, now_ms, args)
        count = tail[0]
        return heads[EVALSHA], heads[EVAL], tail[1 : count + 1], tail[count + 1 :]

    def commands(self, operation: str, calls: Sequence[Call]) -> list[tuple[Any, ...]]:
        """The commands of calls pipelined (batches.py), each the first step of its call,
        by name: redis-py's cluster pipeline refuses evalsha(), yet sends EVALSHA by its keys."""
        step = FCALL if self.use_functions else EVALSHA
        commands = []
        for name, now_ms, args in calls:
            heads, tail = self.prepared(operation, name, now_ms, args)
            commands.append((COMMANDS[step], heads[step], *tail))
        return commands

    def missing(self, result: Any) -> bool:
        """Whether a pipelined call failed for want of its script, not by its own error;
        an FCALL the server does not take (fcall_failed) turns to EVALSHA from now on."""
        if isinstance(result, redis.exceptions.NoScriptError):
            return True
        if not isinstance(result, redis.exceptions.ResponseError):
            return False
        try:
            self.after(FCALL if self.use_functions else EVALSHA, result)
        except redis.exceptions.ResponseError:
            return False  # the script's own error
        return True

    def keys_to_drop(self, operation: str, name: str) -> list[str]:
        """A script's keys, and a breaker's undeclared ones (a corrupted breaker is dropped whole)."""
        keys = self.script_keys(operation, name)
        same_slot = keys[0] == self.route_key(name)  # (a breaker's keys; not health's or a group's)
        return [*keys, *undeclared_keys(self.prefix, name)] if same_slot else keys

    def script_keys(self, operation: str, name: str) -> list[str]:
        """The keys a script call touches: a breaker's seven, or the health key,
        or a breaker group's hash (``name`` is then the group's)."""
        if operation == "health":
            return self.health_keys(name)
        if operation == "group":
            return [group_key(self.prefix, name)]
        keys = self._keys.get(name)
        if keys is None:
            keys = self._keys[name] = breaker_keys(self.prefix, name)
        return keys

    def health_keys(self, name: str) -> list[str]:
        """lua/health.lua's key: <prefix>:health, or on a cluster, to probe the master of
        one breaker, a key in that breaker's slot."""
        return [self.health_key if name == "health" else f"{self.prefix}:{{{name}}}:health"]

    def argv2(self, first_key: str, name: str) -> str:
        """The channels a script publishes on (ARGV 2) on a cluster: the prefix's, and one in
        the slot of the script's keys (a breaker's notices; else the first key's own name)."""
        breaker = first_key == self.route_key(name)
        shard = notices_channel(self.prefix, name) if breaker else first_key
        return f"{self._publish_to} {shard}"

    def route_key(self, name: str) -> str:
        """A key of the breaker (its state): on a cluster, its slot is the breaker's."""
        keys = self._keys.get(name)
        if keys is None:
            keys = self._keys[name] = breaker_keys(self.prefix, name)
        return keys[0]


class ScriptRunner(Scripts):
    """The scripts registered on one client, run against one key prefix."""

    def run(self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]) -> Any:
        heads, tail = self.prepared(operation, name, now_ms, args)
        if self.slots is None:
            return self.send(self.client, heads, tail)
        # straight to the breaker's master (cluster.py), whose key is tail[1]
        return self.slots.call(tail[1], lambda target: self.send(target, heads, tail))

    def send(self, target: Any, heads: tuple[str, ...], tail: list[Any]) -> Any:
        """One script call's steps on target: the client, or a client of the breaker's master."""
        return run_sync(self.steps(blocking, target, heads, tail))

    def run_repairing(self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]) -> Any:
        """run(), except that a breaker with a corrupted key is reset and the call made
        again on a fresh, closed breaker (Scripts.corrupted)."""
        try:
            return self.run(operation, name, now_ms, args)
        except redis.exceptions.ResponseError as exc:
            if not self.corrupted(name, exc):
                raise
        self.client.delete(*self.keys_to_drop(operation, name))
        return self.run(operation, name, now_ms, args)

    def run_many(self, operation: str, calls: Sequence[Call]) -> list[Any]:
        return batches.run_many(self, operation, calls)  # in one pipeline

    def run_chunks(self, operation: str, chunks: Iterable[Sequence[Call]]) -> Generator[list[Any]]:
        return batches.run_chunks(self, operation, chunks)  # pipelined, two chunks in flight

    def register_name(self, name: str, now_ms: int | None = None) -> None:
        """Add a name to the listing set (outside the scripts: it lives in another slot),
        and now and then sweep a few idle breakers (Scripts.chores_due).

        On a cluster a listing that gets no answer has the slot map read again
        (cluster.Slots.following), as redis-py up to 8.1 did itself: an operator's
        action lists the breaker, then sends its script straight to the master the map
        names, the promoted replica if the listing set's master was the one that died."""
        with self.slots.following() if self.slots is not None else contextlib.nullcontext():
            self.listing(name).execute()
        check, sweep = self.chores_due()
        if check:
            with contextlib.suppress(Exception):  # INFO refused (an ACL without it): no check
                self.check_memory_policy(self.client.info("memory"))
        if sweep:
            self.sweep(now_ms)

    def sweep(self, now_ms: int | None = None) -> list[str]:
        """Remove the breakers idle for the key TTL among a few names picked at
        random (lua/sweep.lua); the names removed."""
        picked = [text(name) for name in self.client.srandmember(self.names_key, SWEEP_PICKS)]
        gone = [name for name in picked if self.run("sweep", name, now_ms, ()) == 1]
        if gone:
            self.client.srem(self.names_key, *gone)
        return gone
