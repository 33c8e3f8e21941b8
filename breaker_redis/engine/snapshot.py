"""Turns the snapshot script's flat reply into the dict snapshot() documents.

``Snapshot`` names its keys and their types; it is a plain dict at run time,
so JSON output, the CLI, the dashboard and the metrics read it as before."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Literal, TypedDict, get_args

from breaker_redis.base.config import fields_from_lua
from breaker_redis.engine.ramp import RAMP_FROM, ramp_share
from breaker_redis.engine.reporters import reporters_of
from breaker_redis.storage.scripts import flat_pairs, text

# A snapshot's cumulative counters, by the key that holds each.
Count = Literal[
    "calls",
    "successes",
    "failures",
    "ignored",
    "slow",
    "rejected",
    "would_reject",
    "trips",
    "stale",
    "state_lost",  # times a worker found the state it knew gone (evicted, flushed, deleted)
    "isolations",  # times a reporter was isolated (min_reporters > 1; a renewed isolation not counted)
]
# The cumulative counter of each outcome (lua/record.lua counts them the same way).
OUTCOME_COUNTERS: dict[str, Count] = {"success": "successes", "failure": "failures", "ignored": "ignored"}
_STAT_FIELDS: tuple[Count, ...] = get_args(Count)  # the counters, in the order written above


class _Shown(TypedDict, total=False):
    """What a reader that shows many breakers adds to a snapshot."""

    transitions: list[Any]  # the dashboard: the breaker's last transitions
    group: str  # status --json: the breaker group it is a member of


class Snapshot(_Shown):
    """One breaker as Redis has it (snapshot(), the Reader, status --json, the
    dashboard, the metrics): a plain dict at run time, its keys named here."""

    name: str
    state: str
    forced: str | None
    epoch: int
    retry_after: float | None
    open_until_ms: int | None
    window_calls: int
    window_failures: int
    window_slow: int
    consecutive_failures: int
    half_open_successes: int
    probes_in_flight: int
    bulkhead_in_use: int
    mode: str
    # the ramp after a close (BreakerConfig.ramp_seconds): the share of calls admitted now,
    # 1.0 unless it runs, and until when it runs (Redis ms; None: it does not)
    ramp_share: float
    ramp_until_ms: int | None
    overrides: dict[str, str]
    store: str
    reporters: dict[str, dict[str, Any]]
    isolated: list[str]
    failing_reporters: int
    config: dict[str, Any] | None
    calls: int
    successes: int
    failures: int
    ignored: int
    slow: int
    rejected: int
    would_reject: int
    trips: int
    stale: int
    state_lost: int
    isolations: int


def _counter(value: Any) -> int:
    """A stats counter; one edited into something else (``trips abc``) reads as 0
    until the next count of it or ``reset`` repairs it (lua/_lib.lua, admin.lua)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def snapshot_dict(name: str, raw: Any, store: str) -> Snapshot:
    """The snapshot of snapshot.lua's flat field, value reply."""
    return snapshot_of(name, flat_pairs(raw), store)


def snapshot_of(name: str, fields: dict[str, Any], store: str) -> Snapshot:
    """The snapshot of snapshot.lua's fields by name (lua/read.lua gives them by position).
    Each field is converted once, straight into the snapshot: a reader of 2,000 breakers
    (status, a scrape) makes 2,000 of these, and dicts in between took a quarter of the time."""
    get = fields.get
    state = text(get("state"))
    forced = text(get("forced")) or None
    open_until, now = int(get("open_until") or 0), int(get("now") or 0)
    retry_after: float | None = None
    if state == "open" and forced is None:
        retry_after = max(0, open_until - now) / 1000.0
    # min_reporters > 1: the reporters failing in the window and the isolated ones (by name:
    # failures in its own window, isolated_until_ms), the isolated ones, how many are failing
    reporters = reporters_of(get("reporters"))
    stats = flat_pairs(get("stats") or [])
    counts = [_counter(stats[key]) if key in stats else 0 for key in _STAT_FIELDS]
    _, successes, failures, ignored, slow, rejected, would_reject, trips, stale, lost, isolations = counts
    config = _config_in_force(get("config"))
    ramp_until = int(get("ramp_until") or 0)
    ramp_ms = round((config or {}).get("ramp_seconds", 0) * 1000)
    if state != "closed" or forced is not None or now >= ramp_until or not ramp_ms:
        ramp_until = 0
    share = ramp_share(ramp_until, ramp_ms, (config or {}).get("ramp_from", RAMP_FROM), now)
    return {
        "name": name,
        "state": state,
        "forced": forced,
        "epoch": int(get("epoch") or 0),
        "retry_after": retry_after,
        "open_until_ms": open_until or None,
        "window_calls": int(get("window_calls") or 0),
        "window_failures": int(get("window_failures") or 0),
        "window_slow": int(get("window_slow") or 0),
        "consecutive_failures": int(get("consec") or 0),
        "half_open_successes": int(get("ho_ok") or 0),
        "probes_in_flight": int(get("probes") or 0),
        "bulkhead_in_use": int(get("slots") or 0),
        "mode": text(get("mode")),
        "ramp_share": share,
        "ramp_until_ms": ramp_until or None,
        "overrides": {key: text(value) for key, value in flat_pairs(get("overrides") or []).items()},
        "store": store,
        "reporters": reporters,
        "isolated": [name for name, seen in reporters.items() if seen["isolated_until_ms"]],
        "failing_reporters": len(reporters),
        "config": config,
        # in _STAT_FIELDS' order, calls the sum of the three outcomes
        "calls": successes + failures + ignored,
        "successes": successes,
        "failures": failures,
        "ignored": ignored,
        "slow": slow,
        "rejected": rejected,
        "would_reject": would_reject,
        "trips": trips,
        "stale": stale,
        "state_lost": lost,
        "isolations": isolations,
    }


def _config_in_force(raw: Any) -> dict[str, Any] | None:
    """The config the scripts decide by (the caller's with the live overrides
    applied), in BreakerConfig's names and units; None if it cannot be read.
    A dict of its own: the caller may change it."""
    parsed = _parsed_config(text(raw)) if raw else None
    return None if parsed is None else dict(parsed)


@lru_cache(maxsize=256)
def _parsed_config(raw: str) -> tuple[tuple[str, Any], ...] | None:
    """Parsed once per text: a reader of 2,000 breakers sees a handful of configs."""
    try:
        return tuple(fields_from_lua(json.loads(raw)).items())
    except (ValueError, TypeError, KeyError):
        return None
