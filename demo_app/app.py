"""The demo shop: ``demo_app.app:app``.

- ``/pay``: its call to the payment service goes through the ``pay``
  breaker's requests adapter (breaker_redis.requests), with the numbers of
  the classic OpenResty ``lua_shared_dict`` breaker: 5 failures (a timeout,
  an error, a 5xx) in 10 s open it for 10 s (demo_app/settings.py); no
  fallback, so a refused payment gets the friendly 503 with Retry-After.
- ``/cart``: protected by the ``cart`` breaker through ``BREAKER_ROUTES``
  (no decorator, like an OpenResty ``location``); while the upstream fails
  or the breaker is open it answers the last good cart every worker saw,
  else an empty cart.
- ``/recommend``: not a protected route, but its outbound call is
  (``breakers.call``), degrading to a simplified function: bestsellers.
- ``/products``: unprotected and local; it keeps answering whatever the
  upstream does, which is the point of a breaker.

Every response carries ``X-Worker-Pid`` so that one can see which gunicorn
worker answered. Reads ``BREAKER_REDIS_URL`` and ``UPSTREAM_URL`` (and the DEMO_*
variables of demo_app/settings.py).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import requests
from flask import Flask, Response, jsonify

from breaker_redis import BreakerOpen
from breaker_redis.fallbacks import cached, chain, static
from breaker_redis.flask import BreakerOpenError, FlaskBreakers, retry_after_seconds
from breaker_redis.requests import BreakerAdapter

from . import settings

UPSTREAM_URL = os.environ.get("UPSTREAM_URL", "http://127.0.0.1:8081").rstrip("/")

app = Flask("demo_app")
app.config.update(
    BREAKER_REDIS_URL=os.environ.get("BREAKER_REDIS_URL", "redis://127.0.0.1:6379/0"),
    BREAKER_KEY_PREFIX=os.environ.get("BREAKER_KEY_PREFIX", "breaker"),
    BREAKER_ADMIN_TOKEN=os.environ.get("BREAKER_ADMIN_TOKEN") or None,
    # who this instance's outcomes come from (min_reporters); the host name when unset
    BREAKER_REPORTER=os.environ.get("BREAKER_REPORTER") or None,
    # the live page at /_breakers/ (it needs the token as well)
    BREAKER_DASHBOARD=bool(os.environ.get("BREAKER_ADMIN_TOKEN"))
    and os.environ.get("BREAKER_DASHBOARD", "1").lower() not in ("0", "false", "no", "off", ""),
    BREAKER_ROUTES={
        "/cart": {
            "breaker": "cart",
            "fallback": chain(cached(ttl=600), static({"items": [], "degraded": True})),
            **settings.cart_config(),
        },
    },
)
breakers = FlaskBreakers(app, **settings.clock_options())  # a test's clock when it names one
breakers.breaker("recommend", **settings.recommend_config())  # declares the outbound breaker's config
PAY = breakers.breaker("pay", **settings.pay_config())  # the payment service's breaker, for the adapter

# One HTTP session per worker thread, made on first use (after the fork):
# keep-alive to the upstream without sharing a socket between processes. Calls
# to the payment service go through the pay breaker (one breaker named for the
# service, rather than the default one per host: /cart is on the same host).
_local = threading.local()


def http() -> requests.Session:
    session: requests.Session | None = getattr(_local, "session", None)
    if session is None:
        session = _local.session = requests.Session()
        session.mount(UPSTREAM_URL + "/pay", BreakerAdapter(breakers.breakers, name="pay", config=PAY.config))
    return session


def upstream(method: str, path: str) -> requests.Response:
    return http().request(method, UPSTREAM_URL + path, timeout=settings.UPSTREAM_TIMEOUT)


@app.after_request
def worker_pid(response: Response) -> Response:
    response.headers["X-Worker-Pid"] = str(os.getpid())
    return response


@app.get("/")
def index() -> Any:
    return jsonify(endpoints=["/pay", "/cart", "/recommend", "/products"], worker=os.getpid())


@app.route("/pay", methods=["GET", "POST"])
def pay() -> Any:
    """The adapter counts the payment service's timeouts, errors and 5xx; a refusal
    is the friendly 503 with Retry-After. The view answers 504 and 502 for the failures."""
    try:
        answer = upstream("POST", "/pay")
    except BreakerOpen as refused:  # no connection was made
        seconds = retry_after_seconds(refused, PAY.config)
        raise BreakerOpenError(refused, settings.PAY_UNAVAILABLE, seconds) from None
    except requests.Timeout:
        return jsonify(ok=False, message="The payment service did not answer in time."), 504
    except requests.RequestException:
        return jsonify(ok=False, message="The payment service could not be reached."), 502
    if answer.status_code >= 500:
        return jsonify(ok=False, message="The payment service failed, please try again."), 502
    return jsonify(ok=True, message="Payment accepted.")


@app.get("/cart")
def cart() -> Any:
    try:
        answer = upstream("GET", "/cart")
    except requests.RequestException:
        return jsonify(items=[], error="cart service unreachable"), 502
    if answer.status_code >= 500:
        return jsonify(items=[], error="cart service failed"), 502
    return jsonify(items=answer.json()["items"], source="live")


def bestsellers(cause: BaseException) -> dict[str, Any]:
    """The simplified implementation: no personalisation, no upstream."""
    return {"items": ["green tea sampler", "teapot"], "source": "bestsellers", "why": type(cause).__name__}


@app.get("/recommend")
def recommend() -> Any:
    answer = breakers.call("recommend", upstream, "GET", "/recommend", fallback=bestsellers)
    if isinstance(answer, dict):
        return jsonify(answer)
    return jsonify(items=answer.json()["items"], source="live")


@app.get("/products")
def products() -> Any:
    return jsonify(items=[{"sku": "tea-01", "name": "Oolong"}, {"sku": "cup-07", "name": "Tea cup"}])
