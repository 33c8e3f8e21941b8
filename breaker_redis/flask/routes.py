"""RouteSpec: how one route is protected, and reading ``BREAKER_ROUTES`` into specs.

A decorated view and a ``BREAKER_ROUTES`` prefix end up as the same
RouteSpec, so the hooks have one thing to follow whichever way a route was
protected. The specs and their parsing are the core's (breaker_redis/web/routes.py),
shared with the WSGI and ASGI middlewares: one route format everywhere.
"""

from __future__ import annotations

from typing import Any

from breaker_redis.web.routes import CONFIG_FIELDS as CONFIG_FIELDS
from breaker_redis.web.routes import DEFAULT_FAILURE_STATUSES as DEFAULT_FAILURE_STATUSES
from breaker_redis.web.routes import ROUTE_OPTIONS as ROUTE_OPTIONS
from breaker_redis.web.routes import Classifier as Classifier
from breaker_redis.web.routes import RouteSpec as RouteSpec
from breaker_redis.web.routes import make_spec as make_spec
from breaker_redis.web.routes import parse_routes as _parse_routes
from breaker_redis.web.routes import prefix_matches as prefix_matches
from breaker_redis.web.routes import split_options as split_options


def parse_routes(value: Any) -> tuple[list[tuple[str, RouteSpec]], dict[str, dict[str, Any]]]:
    """BREAKER_ROUTES: {"/pay": "pay", "/cart": {"breaker": "cart", "fallback": ..., **config}}."""
    return _parse_routes(value, "BREAKER_ROUTES")
