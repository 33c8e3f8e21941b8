"""The options of an HTTP client integration (breaker_redis.requests'
adapter, breaker_redis.httpx's transports), checked when it is built, and
what they decide for each request: its breaker (one per upstream host by
default, breaker_redis/web/hosts.py; a group member's from its group) and
how its response is judged (``http_policy.judge``, as the server-side
integrations judge a route's). A failing response whose service said when to
come back (``Retry-After``) keeps the breaker open at least that long, for
every worker (``Breaker.hold_open``). A header a service sent is read by
``parsed_header`` alone, which never raises: a malformed one is ignored,
never the reason a caller loses the response. No HTTP client is imported here.
"""

from __future__ import annotations

import dataclasses
import datetime
import email.utils
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from breaker_redis.base.config import BreakerConfig
from breaker_redis.web.hosts import member_name, request_name
from breaker_redis.web.http_policy import Warnings, judge
from breaker_redis.web.routes import DEFAULT_FAILURE_STATUSES as ROUTE_FAILURE_STATUSES
from breaker_redis.web.routes import RouteSpec, checked_name, route_config, status_codes

# 5xx: the service failed; 429: the service says it is overloaded. Both ask the caller to back off.
DEFAULT_FAILURE_STATUSES = ROUTE_FAILURE_STATUSES | {429}
HOSTS_KEPT = 1024  # origins whose breaker name an adapter or transport keeps
# The most a Retry-After is believed (a day: the longest open period a breaker has).
MAX_RETRY_AFTER_SECONDS = 86400.0
_DELAY_SECONDS = re.compile(r"[0-9]+")  # Retry-After: delay-seconds, ASCII digits only (RFC 9110)

NameRule = Callable[[Any], str]


H = TypeVar("H")


def parsed_header(headers: Any, name: str, parse: Callable[[str], H | None]) -> H | None:
    """A response header as ``parse`` reads it, or None when it is missing,
    undecodable or malformed. The one way the HTTP client integrations read a
    header a service sent, and it never raises: whatever bytes a service
    sends, its caller gets its response and the breaker its outcome (a header
    that cannot be read is ignored, as if it had not been sent)."""
    try:
        value = headers.get(name)
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if not isinstance(value, str):
            return None
        return parse(value)
    except Exception:
        return None


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """The seconds a ``Retry-After`` value asks to wait (delta-seconds in ASCII
    digits, or an HTTP date, one without a zone read as GMT as RFC 9110 says),
    at most MAX_RETRY_AFTER_SECONDS; None when it says nothing usable. Never
    raises: read through ``parsed_header``, but safe alone too."""
    try:
        return _retry_after(value, now)
    except Exception:  # a date past what datetime or a C long holds, or a bug: ignored, never raised
        return None


def _retry_after(value: str | None, now: float | None) -> float | None:
    if not value or not isinstance(value, str):
        return None
    value = value.strip(" \t")
    if _DELAY_SECONDS.fullmatch(value):
        seconds = float(value) if len(value) < 20 else MAX_RETRY_AFTER_SECONDS
    else:
        parsed = email.utils.parsedate_tz(value)
        if parsed is None:
            return None
        # datetime refuses what no date holds (hour 99, 31 February); no zone: GMT, as every HTTP date is
        when = datetime.datetime(*parsed[:6], tzinfo=datetime.timezone.utc).timestamp() - (parsed[9] or 0)
        seconds = when - (time.time() if now is None else now)
    if not seconds > 0:  # (not >: a NaN too)
        return None
    return min(seconds, MAX_RETRY_AFTER_SECONDS)


class Outbound:
    """The options of one adapter or transport, checked when it is built (a bad
    one is an error naming it), and the breaker and rules of each request.

    ``breakers``: a ``Breakers`` (sync) or a ``breaker_redis.asyncio.Breakers``.
    ``name``: a breaker name for every request, or ``name(request) -> str``
    (default: the request's ``host:port``). ``config``: the config of every
    host's breaker (default: the Breakers' defaults); ``configs``: per breaker
    name (or URL), a BreakerConfig or a dict of fields over ``config``.
    ``failure_statuses``, ``ignore_statuses`` and ``classify(response)`` judge a
    response as the route options do (docs/flask.md). ``honor_retry_after``:
    a failing response's Retry-After keeps an open breaker open that long.
    """

    def __init__(
        self,
        breakers: Any,
        *,
        name: str | NameRule | None,
        config: BreakerConfig | None,
        configs: Mapping[str, BreakerConfig | Mapping[str, Any]] | None,
        failure_statuses: Iterable[int] | None,
        ignore_statuses: Iterable[int] | None,
        classify: Callable[[Any], str | bool | None] | None,
        honor_retry_after: bool,
        where: str,
        groups: Iterable[Any] = (),
        asynchronous: bool = False,
    ) -> None:
        from breaker_redis.asyncio import Breakers as AsyncBreakers
        from breaker_redis.engine.breakers import Breakers

        wanted = AsyncBreakers if asynchronous else Breakers
        if not isinstance(breakers, wanted):
            kind = "breaker_redis.asyncio.Breakers" if asynchronous else "breaker_redis.Breakers"
            raise TypeError(f"{where}: breakers must be a {kind} (got {breakers!r})")
        self.breakers = breakers
        self.where = where
        if isinstance(name, str):
            self._fixed: str | None = checked_name(name, f"{where}: name")
            self._rule: NameRule | None = None
        elif name is None or callable(name):
            self._fixed, self._rule = None, name
        else:
            why = "must be a breaker name or a callable name(request)"
            raise TypeError(f"{where}: name {why} (got {name!r})")
        if config is not None and not isinstance(config, BreakerConfig):
            raise TypeError(f"{where}: config must be a BreakerConfig (got {config!r})")
        self.config = config or breakers.defaults
        self.configs = self._per_name(configs)
        if classify is not None and not callable(classify):
            raise TypeError(f"{where}: classify must be callable or None (got {classify!r})")
        if not isinstance(honor_retry_after, bool):
            raise TypeError(f"{where}: honor_retry_after must be True or False (got {honor_retry_after!r})")
        self.honor_retry_after = honor_retry_after
        self._spec = RouteSpec(
            name=where,
            failure_statuses=status_codes(
                failure_statuses, DEFAULT_FAILURE_STATUSES, where, "failure_statuses"
            ),
            ignore_statuses=status_codes(ignore_statuses, frozenset(), where, "ignore_statuses"),
            classify=classify,
        )
        self.groups = self._members(groups, asynchronous)
        self._hosts: dict[str, str] = {}  # scheme://host:port -> its breaker's name
        self._resolved: dict[str, tuple[Any, RouteSpec]] = {}
        self._warnings = Warnings()

    def _members(self, groups: Iterable[Any], asynchronous: bool) -> dict[str, Any]:
        """Each member's group (breaker_redis.groups); a member has its group's config."""
        from breaker_redis.groups import AsyncBreakerGroup, BreakerGroup

        wanted = AsyncBreakerGroup if asynchronous else BreakerGroup
        if isinstance(groups, (str, bytes, wanted)) or not isinstance(groups, Iterable):
            raise TypeError(f"{self.where}: groups must be a list of {wanted.__name__} (got {groups!r})")
        found: dict[str, Any] = {}
        for group in groups:
            if not isinstance(group, wanted):
                raise TypeError(f"{self.where}: groups must hold {wanted.__name__}s (got {group!r})")
            if group.breakers is not self.breakers:
                raise ValueError(f"{self.where}: group {group.name!r} is built on other Breakers")
            for member in group.members:
                if member in self.configs:
                    raise ValueError(
                        f"{self.where}: {member!r} has a config in configs and in group "
                        f"{group.name!r}: a member's config is its group's"
                    )
                found[member] = group
        return found

    def _per_name(
        self, configs: Mapping[str, BreakerConfig | Mapping[str, Any]] | None
    ) -> dict[str, BreakerConfig]:
        if configs is None:
            return {}
        if not isinstance(configs, Mapping):
            raise TypeError(f"{self.where}: configs must map breaker names (or URLs) to configs")
        found: dict[str, BreakerConfig] = {}
        for key, value in configs.items():
            where = f"{self.where}: configs[{key!r}]"
            if not isinstance(key, str):
                raise TypeError(f"{where}: the key must be a breaker name or a URL")
            name = checked_name(key, where, member_name)
            if isinstance(value, BreakerConfig):
                found[name] = value
            elif isinstance(value, Mapping):
                found[name] = route_config(self.config, value, where)
            else:
                raise TypeError(f"{where}: give a BreakerConfig or a dict of its fields (got {value!r})")
        return found

    def name_of(self, request: Any, url: str) -> str:
        if self._fixed is not None:
            return self._fixed
        if self._rule is None:
            end = url.find("/", url.find("//") + 2)
            origin = url if end < 0 else url[:end]  # scheme://host:port, the part host_name reads
            name = self._hosts.get(origin)
            if name is None:
                if len(self._hosts) >= HOSTS_KEPT:
                    self._hosts.clear()
                name = self._hosts[origin] = request_name(origin)
            return name
        return checked_name(self._rule(request), f"{self.where}: name(request)")

    def resolve(self, request: Any, url: str) -> tuple[Any, RouteSpec]:
        """The breaker of this request (built on first use, no I/O) and how its responses are judged."""
        name = self.name_of(request, url)
        found = self._resolved.get(name)
        if found is None:
            group = self.groups.get(name)
            if group is not None:
                breaker = group.breaker(name)
            else:
                breaker = self.breakers.get(name, self.configs.get(name, self.config))
            found = self._resolved[name] = (breaker, dataclasses.replace(self._spec, name=name))
        return found

    def group_due(self, name: str) -> Any:
        """The group of this breaker if it has something to settle (breaker_redis.groups), else None."""
        group = self.groups.get(name)
        return group if group is not None and group.due else None

    def judge(self, spec: RouteSpec, status: int, response: Any) -> str:
        return judge(spec, status, response, None, self._warnings.warn)

    def warn(self, name: str, message: str, *, traceback: bool = True) -> None:
        self._warnings.warn(name, message, traceback=traceback)

    def hold_for(self, breaker: Any, outcome: str, response: Any) -> float | None:
        """How long to keep the breaker open after this outcome (None: nothing to do):
        the Retry-After of a failing response, once the breaker is open."""
        if outcome != "failure" or not self.honor_retry_after:
            return None
        seconds = parsed_header(response.headers, "Retry-After", retry_after_seconds)
        if seconds is None:
            return None
        known = breaker.known
        return seconds if known is not None and known.state == "open" and not known.forced else None


class OutboundClient:
    """What an adapter or a transport (breaker_redis.requests, breaker_redis.httpx)
    takes, checked when it is built (Outbound, named after the class), then the
    client library's own options, which ``_attach`` hands to its base."""

    _asynchronous = False

    def __init__(
        self,
        breakers: Any,
        *args: Any,
        name: str | NameRule | None = None,
        config: BreakerConfig | None = None,
        configs: Mapping[str, BreakerConfig | Mapping[str, Any]] | None = None,
        failure_statuses: Iterable[int] | None = None,
        ignore_statuses: Iterable[int] | None = None,
        classify: Callable[[Any], str | bool | None] | None = None,
        honor_retry_after: bool = True,
        groups: Iterable[Any] = (),
        **options: Any,
    ) -> None:
        self.outbound = Outbound(
            breakers,
            name=name,
            config=config,
            configs=configs,
            failure_statuses=failure_statuses,
            ignore_statuses=ignore_statuses,
            classify=classify,
            honor_retry_after=honor_retry_after,
            where=type(self).__name__,
            groups=groups,
            asynchronous=self._asynchronous,
        )
        self._attach(*args, **options)

    def _attach(self, *args: Any, **options: Any) -> None:
        raise NotImplementedError
