"""``events``: the transition history from the events streams, then (--follow) what
the workers publish on PREFIX:events as it happens."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from breaker_redis.ops.cli.formatting import clock_text, overrides_text, transition_line
from breaker_redis.ops.cli.group import TIMEOUT, Failed, Target, main, pass_target, valid_name
from breaker_redis.storage.notices import Notice, parse_notice


def event_line(notice: Notice, target: Target, verbose: bool) -> str | None:
    """A pub/sub message, read by storage/notices.py parse_notice, as a line (None: not shown)."""
    kind, name, at = notice.kind, notice.name, notice.at
    if kind == "transition":
        return transition_line(
            {
                "at": at,
                "name": name,
                "from": notice.came_from,
                "to": notice.to,
                "cause": notice.cause,
                "epoch": notice.epoch,
                "forced": notice.forced,
                "open_until": notice.open_until,
            }
        )
    if kind == "config":
        overrides = target.overrides(name)
        return f"{clock_text(at)}  {name}  config written: {overrides_text(overrides)}"
    if kind == "armed":
        if not verbose:
            return None
        return f"{clock_text(at)}  {name}  armed: every outcome is sent at once"
    fields: dict[str, Any] = {
        "arms": notice.arms,
        "born": notice.born,
        "cause": notice.cause,
        "db": notice.database,
        "epoch": notice.epoch,
        "reporter": notice.reporter,
        **dict(notice.details),
    }
    rest = {key: value for key, value in fields.items() if value is not None}
    return f"{clock_text(at)}  {name}  {kind} {json.dumps(rest, sort_keys=True)}"


@main.command()
@click.argument("name", required=False)
@click.option(
    "--count",
    "-n",
    default=20,
    show_default=True,
    type=click.IntRange(min=0),
    help="Transitions of history to print first (10 are kept per breaker).",
)
@click.option("--follow", "-f", is_flag=True, help="Then print live events from pub/sub until Ctrl-C.")
@click.option("--verbose", "-v", is_flag=True, help="With --follow, also when a breaker arms.")
@click.option(
    "--max-events", type=click.IntRange(min=1), default=None, help="With --follow, stop after N live events."
)
@pass_target
def events(
    target: Target, name: str | None, count: int, follow: bool, verbose: bool, max_events: int | None
) -> None:
    """Transition history, then live events with --follow.

    The history of NAME (of every breaker without NAME) comes from the events
    streams, oldest first; --follow then prints transitions and config writes
    as they are published (PREFIX:events).

    A NAME not known (yet) is not an error: it has no history.
    """
    if name is not None:
        valid_name(name)
    pubsub = None
    if follow:  # subscribed before the history is read: nothing falls in between
        pubsub = target.client.pubsub()
        pubsub.subscribe(f"{target.prefix}:events")
        deadline = time.monotonic() + (target.timeout or TIMEOUT)
        while (message := pubsub.get_message(timeout=0.1)) is None or message["type"] != "subscribe":
            if time.monotonic() > deadline:
                raise Failed(f"Redis at {target.where} did not confirm the subscription")
    try:
        names = [name] if name is not None else target.names()
        history = [event for events in target.histories(names, count).values() for event in events]
        history.sort(key=lambda e: tuple(int(part) for part in e["id"].split("-")))
        history = history[-count:] if count else []
        for event in history:
            click.echo(transition_line(event))
        if pubsub is None:
            return
        seen = {(event["name"], str(event["epoch"])) for event in history}
        click.echo(f"following {target.prefix}:events at {target.where} (Ctrl-C to stop)", err=True)
        shown = 0
        while max_events is None or shown < max_events:
            message = pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if message is None or message.get("type") != "message":
                continue
            notice = parse_notice(message.get("data"))  # never raises: anyone may publish there
            if notice is None or (name is not None and notice.name != name):
                continue
            key = (notice.name, str(notice.epoch))
            if notice.kind == "transition" and key in seen:
                continue  # already printed from the stream
            line = event_line(notice, target, verbose)
            if line is not None:
                click.echo(line)
                shown += 1
    except KeyboardInterrupt:
        return
    finally:
        if pubsub is not None:
            pubsub.close()
