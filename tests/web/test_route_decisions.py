"""Which requests a route guards, decided the short way, and the Flask walk that
costs one hook where no breaker guards.

The WSGI and ASGI middlewares let a path that starts with no route's stem
through after one ``str.startswith`` on the raw path, and match the others
prefix by prefix (``routes.RouteTable``); the Flask extension keeps, per view
function, what guards its requests. These tests hold the short ways to the
long ones: for every path, the middleware guards exactly the requests
``route_for(request_path(...))`` names, and a route table answers what a scan
of ``prefix_matches`` over its prefixes answers.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import fakeredis
import pytest
from flask import Flask, Response, stream_with_context
from werkzeug.test import Client

from breaker_redis import Breakers
from breaker_redis import asyncio as aio
from breaker_redis.asgi import BreakerMiddleware as AsgiMiddleware
from breaker_redis.asgi import request_path as asgi_path
from breaker_redis.fallbacks import static
from breaker_redis.flask import FlaskBreakers
from breaker_redis.web.routes import RouteTable, prefix_matches
from breaker_redis.wsgi import BreakerMiddleware as WsgiMiddleware
from breaker_redis.wsgi import request_path as wsgi_path

# -- the route table ---------------------------------------------------------------------

ALPHABET = ("/", "a", "b")


def strings(longest: int) -> list[str]:
    return ["".join(chars) for n in range(longest + 1) for chars in itertools.product(ALPHABET, repeat=n)]


def scan(routes: list[tuple[str, int]], path: str) -> int | None:
    return next((value for prefix, value in routes if prefix_matches(prefix, path)), None)


def test_a_route_table_answers_as_the_prefix_scan_for_every_path():
    prefixes = [p for p in strings(4) if p.startswith("/")]
    paths = strings(5)
    sets = [[p] for p in prefixes] + [list(pair) for pair in itertools.combinations(prefixes, 2)]
    sets += [["/", "/pay", "/pay/", "/pay/refunds", "//x"], ["/a/b", "/a", "/ab/", "/b//"]]
    checked = 0
    for chosen in sets:
        routes = sorted(((p, i) for i, p in enumerate(chosen)), key=lambda item: len(item[0]), reverse=True)
        table = RouteTable(routes)
        for path in paths:
            assert table.match(path) == scan(routes, path), (chosen, path)
            checked += 1
    assert checked == len(sets) * len(paths) == 299_208


# -- the middlewares: guarded exactly where route_for says --------------------------------

ROUTES = {"/pay": "pay", "/café": "cafe", "/\u0100x/": "wide", "/static/": "static"}
WSGI_PATHS = [
    "",
    "/",
    "pay",
    "/pay",
    "//pay",
    "///pay/x",
    "/pay/",
    "/payment",
    "/pa",
    "/static",
    "/staticx",
    "/static/a.css",
    "/caf\xc3\xa9",
    "/caf\xc3\xa9/menu",
    "/café",
    "/caf\xc3",
    "/\u0100x",
    "/\u0100x/y",
    "/\xc4\x80x",
    "/other",
    "/p\u00e4y",
]


def test_the_wsgi_middleware_guards_exactly_the_paths_route_for_names():
    breakers = Breakers(fakeredis.FakeRedis(), listen=False)

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"app"]

    middleware = WsgiMiddleware(app, breakers, routes=ROUTES)
    for name in set(ROUTES.values()):
        middleware.breaker(name).force_open()
    guarded = set()
    for path in WSGI_PATHS:
        environ = {"PATH_INFO": path, "REQUEST_METHOD": "GET", "wsgi.url_scheme": "http"}
        expected = middleware.route_for(wsgi_path(environ))
        statuses: list[str] = []

        def start_response(status: str, headers: Any, exc: Any = None, out: list[str] = statuses) -> None:
            out.append(status)

        body = b"".join(middleware(environ, start_response))
        refused = statuses == ["503 Service Unavailable"]
        assert refused == (expected is not None), (path, statuses, body)
        if refused:
            guarded.add(path)
    assert guarded == {
        "pay",
        "/pay",
        "//pay",
        "///pay/x",
        "/pay/",
        "/static",
        "/static/a.css",
        "/caf\xc3\xa9",
        "/caf\xc3\xa9/menu",
        "/\u0100x",
        "/\u0100x/y",
        "/\xc4\x80x",
    }


ASGI_SCOPES = [
    {"path": p}
    for p in (
        "",
        "/",
        "pay",
        "/pay",
        "//pay",
        "/pay/x",
        "/payment",
        "/café",
        "/café/menu",
        "/caf",
        "/\u0100x/y",
        "/static",
        "/staticx",
        "/other",
    )
] + [
    {"path": "/app/pay", "root_path": "/app"},
    {"path": "/pay", "root_path": "/app"},
    {"path": "/app/payment", "root_path": "/app/"},
    {"path": "/other", "root_path": "/app"},
    {"path": "/pay", "root_path": ""},
]


def test_the_asgi_middleware_guards_exactly_the_paths_route_for_names():
    async def main() -> set[str]:
        breakers = aio.Breakers(fakeredis.FakeAsyncRedis(), listen=False)

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"app"})

        middleware = AsgiMiddleware(app, breakers, routes=ROUTES)
        for name in set(ROUTES.values()):
            await middleware.breaker(name).force_open()
        guarded = set()
        for fields in ASGI_SCOPES:
            scope = {"type": "http", "method": "GET", "headers": [], **fields}
            expected = middleware.route_for(asgi_path(scope))
            sent: list[dict[str, Any]] = []

            async def receive() -> dict[str, Any]:
                return {"type": "http.request", "body": b"", "more_body": False}

            async def send(message: dict[str, Any], sent: list[dict[str, Any]] = sent) -> None:
                sent.append(message)

            await middleware(scope, receive, send)
            refused = sent[0]["status"] == 503
            assert refused == (expected is not None), (fields, sent)
            if refused:
                guarded.add(f"{fields.get('root_path', '-')}|{fields['path']}")
        await breakers.aclose()
        return guarded

    assert asyncio.run(main()) == {
        "-|pay",
        "-|/pay",
        "-|//pay",
        "-|/pay/x",
        "-|/café",
        "-|/café/menu",
        "-|/\u0100x/y",
        "-|/static",
        "/app|/app/pay",
        "/app|/pay",
        "|/pay",
    }


# -- Flask ---------------------------------------------------------------------------------


def flask_app(clock: Any, **overrides: Any) -> tuple[Flask, FlaskBreakers]:
    app = Flask(__name__)
    ext = FlaskBreakers(app, client=fakeredis.FakeRedis(), clock=clock, listen=False, **overrides)
    return app, ext


def snapshot(ext: FlaskBreakers, app: Flask, name: str) -> dict[str, Any]:
    with app.app_context():
        return ext.breaker(name).snapshot()


class Unhashable:
    """A view object that cannot be a dict key (it defines __eq__ and no __hash__)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.__name__ = f"unhashable_{text}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unhashable) and other.text == self.text

    __hash__ = None  # type: ignore[assignment]

    def __call__(self) -> str:
        return self.text


def test_a_view_that_cannot_be_hashed_is_guarded_by_its_path_each_time(clock):
    app, ext = flask_app(clock, routes={"/pay": "pay"})
    app.add_url_rule("/pay", view_func=Unhashable("paid"))
    app.add_url_rule("/cart", view_func=Unhashable("cart"))
    client = app.test_client()
    for _ in range(3):
        assert client.get("/pay").text == "paid"
        assert client.get("/cart").text == "cart"
    assert snapshot(ext, app, "pay")["successes"] == 3


def test_a_view_replaced_after_the_first_request_is_judged_anew(clock):
    app, ext = flask_app(clock)

    @app.get("/pay")
    def pay() -> str:
        return "unguarded"

    client = app.test_client()
    assert client.get("/pay").text == "unguarded"

    @ext.protect("pay")
    def guarded() -> tuple[str, int]:
        return "failed", 502

    app.view_functions["pay"] = guarded
    assert client.get("/pay").status_code == 502
    assert snapshot(ext, app, "pay")["failures"] == 1


def test_the_app_after_request_hooks_see_the_fallback_response(clock):
    app, ext = flask_app(clock)

    @app.get("/pay")
    @ext.protect("pay", fallback=static({"queued": True}))
    def pay() -> tuple[str, int]:
        return "upstream failed", 502

    @app.after_request
    def cors(response: Response) -> Response:  # registered after the extension, as CORS(app) often is
        response.headers["Access-Control-Allow-Origin"] = "*"
        return response

    answer = app.test_client().get("/pay")
    assert answer.json == {"queued": True}
    assert answer.headers["X-Breaker-Fallback"] == "static"
    assert answer.headers["Access-Control-Allow-Origin"] == "*"
    assert snapshot(ext, app, "pay")["failures"] == 1


def test_a_streamed_response_is_counted_by_its_status_before_its_body_is_read(clock):
    app, ext = flask_app(clock)

    @app.get("/export")
    @ext.protect("export")
    def export() -> Response:
        def rows() -> Any:
            yield "first row\n"
            raise RuntimeError("the upstream went away mid-stream")

        return Response(stream_with_context(rows()), 200)

    answer = Client(app).get("/export", buffered=False)
    assert answer.status_code == 200
    snap = snapshot(ext, app, "export")
    assert (snap["successes"], snap["failures"]) == (1, 0)  # settled before the body was read
    with pytest.raises(RuntimeError, match="mid-stream"):
        answer.get_data()
    answer.close()
    snap = snapshot(ext, app, "export")
    assert (snap["calls"], snap["successes"], snap["failures"]) == (1, 1, 0)


def test_a_request_no_breaker_guards_leaves_nothing_in_the_environ(clock):
    app, ext = flask_app(clock, routes={"/pay": "pay"})
    seen: list[set[str]] = []

    @app.get("/products")
    def products() -> str:
        from flask import request

        seen.append({key for key in request.environ if key.startswith("breaker_redis")})
        return "tea"

    @app.get("/pay")
    def pay() -> str:
        from flask import request

        seen.append({key for key in request.environ if key.startswith("breaker_redis")})
        return "paid"

    client = app.test_client()
    assert client.get("/products").text == "tea"
    assert client.get("/pay").text == "paid"
    assert seen[0] == set()
    assert len(seen[1]) == 2  # the request's guards and its pending outcome
    assert snapshot(ext, app, "pay")["successes"] == 1
