"""How the commands show breakers: the status table, the transition and group lines,
times and rates; what an operator reads, in one place, for every command."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import click

STATE_COLOURS = {"closed": "green", "open": "red", "half_open": "yellow"}


def state_label(snapshot: Mapping[str, Any]) -> str:
    return f"{snapshot['state']} (forced)" if snapshot.get("forced") else str(snapshot["state"])


def ramp_text(snapshot: Mapping[str, Any]) -> str:
    """', ramp 37%' while the ramp after a close admits that share of calls, else ''."""
    return f", ramp {snapshot['ramp_share']:.0%}" if snapshot.get("ramp_until_ms") else ""


def rate_text(failures: int, calls: int) -> str:
    return f"{100 * failures / calls:.1f}%" if calls else "-"


def retry_text(value: float | None) -> str:
    """Seconds until an open breaker lets a probe through. Its open period can
    end with no call to move it to half-open: the next call is the probe then,
    which "0.0 s" would hide; a wait under 0.1 s is shown as 0.1 s, not 0."""
    if value is None:
        return "-"
    if value <= 0:
        return "next call"
    return f"{math.ceil(value * 10) / 10:.1f} s"


def clock_text(ms: int | str | float | None) -> str:
    """A Redis time in ms as local time, to the millisecond."""
    try:
        stamp = datetime.fromtimestamp(int(float(ms or 0)) / 1000)
    except (TypeError, ValueError, OverflowError, OSError):
        return str(ms)
    return stamp.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


COLUMNS = ("NAME", "STATE", "FAILURES/CALLS", "RATE", "CALLS", "REJECTED", "TRIPS", "RETRY AFTER")


def table(snapshots: Iterable[Mapping[str, Any]], highlight: Iterable[str] = ()) -> list[str]:
    """The status table; rows named in ``highlight`` are shown in reverse video."""
    rows = [
        (
            str(s["name"]),
            state_label(s) + ramp_text(s) + (f", {len(s['isolated'])} isolated" if s.get("isolated") else ""),
            f"{s['window_failures']}/{s['window_calls']}",
            rate_text(s["window_failures"], s["window_calls"]),
            str(s["calls"]),
            str(s["rejected"]),
            str(s["trips"]),
            retry_text(s["retry_after"]),
        )
        for s in snapshots
    ]
    widths = [max(len(row[i]) for row in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    marked = set(highlight)
    lines = ["  ".join(title.ljust(width) for title, width in zip(COLUMNS, widths, strict=True)).rstrip()]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        state = row[1].split(" ", 1)[0]
        cells[1] = click.style(cells[1], fg=STATE_COLOURS.get(state), bold=row[1].endswith("(forced)"))
        line = "  ".join(cells).rstrip()
        lines.append(click.style(line, reverse=True) if row[0] in marked else line)
    return lines


def group_line(group: Mapping[str, Any]) -> str:
    """One breaker group (breaker_redis/groups.py): how many members are open of how
    many may be, which, and how many trips it held back at that cap."""
    opened = ", ".join(group["open"]) or "none"
    return (
        f"group {group['name']}: {len(group['open'])} of {len(group['members'])} members open "
        f"(at most {group['cap']}, max_open_fraction {group['max_open_fraction']:g}): {opened}; "
        f"{group['held']} trips held back at the cap"
    )


def transition_line(event: Mapping[str, Any]) -> str:
    """One transition, from the events list or from a pub/sub message."""
    line = f"{clock_text(event.get('at'))}  {event.get('name')}  {event.get('from')} -> {event.get('to')}"
    line += f"  cause={event.get('cause')} epoch={event.get('epoch')}"
    if event.get("forced"):
        line += f" forced={event['forced']}"
    open_until = int(float(event.get("open_until") or 0))
    if event.get("to") == "open" and open_until and not event.get("forced"):
        line += f" open_until={clock_text(open_until)}"
    return line


def overrides_text(overrides: Mapping[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in overrides.items()) or "no live overrides"
