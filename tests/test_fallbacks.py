"""Fallbacks (static, cached in Redis and shared by workers, function, chain) and
outbound calls (breakers.call and @breakers.outbound) on fakeredis[lua]."""

from __future__ import annotations

import json

import fakeredis
import pytest
import requests
from flask import Flask, jsonify, request

from breaker_redis import BreakerOpen
from breaker_redis.fallbacks import (
    Cached,
    Chain,
    FallbackContext,
    Function,
    Static,
    as_fallback,
    cached,
    chain,
    function,
    static,
)
from breaker_redis.flask import CallFailed, FlaskBreakers
from tests.support.flask_apps import make_app

FAST = {"trip": "consecutive", "failure_threshold": 2, "open_seconds": 10}


def shop(clock, server=None, fallback=None, **options):
    """/cart behind breaker 'cart' with the given fallback; ?fail=1 makes it 502."""
    app, ext = make_app(clock, server)

    @app.route("/cart", methods=["GET", "POST", "HEAD"])
    @ext.protect("cart", fallback=fallback, **{**FAST, **options})
    def cart():
        if request.args.get("fail"):
            return jsonify(error="upstream failed"), 502
        response = jsonify(items=["tea", request.args.get("v", "1")])
        response.headers["X-Custom"] = "kept"
        response.set_cookie("session", "secret")
        return response

    return app, ext


def open_breaker(client, path="/cart?fail=1", n=2):
    for _ in range(n):
        client.get(path)


# -- static -------------------------------------------------------------------------------


def test_static_answers_a_refused_request(clock):
    app, _ = shop(clock, fallback=static({"items": [], "degraded": True}), fallback_on_failure=False)
    client = app.test_client()
    open_breaker(client)
    answer = client.get("/cart")
    assert answer.status_code == 200
    assert answer.get_json() == {"items": [], "degraded": True}
    assert answer.headers["X-Breaker-Fallback"] == "static"
    assert (answer.headers["X-Breaker"], answer.headers["X-Breaker-Reason"]) == ("cart", "open")


def test_static_bodies_and_statuses():
    assert Static(b"\x00", content_type="image/png").response.headers == (("Content-Type", "image/png"),)
    text = static("later", status=202, headers={"X-A": "b"}).response
    assert (text.body, text.status, dict(text.headers)["Content-Type"]) == (
        b"later",
        202,
        "text/plain; charset=utf-8",
    )
    assert json.loads(static([1, "二"]).response.body) == [1, "二"]


def test_a_failed_call_is_answered_by_the_fallback_but_still_counted(clock):
    app, ext = shop(clock, fallback=static("sorry"))
    client = app.test_client()
    answer = client.get("/cart?fail=1")
    assert (answer.status_code, answer.get_data(as_text=True)) == (200, "sorry")
    assert answer.headers["X-Breaker-Fallback"] == "static"
    assert "X-Breaker-Reason" not in answer.headers
    with app.app_context():
        assert ext.breaker("cart").snapshot()["failures"] == 1


def test_fallback_on_failure_can_be_turned_off(clock):
    app, _ = shop(clock, fallback=static("sorry"), fallback_on_failure=False)
    assert app.test_client().get("/cart?fail=1").status_code == 502


def test_an_exception_is_answered_by_the_fallback(clock):
    app, ext = make_app(clock)

    @app.get("/boom")
    @ext.protect("boom", fallback=static("degraded"))
    def boom():
        raise RuntimeError("upstream exploded")

    answer = app.test_client().get("/boom")
    assert (answer.status_code, answer.get_data(as_text=True)) == (200, "degraded")
    with app.app_context():
        assert ext.breaker("boom").snapshot()["failures"] == 1


# -- cached -------------------------------------------------------------------------------


def test_cached_serves_the_last_good_response_to_every_worker(clock):
    server = fakeredis.FakeServer()
    app1, _ = shop(clock, server, fallback=cached(ttl=60))
    app2, _ = shop(clock, server, fallback=cached(ttl=60))  # another worker process
    first, second = app1.test_client(), app2.test_client()
    assert first.get("/cart?v=7").status_code == 200
    open_breaker(second, "/cart?v=7&fail=1")  # failures on the other worker, served from the cache
    answer = second.get("/cart?v=7")
    assert answer.status_code == 200
    assert answer.get_json() == {"items": ["tea", "7"]}
    assert answer.headers["X-Breaker-Fallback"] == "cached"
    assert answer.headers["X-Custom"] == "kept"
    assert "Set-Cookie" not in answer.headers  # never replay someone's cookie
    assert int(answer.headers["Age"]) >= 0
    assert second.get("/cart?v=8").status_code == 503  # a different query string: a miss


def test_cached_entries_are_bytes_and_json_with_a_ttl_never_pickle(clock):
    server = fakeredis.FakeServer()
    app, _ = shop(clock, server, fallback=cached(ttl=30))
    app.test_client().get("/cart")
    redis = fakeredis.FakeRedis(server=server)
    keys = redis.keys("breaker:{cart}:fallback:*")
    assert len(keys) == 1
    entry = redis.hgetall(keys[0])
    assert set(entry) == {b"status", b"headers", b"body", b"stored_at"}
    assert entry[b"status"] == b"200"
    assert json.loads(entry[b"body"]) == {"items": ["tea", "1"]}
    headers = dict(json.loads(entry[b"headers"]))
    assert headers["Content-Type"] == "application/json"
    assert "Set-Cookie" not in headers
    assert 0 < redis.pttl(keys[0]) <= 30_000


def test_cached_keeps_only_cacheable_good_responses(clock):
    server = fakeredis.FakeServer()
    app, ext = make_app(clock, server)

    @app.route("/r/<kind>", methods=["GET", "POST"])
    @ext.protect("r", fallback=cached(max_bytes=100), failure_threshold=50)
    def r(kind):
        if kind == "nostore":
            return "x", 200, {"Cache-Control": "no-store"}
        if kind == "private":
            return "x", 200, {"Cache-Control": "private, max-age=5"}
        if kind == "big":
            return "x" * 101
        if kind == "created":
            return "x", 201
        return "fine"

    client = app.test_client()
    for kind in ("nostore", "private", "big", "created"):
        client.get(f"/r/{kind}")
    client.post("/r/ok")
    redis = fakeredis.FakeRedis(server=server)
    assert redis.keys("breaker:{r}:fallback:*") == []
    client.get("/r/ok")
    assert len(redis.keys("breaker:{r}:fallback:*")) == 1


def test_cached_is_refreshed_at_most_once_per_period_per_worker(clock):
    server = fakeredis.FakeServer()
    app, _ = shop(clock, server, fallback=cached(refresh_seconds=3600))
    client = app.test_client()
    client.get("/cart?v=1")
    client.get("/cart?v=1")
    redis = fakeredis.FakeRedis(server=server)
    (key,) = redis.keys("breaker:{cart}:fallback:*")
    stored_at = redis.hget(key, "stored_at")
    redis.hset(key, "stored_at", b"1")
    client.get("/cart?v=1")
    assert redis.hget(key, "stored_at") == b"1" != stored_at  # not rewritten within the period


def test_head_reads_the_get_entry_and_post_is_never_served_from_cache(clock):
    app, _ = shop(clock, fallback=cached())
    client = app.test_client()
    client.get("/cart")
    open_breaker(client)
    assert client.head("/cart").headers["X-Breaker-Fallback"] == "cached"
    assert client.post("/cart").status_code == 503


def test_cached_with_a_key_function_per_user(clock):
    app, _ = shop(clock, fallback=cached(key=lambda req: req.headers.get("X-User", "")))
    client = app.test_client()
    client.get("/cart?v=alice", headers={"X-User": "alice"})
    open_breaker(client)
    assert client.get("/cart?v=other", headers={"X-User": "alice"}).get_json() == {"items": ["tea", "alice"]}
    assert client.get("/cart", headers={"X-User": "bob"}).status_code == 503


def test_a_corrupted_cache_entry_is_a_miss(clock):
    server = fakeredis.FakeServer()
    app, _ = shop(clock, server, fallback=cached())
    client = app.test_client()
    client.get("/cart")
    redis = fakeredis.FakeRedis(server=server)
    (key,) = redis.keys("breaker:{cart}:fallback:*")
    redis.hset(key, "headers", b"not json")
    open_breaker(client)
    assert client.get("/cart").status_code == 503


def test_a_dead_store_makes_cached_a_miss_not_an_error():
    class Dead:
        def hgetall(self, key):
            raise ConnectionError("down")

        def pipeline(self, transaction=True):
            raise ConnectionError("down")

    context = FallbackContext("x", None, "GET /", "GET", Dead(), "breaker")
    fallback = Cached()
    assert fallback.serve(context) is None
    from breaker_redis.fallbacks import FallbackResponse

    fallback.remember(context, FallbackResponse(b"x"))  # logged, not raised
    unhealthy = FallbackContext("x", None, "GET /", "GET", Dead(), "b", store_healthy=False)
    assert Cached().serve(unhealthy) is None


def test_cached_refuses_a_bad_ttl():
    with pytest.raises(ValueError, match="ttl"):
        cached(ttl=0)


# -- function and chain ----------------------------------------------------------------------


def test_function_is_a_simplified_implementation(clock):
    seen = []

    def simplified(context):
        seen.append((context.breaker, type(context.cause).__name__, context.method))
        return jsonify(items=["bestseller"], simplified=True)

    app, _ = shop(clock, fallback=function(simplified), fallback_on_failure=False)
    client = app.test_client()
    open_breaker(client)
    answer = client.get("/cart")
    assert answer.get_json() == {"items": ["bestseller"], "simplified": True}
    assert answer.headers["X-Breaker-Fallback"] == "function"
    assert seen == [("cart", "BreakerOpen", "GET")]


def test_a_plain_callable_or_value_is_accepted_as_fallback(clock):
    assert isinstance(as_fallback(lambda ctx: "x"), Function)
    assert isinstance(as_fallback({"a": 1}), Static)
    assert as_fallback(None) is None
    app, _ = shop(clock, fallback=lambda ctx: ({"from": "lambda"}, 203), fallback_on_failure=False)
    client = app.test_client()
    open_breaker(client)
    answer = client.get("/cart")
    assert (answer.status_code, answer.get_json()) == (203, {"from": "lambda"})


def test_chain_tries_each_fallback_in_turn(clock):
    def broken(context):
        raise RuntimeError("the simplified path is down too")

    app, _ = shop(
        clock,
        fallback=chain(cached(), function(broken), function(lambda c: None), static({"items": []})),
        fallback_on_failure=False,
    )
    client = app.test_client()
    open_breaker(client)
    answer = client.get("/cart")  # nothing cached, function raised, function had nothing: static
    assert (answer.get_json(), answer.headers["X-Breaker-Fallback"]) == ({"items": []}, "static")


def test_chain_remembers_through_its_cached_member(clock):
    fallback = chain(static("s"), cached())
    assert isinstance(fallback, Chain) and fallback.remembers
    app, _ = shop(clock, fallback=chain(cached(), static("empty")), fallback_on_failure=False)
    client = app.test_client()
    client.get("/cart?v=3")
    open_breaker(client)
    assert client.get("/cart?v=3").headers["X-Breaker-Fallback"] == "cached"
    assert client.get("/cart?v=4").get_data(as_text=True) == "empty"


def test_chain_needs_fallbacks():
    with pytest.raises(ValueError):
        chain()
    with pytest.raises(TypeError):
        chain("not a fallback")  # type: ignore[arg-type]


def test_a_fallback_that_cannot_answer_leaves_the_503(clock):
    app, _ = shop(clock, fallback=function(lambda c: None), fallback_on_failure=False)
    client = app.test_client()
    open_breaker(client)
    answer = client.get("/cart")
    assert answer.status_code == 503 and "X-Breaker-Fallback" not in answer.headers


# -- outbound calls --------------------------------------------------------------------------


class FakeResponse:
    def __init__(self, status_code):
        self.status_code = status_code


def test_call_counts_exceptions_and_timeouts_then_refuses(clock):
    app, ext = make_app(clock)
    ext.breaker("inventory", **FAST)

    def timeout():
        raise requests.Timeout("read timed out")

    with app.app_context():
        for _ in range(2):
            with pytest.raises(requests.Timeout):
                ext.call("inventory", timeout)
        with pytest.raises(BreakerOpen) as info:
            ext.call("inventory", lambda: "never called")
        assert info.value.retry_after == 10
        assert ext.breaker("inventory").snapshot()["failures"] == 2


def test_call_treats_a_5xx_result_as_failure_and_returns_it(clock):
    app, ext = make_app(clock)
    with app.app_context():
        assert ext.call("inv", FakeResponse, 503).status_code == 503
        assert ext.call("inv", FakeResponse, 404).status_code == 404
        assert ext.call("inv", lambda: {"plain": "value"}) == {"plain": "value"}
        snap = ext.breaker("inv").snapshot()
    assert (snap["failures"], snap["successes"]) == (1, 2)


def test_call_fallbacks_get_the_refusal_the_exception_or_the_failed_result(clock):
    app, ext = make_app(clock)
    ext.breaker("inv", **FAST)
    causes = []

    def fallback(cause):
        causes.append(cause)
        return "default"

    def broken():
        raise ConnectionError("refused")

    with app.app_context():
        assert ext.call("inv", FakeResponse, 500, fallback=fallback) == "default"  # failure 1
        assert ext.call("inv", FakeResponse, 200, fallback=fallback).status_code == 200  # success
        assert ext.call("inv", broken, fallback=fallback) == "default"  # failure 1 again
        assert ext.call("inv", broken, fallback=[]) == []  # failure 2: open
        assert ext.call("inv", broken, fallback=fallback) == "default"  # refused: broken not called
        assert ext.breaker("inv").snapshot()["calls"] == 4
    assert len(causes) == 3
    assert isinstance(causes[0], CallFailed) and causes[0].result.status_code == 500
    assert isinstance(causes[1], ConnectionError)
    assert isinstance(causes[-1], BreakerOpen)


def test_call_reraises_ignored_exceptions_even_with_a_fallback(clock):
    app, ext = make_app(clock)
    ext.breaker("inv", ignore_exceptions=(KeyError,))

    def missing():
        raise KeyError("sku")

    with app.app_context(), pytest.raises(KeyError):
        ext.call("inv", missing, fallback="default")


def test_outbound_decorator_is_the_service_wrapper(clock):
    app, ext = make_app(clock)
    calls = []

    @ext.outbound("recommend", fallback=lambda cause: ["bestseller"], **FAST)
    def recommend(user):
        calls.append(user)
        raise requests.ConnectionError("down")

    @app.get("/recommend")
    def view():
        return jsonify(items=recommend("alice"))

    client = app.test_client()
    for _ in range(4):
        assert client.get("/recommend").get_json() == {"items": ["bestseller"]}
    assert calls == ["alice", "alice"]  # the breaker opened after two failures


def test_call_outside_a_request_uses_the_bound_app(clock):
    _app, ext = make_app(clock)
    assert ext.call("inv", lambda: 5) == 5
    unbound = FlaskBreakers(client=fakeredis.FakeRedis(), listen=False)
    with pytest.raises(RuntimeError, match="no application context"):
        unbound.call("inv", lambda: 5)
    other = Flask("other")
    with other.app_context(), pytest.raises(RuntimeError, match="init_app"):
        unbound.call("inv", lambda: 5)
