"""The app bench/recovery.py serves: a /pay route that calls the demo's upstream,
behind a breaker, on gunicorn's sync workers.

The breaker trips after 5 consecutive failures and stays open 5 s;
``RECOVERY_RAMP_SECONDS`` is its ``ramp_seconds`` (0: no ramp, every worker
sends its full traffic at the close), ``ramp_from`` 0.1. /pay waits at most
1 s for the upstream (a timeout is a 504).
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
RAMP_SECONDS = float(os.environ.get("RECOVERY_RAMP_SECONDS", "0"))


@app.post("/pay")
@breakers.protect(
    "pay", failure_threshold=5, open_seconds=5, open_backoff=1, ramp_seconds=RAMP_SECONDS, ramp_from=0.1
)
def pay() -> Any:
    try:  # a fresh connection per call (see bench/http_app.py)
        answer = requests.post(UPSTREAM + "/pay", timeout=1.0, headers={"Connection": "close"})
    except requests.Timeout:
        return jsonify(ok=False), 504
    except requests.RequestException:
        return jsonify(ok=False), 502
    return jsonify(ok=answer.status_code < 500), 200 if answer.status_code < 500 else 502


@app.get("/products")
def products() -> Any:
    return jsonify(items=["oolong", "tea cup"])
