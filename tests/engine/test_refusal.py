"""The framework-free refusal every integration answers with (breaker_redis.web.refusal)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import fakeredis
import httpx
import pytest
from fastapi import FastAPI
from flask import Flask
from werkzeug.test import Client

from breaker_redis import BreakerConfig, BreakerOpen, Breakers
from breaker_redis import asyncio as aio
from breaker_redis.asgi import BreakerMiddleware as AsgiMiddleware
from breaker_redis.fastapi import add_refusal_handler, protect
from breaker_redis.flask import FlaskBreakers
from breaker_redis.web.refusal import Refusal, default_message, retry_after_seconds, wants_json
from breaker_redis.wsgi import BreakerMiddleware as WsgiMiddleware


@pytest.mark.parametrize(
    ("accept", "content_type", "requested_with", "expected"),
    [
        (None, None, None, False),
        ("*/*", None, None, False),
        ("*/*", "application/json", None, True),
        (None, None, "XMLHttpRequest", True),
        ("application/json", None, None, True),
        ("application/problem+json", None, None, True),
        ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", None, None, False),
        ("text/html;q=0.5, application/json", None, None, True),
        ("application/json;q=0.5, text/html", None, None, False),
        ("application/json;q=0", None, None, False),
        ("application/json;q=oops, text/html", None, None, False),
        ("text/plain", "application/json", None, False),
    ],
)
def test_wants_json(accept: str | None, content_type: str | None, requested_with: str | None, expected: bool):
    assert wants_json(accept, content_type, requested_with) is expected


def test_retry_after_rounds_up_and_has_a_floor():
    assert retry_after_seconds(BreakerOpen(2.01, "pay", "open")) == 3
    assert retry_after_seconds(BreakerOpen(0.0, "pay", "open")) == 1
    assert retry_after_seconds(BreakerOpen(None, "pay", "half_open_full")) == 1
    assert retry_after_seconds(BreakerOpen(None, "pay", "forced_open"), BreakerConfig(open_seconds=45)) == 45


def test_json_and_text_refusals_carry_the_same_facts():
    refused = BreakerOpen(4.2, "pay", "open")
    as_json = Refusal.build(refused, as_json=True)
    assert as_json.status == 503
    headers = dict(as_json.headers)
    assert headers["Retry-After"] == "5"
    assert headers["X-Breaker"] == "pay"
    assert headers["X-Breaker-Reason"] == "open"
    assert headers["Content-Type"] == "application/json"
    assert int(headers["Content-Length"]) == len(as_json.body)
    assert json.loads(as_json.body) == {
        "error": "service_unavailable",
        "message": "The pay service is temporarily unavailable, please retry later.",
        "breaker": "pay",
        "reason": "open",
        "retry_after": 5,
    }
    as_text = Refusal.build(refused, as_json=False, message="Payments are resting.")
    assert as_text.body == b"Payments are resting.\n"
    assert dict(as_text.headers)["Content-Type"] == "text/plain; charset=utf-8"


# -- one refusal, whichever integration answers -------------------------------------------------

ROUTE_CONFIG = {"open_seconds": 45}  # forced open: Retry-After is the breaker's open period
MESSAGE = "Payments are resting."
ROUTES = {"/pay": {"breaker": "pay", "message": MESSAGE, **ROUTE_CONFIG}}
ASKS = (("GET", {}, "text"), ("GET", {"Accept": "application/json"}, "json"), ("HEAD", {}, "head"))
COMPARED = ("content-type", "content-length", "retry-after", "x-breaker", "x-breaker-reason")


def _answer(status: int, body: bytes, headers: Any) -> tuple[int, bytes, dict[str, str | None]]:
    return status, body, {name: headers.get(name) for name in COMPARED}


def _ask_wsgi(app: Any) -> dict[tuple[str, str], Any]:
    client = Client(app)
    found = {}
    for path in ("/pay", "/stock"):
        for method, headers, kind in ASKS:
            answer = client.open(path, method=method, headers=headers)
            found[path, kind] = _answer(answer.status_code, answer.get_data(), answer.headers)
    return found


async def _ask_asgi(app: Any, breakers: aio.Breakers, *forced: str) -> dict[tuple[str, str], Any]:
    found = {}
    try:
        for name in forced:
            await breakers.get(name).force_open()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            for path in ("/pay", "/stock"):
                for method, headers, kind in ASKS:
                    answer = await http.request(method, path, headers=headers)
                    found[path, kind] = _answer(answer.status_code, answer.content, answer.headers)
    finally:
        await breakers.aclose()
    return found


def _flask() -> dict[tuple[str, str], Any]:
    app = Flask(__name__)
    ext = FlaskBreakers(app, client=fakeredis.FakeRedis(), listen=False)

    @app.get("/pay")
    @ext.protect("pay", message=MESSAGE, **ROUTE_CONFIG)
    def pay() -> str:
        return "paid"

    @app.get("/stock")
    def stock() -> str:
        return str(ext.call("inventory", lambda: 3))

    with app.app_context():
        ext.breaker("pay").force_open()
        ext.breaker("inventory", **ROUTE_CONFIG).force_open()
    return _ask_wsgi(app)


def _wsgi() -> dict[tuple[str, str], Any]:
    breakers = Breakers(fakeredis.FakeRedis(), listen=False)
    inventory = breakers.get("inventory", BreakerConfig(**ROUTE_CONFIG))

    def app(environ: Any, start_response: Any) -> list[bytes]:
        if environ["PATH_INFO"] == "/stock":
            inventory.call(lambda: 3)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"paid"]

    mw = WsgiMiddleware(app, breakers, routes=ROUTES)
    mw.breaker("pay").force_open()
    inventory.force_open()
    try:
        return _ask_wsgi(mw)
    finally:
        breakers.close()


async def _three() -> int:
    return 3


def _asgi() -> dict[tuple[str, str], Any]:
    breakers = aio.Breakers(fakeredis.FakeAsyncRedis(), listen=False)
    inventory = breakers.get("inventory", BreakerConfig(**ROUTE_CONFIG))

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/stock":
            await inventory.call(_three)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"paid"})

    mw = AsgiMiddleware(app, breakers, routes=ROUTES)
    return asyncio.run(_ask_asgi(mw, breakers, "pay", "inventory"))


def _fastapi() -> dict[tuple[str, str], Any]:
    breakers = aio.Breakers(fakeredis.FakeAsyncRedis(), listen=False)
    inventory = breakers.get("inventory", BreakerConfig(**ROUTE_CONFIG))
    app = FastAPI()
    add_refusal_handler(app, breakers)
    guard = protect(breakers, "pay", BreakerConfig(**ROUTE_CONFIG), message=MESSAGE)

    @app.api_route("/pay", methods=["GET", "HEAD"], dependencies=[guard])
    async def pay() -> str:
        return "paid"

    @app.api_route("/stock", methods=["GET", "HEAD"])
    async def stock() -> int:
        return await inventory.call(_three)

    return asyncio.run(_ask_asgi(app, breakers, "pay", "inventory"))


def test_every_integration_answers_a_refusal_with_the_same_bytes():
    """The Flask extension (its hooks, and an outbound refusal escaping a view),
    the WSGI and ASGI middlewares (a route's breaker, and an outbound refusal
    escaping the app) and FastAPI (the dependency, and the refusal handler),
    each asked as text, as JSON and with HEAD: one status, one body and one
    set of headers per question. An integration that made its 503 another way
    (its own config lookup, message or headers) makes its answers differ here."""
    found = {"flask": _flask(), "wsgi": _wsgi(), "asgi": _asgi(), "fastapi": _fastapi()}
    for name, answers in found.items():
        assert answers == found["wsgi"], name
    text = MESSAGE.encode() + b"\n"
    assert found["wsgi"]["/pay", "text"] == (
        503,
        text,
        {
            "content-type": "text/plain; charset=utf-8",
            "content-length": str(len(text)),
            "retry-after": "45",
            "x-breaker": "pay",
            "x-breaker-reason": "forced_open",
        },
    )
    assert found["wsgi"]["/pay", "head"] == (503, b"", found["wsgi"]["/pay", "text"][2])
    status, body, headers = found["wsgi"]["/stock", "json"]
    assert (status, headers["retry-after"], headers["x-breaker"]) == (503, "45", "inventory")
    assert json.loads(body) == {
        "error": "service_unavailable",
        "message": default_message("inventory"),
        "breaker": "inventory",
        "reason": "forced_open",
        "retry_after": 45,
    }


def test_a_call_left_out_of_the_ramp_is_a_503_with_a_short_retry_after():
    """Just after a close with ramp_seconds (docs/recovery.md) a request the ramp leaves out
    is refused like any other, reason ramp, and asked to come back in a second."""
    assert retry_after_seconds(BreakerOpen(0.4, "pay", "ramp")) == 1
    app = Flask(__name__)
    ext = FlaskBreakers(app, client=fakeredis.FakeRedis(), listen=False)

    @app.get("/pay")
    @ext.protect("pay", ramp_seconds=3600, ramp_from=0.25)  # an hour: the share stays 0.25 here
    def pay() -> str:
        return "paid"

    client = Client(app)
    assert client.get("/pay").status_code == 200  # the workers' config is stored with the state
    with app.app_context():
        ext.breaker("pay").force_open()
        ext.breaker("pay").clear_force()  # closing a breaker that refused calls starts the ramp
    answers = [client.get("/pay", headers={"Accept": "application/json"}) for _ in range(8)]
    assert [a.status_code for a in answers] == [503, 503, 503, 200] * 2
    refused = answers[0]
    assert (refused.headers["Retry-After"], refused.headers["X-Breaker-Reason"]) == ("1", "ramp")
    assert json.loads(refused.get_data())["reason"] == "ramp"
