"""``events``: the transition history from the events streams, then (--follow) what
the workers publish on PREFIX:events as it happens."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import click

from breaker_redis.ops.cli.formatting import clock_text, overrides_text, transition_line
from breaker_redis.ops.cli.group import TIMEOUT, Failed, Invalid, Target, main, pass_target
from breaker_redis.storage.scripts import text, validate_name


def event_line(message: Mapping[str, Any], target: Target, verbose: bool) -> str | None:
    """A pub/sub message as a line (None: not shown)."""
    kind, name = message.get("kind"), str(message.get("name"))
    if kind == "transition":
        return transition_line(message)
    if kind == "config":
        overrides = target.overrides(name)
        return f"{clock_text(message.get('at'))}  {name}  config written: {overrides_text(overrides)}"
    if kind == "armed":
        if not verbose:
            return None
        return f"{clock_text(message.get('at'))}  {name}  armed: every outcome is sent at once"
    rest = {k: v for k, v in message.items() if k not in ("name", "kind", "at")}
    return f"{clock_text(message.get('at'))}  {name}  {kind} {json.dumps(rest, sort_keys=True)}"


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
        try:
            validate_name(name)
        except ValueError as exc:
            raise Invalid(str(exc)) from None
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
            try:
                payload = json.loads(text(message["data"]))
            except ValueError:
                continue
            if not isinstance(payload, dict) or (name is not None and payload.get("name") != name):
                continue
            key = (str(payload.get("name")), str(payload.get("epoch")))
            if payload.get("kind") == "transition" and key in seen:
                continue  # already printed from the stream
            line = event_line(payload, target, verbose)
            if line is not None:
                click.echo(line)
                shown += 1
    except KeyboardInterrupt:
        return
    finally:
        if pubsub is not None:
            pubsub.close()
