"""Finds lua/*.lua, registers them on a client and calls them.

Each script is sent as the shared prelude (``_lib.lua``) followed by the
script's own file, run with EVALSHA (the SHA1 of that text, computed here:
nothing is sent before the first call); on NOSCRIPT (a flushed script cache,
a restarted server) the call is sent again as EVAL, which loads and runs the
body in one command: one extra round trip and nothing else, even when the
cache is flushed again meanwhile.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import redis

OPERATIONS = ("acquire", "record", "admin", "configure", "snapshot")
KEY_SUFFIXES = ("state", "window", "leases", "config", "stats", "events", "cfg")

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


def _lua_dir() -> Path:
    packaged = resources.files("breaker_redis") / "lua"
    if packaged.is_dir():  # installed wheel: lua/ is shipped inside the package
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / "lua"  # source tree / editable install


@cache
def script_source(operation: str) -> str:
    if operation not in OPERATIONS:
        raise ValueError(f"unknown script {operation!r}")
    folder = _lua_dir()
    return (folder / "_lib.lua").read_text("utf-8") + "\n" + (folder / f"{operation}.lua").read_text("utf-8")


def _with_sha(source: str) -> tuple[str, str]:
    return hashlib.sha1(source.encode("utf-8")).hexdigest(), source


def text(value: Any) -> str:
    """Decode a reply element, whatever decode_responses the client was built with."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def flat_pairs(values: Sequence[Any]) -> dict[str, Any]:
    return {text(values[i]): values[i + 1] for i in range(0, len(values) - 1, 2)}


class Scripts:
    """The scripts and keys of one key prefix, and the arguments of a call:
    what the sync runner and the asyncio one (breaker_redis/asyncio/store.py) share."""

    def __init__(self, client: Any, prefix: str, ttl_ms: int) -> None:
        self.client = client
        self.prefix = validate_prefix(prefix)
        self.channel = f"{prefix}:events"
        self.names_key = f"{prefix}:names"
        self.ttl_ms = ttl_ms
        self._scripts = {op: _with_sha(script_source(op)) for op in OPERATIONS}
        self._keys: dict[str, list[str]] = {}

    def call(
        self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]
    ) -> tuple[str, str, list[str], list[Any]]:
        """(sha, source, keys, argv) of one script call."""
        argv: list[Any] = [name, self.channel, "" if now_ms is None else int(now_ms), self.ttl_ms]
        argv.extend(args)
        keys = self._keys.get(name)
        if keys is None:
            keys = self._keys[name] = breaker_keys(self.prefix, name)
        sha, source = self._scripts[operation]
        return sha, source, keys, argv


class ScriptRunner(Scripts):
    """The scripts registered on one client, run against one key prefix."""

    def run(self, operation: str, name: str, now_ms: int | None, args: Sequence[Any]) -> Any:
        sha, source, keys, argv = self.call(operation, name, now_ms, args)
        try:
            return self.client.evalsha(sha, len(keys), *keys, *argv)
        except redis.exceptions.NoScriptError:
            # A flushed script cache or a restarted server: EVAL sends the body
            # and runs it in one command, so a second SCRIPT FLUSH landing
            # between a SCRIPT LOAD and the EVALSHA that follows (redis-py's
            # own retry) cannot fail the call. EVAL caches the script again.
            return self.client.eval(source, len(keys), *keys, *argv)

    def drop_keys(self, name: str) -> None:
        self.client.delete(*breaker_keys(self.prefix, name))

    def register_name(self, name: str) -> None:
        """Add a name to the listing set (outside the scripts: it lives in another slot)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.sadd(self.names_key, name)
        pipe.pexpire(self.names_key, self.ttl_ms)
        pipe.execute()
