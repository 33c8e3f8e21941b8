"""The app the fault tests run under gunicorn: ``tests.support.fault_app:app``.

A small shop like the demo's, with what the fault tests need to see from
outside a worker:

- ``POST /pay``: protected by the ``pay`` breaker through the Flask
  extension (consecutive failures, threshold 3, ``FAULT_OPEN_SECONDS`` open,
  one probe, ``FAULT_PROBE_TIMEOUT`` seconds per probe). While its view runs
  it holds the file ``$FAULT_INFLIGHT/<pid>``, so a test can tell which
  worker holds the probe.
- ``GET /products``: unprotected, always 200.
- ``GET /timed``: one protected call through the core API with nothing
  inside it: the JSON says how long acquire + record took in this worker
  (ns), i.e. the latency the breaker adds to a call, measured where it is
  spent rather than through HTTP's noise.

Every response says which worker answered (``X-Worker-Pid``) and which store
that worker decides on right now (``X-Breaker-Store``: redis or local).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import requests
from flask import Flask, Response, jsonify

from breaker_redis.flask import FlaskBreakers

UPSTREAM_URL = os.environ.get("UPSTREAM_URL", "http://127.0.0.1:8081").rstrip("/")
INFLIGHT = Path(os.environ.get("FAULT_INFLIGHT", "/tmp"))
UPSTREAM_TIMEOUT = float(os.environ.get("FAULT_UPSTREAM_TIMEOUT", "1"))

app = Flask("fault_app")
app.config.update(
    BREAKER_REDIS_URL=os.environ["BREAKER_REDIS_URL"],
    BREAKER_KEY_PREFIX=os.environ.get("BREAKER_KEY_PREFIX", "breaker"),
)
breakers = FlaskBreakers(app)
PAY = {
    "trip": "consecutive",
    "failure_threshold": 3,
    "open_seconds": float(os.environ.get("FAULT_OPEN_SECONDS", "30")),
    "open_backoff": 1.0,
    "half_open_max_calls": 1,
    "half_open_successes": 1,
    "probe_timeout_seconds": float(os.environ.get("FAULT_PROBE_TIMEOUT", "2")),
}
session = requests.Session()


@app.after_request
def who_answered(response: Response) -> Response:
    response.headers["X-Worker-Pid"] = str(os.getpid())
    response.headers["X-Breaker-Store"] = breakers.breakers.gate.kind
    return response


@app.post("/pay")
@breakers.protect("pay", **PAY)
def pay() -> Any:
    marker = INFLIGHT / str(os.getpid())
    marker.touch()
    try:
        answer = session.post(UPSTREAM_URL + "/pay", timeout=UPSTREAM_TIMEOUT)
    except requests.RequestException:
        return jsonify(ok=False, error="unreachable"), 502
    finally:
        marker.unlink(missing_ok=True)
    if answer.status_code >= 500:
        return jsonify(ok=False, error="upstream failure"), 502
    return jsonify(ok=True)


@app.get("/products")
def products() -> Any:
    return jsonify(items=["oolong", "tea cup"])


@app.get("/timed")
def timed() -> Any:
    breaker = breakers.breakers.get("timed")
    started = time.perf_counter_ns()
    permit = breaker.acquire()
    permit.success()
    return jsonify(ns=time.perf_counter_ns() - started)
