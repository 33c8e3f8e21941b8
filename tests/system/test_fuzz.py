"""Fuzz: hostile or careless data in Redis, against the session's real redis-server.

Generated inputs: breaker names (any name the public API accepts: ``{``-free unicode with
``:``, ``*``, quotes, 200-character ones...), BreakerConfigs within bounds, live overrides
written by hand into ``{prefix}:{NAME}:config`` ('1e999', 'nan', '-0', '0x10', ' 3', '', huge
integers, unicode, binary bytes), and corruptions of every key of a breaker (state, window,
leases, config, stats, events, cfg; and the global names and health keys): a field set to
garbage or to its own value slightly off, a field deleted, a key replaced by another type or
deleted, a lease or an events line forged. What must hold:

1. Names: ``Breakers.get`` and ``configure`` accept exactly the names docs/decisions.md allows and
   refuse the others with a ValueError (TypeError for a non-str) naming the problem: the
   character, its code point and its position. A refused name writes nothing to Redis.
2. After any corruption, a sequence of calls (``call`` with a protected function that succeeds,
   fails or raises an ignored exception, with and without a fallback; ``with``; ``acquire`` and
   settling the permit later; ``snapshot``; ``state``; ``force_open`` / ``force_closed`` /
   ``clear_force`` / ``reset``; ``configure``) raises nothing to the caller but ``BreakerOpen``
   or the protected call's own exception (``configure`` may refuse a value with a ValueError
   naming the field), and no script fails behind the caller's back: the store gate stays on
   Redis and the library logs no error (a WRONGTYPE key dropped and rebuilt, and a repaired
   field, are documented and allowed). Time moves only through the test clock (the scripts'
   now_ms), never by sleeping.
3. No command, scripts included, runs longer than 1 ms: SLOWLOG is reset before each example,
   ``slowlog-log-slower-than`` is 1000 (us) for the module and restored afterwards, and the
   slow log must be empty after each example. An example with a slow command is played again
   (SLOW_REPLAYS); slow in every run, it fails if one command (a script at one now_ms) was
   slow in each run and its slowest command also took more than REFERENCE_FACTOR times a
   reference workload measured right after that run (load slows both, and a busy machine's
   stall lands on a different command in each replay).
4. No key outside a breaker's hash tag is touched: after each example every key in Redis is
   ``{prefix}:{NAME}:<suffix>`` (``keys.KEY_SUFFIXES``, ``keys.UNDECLARED_SUFFIXES``) of a
   name in use, or ``{prefix}:names`` / ``{prefix}:health`` (docs/redis-keys.md). A second test
   watches MONITOR: every script declares exactly the seven keys of the name it is given (one
   ``{NAME}`` tag), every command it runs touches only those keys and that name's undeclared one
   (its reporters, in the same tag: ``min_reporters``) and publishes only on ``{prefix}:events``,
   and every other command reaching Redis touches only the keys above.
5. Nothing read from Redis is unpickled or evaluated: a static scan (``ast``) of
   ``breaker_redis/**/*.py`` for pickle, marshal, shelve, eval, exec and yaml.load, and of the Lua
   scripts for loadstring, load, dofile (and the ways to reach them by a computed name).

A failing example prints its reproduction (hypothesis notes): the Python calls and the
redis-cli commands, in the order they ran, with what each answered.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import math
import os
import re
import unicodedata
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import breaker_redis
from breaker_redis import BreakerConfig, BreakerOpen, Breakers
from breaker_redis.base.config import BOUNDS, LUA_FIELDS, MODES, TRIPS
from breaker_redis.engine.permit import Permit
from breaker_redis.storage.keys import KEY_SUFFIXES, UNDECLARED_SUFFIXES, breaker_keys, undeclared_keys
from breaker_redis.storage.lua_source import OPERATIONS, library, script_source
from tests.support.clock import Clock
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.real

# Examples per test: modest, so the file runs in seconds on a 2-core machine, and derandomized,
# so CI runs the same examples every time. For a longer hunt, locally:
#   BREAKER_FUZZ_SCALE=20 BREAKER_FUZZ_RANDOM=1 .venv/bin/python -m pytest -q -p no:cacheprovider \
#       tests/system/test_fuzz.py
# BREAKER_FUZZ_SCALE multiplies every test's max_examples; BREAKER_FUZZ_RANDOM=1 draws new examples
# on every run (no example database is written either way).
_SCALE = float(os.environ.get("BREAKER_FUZZ_SCALE", "1"))
_RANDOM = os.environ.get("BREAKER_FUZZ_RANDOM") == "1"


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=max(1, round(examples * _SCALE)),
        deadline=None,
        derandomize=not _RANDOM,
        database=None,
        # one failure, shrunk, is reported (shrinking each distinct failure takes tens of seconds);
        # the sweep below reports every corruption that fails, deterministically
        report_multiple_bugs=False,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
        ],
    )


log = logging.getLogger("breaker_redis")
SLOW_US = 1000  # slowlog-log-slower-than: no command may take longer than 1 ms
# A script slowed by its data is slow every time the same example runs (the test clock makes a replay
# exact); one stalled because the machine was busy (a 2-core machine running other test sessions has
# stalled a 20 us script for 7 ms) is not. So a run with a slow command is played again, up to this
# many times, and the example fails only if every run had one; a stall seen once is reported as a
# SlowOnce warning in pytest's summary, never dropped. BREAKER_FUZZ_SLOW_REPLAYS=0: fail at once.
SLOW_REPLAYS = int(os.environ.get("BREAKER_FUZZ_SLOW_REPLAYS", "2"))
GLOBAL_SUFFIXES = ("names", "health")  # docs/redis-keys.md: the keys outside any breaker's tag
REPORTER = "web-01"  # the examples' Breakers' reporter (its record in the reporters hash: min_reporters)

# -- the names docs/decisions.md allows ------------------------------------------------------------

MAX_NAME = 200  # docs/decisions.md, "Names": 1-200 characters
_REFUSED_CATEGORIES = ("Cc", "Cf", "Cs")


def name_problems(name: object) -> list[list[str]]:
    """What docs/decisions.md says is wrong with a breaker name: [] if it is allowed, else the ways an
    error may name the problem (each a list of fragments the message must hold)."""
    if not isinstance(name, str):
        return [["must be a str"]]
    if not name:
        return [["empty"]]
    problems = []
    if len(name) > MAX_NAME:
        problems.append([f"{len(name)} characters", str(MAX_NAME)])
    for position, char in enumerate(name):
        if char in "{}" or char.isspace() or unicodedata.category(char) in _REFUSED_CATEGORIES:
            problems.append([f"U+{ord(char):04X}", f"position {position}"])
            break  # the first bad character is the one to name
    return problems


_NAME_CHAR = st.characters(exclude_categories=("Cc", "Cf", "Cs", "Zs", "Zl", "Zp"), exclude_characters="{}")
_ODD_NAMES = [
    "pay",
    "a:b",
    "*",
    "?",
    "[a-z]*",
    "api/v1/pay",
    "\\",
    '"',
    "'",
    "%s%n",
    "::",
    ":state",
    "redis.call('FLUSHALL')",
    "]]..KEYS[2]..[[",
    "\\x00",
    "caf\u00e9",
    "\u65e5\u672c\u8a9e",
    "\U0001f642",
    "x" * MAX_NAME,
    "\u00e9" * MAX_NAME,
    "\U0001f642" * MAX_NAME,
]
NAMES = st.one_of(
    st.sampled_from([n for n in _ODD_NAMES if not name_problems(n)]),
    st.text(_NAME_CHAR, min_size=1, max_size=16),
    st.text(_NAME_CHAR, min_size=MAX_NAME - 10, max_size=MAX_NAME),
)
_BAD_CHAR = st.one_of(
    st.sampled_from(
        "{} \t\n\r\x00\x1f\x7f\x85\xa0\u1680\u2000\u2028\u2029\u200b\u200e\u202e\ufeff\u3000\U000e0001"
    ),
    st.integers(0xD800, 0xDFFF).map(chr),  # lone surrogates
    st.characters(categories=("Cc", "Cf", "Zs", "Zl", "Zp")),
)
REFUSED_NAMES = st.one_of(
    st.just(""),
    st.tuples(st.text(_NAME_CHAR, max_size=10), _BAD_CHAR, st.text(max_size=10)).map("".join),
    st.text(_NAME_CHAR, min_size=MAX_NAME + 1, max_size=MAX_NAME + 40),
)
NOT_STR = st.one_of(
    st.none(), st.integers(), st.floats(), st.binary(max_size=8), st.lists(st.text(max_size=3), max_size=2)
)
PREFIXES = st.sampled_from(["breaker", "fz", "a:b", "x.y-z_1"])

# -- configs within bounds -----------------------------------------------------------------------


def _small(highest: int) -> st.SearchStrategy[int]:
    return st.one_of(st.integers(1, 4), st.just(highest), st.integers(1, highest))


def _seconds(highest: float) -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from([0.001, 1.0, 30.0, highest]), st.floats(0, highest, exclude_min=True))


_RATE = st.one_of(st.sampled_from([0.5, 1.0]), st.floats(0, 1, exclude_min=True))


@st.composite
def config_kwargs(draw: st.DrawFn) -> dict[str, Any]:
    """BreakerConfig keyword arguments, each within BreakerConfig's bounds."""
    kw: dict[str, Any] = {
        "trip": draw(st.sampled_from(TRIPS)),
        "failure_threshold": draw(_small(1_000_000)),
        "failure_rate": draw(_RATE),
        "minimum_calls": draw(_small(1_000_000)),
    }
    if draw(st.booleans()):
        kw["slow_call_seconds"] = draw(_seconds(3600.0))
        kw["slow_call_rate"] = draw(_RATE)
    window = draw(st.one_of(st.sampled_from([0.001, 1.0, 10.0, 600.0, 86400.0]), st.floats(0.001, 86400)))
    buckets = draw(st.one_of(st.sampled_from([1, 10, MAX_BUCKETS]), st.integers(1, MAX_BUCKETS)))
    kw["window_seconds"], kw["window_buckets"] = window, max(1, min(buckets, math.floor(window * 1000)))
    which = draw(st.sampled_from(["neither", "open", "cap", "both"]))
    if which in ("open", "both"):
        kw["open_seconds"] = draw(_seconds(86400.0))
    if which in ("cap", "both"):
        kw["max_open_seconds"] = max(draw(_seconds(86400.0)), kw.get("open_seconds", 0.0))
    kw["open_backoff"] = draw(st.one_of(st.sampled_from([1.0, 2.0, 100.0]), st.floats(1, 100)))
    kw["half_open_max_calls"] = draw(_small(10_000))
    kw["half_open_successes"] = draw(_small(10_000))
    kw["probe_timeout_seconds"] = draw(_seconds(3600.0))
    if draw(st.booleans()):
        kw["max_concurrent_calls"] = draw(_small(1_000_000))
    kw["mode"] = draw(st.sampled_from(["enforce", "enforce", *MODES]))
    if draw(st.booleans()):
        kw["ignore_exceptions"] = (LookupError,)
    BreakerConfig(**kw)  # the strategy's own check: every config it draws is valid
    return kw


def config_code(kw: dict[str, Any]) -> str:
    args = [
        f"{k}=({', '.join(t.__name__ for t in v)},)" if k.endswith("_exceptions") else f"{k}={v!r}"
        for k, v in kw.items()
    ]
    return f"BreakerConfig({', '.join(args)})"


SPECS = st.lists(NAMES, min_size=1, max_size=3, unique=True).flatmap(
    lambda names: st.tuples(*[st.tuples(st.just(n), config_kwargs()) for n in names]).map(list)
)

# -- values a careless hand writes --------------------------------------------------------------

GARBAGE: st.SearchStrategy[str | bytes] = st.one_of(
    st.sampled_from(
        [
            "1e999",
            "-1e999",
            "nan",
            "-nan",
            "inf",
            "-inf",
            "-0",
            "0",
            "0x10",
            " 3",
            "3 ",
            "",
            "1_0",
            "1e-999",
            "4.9e-324",
            "1e308",
            "-1e308",
            "9" * 400,
            "-" + "9" * 400,
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775809",
            "0.5",
            "1.5",
            "600",
            "601",
            "86400",
            "86401",
            "none",
            "off",
            "closed",
            "open",
            "half_open",
            "consecutive",
            "count",
            "rate",
            "enforce",
            "observe",
            "\u00ff",
            "\u65e5\u672c",
            "\x00",
            "1\x002",
            "{}",
            "[]",
            '{"a":1}',
            "true",
            "null",
        ]
    ),
    st.text(alphabet="0123456789.eE+-x ", max_size=12),
    st.integers(-(2**70), 2**70).map(str),
    st.floats().map(repr),
    st.text(max_size=16),
    st.binary(max_size=16),
)


@dataclass(frozen=True)
class Tweak:
    """A field's own value, slightly off (read when the step runs)."""

    how: str

    def apply(self, current: bytes | None) -> bytes:
        raw = (current or b"0").decode("utf-8", "replace")
        try:
            number = int(raw)
        except ValueError:
            if self.how == "neg":
                return f"-{raw}".encode()
            return (raw + {"frac": ".5", "exp": "e0", "pad": " "}.get(self.how, "1")).encode()
        changed = {
            "+1": number + 1,
            "-1": number - 1,
            "x1000": number * 1000,
            "neg": -number,
            "huge": number + 10**30,
        }
        if self.how in changed:
            return str(changed[self.how]).encode()
        return {"frac": f"{number}.5", "exp": f"{number}e0", "pad": f" {number}"}[self.how].encode()


TWEAKS = st.sampled_from(["+1", "-1", "x1000", "neg", "huge", "frac", "exp", "pad"]).map(Tweak)
VALUES: st.SearchStrategy[str | bytes | Tweak] = st.one_of(GARBAGE, TWEAKS)


@dataclass(frozen=True)
class Bucket:
    """The k-th window bucket field (c<id>, f<id>, s<id>) present when the step runs."""

    k: int


STATE_FIELDS = (
    "state",
    "epoch",
    "open_until",
    "forced",
    "consec",
    "open_ms",
    "ho_ok",
    "seq",
    "ttl_at",
    "born",
    "armed",
    "arms",
)
WINDOW_FIELDS = ("head", "bms", "nb", "sat", "tc", "tf", "ts")
STATS_FIELDS = (
    "calls",
    "successes",
    "failures",
    "ignored",
    "slow",
    "rejected",
    "would_reject",
    "trips",
    "stale",
)
ODD_FIELDS = ("", "x", "failure_threshold ", "__index", "\u00e9")
HASH_FIELDS: dict[str, st.SearchStrategy[str | Bucket]] = {
    "state": st.sampled_from(STATE_FIELDS + ODD_FIELDS),
    "window": st.one_of(st.sampled_from(WINDOW_FIELDS + ODD_FIELDS), st.builds(Bucket, st.integers(0, 50))),
    "stats": st.sampled_from(STATS_FIELDS + ODD_FIELDS),
    "config": st.sampled_from(LUA_FIELDS + ODD_FIELDS),
}
DEL_FIELDS = {"state": STATE_FIELDS, "window": WINDOW_FIELDS, "stats": STATS_FIELDS, "config": LUA_FIELDS}
KINDS = ("string", "list", "set", "zset", "hash", "stream")
# a score of the clock's 'now' plus this, or a literal
LEASE_SCORES = st.one_of(
    st.sampled_from(["-inf", "+inf", "0", "1e308", "-1e308"]), st.integers(-(10**9), 10**9)
)
LEASE_MEMBERS = st.one_of(
    st.sampled_from(["p:{epoch}:9999", "b:9999", "p:{epoch}:1 b:2", "p:", "b:", "p:nan:1", "x", ""]),
    GARBAGE,
)
# lines forged into the events list: garbage, well formed, numbers no worker wrote
EVENT_LINES_SWEPT = (
    "garbage",
    "1 closed open count 1 1 -",
    "99999999999999999999 a b c 1e999 nan x",
    "1 2 3 4 5 6 7 8",
    "",
)
EVENT_LINES = st.one_of(st.sampled_from(EVENT_LINES_SWEPT), GARBAGE)

# -- the examples' steps -------------------------------------------------------------------------


class Boom(Exception):
    """The protected call's own failure."""


class Ignored(LookupError):
    """The protected call's own exception, ignored by configs with ignore_exceptions=(LookupError,)."""


FALLBACK = "fallback"
OWN: dict[str, type[Exception] | None] = {"success": None, "failure": Boom, "ignored": Ignored}


class Leak(AssertionError):
    """Something other than BreakerOpen or the call's own exception reached the caller."""


def sh(arg: bytes) -> str:
    """One argument for a bash command line, exactly."""
    try:
        text: str | None = arg.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and re.fullmatch(r"[A-Za-z0-9_.:+/=-]+", text):
        return text
    if text is not None and all(ch.isprintable() for ch in text):
        return "'" + text.replace("'", "'\\''") + "'"
    return (
        "$'"
        + "".join(chr(b) if 0x20 <= b < 0x7F and b not in (0x27, 0x5C) else f"\\x{b:02x}" for b in arg)
        + "'"
    )


def execute(client: Any, *args: object) -> Any:
    """One command on a redis-py client (whose execute_command is not typed)."""
    return client.execute_command(*args)


def as_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode("utf-8")


class Run:
    """One example: a Breakers on the fuzz client with a test clock, and an admin connection
    that writes the corruptions and notes them as redis-cli commands."""

    def __init__(
        self, env: FuzzRedis, prefix: str, specs: list[tuple[str, dict[str, Any]]], say: Callable[[str], None]
    ) -> None:
        self.env, self.prefix = env, prefix
        self.clock = Clock()
        self.names = [name for name, _ in specs]
        self.configs = [BreakerConfig(**kw) for _, kw in specs]
        self.lua = [json.loads(c.to_lua()) for c in self.configs]
        say(f"# redis-cli means: redis-cli -p {env.port}; every example starts with FLUSHALL")
        say(f"clock = Clock({self.clock.now})  # tests/conftest.py")
        say(
            f"breakers = Breakers(redis.Redis(port={env.port}), {prefix!r}, clock=clock, listen=False, "
            f"reporter={REPORTER!r})"
        )
        self.breakers = Breakers(env.client, prefix, clock=self.clock, listen=False, reporter=REPORTER)
        self.breaker = []
        for n, ((name, kw), config) in enumerate(zip(specs, self.configs, strict=True)):
            say(f"b{n} = breakers.get({name!r}, {config_code(kw)})")
            self.breaker.append(self.breakers.get(name, config))
        self.held: list[tuple[int, Permit]] = []

    def index(self, i: int) -> int:
        return i % len(self.names)

    def key(self, i: int, suffix: str) -> bytes:
        if suffix in GLOBAL_SUFFIXES:
            return f"{self.prefix}:{suffix}".encode()
        if suffix in UNDECLARED_SUFFIXES:
            undeclared = undeclared_keys(self.prefix, self.names[self.index(i)])
            return undeclared[UNDECLARED_SUFFIXES.index(suffix)].encode()
        return breaker_keys(self.prefix, self.names[self.index(i)])[KEY_SUFFIXES.index(suffix)].encode()

    def redis(self, *args: object) -> str:
        """Run one command on the admin connection; the redis-cli line that does the same. A
        command Redis refuses (a key another step replaced by another type) is noted, not fatal."""
        encoded = [as_bytes(a) for a in args]
        line = "redis-cli " + " ".join(sh(a) for a in encoded)
        try:
            execute(self.env.admin, *encoded)
        except redis.ResponseError as refused:
            return f"{line}  # (error: {refused})"
        return line

    def read(self, *args: object) -> Any:
        """A read on the admin connection; None if Redis refuses it (a key of another type)."""
        try:
            return execute(self.env.admin, *args)
        except redis.ResponseError:
            return None


class Step:
    def run(self, run: Run) -> str:
        """Do it; the line to note (the code or command, and what it answered)."""
        raise NotImplementedError


def _protected(run: Run, outcome: str, duration_ms: int) -> Callable[[], str]:
    own = OWN[outcome]

    def protected() -> str:
        run.clock.advance(duration_ms)  # the call takes this long, by the test clock
        if own is not None:
            raise own(outcome)
        return "ok"

    return protected


@dataclass(frozen=True)
class Call(Step):
    i: int
    outcome: str
    duration_ms: int
    fallback: bool

    def run(self, run: Run) -> str:
        n, own = run.index(self.i), OWN[self.outcome]
        extra = ", fallback=FALLBACK" if self.fallback else ""
        code = f"b{n}.call(<{self.outcome} in {self.duration_ms} ms>{extra})"
        protected = _protected(run, self.outcome, self.duration_ms)
        try:
            if self.fallback:
                result = run.breaker[n].call(protected, fallback=FALLBACK)
            else:
                result = run.breaker[n].call(protected)
        except BreakerOpen as refused:
            if self.fallback:
                raise Leak(f"{code} raised {refused!r} despite its fallback") from refused
            return f"{code}  # BreakerOpen({refused.reason!r}, retry_after={refused.retry_after})"
        except (Boom, Ignored) as exc:
            if type(exc) is not own:
                raise Leak(f"{code} raised another call's exception {exc!r}") from exc
            return f"{code}  # raised its own {type(exc).__name__}"
        if result not in ("ok", FALLBACK) or (result == "ok" and own is not None):
            raise Leak(f"{code} returned {result!r}")
        return f"{code}  # {result!r}"


@dataclass(frozen=True)
class With(Step):
    i: int
    outcome: str
    duration_ms: int

    def run(self, run: Run) -> str:
        n, own = run.index(self.i), OWN[self.outcome]
        code = f"with b{n}: <{self.outcome} in {self.duration_ms} ms>"
        protected = _protected(run, self.outcome, self.duration_ms)
        try:
            with run.breaker[n]:
                protected()
        except BreakerOpen as refused:
            return f"{code}  # BreakerOpen({refused.reason!r})"
        except (Boom, Ignored) as exc:
            if type(exc) is not own:
                raise Leak(f"{code} raised another exception {exc!r}") from exc
            return f"{code}  # raised its own {type(exc).__name__}"
        return f"{code}  # ok"


@dataclass(frozen=True)
class Acquire(Step):
    """Take a permit and hold it (settled by a later Settle, or never: a worker that died)."""

    i: int

    def run(self, run: Run) -> str:
        n = run.index(self.i)
        try:
            permit = run.breaker[n].acquire()
        except BreakerOpen as refused:
            return f"b{n}.acquire()  # BreakerOpen({refused.reason!r})"
        run.held.append((n, permit))
        return f"p{len(run.held) - 1} = b{n}.acquire()  # epoch {permit.epoch}, lease {permit.lease!r}"


@dataclass(frozen=True)
class Settle(Step):
    j: int
    outcome: str
    after_ms: int

    def run(self, run: Run) -> str:
        if not run.held:
            return "# (no permit held)"
        j = self.j % len(run.held)
        _, permit = run.held[j]
        run.clock.advance(self.after_ms)
        permit.record(self.outcome)
        return f"clock.advance({self.after_ms}); p{j}.record({self.outcome!r})"


@dataclass(frozen=True)
class Snapshot(Step):
    i: int

    def run(self, run: Run) -> str:
        n = run.index(self.i)
        snap = run.breaker[n].snapshot()
        keep = ("state", "forced", "epoch", "window_calls", "window_failures", "consecutive_failures")
        return f"b{n}.snapshot()  # {', '.join(f'{k}={snap[k]!r}' for k in keep)}"


@dataclass(frozen=True)
class StateOf(Step):
    i: int

    def run(self, run: Run) -> str:
        n = run.index(self.i)
        return f"b{n}.state  # {run.breaker[n].state.value}"


@dataclass(frozen=True)
class Admin(Step):
    i: int
    op: str

    def run(self, run: Run) -> str:
        n = run.index(self.i)
        getattr(run.breaker[n], self.op)()
        return f"b{n}.{self.op}()"


@dataclass(frozen=True)
class Configure(Step):
    """configure() validates: a ValueError naming the field is its answer to a bad value."""

    i: int
    field: str
    value: str | None

    def run(self, run: Run) -> str:
        n = run.index(self.i)
        code = f"breakers.configure({run.names[n]!r}, {self.field}={self.value!r})"
        try:
            run.breakers.configure(run.names[n], **{self.field: self.value})
        except ValueError as refused:
            named = re.match(r"BreakerConfig\.(\w+) ", str(refused))
            if named is None or named.group(1) not in LUA_FIELDS:
                raise Leak(f"{code} raised a ValueError that does not name a field: {refused}") from refused
            return f"{code}  # ValueError: {refused}"
        return code


@dataclass(frozen=True)
class Advance(Step):
    ms: int

    def run(self, run: Run) -> str:
        run.clock.advance(self.ms)
        return f"clock.advance({self.ms})"


@dataclass(frozen=True)
class AdvanceBy(Step):
    """Advance by a multiple of one breaker's window, bucket, open period or probe timeout."""

    i: int
    basis: str
    factor: float

    def run(self, run: Run) -> str:
        c = run.lua[run.index(self.i)]
        basis = {
            "window": c["bucket_ms"] * c["buckets"],
            "bucket": c["bucket_ms"],
            "open": c["open_ms"],
            "max_open": c["max_open_ms"],
            "probe": c["probe_ms"],
        }[self.basis]
        ms = round(basis * self.factor)
        run.clock.advance(ms)
        return f"clock.advance({ms})  # {self.factor} x b{run.index(self.i)}'s {self.basis}"


@dataclass(frozen=True)
class HashSet(Step):
    i: int
    key: str
    field: str | Bucket
    value: str | bytes | Tweak

    def run(self, run: Run) -> str:
        key = run.key(self.i, self.key)
        field: str | bytes = self.field if isinstance(self.field, str) else self._bucket(run, key, self.field)
        value = self.value
        if isinstance(value, Tweak):
            value = value.apply(run.read("HGET", key, field))
        return run.redis("HSET", key, field, value)

    def _bucket(self, run: Run, key: bytes, bucket: Bucket) -> bytes:
        fields = sorted(f for f in run.read("HKEYS", key) or [] if re.fullmatch(rb"[cfs]-?\d+", f))
        if fields:
            return bytes(fields[bucket.k % len(fields)])
        c = run.lua[run.index(self.i)]
        return f"{'cfs'[bucket.k % 3]}{run.clock.now // c['bucket_ms']}".encode()


@dataclass(frozen=True)
class HashEdits(Step):
    """Several fields of one hash set (or, with None, deleted) at once."""

    i: int
    key: str
    edits: tuple[tuple[str | Bucket, str | bytes | Tweak | None], ...]

    def run(self, run: Run) -> str:
        done = []
        for field, value in self.edits:
            if value is None:
                if isinstance(field, str):
                    done.append(HashDel(self.i, self.key, field).run(run))
            else:
                done.append(HashSet(self.i, self.key, field, value).run(run))
        return "; ".join(done)


@dataclass(frozen=True)
class HashDel(Step):
    i: int
    key: str
    field: str

    def run(self, run: Run) -> str:
        return run.redis("HDEL", run.key(self.i, self.key), self.field)


@dataclass(frozen=True)
class LeaseAdd(Step):
    """A forged lease: the member may hold the current epoch; the score is relative to now."""

    i: int
    member: str | bytes
    score: str | int

    def run(self, run: Run) -> str:
        epoch = run.read("HGET", run.key(self.i, "state"), "epoch") or b"0"
        member = self.member
        if isinstance(member, str):
            member = member.replace("{epoch}", epoch.decode("utf-8", "replace"))
        score = self.score if isinstance(self.score, str) else run.clock.now + self.score
        return run.redis("ZADD", run.key(self.i, "leases"), score, member)


@dataclass(frozen=True)
class ReporterEntry(Step):
    """A reporters-hash entry (lua/_lib.lua "One sick host") written by hand: a well-formed one
    starting now (9 numbers: isolated; 6: failing) with the number at ``position`` replaced."""

    field: str
    length: int
    position: int
    value: str

    def run(self, run: Run) -> str:
        numbers = [str(run.clock.now), "0", "5", "5", "5", "1", "1000", "1000", "0"][: self.length]
        numbers[self.position] = self.value
        return run.redis("HSET", run.key(0, "reporters"), self.field, " ".join(numbers))


@dataclass(frozen=True)
class EventAdd(Step):
    i: int
    line: str | bytes

    def run(self, run: Run) -> str:
        return run.redis("LPUSH", run.key(self.i, "events"), self.line)


@dataclass(frozen=True)
class StringSet(Step):
    i: int
    key: str  # cfg, or the global health key
    value: str | bytes

    def run(self, run: Run) -> str:
        return run.redis("SET", run.key(self.i, self.key), self.value)


@dataclass(frozen=True)
class NamesAdd(Step):
    member: str | bytes

    def run(self, run: Run) -> str:
        return run.redis("SADD", run.key(0, "names"), self.member)


@dataclass(frozen=True)
class Retype(Step):
    """Replace a key by one of another type (or a hash of garbage)."""

    i: int
    key: str
    kind: str

    def run(self, run: Run) -> str:
        key = run.key(self.i, self.key)
        make: tuple[object, ...] = {
            "string": ("SET", key, "garbage"),
            "list": ("RPUSH", key, "garbage"),
            "set": ("SADD", key, "garbage"),
            "zset": ("ZADD", key, 1, "garbage"),
            "hash": ("HSET", key, "garbage", "1"),
            "stream": ("XADD", key, "*", "garbage", "1"),
        }[self.kind]
        return run.redis("DEL", key) + "; " + run.redis(*make)


@dataclass(frozen=True)
class Delete(Step):
    i: int
    key: str

    def run(self, run: Run) -> str:
        return run.redis("DEL", run.key(self.i, self.key))


_I = st.integers(0, 2)
OUTCOMES = st.sampled_from(list(OWN))
DURATIONS = st.one_of(st.just(0), st.integers(0, 100), st.sampled_from([999, 1000, 3_600_000]))
MS = st.one_of(
    st.integers(0, 2000),
    st.sampled_from([-1, -1000, -60_000, 59_999, 60_000, 86_400_000, 86_400_001, 604_800_000, 10**12]),
    st.integers(-(10**6), 10**10),
)
FACTORS = st.one_of(st.sampled_from([0.5, 0.75, 0.9, 0.99, 0.999, 1.0, 1.001, 2.0]), st.floats(0, 3))
CONFIG_VALUES = st.one_of(
    st.none(),
    st.sampled_from(
        ["1", "2", "0.5", "10", "600", "86400", "observe", "enforce", "count", "rate", "consecutive", "off"]
    ),
    st.integers(1, 5).map(str),
)
API_STEPS: st.SearchStrategy[Step] = st.one_of(
    st.builds(Call, _I, OUTCOMES, DURATIONS, st.booleans()),
    st.builds(With, _I, OUTCOMES, DURATIONS),
    st.builds(Acquire, _I),
    st.builds(Settle, st.integers(0, 7), OUTCOMES, DURATIONS),
    st.builds(Snapshot, _I),
    st.builds(StateOf, _I),
    st.builds(Admin, _I, st.sampled_from(["force_open", "force_closed", "clear_force", "reset"])),
    st.builds(Configure, _I, st.sampled_from(LUA_FIELDS), CONFIG_VALUES),
)
TIME_STEPS: st.SearchStrategy[Step] = st.one_of(
    st.builds(Advance, MS),
    st.builds(
        AdvanceBy, _I, st.sampled_from(["window", "window", "bucket", "open", "max_open", "probe"]), FACTORS
    ),
)


def _corrupt(key: str, *specific: st.SearchStrategy[Step]) -> st.SearchStrategy[Step]:
    """Corruptions of one key: mostly its own kinds; or the key replaced by another type, or deleted."""
    gone = st.one_of(
        st.builds(Retype, _I, st.just(key), st.sampled_from(KINDS)), st.builds(Delete, _I, st.just(key))
    )
    return st.sampled_from([*specific, *specific, *specific, gone]).flatmap(lambda chosen: chosen)


def _scramble(fields: Sequence[str | Bucket]) -> st.SearchStrategy[tuple[tuple[str | Bucket, Any], ...]]:
    """Each field kept (mostly), deleted (None) or set, on its own: one step may break any combination."""
    action = st.tuples(st.integers(0, 7), VALUES)  # 0-5: keep, 6: delete, 7: set
    return st.tuples(*[action for _ in fields]).map(
        lambda actions: tuple(
            (field, None if how == 6 else value)
            for field, (how, value) in zip(fields, actions, strict=True)
            if how > 5
        )
    )


def _hash(key: str) -> st.SearchStrategy[Step]:
    known: list[str | Bucket] = [*DEL_FIELDS[key]]
    if key == "window":
        known += [Bucket(0), Bucket(1), Bucket(2)]
    return _corrupt(
        key,
        st.builds(HashSet, _I, st.just(key), HASH_FIELDS[key], VALUES),
        st.builds(HashDel, _I, st.just(key), st.sampled_from(DEL_FIELDS[key])),
        st.builds(HashEdits, _I, st.just(key), _scramble(known)),
    )


# every key of a breaker gets an equal share (the live config twice), then the global keys
CORRUPTIONS: st.SearchStrategy[Step] = st.one_of(
    _hash("state"),
    _hash("window"),
    _hash("stats"),
    _hash("config"),
    st.builds(HashSet, _I, st.just("config"), st.sampled_from(LUA_FIELDS), GARBAGE),  # live values by hand
    _corrupt("leases", st.builds(LeaseAdd, _I, LEASE_MEMBERS, LEASE_SCORES)),
    _corrupt("events", st.builds(EventAdd, _I, EVENT_LINES)),
    _corrupt("cfg", st.builds(StringSet, _I, st.just("cfg"), GARBAGE)),
    _corrupt("names", st.builds(NamesAdd, GARBAGE)),
    _corrupt("health", st.builds(StringSet, _I, st.just("health"), GARBAGE)),
)
# An example: calls that give the breakers some state (closed with counts, open, half-open...),
# then corruptions, then calls, time steps and more corruptions mixed.
STEPS = st.tuples(
    st.lists(st.one_of(API_STEPS, TIME_STEPS), min_size=1, max_size=10),
    st.lists(CORRUPTIONS, min_size=1, max_size=4),
    st.lists(st.one_of(API_STEPS, API_STEPS, TIME_STEPS, CORRUPTIONS), min_size=1, max_size=16),
).map(lambda parts: [step for part in parts for step in part])

# -- the server, the slow log, MONITOR ------------------------------------------------------------


class FuzzRedis:
    """The session's redis-server: an admin connection (corruptions, checks) and the breakers' client."""

    def __init__(self, port: int, admin: redis.Redis, client: redis.Redis, scripts: dict[str, str]) -> None:
        self.port, self.admin, self.client = port, admin, client
        self.scripts = scripts  # sha1 -> operation, to name a script in the slow log

    def __repr__(self) -> str:
        return f"<redis-server on port {self.port}>"


@pytest.fixture(scope="module")
def fuzz_redis(redis_server: RedisServer) -> Iterator[FuzzRedis]:
    """The session's redis-server, its slow log set to 1 ms for this module (restored after), the
    scripts and the functions library loaded (a first call's load is not a script run)."""
    admin = redis_server.client(protocol=2)
    client = redis_server.client()
    before = str(next(iter(admin.config_get("slowlog-log-slower-than").values())))
    admin.config_set("slowlog-log-slower-than", SLOW_US)
    scripts = {}
    for op in OPERATIONS:
        source = script_source(op)
        admin.script_load(source)
        scripts[hashlib.sha1(source.encode()).hexdigest()] = f"{op}.lua"
    lib, functions = library()
    admin.function_load(lib, replace=True)
    scripts.update({function: f"{op}.lua" for op, function in functions.items()})
    try:
        yield FuzzRedis(redis_server.port, admin, client, scripts)
    finally:
        admin.config_set("slowlog-log-slower-than", before)
        client.close()
        admin.close()


class LogRecords(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def run_example(
    env: FuzzRedis,
    prefix: str,
    specs: list[tuple[str, dict[str, Any]]],
    steps: Sequence[Step],
    monitor: MonitorTap | None = None,
    say: Callable[[str], None] = note,
) -> None:
    """Play the example and check it; a run with a slow command is played again (see SLOW_REPLAYS).

    With ``monitor``, only the keys are judged: a step that raises is noted and the example goes
    on (the test without MONITOR judges the calls), so one bug does not hide another."""
    runs = [_play(env, prefix, specs, steps, monitor, say)]
    # each slow run is judged against the reference measured right after it: a load that
    # comes and goes slows a run and its own reference alike
    references = [_reference_us(env)] if runs[-1] else []
    while monitor is None and runs[-1] and len(runs) <= SLOW_REPLAYS:
        runs.append(_play(env, prefix, specs, steps, None, _quiet))
        if runs[-1]:
            references.append(_reference_us(env))
    if all(runs):
        report = "\n".join(f"run {n + 1}:\n" + "\n".join(slow) for n, slow in enumerate(runs))
        reference = max(references)
        beyond = [
            max(_duration(line) for line in slow) / (REFERENCE_FACTOR * ref)
            for slow, ref in zip(runs, references, strict=True)
        ]
        if min(beyond) > 1 and _same_command(runs):
            raise AssertionError(
                f"commands slower than {SLOW_US} us in every run of this example, and "
                f"slower than {REFERENCE_FACTOR}x the reference workload measured after "
                f"each ({', '.join(map(str, references))} us):\n{report}"
            )
        warnings.warn(
            SlowOnce(
                f"commands slower than {SLOW_US} us in every run, but a different command in "
                f"each run, or within {REFERENCE_FACTOR}x the reference workload measured "
                f"meanwhile ({reference} us: the machine is slow now): {runs[-1]}"
            ),
            stacklevel=1,
        )
        return
    if runs[0]:
        warnings.warn(
            SlowOnce(
                f"a command was slower than {SLOW_US} us once, not again in a replay "
                f"(the machine was busy?): {runs[0]}"
            ),
            stacklevel=1,
        )


class SlowOnce(UserWarning):
    """A command was slow in one run of an example and not in its replay."""


def _quiet(_: str) -> None:
    pass


def _play(
    env: FuzzRedis,
    prefix: str,
    specs: list[tuple[str, dict[str, Any]]],
    steps: Sequence[Step],
    monitor: MonitorTap | None,
    say: Callable[[str], None],
) -> list[str]:
    """One run of an example from an empty Redis: every check but the slow log's, which it returns
    (the commands slower than SLOW_US, described)."""
    admin = env.admin
    admin.flushall()
    if monitor is not None:
        monitor.lines(admin)  # what an earlier (failed) example left behind
    admin.slowlog_reset()
    records = LogRecords()
    log.addHandler(records)
    log.propagate = False  # the notes carry each example's log lines; pytest's capture would pile up all
    run: Run | None = None
    try:
        run = Run(env, prefix, specs, say)
        for number, step in enumerate(steps):
            seen = len(records.records)
            try:
                say(step.run(run))
            except Exception as exc:
                if monitor is not None:
                    say(f"{step!r}  # raised {type(exc).__name__}: {exc} (not judged here)")
                    continue
                if isinstance(exc, Leak):
                    raise
                raise Leak(
                    f"step {number} {step!r} raised {type(exc).__name__}: {exc} (only BreakerOpen "
                    "or the protected call's own exception may reach the caller)"
                ) from exc
            for record in records.records[seen:]:
                say(f"#   logged: {record.getMessage()}")
            if monitor is None:
                _assert_on_redis(run, records.records[seen:], number, step)
    finally:
        log.removeHandler(records)
        log.propagate = True
        if run is not None:
            run.breakers.close()
    assert run is not None
    slow = _slow_commands(env)
    _assert_only_own_keys(env, prefix, run.names)
    if monitor is not None:
        problems = check_commands(monitor.lines(admin), prefix, run.names, admin, monitor.script_first)
        assert not problems, "commands outside the breakers' keys:\n" + "\n".join(problems)
    return slow


def _assert_on_redis(run: Run, records: list[logging.LogRecord], number: int, step: Step) -> None:
    """No script failed behind the caller's back: a failed script (an error reply other than the
    WRONGTYPE the gate repairs) switches the gate to the local store, which the caller never sees."""
    errors = [r.getMessage() for r in records if r.levelno >= logging.ERROR]
    assert not errors, f"step {number} {step!r} logged errors: {errors}"
    if not run.breakers.gate.healthy:
        said = [r.getMessage() for r in records]
        raise AssertionError(
            f"after step {number} {step!r} the breakers left Redis for the local store "
            f"(a script failed): {said}"
        )


# The 1 ms bound is for a quiet machine. On a slow one (a busy 2-core machine, a noisy virtual
# one: the same script has taken 0.26 ms and 1.2 ms on the project's machine at different
# hours) a command slow in every replay is compared with a reference workload of about the
# same size as the costliest legitimate script (the largest window slide: a 300-field hash
# written, read three times, dropped), run right then: a script slowed by its data stays
# slow against it, one slowed by the machine does not.
REFERENCE_FACTOR = 2
_REFERENCE = """
local f = {}
for i = 1, 300 do f[#f + 1] = 'f' .. i; f[#f + 1] = i end
redis.call('HSET', KEYS[1], unpack(f))
for i = 1, 3 do redis.call('HGETALL', KEYS[1]) end
redis.call('DEL', KEYS[1])
return 1
"""


def _reference_us(env: FuzzRedis) -> int:
    """The median server time of the reference workload, µs (SLOWLOG, every command logged)."""
    admin = env.admin
    admin.config_set("slowlog-log-slower-than", 0)
    try:
        admin.slowlog_reset()
        for _ in range(7):
            admin.eval(_REFERENCE, 1, "reference:{fuzz}")
        durations = sorted(
            int(entry["duration"])
            for entry in admin.slowlog_get(128)
            if bytes(entry["command"]).upper().startswith(b"EVAL")
        )
    finally:
        admin.config_set("slowlog-log-slower-than", SLOW_US)
        admin.slowlog_reset()
    return durations[len(durations) // 2]


def _duration(line: str) -> int:
    return int(line.split()[0])


def _slow_commands(env: FuzzRedis) -> list[str]:
    lines = []
    for entry in env.admin.slowlog_get(128):
        command = entry["command"] if isinstance(entry["command"], bytes) else b""
        words = command.split(b" ")
        what = env.scripts.get(words[1].decode("ascii", "replace"), "") if len(words) > 1 else ""
        # the script's now_ms (ARGV 3, the first 13-digit word after the keys): with the
        # clock driven, a replay sends each command at the same now_ms (_same_command)
        now = next((w.decode() for w in words[3:] if len(w) == 13 and w.isdigit()), "")
        lines.append(f"  {entry['duration']} us  {what} @{now}  {command[:300]!r}")
    return lines


def _same_command(runs: list[list[str]]) -> bool:
    """Whether one command (a script at one now_ms) was slow in every run. A command slowed by
    its data is slow again in each replay, which sends it with the same data at the same
    now_ms; a busy machine's stall lands on whichever command runs then, a different one in
    each replay."""

    def commands(slow: list[str]) -> set[str]:
        return {" ".join(line.split()[2:4]) for line in slow}

    return bool(set.intersection(*(commands(slow) for slow in runs)))


def allowed_keys(prefix: str, names: Sequence[str]) -> set[bytes]:
    keys = {f"{prefix}:{suffix}".encode() for suffix in GLOBAL_SUFFIXES}
    for name in names:
        keys.update(k.encode() for k in [*breaker_keys(prefix, name), *undeclared_keys(prefix, name)])
    return keys


def _assert_only_own_keys(env: FuzzRedis, prefix: str, names: Sequence[str]) -> None:
    found = set(env.admin.scan_iter(count=1000))
    stray = found - allowed_keys(prefix, names)
    assert not stray, f"keys outside the breakers' tags and the global keys: {sorted(stray)}"


_MONITOR_LINE = re.compile(rb"\d+\.\d+ \[\d+ ([^\]]*)\] (.*)", re.S)
_ESCAPES = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("a"): b"\a", ord("b"): b"\b"}


def parse_monitor_line(line: bytes) -> tuple[str, list[bytes]]:
    """(client: 'lua' for a command a script ran, else its address; the arguments), undoing
    Redis's quoting (sdscatrepr: \\\\, \\", \\n, \\r, \\t, \\a, \\b, \\xHH)."""
    match = _MONITOR_LINE.fullmatch(line)
    assert match is not None, line
    client, rest = match.group(1).decode(), match.group(2)
    args, pos = [], 0
    while pos < len(rest):
        if rest[pos] == ord(" "):
            pos += 1
            continue
        assert rest[pos] == ord('"'), line
        pos += 1
        arg = bytearray()
        while rest[pos] != ord('"'):
            if rest[pos] == ord("\\"):
                escaped = rest[pos + 1]
                if escaped == ord("x"):
                    arg.append(int(rest[pos + 2 : pos + 4], 16))
                    pos += 4
                    continue
                arg += _ESCAPES.get(escaped, bytes([escaped]))
                pos += 2
                continue
            arg.append(rest[pos])
            pos += 1
        args.append(bytes(arg))
        pos += 1
    return client, args


class MonitorTap:
    """A MONITOR connection, read up to a marker the admin connection sends."""

    def __init__(self, port: int, admin: redis.Redis) -> None:
        connection_class: Any = redis.Connection  # redis-py's Connection is not typed
        self.connection: Any = connection_class(host="127.0.0.1", port=port, socket_timeout=10, protocol=2)
        self.connection.connect()
        self.connection.send_command("MONITOR")
        assert self.connection.read_response() in (b"OK", "OK")
        # Does a script's own line come before the commands it runs (Redis 7.0), or after?
        admin.eval("return redis.call('EXISTS', KEYS[1])", 1, "fuzz-calibration")
        order = [client == "lua" for client, _ in self.lines(admin)]
        assert order in ([False, True], [True, False]), order
        self.script_first = order == [False, True]

    def lines(self, admin: redis.Redis) -> list[tuple[str, list[bytes]]]:
        marker = f"fuzz-marker-{uuid.uuid4().hex}".encode()
        admin.echo(marker)
        out: list[tuple[str, list[bytes]]] = []
        while True:
            raw = self.connection.read_response()
            client, args = parse_monitor_line(raw if isinstance(raw, bytes) else str(raw).encode())
            if args == [b"ECHO", marker]:
                return out
            out.append((client, args))

    def close(self) -> None:
        self.connection.disconnect()

    def __repr__(self) -> str:
        return "<MONITOR>"


_FIRST_KEY = {
    b"HMGET",
    b"HGETALL",
    b"HSET",
    b"HDEL",
    b"HINCRBY",
    b"HGET",
    b"HLEN",
    b"HKEYS",
    b"PEXPIRE",
    b"LPUSH",
    b"LTRIM",
    b"LRANGE",
    b"LINDEX",
    b"LLEN",
    b"EXPIRE",
    b"PTTL",
    b"ZADD",
    b"ZREM",
    b"ZRANGE",
    b"ZRANGEBYSCORE",
    b"ZREMRANGEBYSCORE",
    b"ZSCORE",
    b"ZCARD",
    b"XADD",
    b"XRANGE",
    b"XREVRANGE",
    b"XLEN",
    b"SET",
    b"GET",
    b"SADD",
    b"SMEMBERS",
    b"RPUSH",
    b"TYPE",
    b"PERSIST",
    b"SRANDMEMBER",
    b"SREM",
}
_ALL_KEYS = {b"DEL", b"UNLINK", b"EXISTS"}
_NO_KEYS = {
    b"TIME",
    b"PING",
    b"ECHO",
    b"PUBLISH",
    b"FLUSHALL",
    b"SCAN",
    b"HELLO",
    b"CLIENT",
    b"SELECT",
    b"INFO",
    b"SCRIPT",
    b"COMMAND",
    b"FUNCTION",
}
_SCRIPTS = {b"EVAL", b"EVALSHA", b"FCALL"}  # name or body or sha, numkeys, keys, ARGV
# lua/sweep.lua as FCALL, EVALSHA and EVAL name it
_SWEEP_SCRIPTS = {
    library()[1]["sweep"].encode(),
    hashlib.sha1(script_source("sweep").encode()).hexdigest().encode(),
    script_source("sweep").encode(),
}


def command_keys(args: list[bytes], admin: redis.Redis) -> list[bytes]:
    command = args[0].upper()
    if command in _FIRST_KEY:
        return args[1:2]
    if command in _ALL_KEYS:
        return args[1:]
    if command in _NO_KEYS:
        return []
    if command in _SCRIPTS:
        return args[3 : 3 + int(args[2])]
    try:  # any other command: ask Redis where its keys are
        return list(execute(admin, "COMMAND", "GETKEYS", *args))
    except redis.ResponseError:
        return []


def check_commands(
    lines: list[tuple[str, list[bytes]]],
    prefix: str,
    names: Sequence[str],
    admin: redis.Redis,
    script_first: bool,
) -> list[str]:
    """Every script declares the seven keys of the name it is given and touches only those; every
    other command touches only the keys of the names in use and the global keys."""
    allowed = allowed_keys(prefix, names)
    channels = (f"{prefix}:events".encode(), f"{prefix}:notices:0".encode())  # everyone's, the workers'

    health = f"{prefix}:health".encode()
    problems: list[str] = []
    scripts: list[tuple[list[bytes], list[list[bytes]]]] = []
    current: list[list[bytes]] | None = None  # the commands of the script whose line came last
    pending: list[list[bytes]] = []  # a script's commands, when they come before its own line
    for client, args in lines:
        if client == "lua":
            if not script_first:
                pending.append(args)
            elif current is None:
                problems.append(f"a script command with no script: {args!r}")
            else:
                current.append(args)
            continue
        if args[0].upper() in _SCRIPTS:
            if script_first:
                current = []
                scripts.append((args, current))
            else:
                scripts.append((args, pending))
                pending = []
            continue
        current = None
        if pending:
            problems.append(f"script commands with no script: {pending!r}")
            pending = []
        stray = [k for k in command_keys(args, admin) if k not in allowed]
        if stray:
            problems.append(f"{args[:6]!r} touches {stray!r}")
    for script, inner in scripts:
        keys = command_keys(script, admin)
        argv = script[3 + len(keys) :]
        label = f"script {script[1][:12].decode('ascii', 'replace')}"
        if keys != [health]:  # [health]: the store gate's probe (store.py), which writes that key
            name = argv[0].decode("utf-8", "replace") if argv else ""
            own = [k.encode() for k in breaker_keys(prefix, name)]
            swept = script[1] in _SWEEP_SCRIPTS  # any name of the names set, whose keys it may delete
            if (name not in names and not swept) or keys != own:
                problems.append(f"{label} declares {keys!r}, not the seven keys of its name {name!r}")
            if argv[1:2] != [channels[0] + b" 0"]:  # and database 0's number (lua/_lib.lua ARGV 2)
                problems.append(f"{label} was given the channel {argv[1:2]!r}")
        name_given = argv[0].decode("utf-8", "replace") if argv else ""
        touchable = {*keys, *(k.encode() for k in undeclared_keys(prefix, name_given) if keys != [health])}
        for args in inner:
            stray = [k for k in command_keys(args, admin) if k not in touchable]
            if stray:
                problems.append(f"{label}: {args[:6]!r} touches undeclared {stray!r}")
            if args[0].upper() == b"PUBLISH" and args[1] not in channels:
                problems.append(f"{label} published on {args[1]!r}")
    return problems


# -- 1. names ---------------------------------------------------------------------------------------


@fuzz_settings(300)
@given(name=st.one_of(NAMES, REFUSED_NAMES, st.text(max_size=30), NOT_STR))
def test_names_are_accepted_or_refused_by_name(fuzz_redis: FuzzRedis, name: object) -> None:
    admin = fuzz_redis.admin
    admin.flushall()
    breakers = Breakers(fuzz_redis.client, "fz", clock=Clock(), listen=False)
    try:
        problems = name_problems(name)
        if not problems:
            assert isinstance(name, str)
            breaker = breakers.get(name)
            breaker.call(lambda: None)
            assert breaker.snapshot()["calls"] == 1
            assert set(admin.scan_iter()) <= allowed_keys("fz", [name])
            return
        anything: Any = name  # not always a str: that is the point
        for attempt in (
            lambda: breakers.get(anything),
            lambda: breakers.configure(anything, failure_threshold=3),
        ):
            with pytest.raises((TypeError, ValueError)) as refused:
                attempt()
            assert refused.type is (ValueError if isinstance(name, str) else TypeError), refused.value
            message = str(refused.value)
            assert any(all(f in message for f in fragments) for fragments in problems), (message, problems)
        assert list(admin.scan_iter()) == [], "a refused name wrote to Redis"
    finally:
        breakers.close()


# -- 2-4. hostile data, then calls -------------------------------------------------------------------


@fuzz_settings(400)
@given(prefix=PREFIXES, specs=SPECS, steps=STEPS)
def test_calls_survive_hostile_data_fast_and_within_their_keys(
    fuzz_redis: FuzzRedis, prefix: str, specs: list[tuple[str, dict[str, Any]]], steps: list[Step]
) -> None:
    run_example(fuzz_redis, prefix, specs, steps)


@pytest.fixture
def monitor(fuzz_redis: FuzzRedis) -> Iterator[MonitorTap]:
    tap = MonitorTap(fuzz_redis.port, fuzz_redis.admin)
    yield tap
    tap.close()


@fuzz_settings(100)
@given(prefix=PREFIXES, specs=SPECS, steps=STEPS)
def test_scripts_touch_only_the_keys_of_their_own_name(
    fuzz_redis: FuzzRedis,
    monitor: MonitorTap,
    prefix: str,
    specs: list[tuple[str, dict[str, Any]]],
    steps: list[Step],
) -> None:
    """The same kind of examples, watched with MONITOR. Only the keys are judged here: the calls and
    the slow log are the test above's (MONITOR slows Redis down a little)."""
    fuzz_redis.admin.config_set("slowlog-log-slower-than", -1)
    try:
        run_example(fuzz_redis, prefix, specs, steps, monitor)
    finally:
        fuzz_redis.admin.config_set("slowlog-log-slower-than", SLOW_US)


# -- 2-4, every field of every key, one at a time --------------------------------------------------
#
# The fuzz above draws its corruptions at random; this sweep makes sure each key and each field the
# scripts read is broken on every run: one corruption at a time, after each of four prologues that
# leave the breaker closed with counts, open, half-open with a probe in flight, or with bulkhead
# slots taken (rate and slow-call rules), then the same calls as the fuzz (every script, every
# admin operation), with the same checks.

# per key: the values worth trying (None: the field deleted)
SWEEP_VALUES: dict[str, tuple[str | bytes | None, ...]] = {
    "state": (None, "abc", "inf", "-inf", "-1", "1.5", "9" * 25, b"\xff"),
    "window": (None, "abc", "inf", "-1", "1.5", "9" * 25, b"\xff"),
    "stats": (None, "abc", "1.5", "9" * 25),  # HINCRBY refuses the last three differently
    "config": ("abc", "1e999", "-1", "0.5", ""),
    "reporters": (
        None,
        "abc",
        "inf",
        "-1",
        "1.5",
        "9" * 25,
        b"\xff",
        "",
        "1 2",
        "1  2 3 4 5 6",
        "1 2 3 4 5 6 ",
    ),
}
# the reporters hash's fields: the examples' own reporter, another one, the shared run's number,
# the count of records
REPORTER_FIELDS = (REPORTER, "someone", " run", " n")
# each number of an entry, one at a time: beyond 2^53, large but below it, zero, negative
REPORTER_NUMBERS = ("9" * 23, str(10**15), "0", "-1")
_F, _S = "failure", "success"
PROLOGUES: dict[str, tuple[dict[str, Any], list[Step]]] = {
    "closed": (
        {"failure_threshold": 2, "open_seconds": 1.0, "half_open_successes": 2},
        [Call(0, _S, 0, False), Call(0, _F, 0, False)],
    ),
    "open": (
        {"failure_threshold": 2, "open_seconds": 1.0, "half_open_successes": 2},
        [Call(0, _F, 0, False), Call(0, _F, 0, False)],
    ),
    "half_open": (
        {"failure_threshold": 2, "open_seconds": 1.0, "half_open_successes": 2},
        [Call(0, _F, 0, False), Call(0, _F, 0, False), AdvanceBy(0, "open", 1.001), Acquire(0)],
    ),
    "bulkhead": (
        {
            "trip": "rate",
            "minimum_calls": 2,
            "slow_call_seconds": 0.001,
            "max_concurrent_calls": 2,
            "mode": "observe",
        },
        [Call(0, _S, 5, False), Acquire(0), Call(0, _F, 0, False)],
    ),
}
EPILOGUE: list[Step] = [
    Call(0, _F, 3, False),
    Settle(0, _S, 0),
    Snapshot(0),
    AdvanceBy(0, "max_open", 1.1),
    Call(0, _S, 0, True),
    Admin(0, "force_open"),
    Admin(0, "reset"),
    Configure(0, "failure_threshold", "3"),
    Call(0, _F, 0, False),
    Snapshot(0),
]


def sweep_corruptions(key: str) -> Iterator[Step]:
    if key in DEL_FIELDS:
        fields: list[str | Bucket] = [*DEL_FIELDS[key], *([Bucket(0)] if key == "window" else [])]
        for field in fields:
            for value in SWEEP_VALUES[key]:
                if value is None:
                    if isinstance(field, str):
                        yield HashDel(0, key, field)
                else:
                    yield HashSet(0, key, field, value)
    if key == "reporters":
        for field in REPORTER_FIELDS:
            for value in SWEEP_VALUES[key]:
                yield HashDel(0, key, field) if value is None else HashSet(0, key, field, value)
        for field, length in ((REPORTER, 9), (REPORTER, 6), ("someone", 9), ("someone", 6)):
            for position in range(length):
                for number in REPORTER_NUMBERS:
                    yield ReporterEntry(field, length, position, number)
    if key == "leases":
        for member in ("p:{epoch}:9999", "b:9999", "x"):
            for score in ("-inf", "+inf", -1, 10**6):
                yield LeaseAdd(0, member, score)
    if key == "events":
        yield from (EventAdd(0, line) for line in EVENT_LINES_SWEPT)
    if key in ("cfg", "health"):
        yield from (StringSet(0, key, value) for value in ("abc", "{}", b"\xff"))
    if key == "names":
        yield NamesAdd(b"\xff")
    for kind in KINDS:
        yield Retype(0, key, kind)
    yield Delete(0, key)


@pytest.mark.parametrize("key", [*KEY_SUFFIXES, *UNDECLARED_SUFFIXES, *GLOBAL_SUFFIXES])
def test_every_field_of_every_key_broken_one_at_a_time(fuzz_redis: FuzzRedis, key: str) -> None:
    """The reporters hash is broken under min_reporters=2 (with 1 no script reads it)."""
    failures: dict[str, list[str]] = {}  # per kind of failure: every corruption that fails so
    first: dict[str, str] = {}  # per kind of failure: the reproduction of its first case
    for prologue, (kw, steps) in PROLOGUES.items():
        if key == "reporters":
            kw = {**kw, "min_reporters": 2}
        for corruption in sweep_corruptions(key):
            lines: list[str] = []
            try:
                run_example(
                    fuzz_redis, "breaker", [("pay", kw)], [*steps, corruption, *EPILOGUE], say=lines.append
                )
            except Exception as exc:
                kind = re.sub(r"'[^']*'|\b\d+\b", "_", f"{type(exc).__name__}: {exc}".split("\n")[0])[:160]
                failures.setdefault(kind, []).append(f"{prologue}: {corruption!r}")
                first.setdefault(
                    kind,
                    f"{type(exc).__name__}: {exc}\n  prologue {prologue!r}:\n    " + "\n    ".join(lines),
                )
    report = [
        f"{len(cases)} corruptions fail with {kind}\n  e.g. {first[kind]}\n  all: {'; '.join(cases)}"
        for kind, cases in failures.items()
    ]
    if failures:  # raised, not asserted: pytest would print the dict again
        raise AssertionError(f"corruptions of {key!r} that break a call:\n\n" + "\n\n".join(report))


# -- 3, the worst case the bounds allow ---------------------------------------------------------------
#
# window_buckets is capped (BOUNDS, 100) so that a call's work is bounded (docs/decisions.md, "Live
# config"). With every bucket full, a slide reads and drops the buckets that leave by name up to two
# thirds of the window, and beyond that rebuilds the hash from those that stay (lua/_lib.lua
# window_read): the costliest slides are around that crossover and at either end. snapshot.lua reads
# the same way and writes nothing, so every snapshot pays again. The fuzz draws these cases only
# rarely; here they run every time.

MAX_BUCKETS = int(BOUNDS["window_buckets"][2])


@pytest.mark.parametrize("slide", [1, 2, 33, 66, 67, 98, 99])  # buckets that slide out at once
@pytest.mark.parametrize("window_seconds", [100.0, 0.1])  # buckets of 1 s, and of 1 ms
def test_the_largest_window_slide_the_bounds_allow(
    fuzz_redis: FuzzRedis, window_seconds: float, slide: int
) -> None:
    fill: list[Step] = []
    for _ in range(MAX_BUCKETS):  # a failure in every bucket of the window
        fill += [Call(0, _F, 0, False), AdvanceBy(0, "bucket", 1)]
    lines: list[str] = []
    try:
        run_example(
            fuzz_redis,
            "breaker",
            [
                (
                    "pay",
                    {
                        "trip": "count",
                        "failure_threshold": 1_000_000,
                        "window_seconds": window_seconds,
                        "window_buckets": MAX_BUCKETS,
                    },
                )
            ],
            [
                *fill,
                AdvanceBy(0, "bucket", slide - 1),
                Snapshot(0),
                Snapshot(0),
                Call(0, _S, 0, False),
                Snapshot(0),
            ],
            say=lines.append,
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nreproduction:\n  " + "\n  ".join(lines)[-3000:]) from None


# -- 5. nothing read from Redis is unpickled or evaluated ----------------------------------------------

_UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "jsonpickle"}
_UNSAFE_BUILTINS = {"eval", "exec"}
_YAML_LOADERS = {"load", "load_all", "unsafe_load", "unsafe_load_all", "full_load", "full_load_all"}


def unsafe_python(source: str, filename: str) -> list[str]:
    """'file:line: what' for each import of a deserializer that runs code, each reference to
    eval/exec, and each yaml loader that is not safe_load."""
    found: list[str] = []
    yaml_names = {"yaml"}
    tree = ast.parse(source, filename)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in _UNSAFE_MODULES:
                    found.append(f"{filename}:{node.lineno}: import {alias.name}")
                if alias.name == "yaml":
                    yaml_names.add(alias.asname or "yaml")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            imported = {alias.name for alias in node.names}
            if module.split(".")[0] in _UNSAFE_MODULES:
                found.append(f"{filename}:{node.lineno}: from {module} import ...")
            elif module == "yaml" and imported & _YAML_LOADERS:
                loaders = ", ".join(sorted(imported & _YAML_LOADERS))
                found.append(f"{filename}:{node.lineno}: from yaml import {loaders}")
            elif module == "builtins" and imported & _UNSAFE_BUILTINS:
                found.append(f"{filename}:{node.lineno}: from builtins import {', '.join(imported)}")
        elif isinstance(node, ast.Name) and node.id in _UNSAFE_BUILTINS:
            found.append(f"{filename}:{node.lineno}: {node.id}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner = node.value.id
            unsafe_builtin = owner in ("builtins", "__builtins__") and node.attr in _UNSAFE_BUILTINS
            if unsafe_builtin or (owner in yaml_names and node.attr in _YAML_LOADERS):
                found.append(f"{filename}:{node.lineno}: {owner}.{node.attr}")
        elif isinstance(node, ast.Call):  # by a name in a string: __import__('pickle'), getattr(b, 'eval')
            callee = ast.unparse(node.func)
            texts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if callee in ("__import__", "importlib.import_module", "import_module") and any(
                t.split(".")[0] in _UNSAFE_MODULES for t in texts
            ):
                found.append(f"{filename}:{node.lineno}: {callee}({texts[0]!r})")
            if callee == "getattr" and set(texts) & _UNSAFE_BUILTINS:
                found.append(f"{filename}:{node.lineno}: getattr(..., {texts[0]!r})")
    return found


# Lua: the builtins that compile a string or a file into code, and the ways to reach them by a
# computed name (the global table, function environments)
_UNSAFE_LUA = re.compile(r"(?<![\w.:])(loadstring|load|dofile|loadfile|_G|getfenv|setfenv)(?!\w)")
_LUA_TOKENS = re.compile(
    r"--\[(?P<ceq>=*)\[.*?\](?P=ceq)\]"  # long comment
    r"|--[^\n]*"  # line comment
    r"|\[(?P<seq>=*)\[.*?\](?P=seq)\]"  # long string
    r"|'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"",  # quoted string
    re.S,
)


def unsafe_lua(source: str, filename: str) -> list[str]:
    """'file:line: what' for each use of a Lua builtin that turns data into code (comments and
    string literals are blanked first, keeping the line numbers)."""
    code = _LUA_TOKENS.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), source)
    found = []
    for number, line in enumerate(code.split("\n"), start=1):
        found += [f"{filename}:{number}: {m.group(1)}" for m in _UNSAFE_LUA.finditer(line)]
    return found


def _package_files() -> tuple[list[Path], list[Path]]:
    package = Path(breaker_redis.__file__).parent
    python = sorted(package.rglob("*.py"))
    lua = sorted({*package.glob("lua/**/*.lua"), *package.parent.glob("lua/**/*.lua")})
    return python, lua


def test_nothing_read_from_redis_is_unpickled_or_evaluated() -> None:
    python, lua = _package_files()
    assert len(python) > 10
    assert {p.name for p in lua} >= {"_lib.lua", "call.lua", *(f"{op}.lua" for op in OPERATIONS)}
    found = [hit for path in python for hit in unsafe_python(path.read_text("utf-8"), str(path))]
    found += [hit for path in lua for hit in unsafe_lua(path.read_text("utf-8"), str(path))]
    assert not found, "code that could run data read from Redis:\n" + "\n".join(found)


def test_the_static_scans_find_what_they_look_for() -> None:
    bad_python = "\n".join(
        [
            "import pickle",
            "import marshal as m",
            "from shelve import open",
            "eval(x)",
            "exec(x)",
            "f = eval",
            "builtins.eval(x)",
            "yaml.load(s)",
            "import yaml as y",
            "y.unsafe_load(s)",
            "from yaml import load",
            "__import__('pickle')",
            "getattr(builtins, 'exec')",
        ]
    )
    lines = sorted(int(hit.split(":")[1]) for hit in unsafe_python(bad_python, "bad.py"))
    assert lines == [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13]  # line 9, import yaml as y, is fine
    fine_python = "client.eval(script, 1, key)\nre.compile('x')\nyaml.safe_load(s)\njson.loads(s)\n"
    assert unsafe_python(fine_python, "fine.py") == []
    bad_lua = "loadstring(ARGV[1])()\nlocal f = load(x)\ndofile('x')\nlocal g = _G['load' .. 'string']\n"
    assert [hit.split(": ")[1] for hit in unsafe_lua(bad_lua, "bad.lua")] == [
        "loadstring",
        "load",
        "dofile",
        "_G",
    ]
    fine_lua = (
        "local s = load_state() -- loadstring(x) in a comment\nlocal t = 'load(x)'\n"
        "--[[ dofile ]] local u = cjson.decode(ARGV[5])\nlocal v = [[load(]]\n"
    )
    assert unsafe_lua(fine_lua, "fine.lua") == []


def test_a_slow_command_counts_only_when_the_same_one_is_slow_in_every_run():
    """The slow-log check's criterion (rule 3): the same script at the same now_ms in each
    replay is a slow path; a different command each time is the machine."""
    acquire = "  3434 us  acquire.lua @1700000000000  b'FCALL ...'"
    acquire_again = "  2858 us  acquire.lua @1700000000000  b'FCALL ...'"
    record = "  1499 us  record.lua @1700000330003  b'FCALL ...'"
    acquire_later = "  1600 us  acquire.lua @1700000330003  b'FCALL ...'"
    assert _same_command([[acquire, record], [record], [acquire_again, record]])
    assert not _same_command([[acquire], [record], [acquire_later]])
    assert _duration(acquire) == 3434
