"""One route guarded twice by one breaker: one permit per request, whatever the layers.

An app may put ``BreakerMiddleware(routes={"/pay": "pay"})`` and
``dependencies=[protect(breakers, "pay")]`` on the same path (docs/asgi.md, "One route, two guards"); a WSGI
middleware may wrap a Flask app whose view is ``@protect``-ed too. The outer
guard takes the request's permit and records its one outcome; an inner guard
of the same breaker (same key prefix and name) finds that permit in the ASGI
scope / WSGI environ and neither asks nor records. Guards of different
breakers on one route stay independent.

All on the session's real redis-server, time driven by the test clock.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis.asyncio
from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from flask import Flask

from breaker_redis import Breakers as SyncBreakers
from breaker_redis.asgi import BreakerMiddleware as AsgiMiddleware
from breaker_redis.asyncio import BreakerConfig, Breakers
from breaker_redis.fastapi import add_refusal_handler, protect
from breaker_redis.flask import FlaskBreakers
from breaker_redis.wsgi import BreakerMiddleware as WsgiMiddleware
from tests.support.clock import Clock

THRESHOLD = 3
CONFIG = BreakerConfig(failure_threshold=THRESHOLD, open_seconds=10)
_prefixes = itertools.count()


class Upstream:
    """What the view does next: answer 200, return a 502, or raise."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.calls = 0


def counts(snapshot: dict[str, Any]) -> tuple[Any, ...]:
    return (
        snapshot["state"],
        snapshot["calls"],
        snapshot["successes"],
        snapshot["failures"],
        snapshot["ignored"],
        snapshot["rejected"],
    )


# -- ASGI: the middleware and the FastAPI dependency -----------------------------------------


def fastapi_app(breakers: Breakers, upstream: Upstream, layers: str) -> Any:
    """/pay guarded as ``layers`` says: "mw+dep" (docs/asgi.md, "One route, two guards"), "dep+dep",
    "mw+mw", or "mw+dep:other" (the dependency guards another breaker)."""
    api = FastAPI()
    add_refusal_handler(api, breakers)
    dependencies = []
    if "dep" in layers:
        dependencies.append(protect(breakers, "other" if layers.endswith(":other") else "pay", CONFIG))
    if layers == "dep+dep":
        dependencies.append(protect(breakers, "pay", CONFIG))

    @api.post("/pay", dependencies=dependencies)
    async def pay() -> Any:
        upstream.calls += 1
        if upstream.mode == "return":
            return JSONResponse({"ok": False}, status_code=502)
        if upstream.mode == "raise":
            raise HTTPException(502, "upstream failed")
        return {"ok": True}

    routes = {"/pay": "pay"}
    if layers.startswith("mw"):
        api.add_middleware(AsgiMiddleware, breakers=breakers, routes=routes)
    if layers == "mw+mw":
        api.add_middleware(AsgiMiddleware, breakers=breakers, routes=routes)
    return api


async def _asgi_scenario(port: int, layers: str, mode: str) -> None:
    clock = Clock()
    breakers = Breakers(
        redis.asyncio.Redis(host="127.0.0.1", port=port),
        f"nested{next(_prefixes)}",
        clock=clock,
        defaults=CONFIG,
    )
    upstream = Upstream()
    app = fastapi_app(breakers, upstream, layers)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            upstream.mode = mode
            for n in range(1, THRESHOLD + 1):
                answer = await http.post("/pay")
                assert answer.status_code == 502, (n, answer.status_code, answer.text)
                snap = await breakers.get("pay").snapshot()
                assert snap["calls"] == n and snap["failures"] == n, (n, counts(snap))
            refused = await http.post("/pay")
            assert refused.status_code == 503 and refused.headers["x-breaker"] == "pay"
            assert upstream.calls == THRESHOLD
            assert counts(await breakers.get("pay").snapshot()) == ("open", 3, 0, 3, 0, 1)

            clock.now += 10_001  # the open period is over: the next request is the probe
            upstream.mode = "ok"
            assert (await http.post("/pay")).status_code == 200
            assert counts(await breakers.get("pay").snapshot()) == ("closed", 4, 1, 3, 0, 1)
            assert (await http.post("/pay")).status_code == 200
            assert counts(await breakers.get("pay").snapshot()) == ("closed", 5, 2, 3, 0, 1)
            assert upstream.calls == THRESHOLD + 2
    finally:
        await breakers.aclose()


@pytest.mark.parametrize(
    ("layers", "mode"),
    # dep+dep only raises: a returned response's status is hidden from every dependency
    [
        ("mw+dep", "return"),
        ("mw+dep", "raise"),
        ("dep+dep", "raise"),
        ("mw+mw", "return"),
        ("mw+mw", "raise"),
    ],
)
def test_asgi_one_breaker_twice_is_one_permit_per_request(redis_server, layers: str, mode: str) -> None:
    """A 502 returned or raised trips after exactly failure_threshold requests; the
    probe after the open period closes it again; one outcome per request."""
    asyncio.run(_asgi_scenario(redis_server.port, layers, mode))


def test_asgi_different_breakers_on_one_route_stay_independent(redis_server) -> None:
    async def scenario() -> None:
        clock = Clock()
        breakers = Breakers(
            redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port),
            f"nested{next(_prefixes)}",
            clock=clock,
            defaults=CONFIG,
        )
        upstream = Upstream()
        app = fastapi_app(breakers, upstream, "mw+dep:other")
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
                upstream.mode = "raise"
                for _ in range(2):
                    assert (await http.post("/pay")).status_code == 502
                upstream.mode = "ok"
                assert (await http.post("/pay")).status_code == 200
                for name in ("pay", "other"):  # each asked and told once per request
                    assert counts(await breakers.get(name).snapshot()) == ("closed", 3, 1, 2, 0, 0)
                await breakers.get("other").force_open()
                refused = await http.post("/pay")
                assert refused.status_code == 503 and refused.headers["x-breaker"] == "other"
                # "pay" admitted it, and the refusal by "other" says nothing about pay's service
                assert counts(await breakers.get("pay").snapshot()) == ("closed", 4, 1, 2, 1, 0)
        finally:
            await breakers.aclose()

    asyncio.run(scenario())


# -- WSGI around Flask, and Flask's own two ways ------------------------------------------


@pytest.fixture
def sync_breakers(redis_server) -> Iterator[tuple[SyncBreakers, Clock, str]]:
    clock = Clock()
    prefix = f"nested{next(_prefixes)}"
    made = SyncBreakers(redis_server.client(), prefix, clock=clock, listen=False, defaults=CONFIG)
    yield made, clock, prefix
    made.close()


def flask_app(redis_server, clock: Clock, prefix: str, upstream: Upstream, routes: Any = None) -> Flask:
    app = Flask(__name__)
    app.config.update(BREAKER_REDIS_URL=redis_server.url, BREAKER_KEY_PREFIX=prefix, BREAKER_ROUTES=routes)
    ext = FlaskBreakers(app, clock=clock, listen=False, defaults=CONFIG)

    @app.post("/pay")
    @ext.protect("pay")
    def pay() -> Any:
        upstream.calls += 1
        if upstream.mode == "return":
            return {"ok": False}, 502
        if upstream.mode == "raise":
            raise RuntimeError("upstream failed")
        return {"ok": True}

    app.extensions["test_ext"] = ext
    return app


def _flask_scenario(app: Flask, breakers: SyncBreakers, clock: Clock, upstream: Upstream, mode: str) -> None:
    client = app.test_client()
    failed = 502 if mode == "return" else 500
    upstream.mode = mode
    for n in range(1, THRESHOLD + 1):
        assert client.post("/pay").status_code == failed
        snap = breakers.get("pay").snapshot()
        assert snap["calls"] == n and snap["failures"] == n, (n, counts(snap))
    refused = client.post("/pay")
    assert refused.status_code == 503 and refused.headers["X-Breaker"] == "pay"
    assert upstream.calls == THRESHOLD
    assert counts(breakers.get("pay").snapshot()) == ("open", 3, 0, 3, 0, 1)
    clock.now += 10_001
    upstream.mode = "ok"
    assert client.post("/pay").status_code == 200
    assert counts(breakers.get("pay").snapshot()) == ("closed", 4, 1, 3, 0, 1)
    assert client.post("/pay").status_code == 200
    assert counts(breakers.get("pay").snapshot()) == ("closed", 5, 2, 3, 0, 1)


@pytest.mark.parametrize("mode", ["return", "raise"])
def test_wsgi_middleware_around_a_flask_app_protecting_the_route(redis_server, sync_breakers, mode) -> None:
    breakers, clock, prefix = sync_breakers
    upstream = Upstream()
    app = flask_app(redis_server, clock, prefix, upstream)
    app.wsgi_app = WsgiMiddleware(app.wsgi_app, breakers, {"/pay": "pay"})  # type: ignore[method-assign]
    _flask_scenario(app, breakers, clock, upstream, mode)
    app.extensions["test_ext"].breakers.close()


@pytest.mark.parametrize("mode", ["return", "raise"])
def test_flask_breaker_routes_and_the_decorator_on_one_route(redis_server, sync_breakers, mode) -> None:
    breakers, clock, prefix = sync_breakers
    upstream = Upstream()
    app = flask_app(redis_server, clock, prefix, upstream, routes={"/pay": "pay"})
    _flask_scenario(app, breakers, clock, upstream, mode)
    app.extensions["test_ext"].breakers.close()


def test_wsgi_and_flask_guarding_different_breakers_stay_independent(redis_server, sync_breakers) -> None:
    breakers, clock, prefix = sync_breakers
    upstream = Upstream()
    app = flask_app(redis_server, clock, prefix, upstream)
    app.wsgi_app = WsgiMiddleware(app.wsgi_app, breakers, {"/": "gateway"})  # type: ignore[method-assign]
    client = app.test_client()
    upstream.mode = "return"
    assert client.post("/pay").status_code == 502
    upstream.mode = "ok"
    assert client.post("/pay").status_code == 200
    for name in ("pay", "gateway"):
        assert counts(breakers.get(name).snapshot()) == ("closed", 2, 1, 1, 0, 0)
    breakers.get("pay").force_open()
    refused = client.post("/pay")
    assert refused.status_code == 503 and refused.headers["X-Breaker"] == "pay"
    # the gateway admitted it; pay's refusal says nothing about the gateway's service
    assert counts(breakers.get("gateway").snapshot()) == ("closed", 3, 1, 1, 1, 0)
    assert upstream.calls == 2
    app.extensions["test_ext"].breakers.close()
