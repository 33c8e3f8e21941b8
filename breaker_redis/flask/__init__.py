"""FlaskBreakers: circuit breakers for Flask routes and for the calls views make.

A route is protected by a decorator (``@breakers.protect("pay")``) or by a
``BREAKER_ROUTES`` prefix (an OpenResty ``location`` for apps that do not
want decorators); either way a request walks through three steps (a
``before_request`` hook, an ``after_this_request`` function, the
``wsgi_app`` wrapper) that ask the breaker, classify the response and record the outcome, serving
the route's fallback or a friendly 503 when the breaker refuses. Calls a
view makes to other services go through ``breakers.call`` / ``.outbound``.

This is the only part of breaker_redis that imports Flask. Its modules, one
job each (the public API is what this package exports):

- ``extension``: FlaskBreakers, building an app's protection, declaring breakers;
- ``settings``: the ``BREAKER_*`` keys and constructor arguments, each checked;
- ``hooks``: the request's walk (before_request, after_this_request, wsgi_app) and classification;
- ``refusal``: the 503 ``BreakerOpenError`` and how it is rendered;
- ``serving``: serving a route's fallback and remembering good responses;
- ``routes``: RouteSpec and ``BREAKER_ROUTES``;
- ``state``: the per-app state the hooks, admin and outbound calls share;
- ``admin``: the admin endpoints (only with ``BREAKER_ADMIN_TOKEN``);
- ``outbound``: outbound calls behind a breaker.

Every module imports the real Flask by absolute import (``from flask
import ...``), which this package's own name cannot shadow.

The names imported ``as`` themselves were module-level names of the former
single-module ``breaker_redis.flask`` though not in ``__all__``; they stay
importable from here (an explicit re-export, for ruff and mypy) without
joining the documented API.
"""

from __future__ import annotations

from breaker_redis.flask.extension import CONFIG_KEYS as CONFIG_KEYS
from breaker_redis.flask.extension import EXTRA_ARGUMENTS as EXTRA_ARGUMENTS
from breaker_redis.flask.extension import FlaskBreakers
from breaker_redis.flask.outbound import CallFailed
from breaker_redis.flask.refusal import (
    BREAKER_HEADER,
    REASON_HEADER,
    BreakerOpenError,
    default_message,
    retry_after_seconds,
    wants_json,
)
from breaker_redis.flask.routes import DEFAULT_FAILURE_STATUSES as DEFAULT_FAILURE_STATUSES
from breaker_redis.flask.routes import ROUTE_OPTIONS as ROUTE_OPTIONS
from breaker_redis.flask.routes import Classifier as Classifier
from breaker_redis.flask.routes import RouteSpec
from breaker_redis.flask.serving import FALLBACK_HEADER
from breaker_redis.flask.state import EXTENSION_KEY as EXTENSION_KEY

__all__ = [
    "BREAKER_HEADER",
    "FALLBACK_HEADER",
    "REASON_HEADER",
    "BreakerOpenError",
    "CallFailed",
    "FlaskBreakers",
    "RouteSpec",
    "default_message",
    "retry_after_seconds",
    "wants_json",
]
