"""BreakerMiddleware (breaker_redis.wsgi) in front of bare WSGI apps, on fakeredis[lua]
and the session's real redis-server: routes, classification, the refusal (the Flask
extension's, byte for byte), fallbacks, and when an outcome is recorded (the commit:
the body's first bytes) with permits settled exactly once whatever the server, the
client or the app does. The last test runs a real HTTP server (wsgiref) and a client
that hangs up in the middle of a stream."""

from __future__ import annotations

import gc
import io
import json
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.util import FileWrapper

import fakeredis
import pytest
from werkzeug.test import Client, EnvironBuilder

from breaker_redis import BreakerConfig, BreakerOpen, Breakers
from breaker_redis.fallbacks import FallbackResponse, cached, chain, function, static
from breaker_redis.wsgi import BreakerMiddleware, ResponseInfo, RouteSpec, parse_routes, prefix_matches
from tests.support.redis_server import wait_until

FAST = {"trip": "consecutive", "failure_threshold": 2, "open_seconds": 10}
FRIENDLY = "The pay service is temporarily unavailable, please retry later.\n"


def shop(environ, start_response):
    """?status=N answers N (JSON), ?raise=1 raises, ?cookie=1 sets a cookie."""
    query = parse_qs(environ.get("QUERY_STRING", ""))
    if "raise" in query:
        raise RuntimeError("boom")
    status = int(query.get("status", ["200"])[0])
    answer = {"ok": status < 500, "path": environ["PATH_INFO"], "v": query.get("v", [""])[0]}
    body = json.dumps(answer).encode()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body))), ("X-Custom", "kept")]
    if "cookie" in query:
        headers.append(("Set-Cookie", "session=secret"))
    if "nostore" in query:
        headers.append(("Cache-Control", "no-store"))
    start_response(f"{status} Whatever", headers)
    return [body]


@pytest.fixture
def make(make_breakers):
    """make(app, routes) -> a BreakerMiddleware on the test store (fake or real) and clock."""

    def build(app=shop, routes=None, **kwargs):
        return BreakerMiddleware(app, make_breakers(**kwargs), routes=routes)

    return build


def snap(mw, name="pay"):
    return mw.breaker(name).snapshot()


def counts(mw, name="pay"):
    s = snap(mw, name)
    return s["successes"], s["failures"], s["ignored"]


class Started:
    """A server's start_response, seen from a test driving the middleware by hand.
    Like gunicorn's and wsgiref's: exc_info re-raises only once something was sent."""

    def __init__(self):
        self.calls = []
        self.written = []

    def __call__(self, status, headers, exc_info=None):
        if exc_info is not None and self.written:
            raise exc_info[1].with_traceback(exc_info[2])
        if exc_info is None and self.calls:
            raise AssertionError("Response headers already set!")
        self.calls.append((status, list(headers)))
        return self.written.append

    @property
    def status(self):
        return self.calls[-1][0] if self.calls else None

    @property
    def headers(self):
        return dict(self.calls[-1][1]) if self.calls else None


def environ(path="/pay", method="GET", **kwargs):
    return EnvironBuilder(path=path, method=method, **kwargs).get_environ()


# -- routes ---------------------------------------------------------------------------------


def test_longest_prefix_wins_on_segment_boundaries():
    routes = {"/pay": "pay", "/pay/refunds": "refunds", "/static/": "static"}
    assert [prefix for prefix, _ in parse_routes(routes)[0]] == ["/pay/refunds", "/static/", "/pay"]
    mw = BreakerMiddleware(shop, Breakers(fakeredis.FakeRedis(), listen=False), routes=routes)
    found = {
        path: getattr(mw.route_for(path), "name", None)
        for path in (
            "/pay",
            "/pay/",
            "/pay/x",
            "/payment",
            "/pay/refunds",
            "/pay/refunds/7",
            "/pay/refundsx",
            "/static",
            "/static/a.css",
            "/staticx",
            "/",
        )
    }
    assert found == {
        "/pay": "pay",
        "/pay/": "pay",
        "/pay/x": "pay",
        "/payment": None,
        "/pay/refunds": "refunds",
        "/pay/refunds/7": "refunds",
        "/pay/refundsx": "pay",
        "/static": "static",
        "/static/a.css": "static",
        "/staticx": None,
        "/": None,
    }
    assert prefix_matches("/", "/anything") and prefix_matches("/", "/")


def test_the_path_is_matched_as_flask_reads_it(make):
    """PATH_INFO under the mount point, UTF-8 from WSGI's latin-1, one leading slash."""
    mw = make(routes={"/café": "cafe", "/pay": "pay"})
    assert mw.route_for("/café").name == "cafe"
    client = Client(mw)
    assert client.get("/caf%C3%A9/menu").status_code == 200
    assert client.get("//pay", environ_overrides={"PATH_INFO": "//pay"}).status_code == 200
    assert snap(mw, "cafe")["successes"] == 1 and snap(mw, "pay")["successes"] == 1


def test_route_values_name_dict_and_routespec(make):
    from breaker_redis.flask.routes import RouteSpec as FlaskRouteSpec  # the tests may import Flask

    mw = make(
        routes={
            "/pay": {"breaker": "pay", "trip": "count", "failure_threshold": 7, "message": "Resting."},
            "/refund": "pay",  # a bare name shares the breaker and its config
            "/cart": RouteSpec("cart", failure_statuses=frozenset({418})),
            "/legacy": FlaskRouteSpec("legacy", ignore_statuses=frozenset({503}), fallback_on_failure=False),
        }
    )
    assert mw.breaker("pay").config == BreakerConfig(trip="count", failure_threshold=7)
    assert mw.route_for("/refund").name == "pay" and mw.route_for("/refund").message is None
    assert mw.route_for("/pay").message == "Resting."
    assert mw.route_for("/cart").failure_statuses == {418}
    legacy = mw.route_for("/legacy")
    assert (legacy.ignore_statuses, legacy.fallback_on_failure) == ({503}, False)
    assert mw.breaker("cart").config == mw.breakers.defaults


@pytest.mark.parametrize(
    ("routes", "error"),
    [
        ({"pay": "pay"}, ValueError),
        ({"/pay": {"fallback": "x"}}, ValueError),
        ({"/pay": {"breaker": "pay", "bogus": 1}}, ValueError),
        ({"/pay": {"breaker": "pay", "failure_threshold": 0}}, ValueError),
        (
            {
                "/a": {"breaker": "pay", "failure_threshold": 3},
                "/b": {"breaker": "pay", "failure_threshold": 4},
            },
            ValueError,
        ),
        ({"/pay": 7}, TypeError),
        ({"/pay": {"breaker": "pay", "classify": "yes"}}, TypeError),
        (["/pay"], TypeError),
        ({"/pay": "{bad}"}, ValueError),
    ],
)
def test_bad_routes_fail_at_start_up(routes, error):
    with pytest.raises(error):
        BreakerMiddleware(shop, Breakers(fakeredis.FakeRedis(), listen=False), routes=routes)


def test_bad_arguments_fail_at_start_up():
    with pytest.raises(TypeError, match="Breakers"):
        BreakerMiddleware(shop, fakeredis.FakeRedis(), routes={"/pay": "pay"})
    with pytest.raises(TypeError, match="WSGI app"):
        BreakerMiddleware(None, Breakers(fakeredis.FakeRedis(), listen=False))


def test_a_route_config_must_agree_with_the_breaker_already_built():
    breakers = Breakers(fakeredis.FakeRedis(), listen=False)
    breakers.get("pay", BreakerConfig(failure_threshold=3))
    BreakerMiddleware(shop, breakers, routes={"/pay": "pay"})  # a bare name: fine
    with pytest.raises(ValueError, match="another config"):
        BreakerMiddleware(shop, breakers, routes={"/pay": {"breaker": "pay", "failure_threshold": 4}})


@pytest.mark.processes
def test_the_core_module_imports_no_web_framework():
    code = (
        "import sys, breaker_redis.wsgi; "
        "bad = [m for m in ('flask', 'werkzeug', 'django', 'falcon') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- classification -------------------------------------------------------------------------


def test_5xx_and_exceptions_are_failures_everything_else_success(make):
    mw = make(routes={"/pay": {"breaker": "pay", "failure_threshold": 50}})
    client = Client(mw)
    for status in (200, 201, 302, 400, 404, 429, 500, 502, 503, 504):
        assert client.get(f"/pay?status={status}").status_code == status
    with pytest.raises(RuntimeError, match="boom"):
        client.get("/pay?raise=1")
    assert counts(mw) == (6, 5, 0)


def test_failure_and_ignore_statuses(make):
    mw = make(
        routes={
            "/pay": {
                "breaker": "pay",
                "failure_statuses": [429, 500],
                "ignore_statuses": [503],
                "failure_threshold": 50,
            }
        }
    )
    client = Client(mw)
    for status in (429, 500, 502, 503):
        client.get(f"/pay?status={status}")
    assert counts(mw) == (1, 2, 1)


def test_classify_sees_the_status_and_headers(make):
    seen = []

    def classify(response: ResponseInfo):
        seen.append((response.status_code, response.headers.get("x-custom"), response.environ["PATH_INFO"]))
        return {299: "failure", 418: False, 409: "ignored", 502: True}.get(response.status_code)

    mw = make(routes={"/pay": {"breaker": "pay", "classify": classify, "failure_threshold": 50}})
    client = Client(mw)
    for status in (299, 418, 409, 502, 500, 200):
        client.get(f"/pay?status={status}")
    assert counts(mw) == (2, 3, 1)
    assert seen[0] == (299, "kept", "/pay")


@pytest.mark.parametrize("classify", [lambda response: 1 / 0, lambda response: "maybe"])
def test_a_broken_classify_counts_as_failure_and_is_logged_once(make, caplog, classify):
    mw = make(routes={"/pay": {"breaker": "pay", "classify": classify, "failure_threshold": 50}})
    client = Client(mw)
    assert client.get("/pay").status_code == 200
    assert client.get("/pay").status_code == 200
    assert counts(mw) == (0, 2, 0)
    assert caplog.text.count("classify() of breaker 'pay' raised") == 1


def test_exceptions_are_classified_by_the_breaker_config_and_re_raised(make):
    def app(environ, start_response):
        raise {"/k": KeyError, "/v": ValueError, "/x": SystemExit}[environ["PATH_INFO"]]("x")

    mw = make(
        app,
        routes={
            "/k": {"breaker": "k", "ignore_exceptions": (KeyError,)},
            "/v": {"breaker": "v", "record_exceptions": (KeyError,)},  # a ValueError is neither: ignored
            "/x": "x",  # not an Exception (SystemExit, KeyboardInterrupt): ignored
        },
    )
    client = Client(mw)
    for path, error in (("/k", KeyError), ("/v", ValueError), ("/x", SystemExit)):
        with pytest.raises(error):
            client.get(path)
    assert [counts(mw, name) for name in "kvx"] == [(0, 0, 1)] * 3


def test_options_requests_are_never_refused_or_counted(make):
    mw = make(routes={"/pay": {"breaker": "pay", **FAST}})
    client = Client(mw)
    for _ in range(2):
        client.post("/pay?status=500")
    assert client.options("/pay").status_code == 200
    assert snap(mw)["calls"] == 2


def test_unprotected_paths_get_the_app_s_own_iterable(make):
    body = [b"x"]

    def app(environ, start_response):
        start_response("200 OK", [])
        return body

    mw = make(app, routes={"/pay": "pay"})
    assert mw(environ("/products"), Started()) is body


def test_each_request_records_exactly_once(make, monkeypatch):
    from breaker_redis.engine.breaker import Breaker

    recorded = []
    original = Breaker._record

    def spy(self, permit, outcome, duration_ms):
        recorded.append(outcome)
        return original(self, permit, outcome, duration_ms)

    monkeypatch.setattr(Breaker, "_record", spy)
    mw = make(routes={"/pay": {"breaker": "pay", "failure_threshold": 50}})
    client = Client(mw)
    for query in ("", "status=500", "status=404"):
        client.get(f"/pay?{query}").close()
    with pytest.raises(RuntimeError):
        client.get("/pay?raise=1")
    body = mw(environ("/pay"), Started())
    list(body)
    body.close()
    body.close()  # a second close changes nothing
    assert recorded == ["success", "failure", "success", "failure", "success"]


# -- refusals ------------------------------------------------------------------------------


def trip(client, path="/pay", n=2, expect=500):
    """n failed responses (answered by the route's fallback when it has one: expect=None)."""
    for _ in range(n):
        answer = client.post(f"{path}?status=500")
        assert expect is None or answer.status_code == expect


def test_refusal_is_503_with_retry_after_and_a_friendly_text(make, clock):
    mw = make(routes={"/pay": {"breaker": "pay", **FAST}})
    client = Client(mw)
    trip(client)
    clock.advance(2500)
    answer = client.post("/pay")
    assert answer.status_code == 503
    assert answer.headers["Retry-After"] == "8"  # 7.5 s left, rounded up
    assert answer.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert answer.get_data(as_text=True) == FRIENDLY
    assert (answer.headers["X-Breaker"], answer.headers["X-Breaker-Reason"]) == ("pay", "open")
    clock.advance(7400)
    assert client.post("/pay").headers["Retry-After"] == "1"
    assert snap(mw)["calls"] == 2  # the app was not called for the refusals


@pytest.mark.parametrize(
    ("headers", "json_expected"),
    [
        ({"Accept": "application/json"}, True),
        ({"Accept": "application/problem+json"}, True),
        ({"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}, False),
        ({}, False),
        ({"Accept": "*/*", "X-Requested-With": "XMLHttpRequest"}, True),
        ({"Accept": "*/*", "Content-Type": "application/json"}, True),
    ],
)
def test_refusal_is_json_when_the_client_asks_for_json(make, headers, json_expected):
    mw = make(routes={"/pay": {"breaker": "pay", "message": "Payments are resting.", **FAST}})
    client = Client(mw)
    trip(client)
    answer = client.post("/pay", headers=headers)
    assert answer.status_code == 503
    if json_expected:
        assert answer.get_json() == {
            "error": "service_unavailable",
            "message": "Payments are resting.",
            "breaker": "pay",
            "reason": "open",
            "retry_after": 10,
        }
    else:
        assert answer.get_data(as_text=True) == "Payments are resting.\n"


@pytest.mark.parametrize("headers", [{}, {"Accept": "application/json"}], ids=["text", "json"])
def test_the_refusal_is_the_flask_extension_s(clock, headers):
    from flask import Flask, jsonify

    from breaker_redis.flask import FlaskBreakers

    flask_app = Flask(__name__)
    ext = FlaskBreakers(flask_app, client=fakeredis.FakeRedis(), clock=clock, listen=False)

    @flask_app.post("/pay")
    @ext.protect("pay", **FAST)
    def pay():
        return jsonify(ok=False), 500

    mw = BreakerMiddleware(
        shop,
        Breakers(fakeredis.FakeRedis(), clock=clock, listen=False),
        routes={"/pay": {"breaker": "pay", **FAST}},
    )
    answers = []
    for client in (flask_app.test_client(), Client(mw)):
        trip(client)
    clock.advance(1200)
    for client in (flask_app.test_client(), Client(mw)):
        answers.append(client.post("/pay", headers=headers))
    flask, ours = answers
    assert ours.status_code == flask.status_code == 503
    assert ours.get_data() == flask.get_data()
    names = ("Content-Type", "Content-Length", "Retry-After", "X-Breaker", "X-Breaker-Reason")
    assert {n: ours.headers.get(n) for n in names} == {n: flask.headers.get(n) for n in names}
    assert ours.headers["Retry-After"] == "9"


def test_head_refusals_have_no_body(make):
    mw = make(routes={"/pay": {"breaker": "pay", **FAST}})
    client = Client(mw)
    trip(client)
    started = Started()
    body = b"".join(mw(environ("/pay", "HEAD"), started))
    assert started.status.startswith("503") and body == b""
    assert started.headers["Content-Length"] == str(len(FRIENDLY))


def test_half_open_and_forced_refusals(make, clock):
    mw = make(routes={"/pay": {"breaker": "pay", **FAST, "half_open_max_calls": 1, "open_seconds": 45}})
    client = Client(mw)
    trip(client)
    clock.advance(45_000)
    probe = mw(environ("/pay"), Started())  # admitted as the probe, still running
    answer = client.get("/pay")
    assert (answer.status_code, answer.headers["Retry-After"], answer.headers["X-Breaker-Reason"]) == (
        503,
        "1",
        "half_open_full",
    )
    list(probe)
    probe.close()
    mw.breaker("pay").force_open()
    answer = client.get("/pay")
    assert (answer.headers["Retry-After"], answer.headers["X-Breaker-Reason"]) == ("45", "forced_open")


def test_an_outbound_refusal_escaping_the_app_is_a_503_and_ignored_by_the_route(make):
    def app(environ, start_response):
        if environ["PATH_INFO"] == "/late":
            start_response("200 OK", [])  # already started: the 503 needs exc_info
        raise BreakerOpen(3.2, "inventory", "open")

    mw = make(app, routes={"/checkout": "checkout"})
    client = Client(mw)
    for path in ("/checkout", "/products"):
        answer = client.get(path, headers={"Accept": "application/json"})
        assert answer.status_code == 503, path
        assert answer.headers["X-Breaker"] == "inventory" and answer.headers["Retry-After"] == "4"
        assert answer.get_json()["breaker"] == "inventory"
    assert counts(mw, "checkout") == (0, 0, 1)
    started = Started()  # werkzeug's test start_response re-raises any exc_info: drive it as gunicorn does
    body = b"".join(mw(environ("/late"), started))
    assert started.status.startswith("503") and b"inventory" in body


# -- when the outcome is recorded: the commit ------------------------------------------------


def streaming(chunks, *, status="200 OK", fail_at=None, events=None, start_late=False):
    """A generator app: yields chunks, raising RuntimeError at index fail_at;
    with start_late it calls start_response at its first next(), as PEP 3333 allows."""

    def app(environ, start_response):
        if not start_late:
            start_response(status, [("Content-Type", "text/plain")])

        def body() -> Iterator[bytes]:
            try:
                if start_late:
                    start_response(status, [("Content-Type", "text/plain")])
                for index, chunk in enumerate(chunks):
                    if index == fail_at:
                        raise RuntimeError("upstream died")
                    yield chunk
                if fail_at == len(chunks):
                    raise RuntimeError("upstream died at the end")
            finally:
                if events is not None:
                    events.append("closed")

        return body()

    return app


@pytest.mark.parametrize("start_late", [False, True], ids=["start-first", "start-in-body"])
def test_the_outcome_is_recorded_at_the_first_body_bytes(make, start_late):
    mw = make(streaming([b"", b"a", b"b", b"c"], start_late=start_late), routes={"/pay": "pay"})
    started = Started()
    result = mw(environ(), started)
    body = iter(result)
    assert snap(mw)["calls"] == 0 and started.calls == []  # nothing committed, nothing sent
    assert next(body) == b"a"  # empty chunks are held back: they would make a server send headers
    assert started.status == "200 OK" and counts(mw) == (1, 0, 0)
    assert list(body) == [b"b", b"c"]
    result.close()
    assert snap(mw)["calls"] == 1


def test_a_5xx_stream_is_a_failure_at_its_first_bytes(make):
    mw = make(streaming([b"a", b"b"], status="502 Bad Gateway"), routes={"/pay": "pay"})
    body = iter(mw(environ(), Started()))
    next(body)
    assert counts(mw) == (0, 1, 0)


def test_an_exception_before_the_first_bytes_is_a_failure(make):
    mw = make(streaming([b"a"], fail_at=0), routes={"/pay": "pay"})
    started = Started()
    with pytest.raises(RuntimeError, match="upstream died"):
        list(mw(environ(), started))
    assert counts(mw) == (0, 1, 0) and started.calls == []  # the server answers its own 500


def test_an_exception_before_the_first_bytes_is_served_by_the_fallback(make):
    mw = make(streaming([b"a"], fail_at=0), routes={"/pay": {"breaker": "pay", "fallback": static("later")}})
    started = Started()
    assert b"".join(mw(environ(), started)) == b"later"
    assert started.status == "200 OK" and started.headers["X-Breaker-Fallback"] == "static"
    assert "X-Breaker-Reason" not in started.headers
    assert counts(mw) == (0, 1, 0)


def test_an_exception_after_the_first_bytes_was_already_counted_by_the_status(make):
    """The client has a 200 and part of the body; the breaker judged the same."""
    events = []
    mw = make(streaming([b"a", b"b"], fail_at=1, events=events), routes={"/pay": "pay"})
    body = mw(environ(), Started())
    received = []
    with pytest.raises(RuntimeError, match="upstream died"):
        for chunk in body:
            received.append(chunk)
    body.close()
    assert received == [b"a"] and events == ["closed"]
    assert counts(mw) == (1, 0, 0)


def test_close_without_reading_settles_by_the_status(make):
    events = []
    mw = make(streaming([b"a"], status="503 Service Unavailable", events=events), routes={"/pay": "pay"})
    body = mw(environ(), Started())
    body.close()  # never read: an outer middleware answered instead, say
    assert counts(mw) == (0, 1, 0) and events == []  # the generator never started


def test_close_before_the_app_said_anything_is_ignored_and_closes_the_app(make):
    events = []
    mw = make(streaming([b"a"], start_late=True, events=events), routes={"/pay": "pay"})
    result = mw(environ(), Started())
    iter(result)  # the server took the body's iterator, then gave up before reading it
    result.close()  # a server closes what the app returned (PEP 3333), not its iterator
    assert counts(mw) == (0, 0, 1)


def test_a_body_without_start_response_is_a_failure(make):
    def app(environ, start_response):
        return [b"oops"]

    mw = make(app, routes={"/pay": "pay"})
    with pytest.raises(RuntimeError, match="without calling start_response"):
        list(mw(environ(), Started()))
    assert counts(mw) == (0, 1, 0)


def test_slow_calls_are_timed_to_the_first_byte(make, clock):
    def app(environ, start_response):
        clock.advance(int(environ["QUERY_STRING"].split("=")[1]))  # before the response starts
        start_response("200 OK", [])

        def body():
            yield b"a"
            clock.advance(5000)  # a client reading slowly: not the service's time
            yield b"b"

        return body()

    mw = make(
        app,
        routes={"/pay": {"breaker": "pay", "slow_call_seconds": 0.5, "trip": "rate", "minimum_calls": 100}},
    )
    client = Client(mw)
    client.get("/pay?ms=100").close()
    client.get("/pay?ms=700").close()
    assert (snap(mw)["slow"], snap(mw)["successes"]) == (1, 2)


@pytest.mark.parametrize("how", ["closed", "dropped"])
def test_a_probe_never_leaks(make, clock, how):
    """Half-open with one probe: a probe whose body nobody reads is settled
    (by close(), or by the next request when the server dropped it), so the
    next request is not refused with half_open_full for probe_timeout_seconds."""
    mw = make(streaming([b"a", b"b"]), routes={"/pay": {"breaker": "pay", **FAST, "half_open_successes": 2}})
    client = Client(mw)
    for _ in range(2):
        mw.breaker("pay").acquire().failure()
    clock.advance(10_000)
    body = mw(environ(), Started())
    assert snap(mw)["probes_in_flight"] == 1
    if how == "closed":
        body.close()
    else:
        del body
        gc.collect()
    answer = client.get("/pay")
    assert answer.status_code == 200, answer.headers.get("X-Breaker-Reason")
    s = snap(mw)
    assert (s["state"], s["successes"]) == ("closed", 2)


def test_the_write_callable_commits_and_a_fallback_replaces_what_follows(make):
    def app(environ, start_response):
        status = "502 Bad Gateway" if "fail" in environ["QUERY_STRING"] else "200 OK"
        write = start_response(status, [("Content-Type", "text/plain")])
        write(b"one ")
        write(b"two")
        return []

    route = {"breaker": "pay", "fallback": static("degraded"), "failure_threshold": 9}
    mw = make(app, routes={"/pay": route})
    client = Client(mw)
    assert client.get("/pay").get_data() == b"one two"
    answer = client.get("/pay?fail=1")
    assert (answer.status_code, answer.get_data()) == (200, b"degraded")
    assert counts(mw) == (1, 1, 0)


def test_a_file_wrapper_is_returned_as_it_is_and_recorded(make):
    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return environ["wsgi.file_wrapper"](io.BytesIO(b"file bytes"), 4)

    mw = make(app, routes={"/files": "files"})
    env = environ("/files")
    env["wsgi.file_wrapper"] = FileWrapper
    result = mw(env, Started())
    assert isinstance(result, FileWrapper)  # the server may still use sendfile
    assert counts(mw, "files") == (1, 0, 0)
    assert b"".join(result) == b"file bytes"


def test_start_response_again_with_exc_info_before_the_commit_replaces_the_status(make):
    def app(environ, start_response):
        start_response("200 OK", [])
        try:
            raise ValueError("while rendering")
        except ValueError:
            start_response("500 Internal Server Error", [("Content-Type", "text/plain")], sys.exc_info())
        return [b"error page"]

    mw = make(app, routes={"/pay": "pay"})
    answer = Client(mw).get("/pay")
    assert (answer.status_code, answer.get_data()) == (500, b"error page")
    assert counts(mw) == (0, 1, 0)


# -- fallbacks --------------------------------------------------------------------------------


def test_static_answers_a_refusal_and_a_failure(make):
    mw = make(
        routes={"/cart": {"breaker": "cart", "fallback": static({"items": [], "degraded": True}), **FAST}}
    )
    client = Client(mw)
    failed = client.get("/cart?status=500")
    assert (failed.status_code, failed.get_json()) == (200, {"items": [], "degraded": True})
    assert failed.headers["X-Breaker-Fallback"] == "static" and "X-Breaker-Reason" not in failed.headers
    with_exception = client.get("/cart?raise=1")
    assert with_exception.status_code == 200
    refused = client.get("/cart")
    assert refused.get_json() == {"items": [], "degraded": True}
    assert (refused.headers["X-Breaker"], refused.headers["X-Breaker-Reason"]) == ("cart", "open")
    assert refused.headers["Content-Length"] == str(len(refused.get_data()))
    assert counts(mw, "cart") == (0, 2, 0)  # failures served by the fallback still count


def test_fallback_on_failure_false_keeps_the_failed_response(make):
    mw = make(
        routes={"/cart": {"breaker": "cart", "fallback": static("x"), "fallback_on_failure": False, **FAST}}
    )
    client = Client(mw)
    assert client.get("/cart?status=500").status_code == 500
    with pytest.raises(RuntimeError):
        client.get("/cart?raise=1")
    assert client.get("/cart").get_data() == b"x"


def test_cached_is_shared_by_every_worker(make):
    """Two middlewares on one store are two gunicorn workers."""
    routes = {"/cart": {"breaker": "cart", "fallback": chain(cached(ttl=60), static("empty")), **FAST}}
    first, second = make(routes=routes), make(routes=routes)
    a, b = Client(first), Client(second)
    live = a.get("/cart?v=1&cookie=1")
    assert live.get_data() and live.status_code == 200  # sent whole: remembered in Redis by worker a
    trip(b, "/cart", expect=None)  # served by the fallback, and trips the breaker for both
    served = b.get("/cart?v=1&cookie=1")
    assert (served.status_code, served.headers["X-Breaker-Fallback"]) == (200, "cached")
    assert served.get_json() == {"ok": True, "path": "/cart", "v": "1"}
    assert served.headers["X-Custom"] == "kept" and "Age" in served.headers
    assert "Set-Cookie" not in served.headers
    assert served.headers["X-Breaker-Reason"] == "open"
    assert a.head("/cart?v=1&cookie=1").headers["X-Breaker-Fallback"] == "cached"  # HEAD reads GET's
    other = b.get("/cart?v=2")
    assert (other.get_data(), other.headers["X-Breaker-Fallback"]) == (b"empty", "static")


@pytest.mark.parametrize(
    "how",
    ["post", "head", "5xx", "no-store", "too-big", "cut-short"],
)
def test_cached_never_keeps(make, how):
    big = b"x" * 64

    def app(environ, start_response):
        start_response(
            "200 OK",
            [("Content-Type", "text/plain")] + ([("Cache-Control", "no-store")] if how == "no-store" else []),
        )
        return iter([b"part one ", big if how == "too-big" else b"part two"])

    fallback = chain(cached(ttl=60, max_bytes=32), static("miss"))
    mw = make(app, routes={"/cart": {"breaker": "cart", "fallback": fallback, **FAST}})
    if how == "5xx":
        other_worker = make(shop, routes={"/cart": {"breaker": "cart", "fallback": fallback, **FAST}})
        Client(other_worker).get("/cart?status=503")
    elif how == "cut-short":
        result = mw(environ("/cart"), Started())
        next(iter(result))
        result.close()  # the client went away after the first chunk
    else:
        Client(mw).open("/cart", method={"post": "POST", "head": "HEAD"}.get(how, "GET")).close()
    mw.breaker("cart").force_open()
    assert Client(mw).get("/cart").get_data() == b"miss"


@pytest.mark.parametrize(
    ("returned", "status", "body", "content_type"),
    [
        (b"\x00raw", 200, b"\x00raw", "application/octet-stream"),
        ("text", 200, b"text", "text/plain; charset=utf-8"),
        ({"items": []}, 200, b'{"items": []}', "application/json"),
        (("busy", 202), 202, b"busy", "text/plain; charset=utf-8"),
        (("busy", 202, {"Content-Type": "text/x-busy"}), 202, b"busy", "text/x-busy"),
        (
            FallbackResponse(b"<p>later</p>", 200, (("Content-Type", "text/html"), ("Content-Length", "99"))),
            200,
            b"<p>later</p>",
            "text/html",
        ),
    ],
    ids=["bytes", "str", "json", "pair", "triple", "fallback-response"],
)
def test_function_fallback_return_values(make, returned, status, body, content_type):
    mw = make(routes={"/pay": {"breaker": "pay", "fallback": function(lambda context: returned), **FAST}})
    answer = Client(mw).get("/pay?status=500")
    assert (answer.status_code, answer.get_data(), answer.headers["Content-Type"]) == (
        status,
        body,
        content_type,
    )
    assert answer.headers["X-Breaker-Fallback"] == "function"
    assert answer.headers["Content-Length"] == str(len(body))


def test_a_function_fallback_may_return_a_wsgi_app_or_a_django_style_response(make):
    def simplified(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain"), ("X-Simple", "yes")])
        yield b"simplified "
        yield environ["PATH_INFO"].encode()

    class DjangoLike:  # what a django.http.HttpResponse offers
        status_code = 203
        content = b"from a view"

        def items(self):
            return [("Content-Type", "text/plain"), ("X-Django", "yes")]

    seen = []

    def fallback(context):
        seen.append(
            (
                context.breaker,
                type(context.cause).__name__,
                context.method,
                context.key,
                context.request["PATH_INFO"],
            )
        )
        return simplified if "/pay" in context.key else DjangoLike()

    mw = make(
        routes={
            "/pay": {"breaker": "pay", "fallback": fallback, **FAST},
            "/cart": {"breaker": "cart", "fallback": fallback, **FAST},
        }
    )
    client = Client(mw)
    answer = client.get("/pay?status=500")
    assert (answer.get_data(), answer.headers["X-Simple"]) == (b"simplified /pay", "yes")
    trip(client, "/cart", expect=None)
    answer = client.get("/cart?v=3")
    assert (answer.status_code, answer.get_data(), answer.headers["X-Django"]) == (203, b"from a view", "yes")
    assert seen[0] == ("pay", "NoneType", "GET", "GET /pay?status=500", "/pay")
    assert seen[-1] == ("cart", "BreakerOpen", "GET", "GET /cart?v=3", "/cart")


def test_a_fallback_with_nothing_to_give_or_broken_leaves_the_refusal(make, caplog):
    def broken_app(environ, start_response):
        raise RuntimeError("the fallback's app is broken")

    mw = make(
        routes={
            "/none": {"breaker": "none", "fallback": function(lambda context: None), **FAST},
            "/raises": {"breaker": "raises", "fallback": function(lambda context: 1 / 0), **FAST},
            "/app": {"breaker": "app", "fallback": function(lambda context: broken_app), **FAST},
        }
    )
    client = Client(mw)
    for path in ("/none", "/raises", "/app"):
        assert client.get(f"{path}?status=500").status_code == 500  # a failed response stays as it was
        trip(client, path, 1)
        assert client.get(path).status_code == 503
    assert "the fallback of breaker 'app' failed" in caplog.text


# -- a real HTTP server, and a client that hangs up -----------------------------------------------


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):
        return


def test_a_client_hanging_up_mid_stream_closes_the_app_and_records_once(make):
    """wsgiref over a real socket: the server notices the hang-up when a write
    fails, closes our iterable, and that closes the app's generator."""
    closed = threading.Event()

    def app(environ, start_response):
        if environ["PATH_INFO"] == "/products":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"tea"]
        start_response("200 OK", [("Content-Type", "application/octet-stream")])

        def endless():
            try:
                while True:
                    yield b"x" * 65536
            finally:
                closed.set()

        return endless()

    mw = make(app, routes={"/stream": "stream"})
    server = make_server("127.0.0.1", 0, mw, server_class=WSGIServer, handler_class=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /stream HTTP/1.0\r\nHost: x\r\n\r\n")
            received = b""
            while b"\r\n\r\n" not in received or len(received) < 100_000:
                received += sock.recv(65536)
            assert received.startswith(b"HTTP/1.0 200")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset
        wait_until(closed.is_set, timeout=20, what="the server to close the stream's generator")
        assert counts(mw, "stream") == (1, 0, 0)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /products HTTP/1.0\r\nHost: x\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        assert data.endswith(b"tea")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


# -- an app that raises after its response committed through write() -------------------------


def _served_by_wsgiref(app: Any) -> str:
    """Run app under wsgiref's own handler (which refuses a second start_response); its error log."""
    import wsgiref.handlers

    out, err = io.BytesIO(), io.StringIO()
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": "/pay",
        "SERVER_NAME": "x",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.url_scheme": "http",
    }
    wsgiref.handlers.SimpleHandler(io.BytesIO(), out, err, environ, multithread=False).run(app)
    return err.getvalue()


@pytest.mark.parametrize("raised", ["outbound refusal", "failure with a fallback"])
def test_nothing_is_answered_after_the_app_committed_through_write(redis_server, raised):
    redis_server.client().flushall()
    refusal = BreakerOpen(3.0, "inventory", "open")
    exc: Exception = refusal if raised == "outbound refusal" else RuntimeError("died")

    def app(environ: Any, start_response: Any) -> Any:
        write = start_response("200 OK", [("Content-Type", "text/plain")])
        write(b"partial ")  # committed: the status and headers are out
        raise exc

    breakers = Breakers.from_url(redis_server.url)
    try:
        routes = {"/pay": {"breaker": "pay", "fallback": static("cached")}}
        errors = _served_by_wsgiref(BreakerMiddleware(app, breakers, routes=routes))
        assert "Headers already set" not in errors
        assert type(exc).__name__ in errors  # the app's own exception is what the server saw
        snap = breakers.get("pay").snapshot()
        assert (snap["successes"], snap["failures"]) == (1, 0)  # counted by its status, at the commit
    finally:
        breakers.close()
