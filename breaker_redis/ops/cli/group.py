"""The ``breaker-redis`` group: its options (--url, --prefix, --timeout), the Target
the commands act on, and how a Redis error becomes a message and exit code 1.

Every command module registers itself on ``main``; ``command_group`` puts the
same commands under another group (``flask breakers``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, TypeVar

import click
import redis

from breaker_redis.base.names import validate_name, validate_prefix
from breaker_redis.ops.reader import Reader
from breaker_redis.storage.store import StoreUnavailable
from breaker_redis.url_parsing import parse as parse_url
from breaker_redis.urls import client_from_url, describe

DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_PREFIX = "breaker"
# How long the CLI waits for Redis to connect, and then for each answer: an
# operator asking about an outage must not wait 5 s to learn that Redis is
# one (a hung server accepts the connection and answers nothing). Longer than
# a worker's client (urls.py): the CLI may run far from Redis. --timeout, or
# the URL's own socket_timeout / socket_connect_timeout, set another.
TIMEOUT = 0.5

F = TypeVar("F", bound=Callable[..., Any])


class Failed(click.ClickException):
    """Exit 1: Redis unreachable, a Redis error, an unknown breaker."""

    exit_code = 1


class Invalid(click.ClickException):
    """Exit 2: a bad argument or config value; nothing was written."""

    exit_code = 2


def valid_name(name: str) -> str:
    """``name``, if it is a valid breaker name; else exit 2 saying why (Invalid)."""
    try:
        return validate_name(name)
    except ValueError as exc:
        raise Invalid(str(exc)) from None


@dataclass(eq=False)
class Target(Reader):
    """The Redis and key prefix the commands act on (a Reader), for messages too.

    ``declared``: the breakers an app declares (``flask breakers``), known
    before their first call as the app's admin endpoints know them; the
    ``breaker-redis`` command knows only what Redis knows. ``timeout``: the
    seconds its client waits for an answer, when the CLI made it. ``sleep``:
    how ``watch`` waits between refreshes and ``metrics --port`` while it
    serves (a test acts there instead).
    """

    _: KW_ONLY
    declared: Collection[str] = frozenset()
    timeout: float | None = None
    sleep: Callable[[float], None] = time.sleep
    where: str = field(init=False)  # the client's server, as messages name it

    def __post_init__(self) -> None:
        super().__post_init__()
        self.where = describe(self.client)

    def require(self, name: str, create: bool = False) -> str:
        """The name, if it is valid and known, to Redis or as declared by the app
        (or ``create``, which lists it). A switch lists a declared name itself."""
        valid_name(name)
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


def _from_env(option: str, envvar: str, default: str, help: str) -> Callable[[F], F]:
    """An option read from the environment variable an app sets too (so the CLI finds
    the app's Redis and prefix unasked), its default and its variable in --help."""
    return click.option(
        option, envvar=envvar, default=default, show_default=True, show_envvar=True, help=help
    )


@click.group(cls=MainGroup, name="breaker-redis")
@_from_env(
    "--url",
    "BREAKER_REDIS_URL",
    DEFAULT_URL,
    "Redis URL: redis://, rediss://, unix://, redis+cluster://h:p,h:p, redis+sentinel://h:p,h:p/SERVICE[/DB].",
)
@_from_env(
    "--prefix",
    "BREAKER_KEY_PREFIX",
    DEFAULT_PREFIX,
    "Key prefix of the breakers (Breakers(prefix=...), BREAKER_KEY_PREFIX in Flask).",
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
    """--timeout for both; else what the URL says, else TIMEOUT (ValueError: a bad URL, or
    memory://, a store inside one process that a command run from outside never sees)."""
    parsed = parse_url(url)
    if parsed.memory:
        raise ValueError(
            "memory:// is a store inside one process, which a command run from another "
            "never sees: give the Redis URL the app uses"
        )
    options = parsed.options
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
