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

from typing import Any

from flask import Flask, Response, jsonify, request

from breaker_redis.flask.gate import Gate
from breaker_redis.flask.state import AppState

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # prometheus_client.CONTENT_TYPE_LATEST
ACTIONS = {"open": "force_open", "close": "force_closed", "auto": "clear_force", "reset": "reset"}


def install_admin(app: Flask, state: AppState, path: str, *, dashboard: bool = False) -> None:
    """``GET {path}``: every breaker's snapshot; ``POST {path}/NAME/ACTION``
    with ACTION open | close | auto | reset; ``GET {path}/metrics``; with
    ``dashboard``, the page at ``{path}/``. ``Authorization: Bearer TOKEN``."""
    gate = Gate(str(state.settings.admin_token))

    def status() -> Any:
        names = set(state.breakers.names()) | state.app_names()
        return jsonify(breakers=[state.breaker(n).snapshot() for n in sorted(names)])

    def metrics() -> Any:
        from breaker_redis.metrics import exposition  # prometheus-client is imported only when scraped

        body = exposition(state.breakers.client, state.breakers.prefix, state.breakers.clock)
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
    app.add_url_rule(
        f"{base}/actions", "breaker_redis.act_on_body", gate.guard(act_on_body), methods=["POST"]
    )
    # path: names may hold slashes (api/v1/pay); the action is the last segment. No slash
    # merging: "a//b" reaches the view as it is, never redirected to "a/b". A name that
    # starts with "/" (or holds "." or ".." segments) needs the JSON action above
    app.add_url_rule(
        f"{base}/<path:name>/<action>",
        "breaker_redis.act",
        gate.guard(act),
        methods=["POST"],
        merge_slashes=False,
    )
    if dashboard:
        from breaker_redis.flask.dashboard import install_dashboard

        install_dashboard(app, state, base, gate)
