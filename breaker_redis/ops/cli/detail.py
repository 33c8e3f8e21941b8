"""``show``: one breaker in detail, with its config and which live overrides the
scripts apply, clamp or ignore, and why."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from breaker_redis.base.config import LUA_FIELDS, BreakerConfig, live_value
from breaker_redis.ops.cli.formatting import (
    clock_text,
    rate_text,
    retry_text,
    state_label,
    transition_line,
)
from breaker_redis.ops.cli.group import Target, main, pass_target

TRANSITIONS_SHOWN = 10  # the last transitions `show` lists


def _scripts_apply(key: str, value: str) -> bool:
    """Whether the scripts apply this stored override (lua/includes/config.lua, apply_overrides)."""
    return live_value(key, value)[0] is not None


def override_verdict(key: str, value: str) -> str:
    """How a stored override is treated: in force, clamped, ignored by the
    scripts (and why), or in force though BreakerConfig's rules refuse it."""
    applied, why = live_value(key, value)
    if applied is None:
        return f"IGNORED by the scripts: {why}"
    if why:
        return f"live override, {why}"
    try:
        BreakerConfig().with_overrides({key: value})
    except (ValueError, TypeError) as exc:
        return f"in force, but BreakerConfig refuses it: {exc}"
    return "live override"


def detail_retry(retry_after: float | None) -> str:
    if retry_after is not None and retry_after <= 0:
        return ", open period over: the next call is the probe"
    return f", retry after {retry_text(retry_after)}"


@main.command()
@click.argument("name")
@pass_target
def show(target: Target, name: str) -> None:
    """One breaker in detail.

    State, window, counters, probes in flight, live config overrides (and
    which of them are ignored or out of BreakerConfig's bounds, and why), the
    last transitions.

    An unknown name exits 1.
    """
    target.require(name)
    shape = target.window_shape(name)
    stored = target.stored_config(name)
    s = target.snapshot(name, stored)
    keys = target.keys(name)
    state = state_label(s)
    if s["state"] == "open":
        state += ", until cleared" if s["forced"] else detail_retry(s["retry_after"])
    if s.get("ramp_until_ms"):  # the ramp after a close (docs/recovery.md)
        state += (
            f", ramping: {s['ramp_share']:.0%} of calls admitted, all at {clock_text(s['ramp_until_ms'])}"
        )
    if shape is None:
        window_shape = "no window written yet"
    elif shape[0] == 0:
        window_shape = f"the last {shape[1]} calls, as the workers last wrote it"
    else:
        window_shape = f"{shape[0] * shape[1] / 1000:g} s in {shape[1]} buckets, as the workers last wrote it"
    lines = [
        f"{name}  ({target.where}, prefix {target.prefix!r})",
        f"  state        {state}",
        f"  epoch        {s['epoch']}",
        f"  window       {s['window_failures']} failures / {s['window_calls']} calls "
        f"({rate_text(s['window_failures'], s['window_calls'])}), {s['window_slow']} slow; {window_shape}",
        f"  consecutive  {s['consecutive_failures']} failures",
        f"  probes       {s['probes_in_flight']} in flight, {s['half_open_successes']} succeeded "
        f"(half_open); bulkhead slots in use {s['bulkhead_in_use']}",
        f"  counters     calls {s['calls']} (successes {s['successes']}, failures {s['failures']}, "
        f"ignored {s['ignored']}), slow {s['slow']}, stale {s['stale']}",
        f"               rejected {s['rejected']}, would_reject {s['would_reject']}, trips {s['trips']}, "
        f"state lost {s['state_lost']}",
        *_reporter_lines(s),
        "",
    ]
    overrides = target.overrides(name)
    lines += _config_lines(stored, s.get("config"), overrides)
    lines += ["", f"live overrides ({keys['config']}):"]
    width = max((len(f"{k} = {v}") for k, v in overrides.items()), default=0)
    lines += [f"  {f'{k} = {v}'.ljust(width)}  {override_verdict(k, v)}" for k, v in overrides.items()]
    if not overrides:
        lines.append("  (none)")
    lines += ["", f"last transitions, newest first ({keys['events']}):"]
    history = target.transitions(name, TRANSITIONS_SHOWN)
    lines += [f"  {transition_line(event)}" for event in reversed(history)] or ["  (none)"]
    for line in lines:
        click.echo(line)


def _reporter_lines(s: Mapping[str, Any]) -> list[str]:
    """min_reporters > 1 (docs/one-sick-host.md): the reporters failing in the window, the
    isolated ones and until when."""
    quorum = (s.get("config") or {}).get("min_reporters", 1)
    if quorum <= 1 and not s["reporters"]:
        return []
    seen = [
        f"{name} ({each['failures']} failures"
        + (f", isolated until {clock_text(each['isolated_until_ms'])})" if each["isolated_until_ms"] else ")")
        for name, each in s["reporters"].items()
    ]
    return [
        f"  reporters    a trip needs {quorum}; {s['failing_reporters']} failing in the window, "
        f"{len(s['isolated'])} isolated; isolations {s['isolations']}",
        *(f"               {line}" for line in seen),
    ]


def _value(value: Any) -> str:
    if value is None:
        return "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _config_lines(
    stored: BreakerConfig | None, in_force: Mapping[str, Any] | None, overrides: Mapping[str, str]
) -> list[str]:
    """The config the scripts decide by, field by field, each change by a live override marked."""
    if stored is None or not in_force:
        return [
            "config in force: no worker has written its config yet (it is written with the state);",
            "  the live overrides below apply on top of each app's own config",
        ]
    lines = ["config in force (the config of the last worker to write the state, with the live overrides):"]
    width = max(len(key) for key in LUA_FIELDS)
    for key in LUA_FIELDS:
        own, now = _value(getattr(stored, key)), _value(in_force.get(key))
        note = ""
        if key in overrides and _scripts_apply(key, overrides[key]):
            note = f"live override (the worker's own: {own})"
        elif own != now:
            note = f"follows the live overrides (the worker's own: {own})"
        lines.append(f"  {key.ljust(width)}  {now.ljust(8)}  {note}".rstrip())
    return lines
