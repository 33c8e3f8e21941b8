"""The app bench/http_overhead.py serves: one upstream call per request, with and without a breaker.

``/plain`` and ``/guarded`` do the same work (one GET to the upstream, which
answers after 2 ms); only ``/guarded`` is behind ``@breakers.protect``.
"""

from __future__ import annotations

import os

import requests
from flask import Flask

from breaker_redis.flask import FlaskBreakers

app = Flask(__name__)
app.config["BREAKER_REDIS_URL"] = os.environ["BREAKER_REDIS_URL"]
breakers = FlaskBreakers(app)
UPSTREAM = os.environ["UPSTREAM_URL"].rstrip("/")


def fetch() -> tuple[str, int]:
    # A fresh connection per call: a kept-alive one to the demo's http.server
    # upstream stalls on delayed ACKs (~40 ms) and would hide everything else.
    answer = requests.get(UPSTREAM + "/item", timeout=1.0, headers={"Connection": "close"})
    return answer.text, answer.status_code


@app.get("/plain")
def plain() -> tuple[str, int]:
    return fetch()


@app.get("/guarded")
@breakers.protect("bench", trip="rate", minimum_calls=100, failure_rate=0.5)
def guarded() -> tuple[str, int]:
    return fetch()
