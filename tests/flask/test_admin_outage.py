"""The Flask admin endpoints while Redis is down: a JSON 503, never an HTML 500.

The app runs on a real HTTP server (werkzeug's, in a thread) and talks to
its own redis-server, which each test stops (connections refused) or
SIGSTOPs (connections accepted by the kernel, never answered: every
command runs into the client's 0.25 s timeout). The answer must come well
within the HTTP client's timeout, and say that Redis is unreachable.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from flask import Flask
from werkzeug.serving import make_server

from breaker_redis.flask import FlaskBreakers
from tests.support.redis_server import RedisServer

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CLIENT_TIMEOUT = 5.0  # seconds; the answers come after one or two 0.25 s Redis timeouts


@pytest.fixture
def served() -> Iterator[tuple[RedisServer, str, FlaskBreakers]]:
    """A redis-server of its own, and the app on a real HTTP server, its URL."""
    redis_server = RedisServer().start()
    app = Flask(__name__)
    app.config.update(
        BREAKER_REDIS_URL=redis_server.url, BREAKER_ADMIN_TOKEN=TOKEN, BREAKER_KEY_PREFIX="outage"
    )
    ext = FlaskBreakers(app, listen=False)

    @app.post("/pay")
    @ext.protect("pay", failure_threshold=3)
    def pay() -> Any:
        return {"ok": True}

    http = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield redis_server, f"http://127.0.0.1:{http.server_port}", ext
    finally:
        http.shutdown()
        thread.join(timeout=10)
        ext.breakers.close()
        redis_server.stop()


REQUESTS = [
    ("GET", "/_breakers", None),
    ("POST", "/_breakers/pay/open", None),  # declared by the app: known without Redis
    ("POST", "/_breakers/nope/open", None),  # known or not: only Redis can say
    ("POST", "/_breakers/actions", {"breaker": "pay", "action": "reset"}),
]


def assert_unreachable(answer: httpx.Response) -> None:
    assert answer.status_code == 503, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["retry-after"] == "1"
    assert answer.headers["cache-control"] == "no-store"
    body = answer.json()
    assert list(body) == ["error"] and body["error"].startswith("Redis is unreachable: "), body


def check_every_endpoint(base: str) -> None:
    with httpx.Client(base_url=base, timeout=CLIENT_TIMEOUT) as client:
        for method, path, body in REQUESTS:
            assert_unreachable(client.request(method, path, headers=AUTH, json=body))
        # the unprotected page of the metrics says so in its own format
        metrics = client.get("/_breakers/metrics", headers=AUTH)
        assert metrics.status_code == 200 and "breaker_redis_up 0.0" in metrics.text


@pytest.mark.processes
def test_admin_endpoints_answer_json_503_while_redis_is_stopped(served) -> None:
    redis_server, base, _ext = served
    with httpx.Client(base_url=base, timeout=CLIENT_TIMEOUT) as client:
        assert client.post("/pay").status_code == 200
        assert client.get("/_breakers", headers=AUTH).status_code == 200
    redis_server.stop()
    check_every_endpoint(base)
    redis_server.start()  # back: the endpoints answer again
    with httpx.Client(base_url=base, timeout=CLIENT_TIMEOUT) as client:
        answer = client.post("/_breakers/pay/open", headers=AUTH)
        assert answer.status_code == 200 and answer.json()["forced"] == "open"


@pytest.mark.processes
def test_admin_endpoints_answer_json_503_while_redis_hangs(served) -> None:
    redis_server, base, _ext = served
    with httpx.Client(base_url=base, timeout=CLIENT_TIMEOUT) as client:
        assert client.post("/pay").status_code == 200
    assert redis_server.process is not None
    os.kill(redis_server.process.pid, signal.SIGSTOP)
    try:
        check_every_endpoint(base)  # httpx raises ReadTimeout on a hang
    finally:
        os.kill(redis_server.process.pid, signal.SIGCONT)
