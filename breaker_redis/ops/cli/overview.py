"""``status`` and ``watch``: every breaker under the prefix, once or refreshed in place."""

from __future__ import annotations

import json
import time
from datetime import datetime

import click
import redis

from breaker_redis.ops.cli.formatting import group_line, state_label, table
from breaker_redis.ops.cli.group import Target, main, pass_target
from breaker_redis.storage.store import StoreUnavailable

HIGHLIGHT_SECONDS = 10.0  # `watch` keeps a state change highlighted this long


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of the snapshot dicts.")
@pass_target
def status(target: Target, as_json: bool) -> None:
    """Every breaker known in Redis, one line each.

    State (forced marked), failures / calls in the window and the failure
    rate, cumulative calls, rejected, trips, seconds until a probe (retry after);
    then each breaker group: its members open of how many may be.
    """
    snapshots = target.snapshots()
    groups = target.groups(snapshots)
    if as_json:
        for group in groups:  # a member of a breaker group names it
            for snapshot in snapshots:
                if snapshot["name"] in group["members"]:
                    snapshot["group"] = group["name"]
        # one breaker per line (json.dumps without indent is the C encoder: 2,000 breakers in
        # a fraction of the time), still one JSON array for json.load / jq
        lines = ",\n".join(json.dumps(snapshot) for snapshot in snapshots)
        click.echo(f"[\n{lines}\n]" if snapshots else "[]")
    elif not snapshots:
        click.echo(f"no breakers under prefix {target.prefix!r} at {target.where}")
    else:
        for line in table(snapshots):
            click.echo(line)
        for group in groups:
            click.echo(group_line(group))


@main.command()
@click.option(
    "--interval", default=1.0, show_default=True, type=click.FloatRange(min=0.05), help="Seconds per refresh."
)
@click.option("--count", type=click.IntRange(min=1), default=None, help="Stop after N refreshes.")
@pass_target
def watch(target: Target, interval: float, count: int | None) -> None:
    """The status table, refreshed in place.

    State changes are highlighted for 10 s and listed under the table. Ctrl-C stops.
    If Redis stops answering after the first refresh, the table says so and
    watching goes on; when it cannot be reached at first, the exit code is 1.
    """
    previous: dict[str, str] = {}
    changes: dict[str, tuple[float, str]] = {}  # name -> (monotonic time, "closed -> open at ...")
    refreshes = 0
    try:
        while True:
            try:
                snapshots = target.snapshots()
                problem = ""
            except (
                redis.exceptions.ConnectionError,
                redis.exceptions.TimeoutError,
                redis.exceptions.RedisClusterException,
                StoreUnavailable,
            ) as exc:
                if refreshes == 0:
                    raise
                snapshots, problem = [], f"Redis at {target.where} does not answer ({exc}); retrying"
            now = time.monotonic()
            for snapshot in snapshots:
                name, label = snapshot["name"], state_label(snapshot)
                if name in previous and previous[name] != label:
                    changes[name] = (now, f"{previous[name]} -> {label} at {datetime.now():%H:%M:%S}")
                previous[name] = label
            recent = {name: change for name, (at, change) in changes.items() if now - at < HIGHLIGHT_SECONDS}
            click.clear()
            click.echo(
                f"breaker-redis watch: {target.where}, prefix {target.prefix!r}, "
                f"every {interval:g} s, {datetime.now():%H:%M:%S} (Ctrl-C to stop)"
            )
            click.echo()
            if problem:
                click.echo(click.style(problem, fg="red"))
            elif snapshots:
                for line in table(snapshots, highlight=recent):
                    click.echo(line)
            else:
                click.echo(f"no breakers under prefix {target.prefix!r}")
            if recent:
                click.echo()
                for name, change in sorted(recent.items()):
                    click.echo(click.style(f"changed: {name} {change}", bold=True))
            refreshes += 1
            if count is not None and refreshes >= count:
                return
            target.sleep(interval)
    except KeyboardInterrupt:
        return
