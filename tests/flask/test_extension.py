"""FlaskBreakers on Flask's test client and fakeredis[lua]: config keys, decorator
vs BREAKER_ROUTES, classification, refusals (Retry-After, JSON vs text), and
permits settled exactly once whatever raises where."""

from __future__ import annotations

import json
import socket

import fakeredis
import pytest
from flask import Flask, abort, jsonify

from breaker_redis import BreakerConfig, BreakerOpen, Breakers, urls
from breaker_redis.flask import BreakerOpenError, FlaskBreakers, wants_json
from tests.support.flask_apps import make_app

# A friendly message that is not ASCII: "the payment service is temporarily unavailable,
# please retry later" in Chinese (its full-width comma written as an escape for the linter).
CHINESE_MESSAGE = "支付服务暂时不可用\uff0c请稍后再试"
# 5 failures in 10 s open it for 10 s: the classic OpenResty lua_shared_dict breaker
PAY_5_IN_10S = {
    "trip": "count",
    "failure_threshold": 5,
    "window_seconds": 10,
    "open_seconds": 10,
    "half_open_successes": 2,
}


def snapshot(ext, app, name):
    with app.app_context():
        return ext.breaker(name).snapshot()


def add_pay(app, ext, **options):
    options = {**PAY_5_IN_10S, **options}

    @app.route("/pay", methods=["GET", "POST"])
    @ext.protect("pay", **options)
    def pay():
        from flask import request

        status = int(request.args.get("status", 200))
        if request.args.get("raise"):
            raise RuntimeError("boom")
        return jsonify(ok=status < 500), status


def trip(client, n=5):
    for _ in range(n):
        assert client.post("/pay?status=500").status_code == 500


def dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again on exit: connecting is refused


# -- set-up and config keys ----------------------------------------------------------


def test_registered_in_app_extensions_both_ways(clock):
    app, ext = make_app(clock)
    assert app.extensions["breaker_redis"].breakers is ext.breakers

    later = FlaskBreakers(client=fakeredis.FakeRedis(), clock=clock, listen=False)
    other = Flask("other")
    later.init_app(other)
    assert "breaker_redis" in other.extensions
    with other.app_context():
        assert isinstance(later.breakers, Breakers)


def test_unknown_constructor_argument_is_refused():
    with pytest.raises(TypeError, match="redis_ulr"):
        FlaskBreakers(redis_ulr="redis://x")


def test_key_prefix_from_config_and_overridden_by_the_constructor(clock):
    server = fakeredis.FakeServer()
    app, ext = make_app(clock, server, config={"BREAKER_KEY_PREFIX": "shop"})
    add_pay(app, ext)
    app.test_client().post("/pay")
    redis = fakeredis.FakeRedis(server=server)
    assert redis.hget("shop:{pay}:state", "state") == b"closed"

    app2, ext2 = make_app(clock, server, config={"BREAKER_KEY_PREFIX": "shop"}, key_prefix="override")
    add_pay(app2, ext2)
    app2.test_client().post("/pay")
    assert redis.hget("override:{pay}:state", "state") == b"closed"


def test_redis_url_is_read_and_nothing_connects_at_set_up(clock):
    port = dead_port()
    app = Flask(__name__)
    app.config["BREAKER_REDIS_URL"] = f"redis://127.0.0.1:{port}/3"
    ext = FlaskBreakers(app, listen=False)  # a dead Redis must not break start-up (or --preload)
    with app.app_context():
        pool = ext.breakers.client.connection_pool
        assert (pool.connection_kwargs["port"], pool.connection_kwargs["db"]) == (port, 3)
        ext.breaker("pay", **PAY_5_IN_10S)
    assert pool._created_connections == 0

    override = Flask(__name__)
    override.config["BREAKER_REDIS_URL"] = "redis://127.0.0.1:1/0"
    ext = FlaskBreakers(override, redis_url=f"redis://127.0.0.1:{port}/5", listen=False)
    with override.app_context():
        assert ext.breakers.client.connection_pool.connection_kwargs["db"] == 5


def test_memory_url_keeps_the_state_in_this_process(clock):
    """BREAKER_REDIS_URL="memory://": the app's own store, in its process, for its tests."""
    app = Flask(__name__)
    app.config["BREAKER_REDIS_URL"] = "memory://"
    ext = FlaskBreakers(app, clock=clock)
    add_pay(app, ext)
    client = app.test_client()
    trip(client)
    assert client.post("/pay").status_code == 503
    clock.advance(10_000)  # open_seconds
    assert client.post("/pay").status_code == 200  # the probe
    assert ext.breakers.client.exists("breaker:{pay}:state") == 1
    assert urls.describe(ext.breakers.client) == "memory://"
    other = FlaskBreakers(Flask(__name__), redis_url="memory://", clock=clock)
    assert other.breakers.client.exists("breaker:{pay}:state") == 0  # a store of its own
    other.breakers.close()
    ext.breakers.close()


@pytest.mark.parametrize(("policy", "status"), [("deny", 503), ("allow", 200), ("local", 200)])
def test_on_store_error_decides_what_a_dead_redis_means(policy, status):
    app = Flask(__name__)
    app.config.update(BREAKER_REDIS_URL=f"redis://127.0.0.1:{dead_port()}/0", BREAKER_ON_STORE_ERROR=policy)
    ext = FlaskBreakers(app, listen=False)
    add_pay(app, ext)
    client = app.test_client()
    answer = client.post("/pay")
    assert answer.status_code == status
    if policy == "local":  # still a breaker: five failures open it in this process
        trip(client)
        assert client.post("/pay").status_code == 503
    ext.breakers.close()


def test_on_store_error_constructor_argument_wins():
    app = Flask(__name__)
    app.config.update(BREAKER_REDIS_URL=f"redis://127.0.0.1:{dead_port()}/0", BREAKER_ON_STORE_ERROR="allow")
    ext = FlaskBreakers(app, on_store_error="deny", listen=False)
    add_pay(app, ext)
    assert app.test_client().post("/pay").status_code == 503
    ext.breakers.close()


def test_breaker_defaults_apply_to_breakers_without_their_own_config(clock):
    app, ext = make_app(clock, config={"BREAKER_DEFAULTS": {"failure_threshold": 2, "open_seconds": 7}})

    @app.get("/a")
    @ext.protect("a")
    def a():
        return "", 500

    @app.get("/b")
    @ext.protect("b", failure_threshold=3)
    def b():
        return "", 500

    client = app.test_client()
    for _ in range(2):
        assert client.get("/a").status_code == 500
    denied = client.get("/a")
    assert denied.status_code == 503 and denied.headers["Retry-After"] == "7"
    for _ in range(3):
        assert client.get("/b").status_code == 500
    assert client.get("/b").status_code == 503
    with app.app_context():
        assert ext.breaker("b").config.open_seconds == 7  # the default, under the route's own fields


def test_breaker_defaults_accepts_a_config_and_refuses_unknown_fields(clock):
    app, ext = make_app(clock, defaults=BreakerConfig(failure_threshold=9))
    with app.app_context():
        assert ext.breaker("x").config.failure_threshold == 9
    with pytest.raises(ValueError, match="failure_treshold"):
        make_app(clock, config={"BREAKER_DEFAULTS": {"failure_treshold": 2}})
    with pytest.raises(ValueError, match="open_seconds"):
        make_app(clock, config={"BREAKER_DEFAULTS": {"open_seconds": -1}})


def test_two_configs_for_one_breaker_are_refused_when_declared(clock):
    _app, ext = make_app(clock)
    ext.protect("pay", failure_threshold=3)
    with pytest.raises(ValueError, match="already declared"):
        ext.protect("pay", failure_threshold=4)
    with pytest.raises(ValueError, match="unknown BreakerConfig"):
        ext.protect("pay", failure_treshold=4)


# -- BREAKER_ROUTES ------------------------------------------------------------------------


def routes_app(clock, config_routes, **kw):
    app, ext = make_app(clock, config={"BREAKER_ROUTES": config_routes}, **kw)

    @app.route("/<path:path>", methods=["GET", "POST"])
    def anything(path):
        from flask import request

        return path, int(request.args.get("status", 200))

    return app, ext


def test_routes_protect_path_prefixes_without_decorators(clock):
    app, ext = routes_app(clock, {"/pay": {"breaker": "pay", **PAY_5_IN_10S}, "/pay/refund": "refund"})
    client = app.test_client()
    for _ in range(5):
        assert client.get("/pay/charge?status=502").status_code == 502
    assert client.get("/pay").status_code == 503
    assert client.get("/pay/anything").status_code == 503
    assert client.get("/payment").status_code == 200  # not under /pay/
    assert client.get("/pay/refund/1").status_code == 200  # the longer prefix has its own breaker
    assert snapshot(ext, app, "refund")["calls"] == 1
    assert snapshot(ext, app, "pay")["failures"] == 5


def test_a_trailing_slash_prefix_and_the_root(clock):
    app, ext = routes_app(clock, {"/api/": "api", "/": "everything"})
    client = app.test_client()
    client.get("/api/x")
    client.get("/api")
    client.get("/other")
    assert snapshot(ext, app, "api")["calls"] == 2
    assert snapshot(ext, app, "everything")["calls"] == 1


def test_the_decorator_wins_over_a_route_prefix(clock):
    app, ext = make_app(clock, config={"BREAKER_ROUTES": {"/": "site"}})
    add_pay(app, ext)
    app.test_client().post("/pay")
    assert snapshot(ext, app, "pay")["calls"] == 1
    assert snapshot(ext, app, "site")["calls"] == 0


@pytest.mark.parametrize(
    ("routes", "error"),
    [
        ({"pay": "pay"}, "must start with '/'"),
        ({"/pay": {"fallback": None}}, "needs 'breaker'"),
        ({"/pay": {"breaker": "pay", "colour": "red"}}, "unknown option 'colour'"),
        (
            {"/a": {"breaker": "x", "open_seconds": 1}, "/b": {"breaker": "x", "open_seconds": 2}},
            "configured differently",
        ),
        ({"/a": 3}, "breaker name, a dict or a RouteSpec"),
        ({"/a": {"breaker": "x", "open_seconds": 0}}, "open_seconds"),
    ],
)
def test_bad_routes_fail_at_start_up(clock, routes, error):
    with pytest.raises((ValueError, TypeError), match=error):
        make_app(clock, config={"BREAKER_ROUTES": routes})


def test_a_bare_route_name_uses_the_config_declared_elsewhere(clock):
    app, ext = routes_app(clock, {"/a": "shared", "/b": {"breaker": "shared", "failure_threshold": 2}})
    client = app.test_client()
    client.get("/a/1?status=500")
    client.get("/b/1?status=500")
    assert client.get("/a/2").status_code == 503  # one breaker, tripped by two prefixes
    assert snapshot(ext, app, "shared")["failures"] == 2


def test_a_bad_config_is_refused_when_declared_on_an_initialised_app(clock):
    _app, ext = make_app(clock, config={"BREAKER_DEFAULTS": {"max_open_seconds": 60}})
    with pytest.raises(ValueError, match="max_open_seconds"):
        ext.protect("pay", open_seconds=120)


def test_protect_above_the_route_is_an_error_at_the_decorator(clock):
    """Above @app.route, protect would wrap a function the route already holds:
    the route would serve it unprotected, without a word."""
    app, ext = make_app(clock)
    with pytest.raises(TypeError, match=r"above @app.route for endpoint 'pay' \(breaker 'pay'\)"):

        @ext.protect("pay")
        @app.get("/pay")
        def pay():
            return "paid"


def test_protect_above_the_route_is_an_error_at_init_app(clock):
    """An app factory: the views are registered before init_app sees the app."""
    ext = FlaskBreakers(client=fakeredis.FakeRedis(), clock=clock, listen=False)
    app = Flask(__name__)

    @ext.protect("pay")
    @app.get("/pay")
    def pay():
        return "paid"

    @app.get("/fine")
    @ext.protect("fine")
    def fine():
        return "fine"

    with pytest.raises(TypeError, match=r"for endpoint 'pay' \(breaker 'pay'\): the route serves"):
        ext.init_app(app)


def test_protect_above_a_blueprint_route_registered_later_is_logged(clock, caplog):
    """A blueprint registered after init_app: too late to refuse at start-up, so its
    first request logs an error (and is served, unprotected, as it would be anyway)."""
    from flask import Blueprint

    app, ext = make_app(clock)
    bp = Blueprint("shop", __name__)

    @ext.protect("cart")
    @bp.get("/cart")
    def cart():
        return "cart"

    app.register_blueprint(bp)
    with caplog.at_level("ERROR", logger="breaker_redis"):
        assert app.test_client().get("/cart").status_code == 200
    assert [r.getMessage() for r in caplog.records] == [
        "@breakers.protect is above @app.route for endpoint 'shop.cart' (breaker 'cart'): the route "
        "serves the view unprotected; put @breakers.protect below @app.route (or @bp.route)"
    ]


def test_one_view_protected_twice_is_refused(clock):
    """Flask would dispatch to the outer wrapper only: the inner breaker would never be asked."""
    _app, ext = make_app(clock)
    with pytest.raises(TypeError, match="'pay' is protected by breaker 'inner' already; a route has one"):

        @ext.protect("outer")
        @ext.protect("inner")
        def pay():
            return "paid"


def test_routes_constructor_argument_wins(clock):
    app, ext = routes_app(clock, {"/a": "from-config"}, routes={"/a": "from-arg"})
    app.test_client().get("/a")
    assert snapshot(ext, app, "from-arg")["calls"] == 1
    assert snapshot(ext, app, "from-config")["calls"] == 0


# -- classification -----------------------------------------------------------------------


def test_5xx_and_exceptions_are_failures_everything_else_success(clock):
    app, ext = make_app(clock)
    add_pay(app, ext, failure_threshold=50)
    client = app.test_client()
    for status in (200, 201, 302, 400, 404, 429):
        client.post(f"/pay?status={status}")
    for status in (500, 502, 503, 504):
        client.post(f"/pay?status={status}")
    assert client.post("/pay?raise=1").status_code == 500
    snap = snapshot(ext, app, "pay")
    assert (snap["successes"], snap["failures"], snap["calls"]) == (6, 5, 11)


def test_abort_with_a_client_error_is_a_success(clock):
    app, ext = make_app(clock)

    @app.get("/item")
    @ext.protect("item")
    def item():
        abort(404)

    assert app.test_client().get("/item").status_code == 404
    assert snapshot(ext, app, "item")["successes"] == 1


def test_failure_and_ignore_statuses_per_breaker(clock):
    app, ext = make_app(clock)
    add_pay(app, ext, failure_statuses=[429, 500], ignore_statuses=[503])
    client = app.test_client()
    for status in (429, 500, 502, 503):
        client.post(f"/pay?status={status}")
    snap = snapshot(ext, app, "pay")
    assert (snap["failures"], snap["successes"], snap["ignored"]) == (2, 1, 1)


def test_a_classify_predicate_sees_the_response(clock):
    def classify(response):
        if response.is_json and response.get_json().get("ok") is False:
            return "failure"
        if response.status_code == 418:
            return False  # success
        if response.status_code == 409:
            return "ignored"
        return None  # the status lists decide

    app, ext = make_app(clock)

    @app.get("/x/<int:code>")
    @ext.protect("x", classify=classify)
    def x(code):
        return jsonify(ok=code != 299), code

    client = app.test_client()
    for code in (299, 418, 409, 500, 200):
        client.get(f"/x/{code}")
    snap = snapshot(ext, app, "x")
    assert (snap["failures"], snap["successes"], snap["ignored"]) == (2, 2, 1)


def test_excluded_exceptions_are_ignored_even_behind_an_error_handler(clock):
    app, ext = make_app(clock)

    @app.errorhandler(KeyError)
    def missing(exc):
        return "not found", 500  # a handler turning an exception into a 5xx page

    @app.get("/k")
    @ext.protect("k", ignore_exceptions=(KeyError,))
    def k():
        raise KeyError("x")

    assert app.test_client().get("/k").status_code == 500
    snap = snapshot(ext, app, "k")
    assert (snap["ignored"], snap["failures"]) == (1, 0)


def test_slow_responses_count_as_slow(clock):
    app, ext = make_app(clock)

    @app.get("/slow/<int:ms>")
    @ext.protect("slow", slow_call_seconds=0.5, trip="rate", minimum_calls=100)
    def slow(ms):
        clock.advance(ms)
        return "ok"

    client = app.test_client()
    client.get("/slow/100")
    client.get("/slow/700")
    snap = snapshot(ext, app, "slow")
    assert (snap["slow"], snap["successes"]) == (1, 2)


def test_options_requests_are_never_counted_or_refused(clock):
    app, ext = make_app(clock)
    add_pay(app, ext)
    client = app.test_client()
    trip(client)
    assert client.options("/pay").status_code == 200
    assert snapshot(ext, app, "pay")["calls"] == 5


# -- refusals ------------------------------------------------------------------------------


def test_refusal_is_503_with_retry_after_and_a_friendly_text(clock):
    app, ext = make_app(clock)
    add_pay(app, ext)
    client = app.test_client()
    trip(client)
    clock.advance(2500)
    answer = client.post("/pay")
    assert answer.status_code == 503
    assert answer.headers["Retry-After"] == "8"  # 7.5 s left, rounded up to whole seconds
    assert answer.mimetype == "text/plain"
    assert "temporarily unavailable, please retry later" in answer.get_data(as_text=True)
    assert (answer.headers["X-Breaker"], answer.headers["X-Breaker-Reason"]) == ("pay", "open")
    clock.advance(7400)  # 0.1 s left: still at least 1
    assert client.post("/pay").headers["Retry-After"] == "1"


@pytest.mark.parametrize(
    ("headers", "json_expected"),
    [
        ({"Accept": "application/json"}, True),
        ({"Accept": "application/json, text/plain, */*"}, True),
        ({"Accept": "application/problem+json"}, True),
        ({"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}, False),
        ({"Accept": "*/*"}, False),
        ({}, False),
        ({"Accept": "*/*", "X-Requested-With": "XMLHttpRequest"}, True),
        ({"Accept": "*/*", "Content-Type": "application/json"}, True),
        ({"Accept": "text/html;q=0.5, application/json;q=0.4"}, False),
    ],
)
def test_refusal_is_json_when_the_client_asks_for_json(clock, headers, json_expected):
    app, ext = make_app(clock)
    add_pay(app, ext, message=CHINESE_MESSAGE)
    client = app.test_client()
    trip(client)
    answer = client.post("/pay", headers=headers, data="{}" if "Content-Type" in headers else None)
    assert answer.status_code == 503
    if json_expected:
        body = answer.get_json()
        assert body == {
            "error": "service_unavailable",
            "message": CHINESE_MESSAGE,
            "breaker": "pay",
            "reason": "open",
            "retry_after": 10,
        }
    else:
        assert answer.mimetype == "text/plain"
        assert answer.get_data(as_text=True).strip() == CHINESE_MESSAGE


def test_wants_json_without_an_environ():
    assert wants_json(None) is False


def test_apps_can_handle_the_refusal_themselves(clock):
    app, ext = make_app(clock)
    add_pay(app, ext)

    @app.errorhandler(BreakerOpenError)
    def friendly(error):
        assert isinstance(error, BreakerOpenError) and error.code == 503
        return jsonify(sorry=error.breaker, reason=error.reason, again=error.retry_after), 503

    client = app.test_client()
    trip(client)
    answer = client.post("/pay")
    assert answer.get_json() == {"sorry": "pay", "reason": "open", "again": 10}


def test_half_open_refusals_say_retry_in_a_second(clock):
    app, ext = make_app(clock)
    add_pay(app, ext)
    client = app.test_client()
    trip(client)
    clock.advance(10_000)
    with app.app_context():
        probe = ext.breaker("pay").acquire()  # another worker's probe holds the only lease
    answer = client.post("/pay")
    assert (answer.status_code, answer.headers["Retry-After"]) == (503, "1")
    assert answer.headers["X-Breaker-Reason"] == "half_open_full"
    probe.success()


def test_forced_open_advertises_the_open_period(clock):
    app, ext = make_app(clock)
    add_pay(app, ext, open_seconds=12.5)
    with app.app_context():
        ext.breaker("pay").force_open()
    answer = app.test_client().post("/pay")
    assert (answer.status_code, answer.headers["Retry-After"]) == (503, "13")
    assert answer.headers["X-Breaker-Reason"] == "forced_open"


def test_recovery_closes_after_two_successes(clock):
    app, ext = make_app(clock)
    add_pay(app, ext)
    client = app.test_client()
    trip(client)
    assert client.post("/pay").status_code == 503
    clock.advance(10_000)
    assert client.post("/pay").status_code == 200
    assert snapshot(ext, app, "pay")["state"] == "half_open"
    assert client.post("/pay").status_code == 200
    assert snapshot(ext, app, "pay")["state"] == "closed"


# -- permits settled exactly once -------------------------------------------------------------


def test_an_exception_in_the_view_is_settled_once_and_becomes_a_500(clock):
    app, ext = make_app(clock)
    add_pay(app, ext)
    assert app.test_client().post("/pay?raise=1").status_code == 500
    snap = snapshot(ext, app, "pay")
    assert (snap["calls"], snap["failures"]) == (1, 1)


def test_with_propagated_exceptions_the_permit_is_still_settled(clock):
    app, ext = make_app(clock, testing=True)
    add_pay(app, ext)
    client = app.test_client()
    with pytest.raises(RuntimeError, match="boom"):
        client.post("/pay?raise=1")
    snap = snapshot(ext, app, "pay")
    assert (snap["calls"], snap["failures"]) == (1, 1)


def test_a_later_after_request_hook_that_fails_is_a_failure_settled_once(clock):
    app = Flask(__name__)

    @app.after_request
    def broken(response):  # registered before the extension: runs after its hook
        raise ValueError("hook failed")

    ext = FlaskBreakers(app, client=fakeredis.FakeRedis(), clock=clock, listen=False)
    add_pay(app, ext)
    assert app.test_client().post("/pay").status_code == 500
    snap = snapshot(ext, app, "pay")
    assert (snap["calls"], snap["failures"], snap["successes"]) == (1, 1, 0)


def test_an_earlier_after_request_hook_that_fails_is_settled_by_teardown(clock):
    app, ext = make_app(clock)
    add_pay(app, ext)

    @app.after_request
    def broken(response):  # registered after the extension: runs before its hook
        raise ValueError("hook failed")

    assert app.test_client().post("/pay").status_code == 500
    snap = snapshot(ext, app, "pay")
    assert (snap["calls"], snap["failures"]) == (1, 1)


def test_a_before_request_hook_that_fails_after_admission_is_settled(clock):
    app, ext = make_app(clock)
    add_pay(app, ext)

    @app.before_request
    def broken():
        raise ValueError("auth backend down")

    assert app.test_client().post("/pay").status_code == 500
    snap = snapshot(ext, app, "pay")
    assert (snap["calls"], snap["failures"]) == (1, 1)


def test_a_request_refused_before_the_extension_runs_takes_no_permit(clock):
    app = Flask(__name__)

    @app.before_request
    def auth():
        return "no", 401

    ext = FlaskBreakers(app, client=fakeredis.FakeRedis(), clock=clock, listen=False)
    add_pay(app, ext)
    assert app.test_client().post("/pay").status_code == 401
    assert snapshot(ext, app, "pay")["calls"] == 0


def test_a_failing_classify_counts_as_failure_and_is_logged(clock, caplog):
    app, ext = make_app(clock)

    @app.get("/c")
    @ext.protect("c", classify=lambda response: 1 / 0)
    def c():
        return "ok"

    assert app.test_client().get("/c").status_code == 200
    assert snapshot(ext, app, "c")["failures"] == 1
    assert "classify() of breaker 'c' raised" in caplog.text


def test_each_request_records_exactly_once(clock, monkeypatch):
    from breaker_redis.engine.breaker import Breaker

    recorded = []
    original = Breaker._record

    def spy(self, permit, outcome, duration_ms):
        recorded.append(outcome)
        return original(self, permit, outcome, duration_ms)

    monkeypatch.setattr(Breaker, "_record", spy)
    app, ext = make_app(clock)
    add_pay(app, ext, failure_threshold=50)

    @app.after_request
    def sometimes_broken(response):
        from flask import request

        if request.args.get("hook"):
            raise ValueError("hook")
        return response

    client = app.test_client()
    for query in ("", "status=500", "raise=1", "hook=1", "status=404"):
        client.post(f"/pay?{query}")
    assert recorded == ["success", "failure", "failure", "failure", "success"]


# -- breakers inside views, and admin endpoints ------------------------------------------------


def test_an_outbound_refusal_escaping_a_view_is_a_503_and_ignored_by_the_route(clock):
    app, ext = make_app(clock)

    @app.get("/checkout")
    @ext.protect("checkout")
    def checkout():
        return jsonify(stock=ext.call("inventory", lambda: 3))

    with app.app_context():
        ext.breaker("inventory", open_seconds=4).force_open()
    answer = app.test_client().get("/checkout", headers={"Accept": "application/json"})
    assert answer.status_code == 503
    assert answer.get_json()["breaker"] == "inventory"
    assert answer.headers["Retry-After"] == "4"
    snap = snapshot(ext, app, "checkout")
    assert (snap["ignored"], snap["failures"]) == (1, 0)


def test_admin_endpoints_need_the_token(clock):
    app, ext = make_app(clock)
    add_pay(app, ext)
    assert app.test_client().get("/_breakers").status_code == 404  # no token: not installed

    app, ext = make_app(clock, config={"BREAKER_ADMIN_TOKEN": "s3cret"})
    add_pay(app, ext)
    client = app.test_client()
    client.post("/pay")
    assert client.get("/_breakers").status_code == 401
    assert client.get("/_breakers", headers={"Authorization": "Bearer wrong"}).status_code == 401
    auth = {"Authorization": "Bearer s3cret"}
    listing = client.get("/_breakers", headers=auth).get_json()
    assert [b["name"] for b in listing["breakers"]] == ["pay"]

    assert client.post("/_breakers/pay/open", headers=auth).get_json()["forced"] == "open"
    assert client.post("/pay").headers["X-Breaker-Reason"] == "forced_open"
    assert client.post("/_breakers/pay/auto", headers=auth).get_json()["forced"] is None
    assert client.post("/pay").status_code == 200
    assert client.post("/_breakers/pay/explode", headers=auth).status_code == 404
    assert client.post("/_breakers/pay/reset").status_code == 401
    assert client.post("/_breakers/api/v1/pay/open", headers=auth).status_code == 404  # unknown: not made
    with app.app_context():
        ext.breaker("api/v1/pay")  # declared by the app: known from now on
    slashed = client.post("/_breakers/api/v1/pay/open", headers=auth).get_json()  # a name with slashes
    assert (slashed["name"], slashed["forced"]) == ("api/v1/pay", "open")


def test_admin_token_constructor_argument_and_path(clock):
    app, _ext = make_app(clock, config={"BREAKER_ADMIN_TOKEN": "a"}, admin_token="b", admin_path="/ops/cb")
    client = app.test_client()
    assert client.get("/ops/cb", headers={"Authorization": "Bearer b"}).status_code == 200
    assert client.get("/ops/cb", headers={"Authorization": "Bearer a"}).status_code == 401


def test_two_apps_on_one_redis_are_two_workers_of_one_breaker(clock):
    server = fakeredis.FakeServer()
    app1, ext1 = make_app(clock, server)
    app2, ext2 = make_app(clock, server)
    add_pay(app1, ext1)
    add_pay(app2, ext2)
    c1, c2 = app1.test_client(), app2.test_client()
    trip(c1)
    denied = c2.post("/pay")  # the other worker asks Redis (it knows nothing yet) and is refused
    assert denied.status_code == 503
    assert json.loads(json.dumps(snapshot(ext2, app2, "pay")))["failures"] == 5


def test_breaker_open_error_carries_the_refusal():
    refused = BreakerOpen(2.2, "pay", "open")
    error = BreakerOpenError(refused)
    assert (error.code, error.retry_after, error.breaker, error.refused) == (503, 3, "pay", refused)
    response = error.get_response()
    assert response.status_code == 503 and response.headers["Retry-After"] == "3"


def test_protected_views_stay_callable_directly_and_async_views_stay_async(clock):
    import asyncio
    import inspect

    _app, ext = make_app(clock)

    @ext.protect("a")
    async def async_view():
        return "ok"

    @ext.protect("b")
    def failing_view():
        raise LookupError("outside any request")

    assert inspect.iscoroutinefunction(async_view)
    assert asyncio.run(async_view()) == "ok"
    with pytest.raises(LookupError):
        failing_view()
