"""breaker-redis: every breaker in one Redis at a glance, and an operator's switches.

    breaker-redis [--url URL] [--prefix P] COMMAND [ARGS]...   (the options may follow COMMAND too)
    flask breakers COMMAND [ARGS]...     (the same commands, on the app's Redis and prefix)

Reads go through the snapshot script (for many breakers its twin
lua/read.lua, pipelined: reader.py), so what is shown is what the workers
decide by; switches run the same admin and configure scripts as
``Breaker.force_open()`` and ``Breakers.configure()``, each followed by the
barrier round trip, so every worker (one deciding from memory too) hears of
the change before its next call.

The window is read with the bucket width and count the workers last wrote
(``bms`` and ``nb`` in the window hash): the CLI does not know the apps'
configs, and a window read with another bucket width reads as empty.

Exit codes a script can rely on: 0 done; 1 Redis unreachable, a Redis
error, or an unknown breaker (for ``show`` and the switches); 2 a usage or
validation error (nothing was written). Messages go to stderr.

This module must not import Flask: ``breaker_redis.flask`` registers the
same commands on ``flask`` with ``command_group``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

import click
import redis

from breaker_redis.engine.config import LUA_FIELDS, BreakerConfig, checked_changes, live_value
from breaker_redis.ops.reader import Reader
from breaker_redis.storage.scripts import text, validate_name, validate_prefix
from breaker_redis.storage.store import StoreUnavailable
from breaker_redis.urls import client_from_url, describe
from breaker_redis.urls import parse as parse_url

DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_PREFIX = "breaker"
# How long the CLI waits for Redis to connect, and then for each answer: an
# operator asking about an outage must not wait 5 s to learn that Redis is
# one (a hung server accepts the connection and answers nothing). Longer than
# a worker's client (urls.py): the CLI may run far from Redis. --timeout, or
# the URL's own socket_timeout / socket_connect_timeout, set another.
TIMEOUT = 0.5
TRANSITIONS_SHOWN = 10  # by `show`
HIGHLIGHT_SECONDS = 10.0  # `watch` keeps a state change highlighted this long
STATE_COLOURS = {"closed": "green", "open": "red", "half_open": "yellow"}


class Failed(click.ClickException):
    """Exit 1: Redis unreachable, a Redis error, an unknown breaker."""

    exit_code = 1


class Invalid(click.ClickException):
    """Exit 2: a bad argument or config value; nothing was written."""

    exit_code = 2


class Target(Reader):
    """The Redis and key prefix the commands act on (a Reader), for messages too.

    ``declared``: the breakers an app declares (``flask breakers``), known
    before their first call as the app's admin endpoints know them; the
    ``breaker-redis`` command knows only what Redis knows. ``timeout``: the
    seconds its client waits for an answer, when the CLI made it. ``sleep``:
    how ``watch`` waits between refreshes and ``metrics --port`` while it
    serves (a test acts there instead).
    """

    def __init__(
        self,
        client: Any,
        prefix: str,
        *,
        owns_client: bool = True,
        declared: Iterable[str] = (),
        timeout: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(client, prefix, owns_client=owns_client)
        self.where = describe(client)
        self.declared = frozenset(declared)
        self.timeout = timeout
        self.sleep = sleep

    def require(self, name: str, create: bool = False) -> str:
        """The name, if it is valid and known, to Redis or as declared by the app
        (or ``create``, which lists it). A switch lists a declared name itself."""
        try:
            validate_name(name)
        except ValueError as exc:
            raise Invalid(str(exc)) from None
        if name not in self.declared and not self.known(name):
            if not create:
                raise Failed(
                    f"unknown breaker {name!r}: no such breaker under prefix {self.prefix!r} "
                    f"at {self.where} (see `status`; --create acts on a new name)"
                )
            self.breakers().register_name(name)
        return name


pass_target = click.make_pass_decorator(Target)


class OperationsGroup(click.Group):
    """A group whose commands fail with a message and exit 1 when Redis does."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, StoreUnavailable) as exc:
            cause = exc.__cause__ if isinstance(exc, StoreUnavailable) and exc.__cause__ else exc
            raise Failed(f"cannot reach Redis at {_where(ctx)}: {cause}{_waited(ctx, cause)}") from None
        except redis.exceptions.RedisClusterException as exc:  # not a RedisError: no slot map, cluster down
            raise Failed(f"cannot reach Redis at {_where(ctx)}: {exc}") from None
        except redis.exceptions.RedisError as exc:
            raise Failed(f"Redis at {_where(ctx)} answered with an error: {exc}") from None


class MainGroup(OperationsGroup):
    """``breaker-redis``: its own options (--url, --prefix, --timeout) may also follow
    the command, as operators type them (``breaker-redis doctor --url ...``); a
    subcommand has no option of those names, so none is taken from it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, group_options_first(args, self.params))


def group_options_first(args: list[str], params: Iterable[click.Parameter]) -> list[str]:
    """``args`` with each of the group's options that have a value (``--url X``,
    ``--url=X``) moved before the command, in their order; nothing after ``--``."""
    names = {name for p in params if isinstance(p, click.Option) and not p.is_flag for name in p.opts}
    moved: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        if arg in names and i + 1 < len(args):
            moved += args[i : i + 2]
            i += 2
            continue
        if arg.split("=", 1)[0] in names and "=" in arg:
            moved.append(arg)
        else:
            rest.append(arg)
        i += 1
    return moved + rest


def _where(ctx: click.Context) -> str:
    target = ctx.find_object(Target)
    return target.where if target is not None else "?"


def _waited(ctx: click.Context, cause: BaseException) -> str:
    """For a timeout: how long the CLI waited, and how to wait longer."""
    target = ctx.find_object(Target)
    timeout = target.timeout if target is not None else None
    if timeout is None or not isinstance(cause, (redis.exceptions.TimeoutError, TimeoutError)):
        return ""
    return f" (no answer within {timeout:g} s; --timeout waits longer)"


@click.group(cls=MainGroup, name="breaker-redis")
@click.option(
    "--url",
    envvar="BREAKER_REDIS_URL",
    default=DEFAULT_URL,
    show_default=True,
    show_envvar=True,
    help="Redis URL: redis://, rediss://, unix://, redis+cluster://h:p,h:p, redis+sentinel://h:p,h:p/SERVICE[/DB].",
)
@click.option(
    "--prefix",
    envvar="BREAKER_KEY_PREFIX",
    default=DEFAULT_PREFIX,
    show_default=True,
    show_envvar=True,
    help="Key prefix of the breakers (Breakers(prefix=...), BREAKER_KEY_PREFIX in Flask).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help=f"Seconds to wait for Redis to connect, and then for each answer [default: {TIMEOUT:g}, "
    "or the URL's socket_connect_timeout / socket_timeout].",
)
@click.pass_context
def main(ctx: click.Context, url: str, prefix: str, timeout: float | None) -> None:
    """Show and switch the circuit breakers kept in one Redis, for every worker at once.

    The options may also follow the command (breaker-redis doctor --url URL).

    Exit codes: 0 done; 1 Redis unreachable, a Redis error or an unknown
    breaker; 2 a usage or validation error (nothing was written).
    """
    try:
        validate_prefix(prefix)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--prefix") from None
    try:
        timeouts = _timeouts(url, timeout)
        client = client_from_url(url, **timeouts)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--url") from None
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:  # a cluster
        # client reads its slot map as it is made
        raise Failed(f"cannot reach Redis at {url.rsplit('@', 1)[-1]}: {exc}") from None
    ctx.obj = target = Target(client, prefix, timeout=timeouts["socket_timeout"])
    ctx.call_on_close(target.close)


def _timeouts(url: str, timeout: float | None) -> dict[str, float]:
    """--timeout for both; else what the URL says, else TIMEOUT (ValueError: a bad URL)."""
    options = parse_url(url).options
    return {
        key: timeout if timeout is not None else float(options.get(key, TIMEOUT))
        for key in ("socket_connect_timeout", "socket_timeout")
    }


def command_group(
    name: str,
    target: Callable[[], Target],
    *,
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
    help: str | None = None,
) -> click.Group:
    """The commands of ``breaker-redis`` under another group, with ``target``
    deciding where they act (``flask breakers`` uses the app's Redis and prefix);
    ``wrap`` wraps the group's callback (Flask's ``with_appcontext``)."""

    @click.pass_context
    def callback(ctx: click.Context) -> None:
        ctx.obj = made = target()
        ctx.call_on_close(made.close)

    return OperationsGroup(
        name, commands=dict(main.commands), callback=wrap(callback) if wrap else callback, help=help
    )


# -- formatting -------------------------------------------------------------------


def state_label(snapshot: Mapping[str, Any]) -> str:
    return f"{snapshot['state']} (forced)" if snapshot.get("forced") else str(snapshot["state"])


def _rate(failures: int, calls: int) -> str:
    return f"{100 * failures / calls:.1f}%" if calls else "-"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _clock(ms: int | str | float | None) -> str:
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
            state_label(s) + (f", {len(s['isolated'])} isolated" if s.get("isolated") else ""),
            f"{s['window_failures']}/{s['window_calls']}",
            _rate(s["window_failures"], s["window_calls"]),
            str(s["calls"]),
            str(s["rejected"]),
            str(s["trips"]),
            _seconds(s["retry_after"]),
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
    return (f"group {group['name']}: {len(group['open'])} of {len(group['members'])} members open "
            f"(at most {group['cap']}, max_open_fraction {group['max_open_fraction']:g}): {opened}; "
            f"{group['held']} trips held back at the cap")


def transition_line(event: Mapping[str, Any]) -> str:
    """One transition, from the events list or from a pub/sub message."""
    line = f"{_clock(event.get('at'))}  {event.get('name')}  {event.get('from')} -> {event.get('to')}"
    line += f"  cause={event.get('cause')} epoch={event.get('epoch')}"
    if event.get("forced"):
        line += f" forced={event['forced']}"
    open_until = int(float(event.get("open_until") or 0))
    if event.get("to") == "open" and open_until and not event.get("forced"):
        line += f" open_until={_clock(open_until)}"
    return line


def _overrides_text(overrides: Mapping[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in overrides.items()) or "no live overrides"


# -- status and watch ------------------------------------------------------------


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


# -- show ------------------------------------------------------------------------


def _scripts_apply(key: str, value: str) -> bool:
    """Whether the scripts apply this stored override (lua/_lib.lua, apply_overrides)."""
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
        state += ", until cleared" if s["forced"] else f", retry after {_seconds(s['retry_after'])}"
    if shape is None:
        window_shape = "no window written yet"
    else:
        window_shape = f"{shape[0] * shape[1] / 1000:g} s in {shape[1]} buckets, as the workers last wrote it"
    lines = [
        f"{name}  ({target.where}, prefix {target.prefix!r})",
        f"  state        {state}",
        f"  epoch        {s['epoch']}",
        f"  window       {s['window_failures']} failures / {s['window_calls']} calls "
        f"({_rate(s['window_failures'], s['window_calls'])}), {s['window_slow']} slow; {window_shape}",
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
    """min_reporters > 1 (README, "One sick host"): the reporters failing in the window, the
    isolated ones and until when."""
    quorum = (s.get("config") or {}).get("min_reporters", 1)
    if quorum <= 1 and not s["reporters"]:
        return []
    seen = [
        f"{name} ({each['failures']} failures"
        + (f", isolated until {_clock(each['isolated_until_ms'])})" if each["isolated_until_ms"] else ")")
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


# -- switches --------------------------------------------------------------------

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
        click.echo(f"{name}: {_overrides_text(current)}")
        return
    merged = {key: value for key, value in current.items() if _valid_alone(key, value)}
    merged = {key: value for key, value in {**merged, **setting}.items() if key not in unset}
    try:
        BreakerConfig().with_overrides(merged)
        in_force = target.breakers().configure(name, **changes)
    except (ValueError, TypeError) as exc:
        raise Invalid(f"{exc} (with the live overrides {_overrides_text(merged)})") from None
    click.echo(f"{name}: {_overrides_text(dict(sorted(in_force.items())))}")


def _valid_alone(key: str, value: str) -> bool:
    try:
        BreakerConfig().with_overrides({key: value})
    except (ValueError, TypeError):
        return False
    return True


# -- doctor ----------------------------------------------------------------------

_DOCTOR_COLOURS = {"OK": "green", "NOTE": "cyan", "SKIP": "cyan", "WARN": "yellow", "PROBLEM": "red"}


@main.command()
@pass_target
def doctor(target: Target) -> None:
    """Check the Redis the breakers use, before the users find out.

    Server version and Redis Functions, topology (standalone, replica,
    Sentinel, Cluster), maxmemory-policy, the ACL permissions the engine needs
    (each command sent once; only PREFIX:health and the names set are written,
    and left as they were), pub/sub ordering, round-trip latency, and the keys
    with their memory per breaker.

    The report goes to stdout, a line per check. Exit codes: 0 nothing wrong;
    1 a PROBLEM line for each problem, saying what to do (a Redis that cannot
    be reached is one line).
    """
    from breaker_redis.ops.doctor import diagnose

    report = diagnose(target.client, target.prefix, target.where)
    for line in report.lines(lambda status, word: click.style(word, fg=_DOCTOR_COLOURS.get(status))):
        click.echo(line)
    if report.problems:
        raise click.exceptions.Exit(1)


# -- events ----------------------------------------------------------------------


def event_line(message: Mapping[str, Any], target: Target, verbose: bool) -> str | None:
    """A pub/sub message as a line (None: not shown)."""
    kind, name = message.get("kind"), str(message.get("name"))
    if kind == "transition":
        return transition_line(message)
    if kind == "config":
        overrides = target.overrides(name)
        return f"{_clock(message.get('at'))}  {name}  config written: {_overrides_text(overrides)}"
    if kind == "armed":
        if not verbose:
            return None
        return f"{_clock(message.get('at'))}  {name}  armed: every outcome is sent at once"
    rest = {k: v for k, v in message.items() if k not in ("name", "kind", "at")}
    return f"{_clock(message.get('at'))}  {name}  {kind} {json.dumps(rest, sort_keys=True)}"


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


@main.command()
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve the exposition at http://HOST:PORT/metrics until Ctrl-C, instead of printing it once.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to serve on, with --port.")
@pass_target
def metrics(target: Target, port: int | None, host: str) -> None:
    """Prometheus metrics of every breaker, read from Redis (all workers of all hosts).

    Names: breaker_redis_state, _forced, _calls_total, _slow_calls_total,
    _rejected_total, _trips_total, _window_calls, _window_failures,
    _retry_after_seconds (see breaker_redis.metrics).
    """
    from prometheus_client import CollectorRegistry, start_http_server

    from breaker_redis.metrics import BreakerCollector, exposition

    target.names()  # Redis unreachable: exit 1 now, not an exposition saying breaker_redis_up 0
    if port is None:
        click.echo(exposition(target.client, target.prefix).decode(), nl=False)
        return
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BreakerCollector(target.client, target.prefix))
    server, _ = start_http_server(port, addr=host, registry=registry)
    click.echo(f"serving http://{host}:{port}/metrics (Ctrl-C stops)")
    try:
        while True:
            target.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()


if __name__ == "__main__":
    main(prog_name="breaker-redis")
