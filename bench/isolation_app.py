"""The app bench/isolation.py serves: a /pay route that calls the upstream and a
local /products route, on gunicorn's sync workers.

``ISOLATION_BREAKER=1`` puts /pay behind a breaker (5 consecutive failures,
open 5 s); ``0`` serves the same route unprotected. /pay waits at most 1 s
for the upstream (a timeout is a 504). ``BENCH_RAMP_SECONDS`` is the
breaker's ``ramp_seconds`` (0, no ramp, unless set; ``ramp_from`` 0.1):
bench/recovery.py serves this app too.
"""

from __future__ import annotations

import os
from typing import Any

import requests
from flask import Flask, jsonify

from breaker_redis.flask import FlaskBreakers

app = Flask(__name__)
app.config["BREAKER_REDIS_URL"] = os.environ["BREAKER_REDIS_URL"]
app.config["BREAKER_KEY_PREFIX"] = os.environ.get("BREAKER_KEY_PREFIX", "breaker")
breakers = FlaskBreakers(app)
UPSTREAM = os.environ["UPSTREAM_URL"].rstrip("/")
GUARDED = os.environ.get("ISOLATION_BREAKER", "1") == "1"
RAMP_SECONDS = float(os.environ.get("BENCH_RAMP_SECONDS", "0"))


def pay() -> Any:
    try:  # a fresh connection per call (see bench/http_app.py)
        answer = requests.post(UPSTREAM + "/pay", timeout=1.0, headers={"Connection": "close"})
    except requests.Timeout:
        return jsonify(ok=False), 504
    except requests.RequestException:
        return jsonify(ok=False), 502
    return jsonify(ok=answer.status_code < 500), 200 if answer.status_code < 500 else 502


if GUARDED:
    ramp = {"ramp_seconds": RAMP_SECONDS, "ramp_from": 0.1}
    pay = breakers.protect("pay", trip="consecutive", failure_threshold=5, open_seconds=5, **ramp)(pay)
app.add_url_rule("/pay", "pay", pay, methods=["POST"])


@app.get("/products")
def products() -> Any:
    return jsonify(items=["oolong", "tea cup"])
