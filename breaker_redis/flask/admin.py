"""The admin endpoints, installed only when ``BREAKER_ADMIN_TOKEN`` is set.

``GET {path}`` lists every breaker's snapshot; ``GET {path}/metrics`` is the
Prometheus exposition of every breaker (breaker_redis.metrics); ``POST {path}/NAME/ACTION``
forces one open or closed, hands it back to the state machine, or resets it;
``POST {path}/actions`` does the same with ``{"breaker": NAME, "action": ACTION}``
(any valid name: a URL path normalises ``..`` segments away).
With ``BREAKER_DASHBOARD`` the live page is at ``{path}/`` (``dashboard``).
Their endpoints are named ``breaker_redis.*``, which the hooks never put
behind a breaker: the switch must work while everything else is refused.

Authentication (RFC 6750): ``Authorization: Bearer TOKEN`` and nothing else
(never a query string, never a cookie), compared in constant time; without
it or with a wrong one the answer is 401 with ``WWW-Authenticate: Bearer``.
An action on a name that neither Redis nor this app knows is a 404: an
admin call never creates a breaker.

While Redis is down or does not answer, every endpoint answers a JSON 503
(``{"error": "Redis is unreachable: ..."}``, ``Retry-After: 1``) after the
client's own timeouts (0.25 s a command), never an HTML 500: an operator
reaching for the switch during an outage needs to be told why it does not
work. ``/metrics`` says ``breaker_redis_up 0`` instead, as Prometheus expects.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from typing import Any

import redis
from flask import Flask, Response, jsonify, request

from breaker_redis.flask.state import AppState
from breaker_redis.storage.store import StoreUnavailable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # prometheus_client.CONTENT_TYPE_LATEST
ACTIONS = {"open": "force_open", "close": "force_closed", "auto": "clear_force", "reset": "reset"}
REALM = "breaker_redis"
REDIS_DOWN = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, StoreUnavailable, OSError)
_UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, StoreUnavailable, OSError)
RETRY_SECONDS = 1  # the store gate probes Redis again within 2 s


def redis_down(exc: BaseException) -> Response:
    """The 503 an admin endpoint answers when Redis cannot be read or written."""
    cause = exc.__cause__ if isinstance(exc, StoreUnavailable) and exc.__cause__ else exc
    if isinstance(exc, _UNREACHABLE):
        error = f"Redis is unreachable: {cause}"
    else:
        error = f"Redis answered with an error: {cause}"
    response = jsonify(error=error)
    response.status_code = 503
    response.headers["Retry-After"] = str(RETRY_SECONDS)
    response.headers["Cache-Control"] = "no-store"
    return response


class Gate:
    """The bearer-token check every admin and dashboard endpoint starts with."""

    def __init__(self, token: str) -> None:
        # Digests have one length whatever the token's: the comparison tells nothing of it.
        self._digest = hashlib.sha256(token.encode()).digest()

    def given(self) -> str | None:
        """The token of the Authorization header; None when there is no bearer credential."""
        scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not credential.strip():
            return None
        return credential.strip()

    def authorized(self) -> bool:
        given = self.given()
        digest = hashlib.sha256((given or "").encode()).digest()
        return hmac.compare_digest(digest, self._digest) and given is not None

    def denied(self, body: Any = None) -> Response:
        """401 with the challenge RFC 6750 asks for (``invalid_token`` when one was given)."""
        challenge = f'Bearer realm="{REALM}"'
        if self.given() is not None:
            challenge += ', error="invalid_token"'
        response = body if isinstance(body, Response) else jsonify(error="unauthorized")
        response.status_code = 401
        response.headers["WWW-Authenticate"] = challenge
        response.headers["Cache-Control"] = "no-store"
        return response

    def guard(self, view: Callable[..., Any]) -> Callable[..., Any]:
        """The view behind the token; Redis down is the JSON 503, not a 500."""

        def guarded(*args: Any, **kwargs: Any) -> Any:
            if not self.authorized():
                return self.denied()
            try:
                return view(*args, **kwargs)
            except REDIS_DOWN as exc:
                return redis_down(exc)

        guarded.__name__ = view.__name__
        return guarded


def install_admin(app: Flask, state: AppState, path: str, *, dashboard: bool = False) -> None:
    """``GET {path}``: every breaker's snapshot; ``POST {path}/NAME/ACTION``
    with ACTION open | close | auto | reset; ``GET {path}/metrics``; with
    ``dashboard``, the page at ``{path}/``. ``Authorization: Bearer TOKEN``."""
    gate = Gate(str(state.admin_token))

    def status() -> Any:
        names = set(state.breakers.names()) | state.app_names()
        return jsonify(breakers=[state.breaker(n).snapshot() for n in sorted(names)])

    def metrics() -> Any:
        from breaker_redis.metrics import exposition  # prometheus-client is imported only when scraped

        body = exposition(state.breakers.client, state.breakers.prefix)
        return Response(body, content_type=CONTENT_TYPE)

    def act_on_body() -> Any:
        """The same with the name in a JSON body: any valid name, ``..`` and a
        leading ``/`` included, which a URL path cannot carry unchanged."""
        body = request.get_json(silent=True)
        if not isinstance(body, dict) or not isinstance(body.get("breaker"), str):
            return jsonify(error='expected a JSON body {"breaker": NAME, "action": ACTION}'), 400
        return act(body["breaker"], str(body.get("action")))

    def act(name: str, action: str) -> Any:
        if action not in ACTIONS:
            return jsonify(error=f"unknown action {action!r}", actions=sorted(ACTIONS)), 404
        if not state.knows(name):
            return jsonify(error=f"unknown breaker {name!r}: neither Redis nor this app knows it"), 404
        breaker = state.breaker(name)
        getattr(breaker, ACTIONS[action])()
        return jsonify(breaker.snapshot())

    base = path.rstrip("/")
    app.add_url_rule(base, "breaker_redis.status", gate.guard(status), methods=["GET"])
    app.add_url_rule(f"{base}/metrics", "breaker_redis.metrics", gate.guard(metrics), methods=["GET"])
    app.add_url_rule(f"{base}/actions", "breaker_redis.act_on_body", gate.guard(act_on_body),
                     methods=["POST"])
    # path: names may hold slashes (api/v1/pay); the action is the last segment. No slash
    # merging: "a//b" reaches the view as it is, never redirected to "a/b". A name that
    # starts with "/" (or holds "." or ".." segments) needs the JSON action above
    app.add_url_rule(f"{base}/<path:name>/<action>", "breaker_redis.act", gate.guard(act),
                     methods=["POST"], merge_slashes=False)
    if dashboard:
        from breaker_redis.flask.dashboard import install_dashboard

        install_dashboard(app, state, base, gate)
