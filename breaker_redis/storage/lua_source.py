"""The scripts' text, built from lua/: the prelude (lua/_lib.lua with its
includes put in and BreakerConfig's live rules written in), each script as
EVAL runs it, and the same code as one library of Redis Functions.

What runs, apart from how it is sent: scripts.py registers and calls this
text on a client; the ACL check (acl.py), the tests and the benchmarks read
it without one. Each is built once per process (``functools.cache``).
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from importlib import resources
from pathlib import Path

from breaker_redis.storage.lua_rules import with_live_rules

__all__ = ["OPERATIONS", "assembled", "library", "prelude", "script_source"]

OPERATIONS = (
    *("acquire", "record", "admin", "configure", "snapshot", "read", "health", "sweep"),
    # the HTTP client integrations': a service's Retry-After, a breaker group's grants (groups.py)
    *("hold", "member", "group"),
)


def _lua_dir() -> Path:
    packaged = resources.files("breaker_redis") / "lua"
    if packaged.is_dir():  # installed wheel: lua/ is shipped inside the package
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "lua"  # source tree / editable install


def _read(name: str) -> str:
    return (_lua_dir() / f"{name}.lua").read_text("utf-8")


_INCLUDE = re.compile(r"^-- @include ([a-z_]+)[ \t]*$", re.MULTILINE)


def assembled(name: str = "_lib") -> str:
    """A Lua file with each of its ``-- @include <job>`` lines replaced by lua/includes/<job>.lua.

    lua/_lib.lua is the prelude's table of contents: its header (the keys and the
    common arguments), then one ``-- @include`` line per include, in the order they
    are put together. Each include does one job and may use what the includes above
    it define (one Lua chunk: their locals are in scope below them), so the order
    is the one written there. An include holds no ``-- @include`` line itself.
    """

    def include(match: re.Match[str]) -> str:
        text = _read(f"includes/{match.group(1)}")
        if _INCLUDE.search(text):
            raise RuntimeError(f"lua/includes/{match.group(1)}.lua has an @include: only lua/_lib.lua may")
        return text.rstrip("\n")

    return _INCLUDE.sub(include, _read(name))


@cache
def prelude() -> str:
    """lua/_lib.lua as the scripts run it: its includes put in (assembled) and
    BreakerConfig's live rules written in (lua_rules.py)."""
    return with_live_rules(assembled())


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
    body = (
        prelude()
        + "\n"
        + "".join(
            f"redis.register_function('@@_{op}', function(KEYS, ARGV)\nbegin(KEYS, ARGV)\n{_read(op)}\nend)\n"
            for op in OPERATIONS
        )
    )
    tag = "breaker_redis_" + hashlib.sha1(body.encode("utf-8")).hexdigest()[:16]
    source = f"#!lua name={tag}\n" + body.replace("@@", tag)
    return source, {op: f"{tag}_{op}" for op in OPERATIONS}
