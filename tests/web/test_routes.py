"""Every route option refuses a wrong type or value at start-up, naming the route and the option.

The route format is shared (breaker_redis/web/routes.py): the Flask extension's
``BREAKER_ROUTES`` and ``protect()``, the WSGI middleware, the ASGI middleware
and the FastAPI dependency all build their RouteSpecs with ``make_spec``,
so one table of bad options runs through each of them. Nothing here reaches
Redis: every error is raised while the app is being built.
"""

from __future__ import annotations

import re
from typing import Any

import fakeredis
import pytest
from flask import Flask

from breaker_redis import Breakers as SyncBreakers
from breaker_redis.asgi import BreakerMiddleware as AsgiMiddleware
from breaker_redis.asyncio import Breakers
from breaker_redis.fallbacks import Static, cached, static
from breaker_redis.fastapi import BreakerGuard
from breaker_redis.flask import FlaskBreakers
from breaker_redis.web.routes import GuardOptions
from breaker_redis.wsgi import BreakerMiddleware as WsgiMiddleware

# (options, the option an error must name, what else it says)
ROUTE_OPTIONS = [
    ({"failure_statuses": 502}, "failure_statuses", "collection of HTTP status codes"),
    ({"failure_statuses": "502"}, "failure_statuses", "collection of HTTP status codes"),
    ({"failure_statuses": {"a": 502}}, "failure_statuses", "collection of HTTP status codes"),
    ({"failure_statuses": [502, "503"]}, "failure_statuses", "int status codes"),
    ({"failure_statuses": [True]}, "failure_statuses", "int status codes"),
    ({"failure_statuses": [5000]}, "failure_statuses", "not an HTTP status code"),
    ({"ignore_statuses": 404}, "ignore_statuses", "collection of HTTP status codes"),
    ({"ignore_statuses": [40.4]}, "ignore_statuses", "int status codes"),
    ({"classify": "5xx"}, "classify", "must be callable"),
    ({"message": 503}, "message", "must be a str"),
    ({"fallback_on_failure": "false"}, "fallback_on_failure", "must be True or False"),
    ({"fallback_on_failure": 0}, "fallback_on_failure", "must be True or False"),
    ({"fallback": cached}, "fallback=cached", "must be called"),
    ({"fallback": static}, "fallback=static", "must be called"),
    ({"fallback": Static}, "fallback=Static", "is a class"),
    ({"fallback": {1, 2}}, "fallback", "not a Fallback, a callable or a body"),
]
# BreakerConfig fields given with a route (not BreakerGuard options: it takes a BreakerConfig)
CONFIG_OPTIONS = [
    ({"record_exceptions": ValueError}, "record_exceptions", "tuple of exception classes"),
    ({"ignore_exceptions": [KeyError]}, "ignore_exceptions", "tuple of exception classes"),
    ({"predicate": True}, "predicate", "must be callable"),
    ({"failure_threshold": "5"}, "failure_threshold", "must be an integer"),
    ({"open_seconds": 0}, "open_seconds", "must be > 0"),
]
NAMES = [
    ({"breaker": "my pay"}, "invalid breaker name 'my pay'", "' ' (U+0020"),
    ({"breaker": ""}, "invalid breaker name ''", "must not be empty"),
]
ALL = ROUTE_OPTIONS + CONFIG_OPTIONS + NAMES
GUARD_OPTIONS = {"failure_statuses", "ignore_statuses", "classify", "message"}


def ids(cases: list[tuple[dict[str, Any], str, str]]) -> list[str]:
    made = []
    for options, _, _ in cases:
        ((key, value),) = options.items()
        made.append(f"{key}={getattr(value, '__name__', repr(value))}")
    return made


def expect(where: str, option: str, says: str) -> str:
    """The pattern an error must match: the route first, then the option and what is wrong."""
    return re.escape(where) + ".*" + re.escape(option) + ".*" + re.escape(says)


def route(options: dict[str, Any]) -> dict[str, Any]:
    return {"breaker": "pay", **options}


@pytest.mark.parametrize(("options", "option", "says"), ALL, ids=ids(ALL))
def test_flask_routes_and_protect(options: dict[str, Any], option: str, says: str) -> None:
    app = Flask(__name__)
    app.config["BREAKER_ROUTES"] = {"/pay": route(options)}
    with pytest.raises((TypeError, ValueError), match=expect("BREAKER_ROUTES['/pay']", option, says)):
        FlaskBreakers(app, client=fakeredis.FakeRedis(), listen=False)

    ext = FlaskBreakers(Flask(__name__), client=fakeredis.FakeRedis(), listen=False)
    given = dict(options)
    name = given.pop("breaker", "pay")
    with pytest.raises((TypeError, ValueError), match=expect(f"protect({name!r})", option, says)):
        ext.protect(name, **given)


@pytest.mark.parametrize(("options", "option", "says"), ALL, ids=ids(ALL))
def test_wsgi_middleware(options: dict[str, Any], option: str, says: str) -> None:
    breakers = SyncBreakers(fakeredis.FakeRedis(), listen=False)
    with pytest.raises((TypeError, ValueError), match=expect("routes['/pay']", option, says)):
        WsgiMiddleware(lambda environ, start_response: [], breakers, {"/pay": route(options)})


@pytest.mark.parametrize(("options", "option", "says"), ALL, ids=ids(ALL))
def test_asgi_middleware_and_fastapi_guard(options: dict[str, Any], option: str, says: str) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None: ...

    breakers = Breakers(fakeredis.FakeAsyncRedis(), listen=False)
    with pytest.raises((TypeError, ValueError), match=expect("routes['/pay']", option, says)):
        AsgiMiddleware(app, breakers, {"/pay": route(options)})
    given = dict(options)
    name = given.pop("breaker", "pay")
    if not set(given) <= GUARD_OPTIONS:
        return  # BreakerGuard takes a BreakerConfig, not its fields, and has no fallback
    with pytest.raises((TypeError, ValueError), match=expect(f"BreakerGuard({name!r})", option, says)):
        BreakerGuard(breakers, name, **given)


def test_the_guard_takes_the_judging_options_and_no_other() -> None:
    assert GuardOptions.__optional_keys__ == GUARD_OPTIONS
    breakers = Breakers(fakeredis.FakeAsyncRedis(), listen=False)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments: failure_status$"):
        BreakerGuard(breakers, "pay", failure_status=[502])  # (a typo of failure_statuses)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments: fallback$"):
        BreakerGuard(breakers, "pay", fallback=static({}))


def test_good_options_are_kept_as_given() -> None:
    """What the checks let through: any iterable of status codes (a range, a list,
    HTTPStatus members), a bool, a str message, a Fallback, a callable or a body."""
    from http import HTTPStatus

    from breaker_redis.web.routes import make_spec

    spec = make_spec(
        "pay",
        {
            "failure_statuses": range(500, 504),
            "ignore_statuses": [HTTPStatus.CONFLICT],
            "fallback_on_failure": False,
            "message": "Resting.",
            "fallback": {"ok": False},
            "classify": lambda info: None,
        },
    )
    assert spec.failure_statuses == frozenset({500, 501, 502, 503})
    assert spec.ignore_statuses == frozenset({409})
    assert (spec.fallback_on_failure, spec.message) == (False, "Resting.")
    assert type(spec.fallback).__name__ == "Static"
    assert make_spec("pay", {"fallback": lambda context: "x"}).fallback.__class__.__name__ == "Function"
