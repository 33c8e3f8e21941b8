"""Finds lua/*.lua, registers them on a client and calls them.

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
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import time
import unicodedata
from collections import deque
from collections.abc import Generator, Iterable, Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

from breaker_redis.storage.cluster import Slots, is_cluster, notices_channel
from breaker_redis.storage.lua_rules import with_live_rules

log = logging.getLogger("breaker_redis")

Call = tuple[str, "int | None", Sequence[Any]]  # name, now_ms, args: one script call (run_many)
OPERATIONS = (
    *("acquire", "record", "admin", "configure", "snapshot", "read", "health", "sweep"),
    # the HTTP client integrations': a service's Retry-After, a breaker group's grants (groups.py)
    *("hold", "member", "group"),
)
KEY_SUFFIXES = ("state", "window", "leases", "config", "stats", "events", "cfg")
# A breaker's key the scripts touch without declaring it: only with min_reporters above 1
# (lua/_lib.lua rep_key, '<prefix>:{NAME}:reporters'). It carries the breaker's hash tag, so it
# is in the slot of the declared keys (on Redis Cluster too); declared, it would cost every
# call one more key, for a feature off by default.
UNDECLARED_SUFFIXES = ("reporters",)
SWEEP_PICKS = 3  # names a process sweeps at a time (lua/sweep.lua)

# A name becomes part of a key (prefix:{NAME}:suffix), of the names SET and of
# the JSON messages the scripts publish (encoded there with cjson), so it may
# hold anything a key can, URL paths such as "api/v1/pay" and non-ASCII text
# included, except: braces, which would break the hash tag that keeps a
# breaker's keys in one Redis Cluster slot; whitespace (str.isspace, Unicode
# spaces included) and control, format and surrogate characters (Unicode
# categories Cc, Cf, Cs), which make names that look alike in logs and
# dashboards or cannot be encoded. At most MAX_NAME_LENGTH characters: a name
# is repeated in six keys and in every message about the breaker.
MAX_NAME_LENGTH = 200
_NAME_RULE = "names may hold anything but {, }, whitespace and control characters (Unicode Cc, Cf, Cs)"
_REFUSED_CATEGORIES = {"Cc": "control character", "Cf": "format character", "Cs": "surrogate"}
_PREFIX = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")


def _refused_kind(char: str) -> str | None:
    if char in "{}":
        return "brace"
    if char.isspace():
        return "whitespace"
    return _REFUSED_CATEGORIES.get(unicodedata.category(char))


def validate_name(name: object) -> str:
    """The name, if it can name a breaker; else an error saying what is wrong with it."""
    if not isinstance(name, str):
        raise TypeError(f"invalid breaker name {name!r}: must be a str (got {type(name).__name__})")
    if not name:
        raise ValueError(f"invalid breaker name '': names must not be empty; {_NAME_RULE}")
    if len(name) > MAX_NAME_LENGTH:
        too_long = f"{len(name)} characters, at most {MAX_NAME_LENGTH} allowed"
        raise ValueError(f"invalid breaker name {name[:40]!r}...: {too_long}")
    for position, char in enumerate(name):
        kind = _refused_kind(char)
        if kind is not None:
            raise ValueError(
                f"invalid breaker name {name!r}: character {char!r} (U+{ord(char):04X}, {kind}) "
                f"at position {position} is not allowed; {_NAME_RULE}"
            )
    return name


def validate_prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise ValueError(f"invalid key prefix {prefix!r}: use 1-64 characters from A-Z a-z 0-9 _ . : -")
    return prefix


def breaker_keys(prefix: str, name: str) -> list[str]:
    """The seven keys of one breaker, in the order the scripts expect (KEYS[1..7])."""
    return [f"{prefix}:{{{name}}}:{suffix}" for suffix in KEY_SUFFIXES]


def undeclared_keys(prefix: str, name: str) -> list[str]:
    """The keys of one breaker the scripts touch undeclared (UNDECLARED_SUFFIXES)."""
    return [f"{prefix}:{{{name}}}:{suffix}" for suffix in UNDECLARED_SUFFIXES]


def group_key(prefix: str, group: str) -> str:
    """The hash of a breaker group (lua/group.lua): in the slot of its own hash tag."""
    return f"{prefix}:group:{{{group}}}"


def _lua_dir() -> Path:
    packaged = resources.files("breaker_redis") / "lua"
    if packaged.is_dir():  # installed wheel: lua/ is shipped inside the package
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "lua"  # source tree / editable install


def _read(name: str) -> str:
    return (_lua_dir() / f"{name}.lua").read_text("utf-8")


@cache
def prelude() -> str:
    """lua/_lib.lua as the scripts run it: BreakerConfig's live rules written in (lua_rules.py)."""
    return with_live_rules(_read("_lib"))


@cache
def script_source(operation: str) -> str:
    """One script as EVAL runs it: the prelude, then the script's own file."""
    if operation not in OPERATIONS:
        raise ValueError(f"unknown script {operation!r}")
    return prelude() + "\nbegin(KEYS, ARGV)\n" + _read(operation)


@cache
def library() -> tuple[str, dict[str, str]]:
    """The same code as one library of Redis Functions: (source, function name per operation).

    The prelude is loaded once (FUNCTION LOAD) instead of running on every
    call. Names carry a hash of the code, so two versions of breaker_redis can
    share a server (a rolling deploy), each calling its own functions.
    """
    body = prelude() + "\n" + "".join(
        f"redis.register_function('@@_{op}', function(KEYS, ARGV)\nbegin(KEYS, ARGV)\n{_read(op)}\nend)\n"
        for op in OPERATIONS
    )
    tag = "breaker_redis_" + hashlib.sha1(body.encode("utf-8")).hexdigest()[:16]
    source = f"#!lua name={tag}\n" + body.replace("@@", tag)
    return source, {op: f"{tag}_{op}" for op in OPERATIONS}


def _with_sha(source: str) -> tuple[str, str]:
    return hashlib.sha1(source.encode("utf-8")).hexdigest(), source


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
        self.names_key = f"{prefix}:names"
        self.health_key = f"{prefix}:health"  # lua/health.lua's, outside every breaker's hash tag
        self.groups_key = f"{prefix}:groups"  # the names of the breaker groups (breaker_redis/groups.py)
        self.ttl_ms = ttl_ms
        self._scripts = {op: _with_sha(script_source(op)) for op in OPERATIONS}
        self._keys: dict[str, list[str]] = {}
        self._swept = (0, 0.0)  # (pid, when) of this process's last sweep
        # Redis Functions (FCALL) while the server takes them, EVALSHA on a server
        # without them (Redis < 7, an older fakeredis, an ACL without FCALL). Not
        # on a cluster: redis-py finds FCALL's keys with a COMMAND GETKEYS round
        # trip per call (EVALSHA's it reads itself).
        self.library, self.function_names = library()
        if functions is None:
            functions = isinstance(client, (redis.Redis, redis.asyncio.Redis))
        self.use_functions = functions
        # On Redis Cluster: where each breaker lives, and each call sent to its master
        # (breaker_redis/storage/cluster.py); the scripts also SPUBLISH on the breaker's own channel.
        self.slots: Slots | None = Slots(client) if is_cluster(client) else None
        self._argv2: dict[str, str] = {}

    def fcall_failed(self, exc: redis.exceptions.ResponseError, attempt: int) -> bool:
        """After FCALL failed with ``exc``: True to load the library and call
        again, False to run this call with EVALSHA; raises ``exc`` when the
        function itself failed."""
        message = str(exc)
        refused = isinstance(exc, redis.exceptions.NoPermissionError)
        if refused or message.lower().startswith("unknown command"):
            self.use_functions = False  # an ACL without FCALL, Redis < 7: EVALSHA from now on
            return False
        if not message.startswith("Function not found"):
            raise exc
        # not loaded there (a new, restarted or flushed server); loaded and gone
        # again (a FUNCTION FLUSH right after the load): EVAL runs this call
        return attempt == 1

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

    def check_memory_policy(self, info: dict[str, Any]) -> None:
        """A WARNING when the server may evict the breakers' keys (doctor.memory says
        why); ``info`` is INFO memory, per node on a cluster."""
        from breaker_redis.ops.doctor.memory import eviction_problem

        nodes = list(info.values()) if info and all(isinstance(v, dict) for v in info.values()) else [info]
        for node in nodes:
            problem = eviction_problem(text(node.get("maxmemory_policy")), int(node.get("maxmemory") or 0))
            if problem is not None:
                log.warning("the breakers' Redis: %s (see README: Redis memory and permissions; "
                            "breaker-redis doctor checks it)", problem)
                return

    def call(
        self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]
    ) -> tuple[str, str, list[str], list[Any]]:
        """(sha, source, keys, argv) of one script call."""
        keys = self.script_keys(operation, name)
        channel = self._publish_to
        if self.slots is not None:  # ARGV 2: '<prefix>:events 0 <sharded channel>' (lua/_lib.lua)
            channel = self._argv2.get(keys[0]) or self._argv2.setdefault(keys[0], self.argv2(keys[0], name))
        argv: list[Any] = [name, channel, "" if now_ms is None else int(now_ms), self.ttl_ms]
        argv.extend(args)
        sha, source = self._scripts[operation]
        return sha, source, keys, argv

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


def _evalsha(client: Any, sha: str, source: str, keys: list[str], argv: list[Any]) -> Any:
    try:
        return client.evalsha(sha, len(keys), *keys, *argv)
    except redis.exceptions.NoScriptError:
        # A flushed script cache or a restarted server: EVAL sends the body
        # and runs it in one command, so a second SCRIPT FLUSH landing
        # between a SCRIPT LOAD and the EVALSHA that follows (redis-py's
        # own retry) cannot fail the call. EVAL caches the script again.
        return client.eval(source, len(keys), *keys, *argv)


class ScriptRunner(Scripts):
    """The scripts registered on one client, run against one key prefix."""

    def run(self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]) -> Any:
        sha, source, keys, argv = self.call(operation, name, now_ms, args)
        if self.slots is not None:  # straight to the breaker's master (cluster.py)
            return self.slots.call(keys[0], lambda target: _evalsha(target, sha, source, keys, argv))
        if self.use_functions:
            function = self.function_names[operation]
            for attempt in (1, 2):
                try:
                    return self.client.fcall(function, len(keys), *keys, *argv)
                except redis.exceptions.ResponseError as exc:
                    if not self.fcall_failed(exc, attempt):
                        break
                try:
                    self.client.function_load(self.library)
                except redis.exceptions.ResponseError as exc:
                    self.load_failed(exc)
        return _evalsha(self.client, sha, source, keys, argv)

    def run_repairing(self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]) -> Any:
        """run(), except that a key of the wrong type (written by hand, or by another
        program), which would fail every call for good, is dropped with the rest of
        the breaker's keys, said once in the log, and the call made again on a fresh,
        closed breaker."""
        try:
            return self.run(operation, name, now_ms, args)
        except redis.exceptions.ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            log.warning("breaker %r had a corrupted key (%s); its keys were reset", name, exc)
            self.drop_keys(name, operation)
            return self.run(operation, name, now_ms, args)

    def run_many(self, operation: str, calls: Sequence[Call]) -> list[Any]:
        """Calls of one script, each (name, now_ms, args), in one pipeline (on a
        cluster, redis-py's sends one per node): each call's reply, or the
        ResponseError it got, in order.

        Calls that found the script missing there (a new, restarted or flushed
        server: every call of the pipeline) are sent again in one more pipeline
        once it is loaded; one that misses it even then runs alone (run())."""
        return self._loaded(operation, calls, self._pipelined(operation, calls))

    def run_chunks(
        self, operation: str, chunks: Iterable[Sequence[Call]]
    ) -> Generator[list[Any], None, None]:
        """run_many() of each chunk in turn, except that on one server the next
        chunk is sent before this one's replies are handed over: Redis runs it
        while the caller decodes these (a third less time for 2,000 breakers read,
        bench/status.py). Two chunks at most are in flight, on one connection of
        the client's pool, which is dropped if the caller stops before the end
        (replies would be left in it). A cluster's chunks go one after the other."""
        if not isinstance(self.client, redis.Redis):
            for calls in chunks:
                yield self.run_many(operation, calls)
            return
        from breaker_redis.storage.internals import pooled_connection, send_commands

        pool = self.client.connection_pool
        conn = pooled_connection(pool)
        sent: deque[Sequence[Call]] = deque()
        drained = False
        try:
            for calls in chunks:
                send_commands(conn, self._commands(operation, calls))
                sent.append(calls)
                if len(sent) == 2:
                    done = sent.popleft()
                    yield self._loaded(operation, done, self._replies(conn, len(done)))
            while sent:
                done = sent.popleft()
                yield self._loaded(operation, done, self._replies(conn, len(done)))
            drained = True
        finally:
            if not drained:
                conn.disconnect()
            pool.release(conn)

    @staticmethod
    def _replies(conn: Any, count: int) -> list[Any]:
        replies: list[Any] = []
        for _ in range(count):
            try:
                replies.append(conn.read_response())
            except redis.exceptions.ResponseError as exc:
                replies.append(exc)
        return replies

    def _commands(self, operation: str, calls: Sequence[Call]) -> list[tuple[Any, ...]]:
        commands = []
        for name, now_ms, args in calls:
            sha, _, keys, argv = self.call(operation, name, now_ms, args)
            if self.use_functions:
                commands.append(("FCALL", self.function_names[operation], len(keys), *keys, *argv))
            else:  # by name: redis-py's cluster pipeline refuses evalsha(), yet sends EVALSHA by its keys
                commands.append(("EVALSHA", sha, len(keys), *keys, *argv))
        return commands

    def _loaded(self, operation: str, calls: Sequence[Call], results: list[Any]) -> list[Any]:
        """The results of calls, those that found the script missing sent again once it is loaded."""
        missing = [i for i, result in enumerate(results) if self._not_loaded(result)]
        if not missing:
            return results
        self._load(operation)
        for i, result in zip(missing, self._pipelined(operation, [calls[i] for i in missing]), strict=True):
            results[i] = self.run(operation, *calls[i]) if self._not_loaded(result) else result
        return results

    def _pipelined(self, operation: str, calls: Sequence[Call]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for command in self._commands(operation, calls):
            pipe.execute_command(*command)
        return list(pipe.execute(raise_on_error=False))

    def _not_loaded(self, result: Any) -> bool:
        """Whether a pipelined call failed for want of its script, not by its own error;
        an FCALL the server does not take (fcall_failed) turns to EVALSHA from now on."""
        if isinstance(result, redis.exceptions.NoScriptError):
            return True
        if not (self.use_functions and isinstance(result, redis.exceptions.ResponseError)):
            return False
        try:
            self.fcall_failed(result, 1)
        except redis.exceptions.ResponseError:
            return False  # the function's own error
        return True

    def _load(self, operation: str) -> None:
        if self.use_functions:
            try:
                self.client.function_load(self.library)
            except redis.exceptions.ResponseError as exc:
                self.load_failed(exc)
        else:
            self.client.script_load(self._scripts[operation][1])

    def drop_keys(self, name: str, operation: str = "acquire") -> None:
        self.client.delete(*self.keys_to_drop(operation, name))

    def register_name(self, name: str, now_ms: int | None = None) -> None:
        """Add a name to the listing set (outside the scripts: it lives in another slot),
        and now and then sweep a few idle breakers (Scripts.chores_due)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.sadd(self.names_key, name)
        pipe.persist(self.names_key)  # a TTL an older version gave it
        pipe.execute()
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
