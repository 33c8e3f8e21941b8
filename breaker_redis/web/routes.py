"""The routes every HTTP integration guards: how a path prefix names a breaker
and its options, the table a request's path is looked up in, and what the
guards of one request share.

The shape is the Flask extension's ``BREAKER_ROUTES``, so a deployment that
mixes frameworks writes its routes once. How a guarded request is judged and
answered is breaker_redis/web/http_policy.py. No web framework is imported here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypedDict, TypeVar

from breaker_redis.base.config import BreakerConfig, config_field_names
from breaker_redis.base.names import validate_name
from breaker_redis.fallbacks import Fallback, as_fallback, cached, chain, function, static

T = TypeVar("T")

DEFAULT_FAILURE_STATUSES = frozenset(range(500, 600))
ROUTE_OPTIONS = (
    "breaker",
    "fallback",
    "failure_statuses",
    "ignore_statuses",
    "classify",
    "message",
    "fallback_on_failure",
)
# CORS preflights never reach a service: never refused, never counted (as in Flask).
UNPROTECTED_METHODS = frozenset({"OPTIONS"})
CONFIG_FIELDS = frozenset(config_field_names())

# classify(info) -> "success" / "failure" / "ignored", True / False, or None
Classifier = Callable[[Any], "str | bool | None"]


class GuardOptions(TypedDict, total=False):
    """The route options that judge a guarded request's outcome and word its refusal,
    as keyword arguments (FastAPI's BreakerGuard); make_spec checks each."""

    failure_statuses: Iterable[int] | None
    ignore_statuses: Iterable[int] | None
    classify: Classifier | None
    message: str | None


# In the ASGI scope / WSGI environ of a guarded request: what its guards did (RequestGuards).
GUARDS_KEY = "breaker_redis.guards"


class RequestGuards:
    """What the guards of one request did, seen by every guard nested inside.

    A route may be guarded at two layers: the ASGI middleware and a FastAPI
    dependency, or the WSGI middleware around a Flask app that protects the
    route too. The outermost guard of a breaker takes the request's one
    permit and records its one outcome; an inner guard of the same breaker
    (the same key prefix and name) finds that permit here and neither asks
    nor records. A guard of another breaker that refuses the request notes it
    here, so that the outer guards count the request as ignored: their
    service was not asked. One object per request, made by the first guard
    that admits it and shared by the scope copies of the guards inside.
    """

    __slots__ = ("permits", "refused")

    permits: dict[str, Any]  # guard_id -> the permit an outer guard holds
    refused: str | None  # the breaker of a guard that refused the request inside

    # Made by holding(), not by an __init__: a class whose __init__ is Python code
    # costs a frame of the interpreter's own to make, on every protected request.


def holding(guard: str, permit: Any) -> RequestGuards:
    """A request's guards, as its first guard makes them: holding its permit."""
    guards = RequestGuards()
    guards.permits, guards.refused = {guard: permit}, None
    return guards


def guard_id(prefix: str, name: str) -> str:
    """Who a permit belongs to in RequestGuards: the breaker's keys, so the same
    breaker for every Breakers on them. A guard computes it once, at start-up."""
    return f"{prefix}:{{{name}}}"


def request_guards(carrier: Mapping[str, Any]) -> RequestGuards | None:
    """What the guards of this request did so far, or None: no guard admitted it yet."""
    guards = carrier.get(GUARDS_KEY)
    return guards if isinstance(guards, RequestGuards) else None


def held(carrier: Mapping[str, Any], guard: str) -> Any:
    """The permit an outer guard holds for the breaker ``guard`` (a guard_id) in this request, or None."""
    guards = carrier.get(GUARDS_KEY)
    return guards.permits.get(guard) if isinstance(guards, RequestGuards) else None


def hold(carrier: MutableMapping[str, Any], guard: str, permit: Any) -> RequestGuards:
    """Note the permit this guard took, for the guards nested inside it. Returns
    the request's RequestGuards, where this guard finds a refusal inside when
    it judges the request (without looking it up in the carrier again)."""
    guards = carrier.get(GUARDS_KEY)
    if isinstance(guards, RequestGuards):
        guards.permits[guard] = permit
    else:
        guards = carrier[GUARDS_KEY] = holding(guard, permit)
    return guards


def note_refusal(carrier: Mapping[str, Any], name: str) -> None:
    """A guard refused the request: the outer guards (if any) count it as ignored."""
    guards = request_guards(carrier)
    if guards is not None and guards.refused is None:
        guards.refused = name


@dataclass(frozen=True)
class RouteSpec:
    """How one path prefix is protected: the Flask extension's RouteSpec, without Flask.

    ``classify(info)`` (the integration's ResponseInfo) returns "success" / "failure" / "ignored",
    True (failure) / False (success), or None to let the status lists decide.
    """

    name: str
    fallback: Fallback | None = None
    failure_statuses: frozenset[int] = DEFAULT_FAILURE_STATUSES
    ignore_statuses: frozenset[int] = frozenset()
    classify: Classifier | None = None
    message: str | None = None
    fallback_on_failure: bool = True


def prefix_matches(prefix: str, path: str) -> bool:
    """``/pay`` covers ``/pay`` and ``/pay/...`` but not ``/payment``; ``/`` covers all."""
    if prefix.endswith("/"):
        return path.startswith(prefix) or path == prefix.rstrip("/")
    return path == prefix or path.startswith(prefix + "/")


class RouteTable(Generic[T]):
    """Path prefixes, longest first, each with what guards it (a RouteSpec, or
    an integration's own record of one).

    A prefix covers only paths that start with its stem (the prefix less its
    trailing slashes: ``/pay/`` covers ``/pay`` and ``/pay/...``), so one
    ``str.startswith`` over every stem tells most paths no route covers them:
    the price every unprotected request pays. Only a path that starts with a
    stem is compared prefix by prefix, longest first.
    """

    __slots__ = ("entry", "routes", "stems")

    def __init__(self, routes: Iterable[tuple[str, T]]) -> None:
        self.routes = list(routes)
        self.stems = tuple(sorted({prefix.rstrip("/") for prefix, _ in self.routes}))
        self.entry = entry_stems(self.stems)

    def match(self, path: str) -> T | None:
        """What guards the longest prefix covering path, or None."""
        if not path.startswith(self.stems):
            return None
        for prefix, value in self.routes:
            if prefix_matches(prefix, path):
                return value
        return None


def entry_stems(stems: tuple[str, ...]) -> tuple[str, ...]:
    """What a path as a server hands it over starts with when a route may cover
    it: a stem as it is (an ASGI path, a PATH_INFO the server decoded), as UTF-8
    read as latin-1 (WSGI's PATH_INFO), or ``//`` (which a middleware's
    request_path normalises). A path that starts with "/" and with none of these
    is covered by no route: a middleware tells so with one ``str.startswith``,
    without decoding the path."""
    if any("\ufffd" in stem for stem in stems):
        return ("",)  # a stem a bad byte could decode to: every path goes the long way
    found = {"//"}
    for stem in stems:
        found.update((stem, stem.encode("utf-8").decode("latin-1")))
    return tuple(sorted(found))


def status_codes(value: Any, default: frozenset[int], where: str, option: str) -> frozenset[int]:
    """``failure_statuses`` / ``ignore_statuses`` checked: a collection of int
    codes from 100 to 599 (a bare ``502`` is refused, not iterated); None: ``default``."""
    if value is None:
        return default
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise TypeError(
            f"{where}: {option} must be a collection of HTTP status codes, "
            f"such as {{502, 503}} or range(500, 600) (got {value!r})"
        )
    codes = set()
    for code in value:
        if isinstance(code, bool) or not isinstance(code, int):
            raise TypeError(f"{where}: {option} must hold int status codes (got {code!r} in {value!r})")
        if not 100 <= code <= 599:
            raise ValueError(f"{where}: {option} holds {code}, not an HTTP status code (100-599)")
        codes.add(int(code))
    return frozenset(codes)


_FACTORIES = {"static": static, "cached": cached, "function": function, "chain": chain}


def _fallback(value: Any, where: str) -> Fallback | None:
    """as_fallback, but a factory or class handed over uncalled (``fallback=cached``
    for ``cached()``) is an error now, not a fallback that fails at every refusal."""
    for factory_name, factory in _FACTORIES.items():
        if value is factory:
            raise TypeError(f"{where}: fallback={factory_name} must be called: fallback={factory_name}(...)")
    if isinstance(value, type) and issubclass(value, Fallback):
        cls = value.__name__
        raise TypeError(f"{where}: fallback={cls} is a class: give an instance, fallback={cls}(...)")
    try:
        return as_fallback(value)
    except (TypeError, ValueError) as exc:
        why = f"fallback {value!r} is not a Fallback, a callable or a body"
        raise type(exc)(f"{where}: {why}: {exc}") from None


def checked_name(name: Any, where: str, check: Callable[[Any], str] = validate_name) -> str:
    """A breaker name checked where it is written (a route, a decorator, an option),
    not at its first request: an error names ``where``. ``check``: validate_name,
    or a rule that also reads a URL as its host's name (web/hosts.py)."""
    try:
        return check(name)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}: {exc}") from None


def make_spec(name: str, route: Mapping[str, Any], where: str | None = None) -> RouteSpec:
    """A RouteSpec from route options, each checked: a wrong type or value is an
    error naming ``where`` (the route, e.g. ``routes['/pay']``) and the option."""
    where = where or f"route {name!r}"
    checked_name(name, where)
    classify = route.get("classify")
    if classify is not None and not callable(classify):
        raise TypeError(f"{where}: classify must be callable or None (got {classify!r})")
    message = route.get("message")
    if message is not None and not isinstance(message, str):
        raise TypeError(f"{where}: message must be a str or None (got {message!r})")
    on_failure = route.get("fallback_on_failure", True)
    if not isinstance(on_failure, bool):
        raise TypeError(f"{where}: fallback_on_failure must be True or False (got {on_failure!r})")
    return RouteSpec(
        name=name,
        fallback=_fallback(route.get("fallback"), where),
        failure_statuses=status_codes(
            route.get("failure_statuses"), DEFAULT_FAILURE_STATUSES, where, "failure_statuses"
        ),
        ignore_statuses=status_codes(route.get("ignore_statuses"), frozenset(), where, "ignore_statuses"),
        classify=classify,
        message=message,
        fallback_on_failure=on_failure,
    )


def route_config(defaults: BreakerConfig, config: Mapping[str, Any], where: str) -> BreakerConfig:
    """A route's BreakerConfig fields over the defaults; a bad one is an error naming the route."""
    try:
        return dataclasses.replace(defaults, **config)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}: {exc}") from None


def split_options(options: Mapping[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(route options, BreakerConfig fields); anything else is a clear error."""
    route: dict[str, Any] = {}
    config: dict[str, Any] = {}
    for key, value in options.items():
        if key in ROUTE_OPTIONS:
            route[key] = value
        elif key in CONFIG_FIELDS:
            config[key] = value
        else:
            raise ValueError(
                f"{where}: unknown option {key!r} (route options: {', '.join(ROUTE_OPTIONS)}; "
                f"or a BreakerConfig field)"
            )
    return route, config


def parse_routes(
    value: Any, setting: str = "routes", defaults: BreakerConfig | None = None
) -> tuple[list[tuple[str, RouteSpec]], dict[str, dict[str, Any]]]:
    """``{"/pay": "pay", "/cart": {"breaker": "cart", "fallback": ..., **config}, "/x": RouteSpec(...)}``.

    The same shape as the Flask extension's ``BREAKER_ROUTES`` (plus
    RouteSpec objects, or anything with RouteSpec's attributes). Returns the
    (prefix, spec) pairs, longest prefix first so that the first match is
    the most specific, and the BreakerConfig fields each breaker was given.
    ``setting`` names the routes in error messages (``BREAKER_ROUTES`` for Flask);
    with ``defaults`` each route's BreakerConfig fields are checked over them
    here, so that a bad one names its route.
    """
    if value is None:
        return [], {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{setting} must map path prefixes to breaker names, dicts or RouteSpecs")
    routes: list[tuple[str, RouteSpec]] = []
    configs: dict[str, dict[str, Any]] = {}
    for prefix, target in value.items():
        if not isinstance(prefix, str) or not prefix.startswith("/"):
            raise ValueError(f"{setting}: a prefix must start with '/' (got {prefix!r})")
        where = f"{setting}[{prefix!r}]"
        config: dict[str, Any] = {}
        if isinstance(target, str):
            spec = make_spec(target, {}, where)
        elif isinstance(target, Mapping):
            route, config = split_options(target, where)
            if not isinstance(route.get("breaker"), str):
                raise ValueError(f"{where}: needs 'breaker': NAME (got {route.get('breaker')!r})")
            spec = make_spec(route["breaker"], route, where)
        elif isinstance(getattr(target, "name", None), str):  # a RouteSpec, ours or Flask's
            options = {k: getattr(target, k) for k in ROUTE_OPTIONS[1:] if hasattr(target, k)}
            spec = make_spec(target.name, options, where)
        else:
            raise TypeError(f"{where}: give a breaker name, a dict or a RouteSpec (got {target!r})")
        if config and defaults is not None:
            route_config(defaults, config, where)
        if config:  # a bare name uses the breaker as configured elsewhere; fields configure it
            if configs.get(spec.name, config) != config:
                raise ValueError(
                    f"{where}: breaker {spec.name!r} is configured differently by another prefix"
                )
            configs[spec.name] = config
        routes.append((prefix, spec))
    routes.sort(key=lambda item: len(item[0]), reverse=True)  # longest prefix wins
    return routes, configs


class Route(NamedTuple):
    """A route as a middleware's request meets it: its spec, its Breaker (sync or
    asyncio) and its guard_id, found at start-up."""

    spec: RouteSpec
    breaker: Any
    guard: str


def route_table(
    breakers: Any, routes: list[tuple[str, RouteSpec]], configs: Mapping[str, Mapping[str, Any]]
) -> tuple[dict[str, Any], RouteTable[Route]]:
    """The Breaker of every route's name (route_breakers) and the routes as a RouteTable."""
    resolved = route_breakers(breakers, routes, configs)
    table = RouteTable(
        (prefix, Route(spec, resolved[spec.name], guard_id(breakers.prefix, spec.name)))
        for prefix, spec in routes
    )
    return resolved, table


def route_to_ask(route: Route | None, method: Any, carrier: Mapping[str, Any]) -> Route | None:
    """The route whose breaker a middleware asks for a request, or None: no route
    covers the path (``route``: what the table matched), the method is never
    guarded (OPTIONS), or an outer guard of the same breaker holds the
    request's permit (it asks and records)."""
    if route is None or (method != "GET" and str(method).upper() in UNPROTECTED_METHODS):
        return None
    guards = carrier.get(GUARDS_KEY)  # held(), inline: this runs on every request a route covers
    if isinstance(guards, RequestGuards) and guards.permits.get(route.guard) is not None:
        return None
    return route


def route_breakers(
    breakers: Any, routes: list[tuple[str, RouteSpec]], configs: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The Breaker (sync or asyncio) of every route's name, built with the fields
    its routes give it over the Breakers' defaults: no I/O, so at start-up."""
    resolved: dict[str, Any] = {}
    for _prefix, spec in routes:
        if spec.name not in resolved:
            config = configs.get(spec.name)
            built = dataclasses.replace(breakers.defaults, **config) if config else None
            resolved[spec.name] = breakers.get(spec.name, built)
    return resolved
