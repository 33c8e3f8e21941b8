"""RouteSpec: how one route is protected, and reading ``BREAKER_ROUTES`` into specs.

A decorated view and a ``BREAKER_ROUTES`` prefix end up as the same
RouteSpec, so the hooks have one thing to follow whichever way a route was
protected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flask import Response

from ..config import config_field_names
from ..fallbacks import Fallback, as_fallback

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
CONFIG_FIELDS = frozenset(config_field_names())

Classifier = Callable[[Response], "str | bool | None"]


@dataclass(frozen=True)
class RouteSpec:
    """How one route (a decorated view or a BREAKER_ROUTES prefix) is protected."""

    name: str
    fallback: Fallback | None = None
    failure_statuses: frozenset[int] = DEFAULT_FAILURE_STATUSES
    ignore_statuses: frozenset[int] = frozenset()
    classify: Classifier | None = None
    message: str | None = None
    fallback_on_failure: bool = True


def _statuses(value: Iterable[int] | None, default: frozenset[int]) -> frozenset[int]:
    return default if value is None else frozenset(int(s) for s in value)


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


def make_spec(name: str, route: Mapping[str, Any]) -> RouteSpec:
    return RouteSpec(
        name=name,
        fallback=as_fallback(route.get("fallback")),
        failure_statuses=_statuses(route.get("failure_statuses"), DEFAULT_FAILURE_STATUSES),
        ignore_statuses=_statuses(route.get("ignore_statuses"), frozenset()),
        classify=route.get("classify"),
        message=route.get("message"),
        fallback_on_failure=bool(route.get("fallback_on_failure", True)),
    )


def prefix_matches(prefix: str, path: str) -> bool:
    """``/pay`` covers ``/pay`` and ``/pay/...`` but not ``/payment``; ``/`` covers all."""
    if prefix.endswith("/"):
        return path.startswith(prefix) or path == prefix.rstrip("/")
    return path == prefix or path.startswith(prefix + "/")


def parse_routes(value: Any) -> tuple[list[tuple[str, RouteSpec]], dict[str, dict[str, Any]]]:
    """BREAKER_ROUTES: {"/pay": "pay", "/cart": {"breaker": "cart", "fallback": ..., **config}}.

    Returns the (prefix, spec) pairs, longest prefix first so that the first
    match is the most specific, and the breaker configs the prefixes declare.
    """
    if value is None:
        return [], {}
    if not isinstance(value, Mapping):
        raise TypeError("BREAKER_ROUTES must map path prefixes to breaker names or dicts")
    routes: list[tuple[str, RouteSpec]] = []
    configs: dict[str, dict[str, Any]] = {}
    for prefix, target in value.items():
        if not isinstance(prefix, str) or not prefix.startswith("/"):
            raise ValueError(f"BREAKER_ROUTES: a prefix must start with '/' (got {prefix!r})")
        where = f"BREAKER_ROUTES[{prefix!r}]"
        route: dict[str, Any]
        config: dict[str, Any]
        if isinstance(target, str):
            route, config = {"breaker": target}, {}
        elif isinstance(target, Mapping):
            route, config = split_options(target, where)
            if not isinstance(route.get("breaker"), str):
                raise ValueError(f"{where}: needs 'breaker': NAME")
        else:
            raise TypeError(f"{where}: give a breaker name or a dict")
        name = route["breaker"]
        if config:  # a bare name uses the breaker; fields configure it
            if configs.get(name, config) != config:
                raise ValueError(f"{where}: breaker {name!r} is configured differently by another prefix")
            configs[name] = config
        routes.append((prefix, make_spec(name, route)))
    routes.sort(key=lambda item: len(item[0]), reverse=True)  # longest prefix wins
    return routes, configs
