"""The admin endpoints, installed only when ``BREAKER_ADMIN_TOKEN`` is set.

``GET {path}`` lists every breaker's snapshot; ``GET {path}/metrics`` is the
Prometheus exposition of every breaker (breaker_redis.metrics); ``POST {path}/NAME/ACTION``
forces one open or closed, hands it back to the state machine, or resets it.
Their endpoints are named ``breaker_redis.*``, which the hooks never put
behind a breaker: the switch must work while everything else is refused.
"""

from __future__ import annotations

import hmac
from typing import Any

from flask import Flask, Response, jsonify, request

from .state import AppState

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # prometheus_client.CONTENT_TYPE_LATEST
ACTIONS = {"open": "force_open", "close": "force_closed", "auto": "clear_force", "reset": "reset"}


def install_admin(app: Flask, state: AppState, path: str) -> None:
    """``GET {path}``: every breaker's snapshot; ``POST {path}/NAME/ACTION``
    with ACTION open | close | auto | reset. ``Authorization: Bearer TOKEN``."""
    token = str(state.admin_token).encode()

    def authorized() -> bool:
        header = request.headers.get("Authorization", "")
        given = header[7:] if header.startswith("Bearer ") else ""
        return hmac.compare_digest(given.encode(), token)

    def denied() -> Any:
        return jsonify(error="unauthorized"), 401, {"WWW-Authenticate": "Bearer"}

    def status() -> Any:
        if not authorized():
            return denied()
        names = set(state.breakers.names()) | set(state.declared) | set(state.route_configs)
        return jsonify(breakers=[state.breaker(n).snapshot() for n in sorted(names)])

    def metrics() -> Any:
        if not authorized():
            return denied()
        from ..metrics import exposition  # prometheus-client is imported only when scraped

        body = exposition(state.breakers.client, state.breakers.prefix)
        return Response(body, content_type=CONTENT_TYPE)

    def act(name: str, action: str) -> Any:
        if not authorized():
            return denied()
        if action not in ACTIONS:
            return jsonify(error=f"unknown action {action!r}", actions=sorted(ACTIONS)), 404
        breaker = state.breaker(name)
        getattr(breaker, ACTIONS[action])()
        return jsonify(breaker.snapshot())

    base = path.rstrip("/")
    app.add_url_rule(base, "breaker_redis.status", status, methods=["GET"])
    app.add_url_rule(f"{base}/metrics", "breaker_redis.metrics", metrics, methods=["GET"])
    # path: names may hold slashes (api/v1/pay); the action is the last segment
    app.add_url_rule(f"{base}/<path:name>/<action>", "breaker_redis.act", act, methods=["POST"])
