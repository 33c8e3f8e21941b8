"""The operator's switches: ``open``, ``close``, ``auto``, ``reset`` and ``config``
(live overrides), each the admin or configure script a Breaker runs, for every worker;
and ``release``, a breaker group member's grant given back by hand."""

from __future__ import annotations

from collections.abc import Iterable

import click

from breaker_redis.base.config import BreakerConfig, checked_changes
from breaker_redis.base.names import validate_name
from breaker_redis.groups import release_grant
from breaker_redis.ops.cli.formatting import overrides_text, state_label
from breaker_redis.ops.cli.group import Failed, Invalid, Target, main, pass_target, valid_name

SWITCHES = {
    "open": ("force_open", "Force NAME open.\n\nEvery worker denies every call until `auto` or `reset`."),
    "close": ("force_closed", "Force NAME closed.\n\nEvery call is admitted and counted; it never trips."),
    "auto": ("clear_force", "Clear the force on NAME.\n\nBack to the rules: closed with a clean window."),
    "reset": ("reset", "Reset NAME.\n\nClosed, clean window, no backoff or leases, force cleared."),
}
_CREATE_HELP = "Act on a name not known in Redis yet (it is added to the listing)."


def _switch(command: str, method: str, help_text: str) -> click.Command:
    @click.argument("name")
    @click.option("--create", is_flag=True, help=_CREATE_HELP)
    @pass_target
    def switch(target: Target, name: str, create: bool) -> None:
        target.require(name, create)
        unforced = method == "clear_force" and not target.snapshot(name)["forced"]
        getattr(target.breakers().get(name), method)()
        after = target.snapshot(name)
        note = " (it was not forced: unchanged)" if unforced else ""
        click.echo(f"{name}: {state_label(after)}{note}")

    switch.__doc__ = help_text + "\n\nEvery worker applies it before its next call. An unknown NAME exits 1."
    return main.command(name=command)(switch)


for _command, (_method, _help) in SWITCHES.items():
    _switch(_command, _method, _help)


@main.command("release")
@click.argument("group")
@click.argument("member")
@pass_target
def release_command(target: Target, group: str, member: str) -> None:
    """Give MEMBER's grant in breaker group GROUP back, by hand.

    MEMBER is closed first if it is open or half-open (transition cause
    `released`), its grant is revoked in its own keys, then GROUP forgets it, so
    another member may open in its place. A member that closes, or is reset,
    gives its grant back by itself; this is for one the group's workers no longer
    look after. An unknown GROUP or MEMBER exits 1, an invalid name 2.
    """
    valid_name(group)
    target.require(member)
    if group not in target.group_names():
        raise Failed(f"unknown breaker group {group!r} under prefix {target.prefix!r} at {target.where}")
    released = release_grant(target.breakers(), group, member)
    after = target.snapshot(member)
    outcome = f"its grant in group {group} released" if released else f"group {group} listed no grant for it"
    click.echo(f"{member}: {state_label(after)}; {outcome}")


# -- config ----------------------------------------------------------------------


def _parse_settings(settings: Iterable[str], unset: Iterable[str]) -> dict[str, str | None]:
    changes: dict[str, str | None] = {}
    for item in settings:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="KEY=VALUE")
        if not value:
            raise click.BadParameter(f"{item!r} has no value; --unset {key} removes an override")
        if key in changes:
            raise click.BadParameter(f"{key} is given twice", param_hint="KEY=VALUE")
        changes[key] = value
    for key in unset:
        if key in changes:
            raise click.BadParameter(f"{key} is both set and unset", param_hint="--unset")
        changes[key] = None
    return changes


@main.command("config")
@click.argument("name")
@click.argument("settings", nargs=-1, metavar="[KEY=VALUE]...")
@click.option("--unset", multiple=True, metavar="KEY", help="Remove a live override (repeatable).")
@click.option("--create", is_flag=True, help=_CREATE_HELP)
@pass_target
def config_command(
    target: Target, name: str, settings: tuple[str, ...], unset: tuple[str, ...], create: bool
) -> None:
    """Write (or print) live config overrides of NAME.

    KEY is a BreakerConfig field; every worker applies the overrides at its
    next call. Without KEY=VALUE or --unset, print the overrides in force.

    Values are checked with BreakerConfig's rules, together with the overrides
    already in force: a bad one exits 2 naming the field, and nothing is
    written. An unknown NAME exits 1.
    """
    changes = _parse_settings(settings, unset)
    setting = {key: value for key, value in changes.items() if value is not None}
    try:  # before anything reaches Redis
        validate_name(name)
        checked_changes(BreakerConfig(), changes)
    except (ValueError, TypeError) as exc:
        raise Invalid(str(exc)) from None
    target.require(name, create)
    current = target.overrides(name)
    if not changes:
        click.echo(f"{name}: {overrides_text(current)}")
        return
    merged = {key: value for key, value in current.items() if _valid_alone(key, value)}
    merged = {key: value for key, value in {**merged, **setting}.items() if key not in unset}
    try:
        BreakerConfig().with_overrides(merged)
        in_force = target.breakers().configure(name, **changes)
    except (ValueError, TypeError) as exc:
        raise Invalid(f"{exc} (with the live overrides {overrides_text(merged)})") from None
    click.echo(f"{name}: {overrides_text(dict(sorted(in_force.items())))}")


def _valid_alone(key: str, value: str) -> bool:
    try:
        BreakerConfig().with_overrides({key: value})
    except (ValueError, TypeError):
        return False
    return True
