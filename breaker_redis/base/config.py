"""BreakerConfig: what a breaker trips on and how it recovers.

The config is validated once, when it is built, so a typo in a deployment
fails at start-up with the field's name instead of at the first outage.
The Lua scripts receive it as one JSON argument (``to_lua``)
and merge live overrides from ``breaker:{NAME}:config`` on top; the strings
stored there are parsed by ``parse_overrides`` with the same rules.

Each field that can be set live is declared once, in BreakerConfig's body:
its type, default, name in the scripts' config and bounds (``live``, whose
rules are fields.py's LiveField). The
constructor's checks, the live parsing, ``to_lua`` and its inverse, and the
scripts' own table of bounds (written into lua/includes/config.lua by
breaker_redis/storage/lua_rules.py) all follow from that one line (``LIVE_FIELDS``).
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, get_args, get_type_hints

from breaker_redis.base.fields import LiveField, invalid, live

TRIPS = ("consecutive", "count", "rate")
MODES = ("enforce", "observe")

ExceptionTypes = tuple[type[BaseException], ...]
Predicate = Callable[[BaseException], bool | None]

# The open period and its cap when neither is set. Whichever of the two is
# left unset follows the other (see BreakerConfig):
#   open_seconds     = min(30, max_open_seconds)
#   max_open_seconds = max(300, open_seconds)
# lua/includes/config.lua (apply_overrides) is given the same two numbers (lua_rules.py).
OPEN_SECONDS = 30.0
MAX_OPEN_SECONDS_FLOOR = 300.0
# The highest min_reporters: below the reporters a breaker tracks (lua/includes/quorum.lua REP_CAP, 128),
# so that a quorum can always be counted however many other reporters fail now and then.
MAX_MIN_REPORTERS = 100

# What a live value of a field that can be off (typed ``X | None``) turns it off with.
OFF_VALUES = ("", "none", "off")
_DECIMAL = re.compile(r"[0-9.eE+-]+")  # what the scripts parse: no hex, inf, nan, spaces or underscores


class _Derived(float):
    """A duration the user did not set, derived from the other one.

    It is a float everywhere (equality, hashing, repr, arithmetic), so code
    reading ``config.max_open_seconds`` gets the effective value; the type only
    tells ``__post_init__`` that the value was derived, so that
    ``dataclasses.replace(config, open_seconds=900)`` derives it again instead
    of holding the new value to a cap nobody chose.
    """

    __slots__ = ()


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

    # field: type = live(name in the scripts' config, default, bounds): see LiveField. The type
    # says whether a number is an integer and whether the field can be off (X | None).
    trip: str = live("trip", "consecutive", words=TRIPS)
    failure_threshold: int = live("threshold", 5, ge=1, le=1_000_000)
    failure_rate: float = live("rate", 0.5, gt=0, le=1)
    minimum_calls: int = live("min_calls", 20, ge=1, le=1_000_000)
    slow_call_seconds: float | None = live("slow_ms", None, gt=0, le=3600)
    slow_call_rate: float = live("slow_rate", 1.0, gt=0, le=1)
    # sent as the length of one bucket, "bucket_ms" (to_lua); "window_ms" is the scripts' name
    # of a live override of it
    window_seconds: float = live("window_ms", 10.0, gt=0, le=86400)
    window_buckets: int = live("buckets", 10, ge=1, le=100)
    # the count window: the last N outcomes instead of window_seconds (lua/includes/ring.lua); absent
    # when off. Not the snapshot's window_calls, which counts the calls in whichever window is used
    window_calls: int | None = live("win_n", None, ge=1, le=10_000, omitted_at_default=True)
    open_seconds: float = live("open_ms", _Derived(OPEN_SECONDS), gt=0, le=86400)
    open_backoff: float = live("backoff", 2.0, ge=1, le=100)
    max_open_seconds: float = live("max_open_ms", _Derived(MAX_OPEN_SECONDS_FLOOR), gt=0, le=86400)
    half_open_max_calls: int = live("ho_max", 1, ge=1, le=10_000)
    half_open_successes: int = live("ho_successes", 1, ge=1, le=10_000)
    probe_timeout_seconds: float = live("probe_ms", 30.0, gt=0, le=3600)
    max_concurrent_calls: int | None = live("max_conc", None, ge=1, le=1_000_000)
    mode: str = live("mode", "enforce", words=MODES)
    # reporters (hosts) whose failures a shared trip needs; a reporter failing alone is
    # isolated instead (docs/one-sick-host.md); absent at 1: the scripts then do nothing of it.
    # At most MAX_MIN_REPORTERS: a breaker tracks at most 128 reporters (lua/includes/quorum.lua REP_CAP)
    min_reporters: int = live("min_rep", 1, ge=1, le=MAX_MIN_REPORTERS, omitted_at_default=True)
    # recovery without a stampede (docs/recovery.md): after a close, the share of calls admitted
    # rises linearly from ramp_from to 1 over ramp_seconds (0: off), for every worker together;
    # both absent from the scripts' config at their defaults
    ramp_seconds: float = live("ramp_ms", 0.0, ge=0, le=3600, omitted_at_default=True)
    ramp_from: float = live("ramp_from", 0.1, gt=0, le=1, omitted_at_default=True)
    record_exceptions: ExceptionTypes = (Exception,)
    ignore_exceptions: ExceptionTypes = ()
    predicate: Predicate | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> BreakerConfig:
        # A misspelt field gets a did-you-mean, not the dataclass's bare "unexpected keyword".
        known = cls.__dataclass_fields__  # a subclass's own fields too (a group member's config)
        for key in kwargs:
            if key not in known:
                names = tuple(known)
                raise TypeError(f"{cls.__name__} has no field {key!r}; {suggestion(key, names)}")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        for rule in _SENT:  # the words first, then the numbers in field order
            if rule.name == "open_seconds":
                self._resolve_open_period()  # with max_open_seconds: an unset one is derived
            elif rule.name != "max_open_seconds":
                rule.check(getattr(self, rule.name))
            if rule.name == "window_buckets" and self.window_seconds * 1000 < self.window_buckets:
                raise invalid("window_seconds", "must give each bucket at least 1 ms", self.window_seconds)
        for name in ("record_exceptions", "ignore_exceptions"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(
                isinstance(t, type) and issubclass(t, BaseException) for t in value
            ):
                raise invalid(name, "must be a tuple of exception classes", value)
        if self.predicate is not None and not callable(self.predicate):
            raise invalid("predicate", "must be callable", self.predicate)

    def _resolve_open_period(self) -> None:
        """Validate what the user set of open_seconds / max_open_seconds, derive the rest."""
        open_set = not isinstance(self.open_seconds, _Derived)
        cap_set = not isinstance(self.max_open_seconds, _Derived)
        if open_set:
            LIVE_FIELD["open_seconds"].check(self.open_seconds)
        if cap_set:
            LIVE_FIELD["max_open_seconds"].check(self.max_open_seconds)
        if open_set and cap_set:
            if self.max_open_seconds < self.open_seconds:
                why = f"must be >= open_seconds ({self.open_seconds!r})"
                raise invalid("max_open_seconds", why, self.max_open_seconds)
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
        fraction of reading sixteen (see lua/includes/config.lua). Its text is stored with
        the state (the ``cfg`` key) and compared by readers: the words first,
        then the numbers in field order, always.
        """
        values: dict[str, Any] = {}
        for rule in _SENT:
            value = getattr(self, rule.name)
            if rule.omitted_at_default and value == rule.default:
                continue
            if rule.name == "window_seconds":  # the length of one bucket, at least 1 ms
                values["bucket_ms"] = max(1, round(value * 1000) // self.window_buckets)
            elif rule.name == "probe_timeout_seconds":  # at least 1 ms: a lease must not lapse as taken
                values[rule.lua] = max(1, rule.encode(value))
            else:
                values[rule.lua] = rule.encode(value)
            if rule.name == "max_open_seconds":  # the effective cap, derived or set
                # which of the two the user set: a live override of one re-derives the other
                # (lua/includes/config.lua, apply_overrides)
                values["open_set"] = 0 if isinstance(self.open_seconds, _Derived) else 1
                values["cap_set"] = 0 if isinstance(self.max_open_seconds, _Derived) else 1
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


def _fields() -> tuple[LiveField, ...]:
    """BreakerConfig's live fields, in its order, each rule read from its declaration."""
    hints = get_type_hints(BreakerConfig)
    found = []
    for declared in fields(BreakerConfig):
        rules = declared.metadata.get("live")
        if rules is None:
            continue
        kinds = get_args(hints[declared.name]) or (hints[declared.name],)
        unit = 1000 if declared.name.endswith("_seconds") else 1
        found.append(
            LiveField(
                name=declared.name,
                default=declared.default,
                integer=int in kinds,
                off=type(None) in kinds,
                unit=unit,
                **rules,
            )
        )
    return tuple(found)


LIVE_FIELDS = _fields()
LIVE_FIELD = {rule.name: rule for rule in LIVE_FIELDS}
_SENT = tuple(sorted(LIVE_FIELDS, key=lambda rule: not rule.words))  # the words first, then field order

# The fields that can be overridden live (breaker:{NAME}:config), in BreakerConfig's order.
LUA_FIELDS = tuple(LIVE_FIELD)
# The numbers' bounds: (lowest, lowest excluded, highest, integer). The scripts
# apply the same to live values written to the config hash (lua/includes/config.lua
# rules(), written from LIVE_FIELDS by lua_rules.py): they skip a value that is not a
# number, not an integer where one is due, or below the lowest; they clamp one
# above the highest.
BOUNDS: dict[str, tuple[float, bool, float, bool]] = {
    rule.name: (rule.low, rule.low_open, rule.high, rule.integer) for rule in LIVE_FIELDS if not rule.words
}
# Fields a live value of '', 'none' or 'off' (OFF_VALUES) turns off.
OFF_FIELDS = tuple(rule.name for rule in LIVE_FIELDS if rule.off)


def live_field(key: str) -> LiveField:
    """The live field named ``key``; ValueError naming it and the live ones if there is none."""
    rule = LIVE_FIELD.get(key)
    if rule is None:
        raise ValueError(f"unknown config field {key!r}; {suggestion(key, LUA_FIELDS)}")
    return rule


def live_value(key: str, raw: str) -> tuple[Any, str]:
    """What the scripts make of a live value written to the config hash: (the
    value applied, or None when skipped; why it was skipped or clamped, or '').
    The same rules as apply_overrides in lua/includes/config.lua."""
    rule = LIVE_FIELD.get(key)
    if rule is None:
        return None, f"unknown config field {key!r}"
    if rule.words:
        return (raw, "") if raw in rule.words else (None, f"must be one of {', '.join(rule.words)}")
    if rule.off and raw in OFF_VALUES:
        return "off", ""
    try:
        if not _DECIMAL.fullmatch(raw):
            raise ValueError(raw)
        number = float(raw)
    except ValueError:
        return None, "not a number"
    if rule.integer and math.isfinite(number) and number != math.floor(number):
        return None, "must be an integer"
    if number < rule.low or (rule.low_open and number == rule.low):
        return None, f"must be {'>' if rule.low_open else '>='} {rule.low:g}"
    if number > rule.high:
        return rule.high, f"clamped to {rule.high:g}, the highest BreakerConfig allows"
    return number, ""


def fields_from_lua(values: Mapping[str, Any]) -> dict[str, Any]:
    """BreakerConfig's live fields from the scripts' config (``to_lua``, or what
    snapshot.lua says it applies), seconds again; no validation."""
    found: dict[str, Any] = {}
    for rule in _SENT:
        if rule.name == "window_seconds":  # sent as the length of one bucket
            found[rule.name] = float(values["bucket_ms"]) * float(values["buckets"]) / 1000
        elif rule.omitted_at_default:
            found[rule.name] = rule.decode(values[rule.lua]) if values.get(rule.lua) else rule.default
        else:
            found[rule.name] = rule.decode(values[rule.lua])
    return found


def parse_overrides(overrides: Mapping[str, str]) -> dict[str, Any]:
    """Parse live-config strings ('open_seconds' -> '30') into typed values.

    Raises ValueError naming the field for an unknown field or a bad value;
    the resulting config is validated as a whole by the caller's replace().
    """
    parsed: dict[str, Any] = {}
    for key, raw in overrides.items():
        rule = live_field(key)
        text = raw.strip()
        value: str | int | float | None
        try:
            if rule.words:
                value = text
            elif rule.off and text.lower() in OFF_VALUES:
                value = None
            elif rule.integer:
                value = int(text)
            else:
                value = float(text)
        except ValueError:
            raise invalid(key, f"must be {'an integer' if rule.integer else 'a number'}", raw) from None
        parsed[key] = value
    return parsed


def checked_changes(base: BreakerConfig, changes: Mapping[str, object]) -> dict[str, str]:
    """Live-config changes as configure.lua writes them (field -> text, '' removing
    the override; None removes one too), checked before anything is written: a
    field removed must be a live one, the values set must make a valid config
    with ``base``. ValueError (or TypeError) naming the field otherwise."""
    as_text = {key: "" if value is None else str(value) for key, value in changes.items()}
    for key, value in as_text.items():
        if value == "":
            live_field(key)
    base.with_overrides({key: value for key, value in as_text.items() if value != ""})
    return as_text


def config_field_names() -> tuple[str, ...]:
    return _FIELD_NAMES


def suggestion(key: str, known: tuple[str, ...]) -> str:
    """What a misspelt field name was probably meant to be, or the names to pick from."""
    close = difflib.get_close_matches(key, known, n=1)
    return f"did you mean {close[0]!r}?" if close else f"fields: {', '.join(known)}"


_FIELD_NAMES = tuple(f.name for f in fields(BreakerConfig))
