"""BreakerConfig: what a breaker trips on and how it recovers.

The config is validated once, when it is built, so a typo in a deployment
fails at start-up with the field's name instead of at the first outage.
The Lua scripts receive it as one JSON argument (``to_lua``)
and merge live overrides from ``breaker:{NAME}:config`` on top; the strings
stored there are parsed by ``parse_overrides`` with the same rules.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

TRIPS = ("consecutive", "count", "rate")
MODES = ("enforce", "observe")

# The fields that can be overridden live (breaker:{NAME}:config); the
# scripts' prelude (lua/_lib.lua, OVERRIDES) maps each to its Lua name.
LUA_FIELDS = (
    "trip",
    "failure_threshold",
    "failure_rate",
    "minimum_calls",
    "slow_call_seconds",
    "slow_call_rate",
    "window_seconds",
    "window_buckets",
    "open_seconds",
    "open_backoff",
    "max_open_seconds",
    "half_open_max_calls",
    "half_open_successes",
    "probe_timeout_seconds",
    "max_concurrent_calls",
    "mode",
    "min_reporters",
)

ExceptionTypes = tuple[type[BaseException], ...]
Predicate = Callable[[BaseException], bool | None]

# The open period and its cap when neither is set. Whichever of the two is
# left unset follows the other (see BreakerConfig):
#   open_seconds     = min(30, max_open_seconds)
#   max_open_seconds = max(300, open_seconds)
OPEN_SECONDS = 30.0  # lua/_lib.lua (apply_overrides) applies the same two numbers
MAX_OPEN_SECONDS_FLOOR = 300.0


# BreakerConfig's bounds: (lowest, lowest excluded, highest, integer). The
# scripts apply the same to live values written to the config hash
# (lua/_lib.lua BOUNDS; tests/test_live_config.py keeps the two equal): they
# skip a value that is not a number, not an integer where one is due, or
# below the lowest; they clamp one above the highest.
BOUNDS: dict[str, tuple[float, bool, float, bool]] = {
    "failure_threshold": (1, False, 1_000_000, True),
    "failure_rate": (0, True, 1, False),
    "minimum_calls": (1, False, 1_000_000, True),
    "slow_call_seconds": (0, True, 3600, False),
    "slow_call_rate": (0, True, 1, False),
    "window_seconds": (0, True, 86400, False),
    "window_buckets": (1, False, 100, True),
    "open_seconds": (0, True, 86400, False),
    "open_backoff": (1, False, 100, False),
    "max_open_seconds": (0, True, 86400, False),
    "half_open_max_calls": (1, False, 10_000, True),
    "half_open_successes": (1, False, 10_000, True),
    "probe_timeout_seconds": (0, True, 3600, False),
    "max_concurrent_calls": (1, False, 1_000_000, True),
    "min_reporters": (1, False, 1000, True),
}
# Fields a live value of '', 'none' or 'off' turns off.
OFF_FIELDS = ("slow_call_seconds", "max_concurrent_calls")
OFF_VALUES = ("", "none", "off")
_DECIMAL = re.compile(r"[0-9.eE+-]+")  # what the scripts parse: no hex, inf, nan, spaces or underscores


def live_value(key: str, raw: str) -> tuple[Any, str]:
    """What the scripts make of a live value written to the config hash: (the
    value applied, or None when skipped; why it was skipped or clamped, or '').
    The same rules as apply_overrides in lua/_lib.lua."""
    if key in ("trip", "mode"):
        allowed = TRIPS if key == "trip" else MODES
        return (raw, "") if raw in allowed else (None, f"must be one of {', '.join(allowed)}")
    if key not in BOUNDS:
        return None, f"unknown config field {key!r}"
    if key in OFF_FIELDS and raw in OFF_VALUES:
        return "off", ""
    low, low_open, high, integer = BOUNDS[key]
    try:
        if not _DECIMAL.fullmatch(raw):
            raise ValueError(raw)
        number = float(raw)
    except ValueError:
        return None, "not a number"
    if integer and math.isfinite(number) and number != math.floor(number):
        return None, "must be an integer"
    if number < low or (low_open and number == low):
        return None, f"must be {'>' if low_open else '>='} {low:g}"
    if number > high:
        return high, f"clamped to {high:g}, the highest BreakerConfig allows"
    return number, ""


class _Derived(float):
    """A duration the user did not set, derived from the other one.

    It is a float everywhere (equality, hashing, repr, arithmetic), so code
    reading ``config.max_open_seconds`` gets the effective value; the type only
    tells ``__post_init__`` that the value was derived, so that
    ``dataclasses.replace(config, open_seconds=900)`` derives it again instead
    of holding the new value to a cap nobody chose.
    """

    __slots__ = ()


def _fail(field: str, why: str, value: object) -> ValueError:
    return ValueError(f"BreakerConfig.{field} {why} (got {value!r})")


def _int(field: str, value: object) -> None:
    low, _, high, _ = BOUNDS[field]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(field, "must be an integer", value)
    if value < low or value > high:
        raise _fail(field, f"must be >= {low:g} and <= {high:g}", value)


def _number(field: str, value: object) -> None:
    low, low_open, high, _ = BOUNDS[field]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(field, "must be a finite number", value)
    if value < low or (low_open and value == low) or value > high:
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        raise _fail(field, f"must be {bound} and <= {high:g}", value)


@dataclass(frozen=True)
class BreakerConfig:
    """Trip rule, window, open period and half-open policy of one breaker.

    Defaults follow pybreaker and Hystrix where they agree: trip after 5
    consecutive failures, stay open 30 s, let one probe through.

    ``open_seconds`` and ``max_open_seconds`` (the cap of the backed-off open
    period): set either, both or neither; one left unset follows the other.
    An unset cap is ``max(300, open_seconds)``, so ``open_seconds=600`` works
    and caps at 600; an unset open period is ``min(30, max_open_seconds)``, so
    ``max_open_seconds=10`` opens for 10 s and never longer. Only both set
    with ``max_open_seconds < open_seconds`` is an error. Both attributes read
    as the effective values; ``dataclasses.replace`` derives an unset one
    again from the new values (``replace(BreakerConfig(open_seconds=600),
    open_seconds=900).max_open_seconds == 900``).
    """

    trip: str = "consecutive"
    failure_threshold: int = 5
    failure_rate: float = 0.5
    minimum_calls: int = 20
    slow_call_seconds: float | None = None
    slow_call_rate: float = 1.0
    window_seconds: float = 10.0
    window_buckets: int = 10
    open_seconds: float = _Derived(OPEN_SECONDS)
    open_backoff: float = 2.0
    max_open_seconds: float = _Derived(MAX_OPEN_SECONDS_FLOOR)
    half_open_max_calls: int = 1
    half_open_successes: int = 1
    probe_timeout_seconds: float = 30.0
    max_concurrent_calls: int | None = None
    mode: str = "enforce"
    # reporters (hosts) whose failures a shared trip needs; a reporter failing alone is
    # isolated instead (README, "One sick host")
    min_reporters: int = 1
    record_exceptions: ExceptionTypes = (Exception,)
    ignore_exceptions: ExceptionTypes = ()
    predicate: Predicate | None = None

    def __post_init__(self) -> None:
        if self.trip not in TRIPS:
            raise _fail("trip", f"must be one of {', '.join(TRIPS)}", self.trip)
        if self.mode not in MODES:
            raise _fail("mode", f"must be one of {', '.join(MODES)}", self.mode)
        _int("failure_threshold", self.failure_threshold)
        _number("failure_rate", self.failure_rate)
        _int("minimum_calls", self.minimum_calls)
        if self.slow_call_seconds is not None:
            _number("slow_call_seconds", self.slow_call_seconds)
        _number("slow_call_rate", self.slow_call_rate)
        _number("window_seconds", self.window_seconds)
        _int("window_buckets", self.window_buckets)
        if self.window_seconds * 1000 < self.window_buckets:
            raise _fail("window_seconds", "must give each bucket at least 1 ms", self.window_seconds)
        self._resolve_open_period()
        _number("open_backoff", self.open_backoff)
        _int("half_open_max_calls", self.half_open_max_calls)
        _int("half_open_successes", self.half_open_successes)
        _number("probe_timeout_seconds", self.probe_timeout_seconds)
        if self.max_concurrent_calls is not None:
            _int("max_concurrent_calls", self.max_concurrent_calls)
        _int("min_reporters", self.min_reporters)
        for field in ("record_exceptions", "ignore_exceptions"):
            value = getattr(self, field)
            if not isinstance(value, tuple) or not all(
                isinstance(t, type) and issubclass(t, BaseException) for t in value
            ):
                raise _fail(field, "must be a tuple of exception classes", value)
        if self.predicate is not None and not callable(self.predicate):
            raise _fail("predicate", "must be callable", self.predicate)

    def _resolve_open_period(self) -> None:
        """Validate what the user set of open_seconds / max_open_seconds, derive the rest."""
        open_set = not isinstance(self.open_seconds, _Derived)
        cap_set = not isinstance(self.max_open_seconds, _Derived)
        if open_set:
            _number("open_seconds", self.open_seconds)
        if cap_set:
            _number("max_open_seconds", self.max_open_seconds)
        if open_set and cap_set:
            if self.max_open_seconds < self.open_seconds:
                why = f"must be >= open_seconds ({self.open_seconds!r})"
                raise _fail("max_open_seconds", why, self.max_open_seconds)
            return
        open_seconds = self.open_seconds if open_set else OPEN_SECONDS
        if cap_set:
            open_seconds = min(open_seconds, self.max_open_seconds)
        else:
            object.__setattr__(self, "max_open_seconds", _Derived(max(MAX_OPEN_SECONDS_FLOOR, open_seconds)))
        if not open_set:
            object.__setattr__(self, "open_seconds", _Derived(open_seconds))

    def to_lua(self) -> bytes:
        """The config as the Lua scripts take it: one JSON argument, times in ms.

        Encoded once per breaker; decoding one argument costs the scripts a
        fraction of reading sixteen (see lua/_lib.lua).
        """
        window_ms = round(self.window_seconds * 1000)
        values = {
            "trip": self.trip,
            "mode": self.mode,
            "threshold": self.failure_threshold,
            "rate": self.failure_rate,
            "min_calls": self.minimum_calls,
            "slow_ms": round(self.slow_call_seconds * 1000) if self.slow_call_seconds else 0,
            "slow_rate": self.slow_call_rate,
            "bucket_ms": max(1, window_ms // self.window_buckets),
            "buckets": self.window_buckets,
            "open_ms": round(self.open_seconds * 1000),
            "backoff": self.open_backoff,
            "max_open_ms": round(self.max_open_seconds * 1000),  # the effective cap, derived or set
            # which of the two the user set: a live override of one re-derives the other (lua/_lib.lua)
            "open_set": 0 if isinstance(self.open_seconds, _Derived) else 1,
            "cap_set": 0 if isinstance(self.max_open_seconds, _Derived) else 1,
            "ho_max": self.half_open_max_calls,
            "ho_successes": self.half_open_successes,
            "probe_ms": max(1, round(self.probe_timeout_seconds * 1000)),
            "max_conc": self.max_concurrent_calls or 0,
        }
        if self.min_reporters > 1:  # absent at 1: the scripts then do nothing of it (lua/_lib.lua)
            values["min_rep"] = self.min_reporters
        return json.dumps(values, separators=(",", ":")).encode()

    @classmethod
    def from_lua(cls, raw: str | bytes) -> BreakerConfig:
        """The config a worker gave the scripts (``to_lua``), read back from Redis.

        Plain JSON, never evaluated; a value out of bounds (the hash was
        edited) raises ValueError, as the constructor does.
        """
        given = json.loads(raw)
        if not isinstance(given, dict):
            raise ValueError(f"not a config: {raw!r}")
        try:
            values = fields_from_lua(given)
        except KeyError as exc:
            raise ValueError(f"config without {exc}") from None
        if not given.get("open_set"):  # derived from the other one, as the worker's was
            del values["open_seconds"]
        if not given.get("cap_set"):
            del values["max_open_seconds"]
        return cls(**values)

    def with_overrides(self, overrides: Mapping[str, str]) -> BreakerConfig:
        """This config with live overrides (strings, as stored in Redis) applied."""
        return replace(self, **parse_overrides(overrides))

    def classify(self, exc: BaseException) -> str:
        """'failure' or 'ignored' for an exception raised by a protected call.

        The predicate decides first (True: failure, False: ignored, None: fall
        through); then ignore_exceptions; then record_exceptions. An exception
        matching neither list is ignored: it neither trips nor heals the breaker.
        """
        if self.predicate is not None:
            verdict = self.predicate(exc)
            if verdict is not None:
                return "failure" if verdict else "ignored"
        if self.ignore_exceptions and isinstance(exc, self.ignore_exceptions):
            return "ignored"
        if isinstance(exc, self.record_exceptions):
            return "failure"
        return "ignored"


_FIELD_TYPES: dict[str, str] = {
    "trip": "str",
    "mode": "str",
    "failure_threshold": "int",
    "minimum_calls": "int",
    "window_buckets": "int",
    "half_open_max_calls": "int",
    "half_open_successes": "int",
    "max_concurrent_calls": "optint",
    "min_reporters": "int",
    "slow_call_seconds": "optfloat",
}


def fields_from_lua(values: Mapping[str, Any]) -> dict[str, Any]:
    """BreakerConfig's live fields from the scripts' config (``to_lua``, or what
    snapshot.lua says it applies), seconds again; no validation."""

    def seconds(key: str) -> float:
        return float(values[key]) / 1000

    buckets = values["buckets"]
    return {
        "trip": values["trip"],
        "mode": values["mode"],
        "failure_threshold": values["threshold"],
        "failure_rate": values["rate"],
        "minimum_calls": values["min_calls"],
        "slow_call_seconds": seconds("slow_ms") if values["slow_ms"] else None,
        "slow_call_rate": values["slow_rate"],
        "window_seconds": float(values["bucket_ms"]) * float(buckets) / 1000,
        "window_buckets": buckets,
        "open_seconds": seconds("open_ms"),
        "open_backoff": values["backoff"],
        "max_open_seconds": seconds("max_open_ms"),
        "half_open_max_calls": values["ho_max"],
        "half_open_successes": values["ho_successes"],
        "probe_timeout_seconds": seconds("probe_ms"),
        "max_concurrent_calls": values["max_conc"] or None,
        "min_reporters": values.get("min_rep") or 1,
    }


def parse_overrides(overrides: Mapping[str, str]) -> dict[str, Any]:
    """Parse live-config strings ('open_seconds' -> '30') into typed values.

    Raises ValueError naming the field for an unknown field or a bad value;
    the resulting config is validated as a whole by the caller's replace().
    """
    parsed: dict[str, Any] = {}
    for key, raw in overrides.items():
        if key not in LUA_FIELDS:
            raise ValueError(f"unknown config field {key!r}; live fields: {', '.join(LUA_FIELDS)}")
        kind = _FIELD_TYPES.get(key, "float")
        text = raw.strip()
        value: str | int | float | None
        try:
            if kind == "str":
                value = text
            elif kind in ("optint", "optfloat") and text.lower() in ("", "none", "off"):
                value = None
            elif kind in ("int", "optint"):
                value = int(text)
            else:
                value = float(text)
        except ValueError:
            raise _fail(key, f"must be {'an integer' if 'int' in kind else 'a number'}", raw) from None
        parsed[key] = value
    return parsed


def config_field_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(BreakerConfig))
