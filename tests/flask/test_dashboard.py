"""The admin surface and the dashboard's server side, through Flask's test client.

The token: 401 with the RFC 6750 challenge without it, with a wrong one, or
with one sent anywhere but the Authorization header. An admin action never
creates a breaker. The dashboard is off unless enabled, needs the token to be
enabled, ships its files in the package, and streams snapshots: one at once,
one after each published change (on a real redis-server, without waiting
for the periodic one), and a problem event rather than an error while Redis
is down. The page in a real browser: test_dashboard_browser.py.
"""

from __future__ import annotations

import re
import socket
from concurrent.futures import ThreadPoolExecutor

import fakeredis
import pytest
from flask import Flask

from breaker_redis import BreakerConfig, Breakers
from breaker_redis.flask import FlaskBreakers
from breaker_redis.flask import dashboard as dashboard_module
from breaker_redis.flask.dashboard import stream_events
from breaker_redis.flask.state import EXTENSION_KEY
from breaker_redis.urls import client_from_url
from tests.support.redis_server import wait_until
from tests.support.sse import events

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PAY_5_IN_10S = {"trip": "count", "failure_threshold": 5, "window_seconds": 10, "open_seconds": 10}


def make_app(client=None, **config):
    app = Flask(__name__)
    app.config.update({"BREAKER_ADMIN_TOKEN": TOKEN, "BREAKER_DASHBOARD": True, **config})
    client = client or fakeredis.FakeRedis(server=fakeredis.FakeServer())
    ext = FlaskBreakers(app, client=client, listen=False)

    @app.post("/pay")
    @ext.protect("pay", **PAY_5_IN_10S)
    def pay():
        from flask import request

        return "ok", int(request.args.get("status", 200))

    return app, ext, client


@pytest.fixture
def one_frame(monkeypatch):
    """Streams end after their first snapshot."""
    monkeypatch.setattr(dashboard_module, "STREAM_SECONDS", 0)


# -- admin authentication --------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/_breakers", "/_breakers/metrics", "/_breakers/", "/_breakers/stream"])
def test_every_admin_and_dashboard_endpoint_answers_401_with_the_bearer_challenge(path, one_frame):
    app, _ext, _client = make_app()
    client = app.test_client()
    missing = client.get(path)
    assert missing.status_code == 401
    assert missing.headers["WWW-Authenticate"] == 'Bearer realm="breaker_redis"'
    for header in ("Bearer wrong", "Bearer " + TOKEN + "x", "Basic " + TOKEN, "Bearer", TOKEN):
        answer = client.get(path, headers={"Authorization": header})
        assert answer.status_code == 401, header
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    assert (
        'error="invalid_token"'
        in client.get(path, headers={"Authorization": "Bearer no"}).headers["WWW-Authenticate"]
    )
    # the Authorization header only: not a query string, not a cookie, not a form
    assert client.get(f"{path}?access_token={TOKEN}").status_code == 401
    client.set_cookie("access_token", TOKEN)
    assert client.get(path).status_code == 401
    assert app.test_client().get(path, headers={"Authorization": f"bearer {TOKEN}"}).status_code == 200
    assert app.test_client().get(path, headers=AUTH).status_code == 200


def test_post_actions_need_the_token_too():
    app, _ext, _client = make_app()
    client = app.test_client()
    client.post("/pay")
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        answer = client.post("/_breakers/pay/open", headers=headers)
        assert answer.status_code == 401 and answer.headers["WWW-Authenticate"].startswith("Bearer")
    assert client.post(f"/_breakers/pay/open?access_token={TOKEN}").status_code == 401
    assert client.post("/_breakers/pay/open", headers=AUTH).get_json()["forced"] == "open"


def test_an_admin_action_never_creates_a_breaker():
    app, ext, redis_client = make_app()
    client = app.test_client()
    client.post("/pay")
    before = sorted(redis_client.keys())
    for action in ("open", "close", "auto", "reset"):
        answer = client.post(f"/_breakers/anything/{action}", headers=AUTH)
        assert answer.status_code == 404
        assert "unknown breaker 'anything'" in answer.get_json()["error"]
    assert client.post("/_breakers/bad%20name/open", headers=AUTH).status_code == 404
    assert sorted(redis_client.keys()) == before
    assert "anything" not in ext.breakers.names()


def test_a_breaker_known_only_in_redis_or_only_to_the_app_can_be_switched():
    app, ext, redis_client = make_app()
    other = Breakers(redis_client, "breaker", listen=False)  # another app on the same Redis
    other.get("billing/v2").acquire().success()
    with app.app_context():
        ext.breaker("inventory")  # declared here, never called yet
    client = app.test_client()
    assert client.post("/_breakers/billing/v2/open", headers=AUTH).get_json()["forced"] == "open"
    assert other.get("billing/v2").snapshot()["forced"] == "open"
    assert client.post("/_breakers/inventory/reset", headers=AUTH).status_code == 200


# -- the dashboard is configured -------------------------------------------------------------


def test_the_dashboard_is_off_unless_enabled():
    app, _ext, _client = make_app(BREAKER_DASHBOARD=False)
    client = app.test_client()
    assert client.get("/_breakers/", headers=AUTH).status_code == 404
    assert client.get("/_breakers/stream", headers=AUTH).status_code == 404
    assert client.get("/_breakers/static/dashboard.js").status_code in (404, 405)  # only POST NAME/ACTION
    assert client.get("/_breakers", headers=AUTH).status_code == 200  # the admin endpoints stay


def test_the_dashboard_needs_the_token_and_a_boolean():
    with pytest.raises(ValueError, match="BREAKER_DASHBOARD is True but BREAKER_ADMIN_TOKEN is not set"):
        make_app(BREAKER_ADMIN_TOKEN=None)
    with pytest.raises(TypeError, match="BREAKER_DASHBOARD must be True or False, not 'yes'"):
        make_app(BREAKER_DASHBOARD="yes")
    app = Flask(__name__)
    ext = FlaskBreakers(app, client=fakeredis.FakeRedis(), admin_token="t", dashboard=True, admin_path="/ops")
    assert ext is not None
    assert app.test_client().get("/ops/", headers={"Authorization": "Bearer t"}).status_code == 200


# -- the page and its files ------------------------------------------------------------------


def test_the_page_holds_no_data_and_loads_only_its_own_files():
    app, _ext, _client = make_app()
    client = app.test_client()
    client.post("/pay")
    refused, page = client.get("/_breakers/"), client.get("/_breakers/", headers=AUTH)
    assert (refused.status_code, page.status_code) == (401, 200)
    assert refused.data == page.data  # the same shell either way: no breaker in it
    body = page.get_data(as_text=True)
    assert "pay" not in body and 'data-base="/_breakers"' in body
    assert re.findall(r"<script[^>]*>", body) == ['<script src="/_breakers/static/dashboard.js" defer>']
    assert re.findall(r'(?:src|href)="([^"]+)"', body) == [
        "/_breakers/static/dashboard.css",
        "/_breakers/static/dashboard.js",
    ]
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    assert page.headers["Cache-Control"] == "no-store"
    for name, kind in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        asset = client.get(f"/_breakers/static/{name}")
        assert asset.status_code == 200 and asset.content_type.startswith(kind)
        assert "http://" not in asset.get_data(as_text=True).replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in asset.get_data(as_text=True)
    for path in (
        "/_breakers/static/../admin.py",
        "/_breakers/static/%2e%2e/admin.py",
        "/_breakers/static/dashboard.html",
    ):
        assert client.get(path).status_code in (404, 405), path  # 405: only POST NAME/ACTION matches


def test_the_script_sends_the_token_in_a_header_and_never_in_a_url():
    app, _ext, _client = make_app()
    script = app.test_client().get("/_breakers/static/dashboard.js").get_data(as_text=True)
    assert 'Authorization: "Bearer " + token' in script
    assert "EventSource" not in script.replace("since EventSource", "")
    assert "cookie" not in script.lower().replace("never in a cookie", "")
    assert "sessionStorage" in script and "localStorage" not in script
    assert not re.search(r"[?&](token|access_token)=", script)


# -- the stream ------------------------------------------------------------------------------


def test_the_stream_sends_every_breaker_with_its_last_transitions(one_frame):
    app, _ext, _client = make_app()
    client = app.test_client()
    for _ in range(5):
        client.post("/pay?status=500")
    answer = client.get("/_breakers/stream", headers=AUTH)
    assert answer.status_code == 200
    assert answer.content_type == "text/event-stream"
    assert answer.headers["Cache-Control"] == "no-store"
    body = answer.get_data(as_text=True)
    assert body.startswith("retry: 1000\n\n")
    ((kind, frame),) = events(body)
    assert kind == "snapshot"
    (pay,) = frame["breakers"]
    assert (pay["name"], pay["state"], pay["window_failures"], pay["window_calls"]) == ("pay", "open", 5, 5)
    assert 9_000 <= pay["open_until_ms"] - frame["now"] <= 10_000
    assert [(t["from"], t["to"], t["cause"]) for t in pay["transitions"]] == [("closed", "open", "count")]


def test_the_stream_reads_by_the_breakers_clock_when_they_have_one(one_frame, clock):
    """A test's clock (docs/testing.md): the page counts down on the time the breakers
    decide by, not on Redis's (fakeredis' is the real time, years after this clock's)."""
    app = Flask(__name__)
    app.config.update({"BREAKER_ADMIN_TOKEN": TOKEN, "BREAKER_DASHBOARD": True})
    ext = FlaskBreakers(
        app, client=fakeredis.FakeRedis(server=fakeredis.FakeServer()), clock=clock, listen=False
    )

    @app.post("/pay")
    @ext.protect("pay", **PAY_5_IN_10S)
    def pay():
        return "upstream down", 500

    client = app.test_client()
    for _ in range(5):
        client.post("/pay")
    clock.advance(4_000)
    ((_, frame),) = events(client.get("/_breakers/stream", headers=AUTH).get_data(as_text=True))
    (pay_tile,) = frame["breakers"]
    assert frame["now"] == clock()
    assert (pay_tile["state"], pay_tile["open_until_ms"] - frame["now"], pay_tile["retry_after"]) == (
        "open",
        6_000,
        6.0,
    )


def test_a_count_window_is_named_with_its_size(one_frame):
    """A breaker with window_calls: its tile reads "failed / calls of the last N" from the
    config in force the frame carries (the JS names the field)."""
    app, ext, _client = make_app()
    breaker = ext.breakers.get("last", BreakerConfig(trip="rate", window_calls=100))
    for outcome in ("failure", "success", "success"):
        breaker.acquire().record(outcome)
    ((_kind, frame),) = events(
        app.test_client().get("/_breakers/stream", headers=AUTH).get_data(as_text=True)
    )
    last = next(b for b in frame["breakers"] if b["name"] == "last")
    assert (last["window_failures"], last["window_calls"], last["config"]["window_calls"]) == (1, 3, 100)
    script = app.test_client().get("/_breakers/static/dashboard.js").get_data(as_text=True)
    assert '" of the last " + b.config.window_calls' in script


def test_the_stream_sends_the_share_a_ramping_breaker_admits(one_frame):
    """dashboard.js shows "ramping: 25% of calls admitted" from these two fields."""
    app, ext, _client = make_app(BREAKER_DEFAULTS={"ramp_seconds": 3600, "ramp_from": 0.25})
    client = app.test_client()
    for _ in range(5):
        client.post("/pay?status=500")
    ext.breakers.get("pay").reset()  # closing a breaker that refused calls starts the ramp
    ((_, frame),) = events(client.get("/_breakers/stream", headers=AUTH).get_data(as_text=True))
    (pay,) = frame["breakers"]
    assert pay["state"] == "closed" and 0.25 <= pay["ramp_share"] < 0.26
    assert 3_590_000 <= pay["ramp_until_ms"] - frame["now"] <= 3_600_000
    script = client.get("/_breakers/static/dashboard.js", headers=AUTH).get_data(as_text=True)
    assert "b.ramp_share" in script and "b.ramp_until_ms" in script


def test_a_published_change_sends_a_snapshot_at_once(redis_server, monkeypatch):
    """The frame after a trip shows it, though the periodic frame is an hour away.

    Each change is made before the next frame is asked for, so its message is
    already in the stream's socket: a correct stream answers at once, a broken
    one (not subscribed, or woken by something else) only after an hour, and
    the 30 s deadline fails it.
    """
    monkeypatch.setattr(dashboard_module, "FRAME_SECONDS", 3600.0)
    client = redis_server.client()
    prefix = "dashpush"
    app = Flask(__name__)
    app.config.update(BREAKER_ADMIN_TOKEN=TOKEN, BREAKER_DASHBOARD=True, BREAKER_KEY_PREFIX=prefix)
    FlaskBreakers(app, client=client, listen=False)
    worker = Breakers(redis_server.client(), prefix)  # another process, as far as Redis can tell
    pay = worker.get("pay", BreakerConfig(**PAY_5_IN_10S))
    pay.reset()
    frames = stream_events(app.extensions[EXTENSION_KEY], seconds=7200)
    pool = ThreadPoolExecutor(max_workers=1)

    def next_frame() -> dict:
        ((_, found),) = events(pool.submit(next, frames).result(timeout=30))
        return {b["name"]: b for b in found["breakers"]}

    try:
        assert pool.submit(next, frames).result(timeout=30) == "retry: 0\n\n"
        assert next_frame()["pay"]["state"] == "closed"  # subscribed (and confirmed) before this frame
        for _ in range(5):
            pay.acquire().failure()
        assert next_frame()["pay"]["state"] == "open"
        pay.force_closed()
        assert (next_frame()["pay"]["forced"]) == "closed"
        frames.close()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        worker.close()

    def unsubscribed() -> bool:  # Redis drops a closed connection's subscription when it reads the close
        return int(dict(client.pubsub_numsub(f"{prefix}:events"))[f"{prefix}:events".encode()]) == 0

    wait_until(unsubscribed, timeout=10, what="the stream's subscription to end")


def test_a_single_threaded_server_gets_one_frame_per_request_and_a_threaded_one_a_stream(monkeypatch):
    app, _ext, _client = make_app()
    client = app.test_client()
    client.post("/pay")
    polled = client.get("/_breakers/stream", headers=AUTH)  # the test client: wsgi.multithread is false
    body = polled.get_data(as_text=True)
    assert body.startswith("retry: 1000\n\n") and [kind for kind, _ in events(body)] == ["snapshot"]
    monkeypatch.setattr(dashboard_module, "STREAM_SECONDS", 0)
    streamed = client.get("/_breakers/stream", headers=AUTH, environ_overrides={"wsgi.multithread": True})
    assert streamed.get_data(as_text=True).startswith("retry: 0\n\n")


def test_declared_breakers_have_a_tile_before_their_first_call(one_frame):
    app, ext, redis_client = make_app()
    with app.app_context():
        ext.breaker("inventory")
    answer = app.test_client().get("/_breakers/stream", headers=AUTH)
    ((_, frame),) = events(answer.get_data(as_text=True))
    assert [(b["name"], b["state"], b["calls"]) for b in frame["breakers"]] == [
        ("inventory", "closed", 0),
        ("pay", "closed", 0),
    ]
    assert redis_client.keys() == []  # showing them wrote nothing


@pytest.mark.parametrize("name", ["/", "/a", "a/", "..", ".", "a/../b", "api/v1/pay", "caf\u00e9"])
def test_any_valid_name_can_be_switched_by_the_json_action(name):
    app, ext, _client = make_app()
    with app.app_context():
        ext.breaker(name)
        ext.breaker("b")
        ext.breaker("a")
    client = app.test_client()
    answer = client.post("/_breakers/actions", headers=AUTH, json={"breaker": name, "action": "open"})
    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert (answer.get_json()["name"], answer.get_json()["forced"]) == (name, "open")
    with app.app_context():
        assert ext.breaker(name).snapshot()["forced"] == "open"
        others = {other: ext.breaker(other).snapshot()["forced"] for other in ("a", "b") if other != name}
    assert set(others.values()) == {None}  # no other breaker was touched


def test_the_json_action_refuses_what_it_cannot_do():
    app, _ext, redis_client = make_app()
    client = app.test_client()
    client.post("/pay")
    before = sorted(redis_client.keys())
    assert client.post("/_breakers/actions", json={"breaker": "pay", "action": "open"}).status_code == 401
    for body in (None, [], {"action": "open"}, {"breaker": 3, "action": "open"}):
        assert client.post("/_breakers/actions", headers=AUTH, json=body).status_code == 400, body
    for body in ({"breaker": "pay", "action": "x"}, {"breaker": "new", "action": "open"}):
        assert client.post("/_breakers/actions", headers=AUTH, json=body).status_code == 404, body
    assert sorted(redis_client.keys()) == before


def test_the_path_action_never_folds_slashes_into_another_name():
    """Werkzeug's path converter takes no leading "/" (that name needs the JSON
    action), and with slash merging off nothing is redirected to another name."""
    app, ext, _client = make_app()
    with app.app_context():
        for name in ("/a", "a", "a//b", "a/b"):
            ext.breaker(name)
    client = app.test_client()
    assert client.post("/_breakers//a/open", headers=AUTH).status_code == 404  # not a 308 to "a"
    answer = client.post("/_breakers/a//b/open", headers=AUTH)
    assert answer.status_code == 200 and answer.get_json()["name"] == "a//b"
    with app.app_context():
        assert [ext.breaker(n).snapshot()["forced"] for n in ("/a", "a", "a//b", "a/b")] == [
            None,
            None,
            "open",
            None,
        ]


def test_the_stream_reports_redis_down_and_keeps_the_page_served(one_frame):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = client_from_url(f"redis://127.0.0.1:{port}/0")  # the app's own kind of client: no retry loop
    app, _ext, _client = make_app(client=dead)
    client = app.test_client()
    assert client.get("/_breakers/", headers=AUTH).status_code == 200
    for environ in ({}, {"wsgi.multithread": True}):  # one frame, and a stream (of one frame here)
        answer = client.get("/_breakers/stream", headers=AUTH, environ_overrides=environ)
        assert answer.status_code == 200
        ((kind, problem),) = events(answer.get_data(as_text=True))
        assert kind == "problem" and problem["error"].startswith("Redis does not answer")
