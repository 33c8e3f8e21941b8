"""The live dashboard at ``<admin path>/`` (``BREAKER_DASHBOARD = True``).

- ``GET {base}/``: the page shell. It holds no data; without the token it is
  still sent (as the body of a 401 with the Bearer challenge), so a browser
  shows the form that asks for the token.
- ``GET {base}/static/<file>``: its script and style sheet, shipped in the
  package (no CDN, works offline); no data either, so no token.
- ``GET {base}/stream``: server-sent events, behind the token. Browsers
  cannot add a header to ``EventSource``, so the page reads this stream with
  ``fetch`` and ``Authorization: Bearer``: the token never travels in a URL
  and never sits in a cookie. Each ``snapshot`` event carries every breaker
  under the app's prefix, read as the CLI reads them, plus its last
  transitions; one is sent every second and at once when a transition or
  a switch is published on the breakers' channel.
- The buttons POST to ``{base}/actions`` (admin.py), with the token.

On a threaded server (gunicorn's gthread worker, ``flask run``) a stream
lasts ``STREAM_SECONDS`` and the page reconnects at once. On a server with
one request per process at a time (gunicorn's sync worker: the WSGI
environ's ``wsgi.multithread`` is false) each request gets one frame and the
page asks again a second later: an open page never holds such a worker, nor
runs into its timeout; a change then shows within a second.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Iterator
from importlib import resources
from typing import Any

import redis
from flask import Flask, Response, abort, request

from breaker_redis.flask.gate import REDIS_DOWN, Gate
from breaker_redis.flask.state import AppState

STREAM_SECONDS = 15.0
POLL_MS = 1000  # single-threaded servers: one frame per request, the page asks every second
FRAME_SECONDS = 1.0
TRANSITIONS_SHOWN = 5
STATIC_TYPES = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
PAGE_HEADERS = {
    **HEADERS,
    # Only the package's own files; no inline script, no frame around the page.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
}


def _asset(name: str) -> str:
    return resources.files("breaker_redis.flask").joinpath("static", name).read_text(encoding="utf-8")


def frame(state: AppState) -> dict[str, Any]:
    """Every breaker under the app's prefix (and those the app declared, before their
    first call) with its last transitions, and Redis's clock (the breakers' own, if given one)."""
    reader = state.reader()
    now = reader.now_ms()  # a test's clock, if the breakers decide by one: so does the page
    names = sorted(set(reader.names()) | state.app_names())
    breakers = reader.snapshots(names)  # reads only: a declared name gets no keys from it
    histories = reader.histories(names, TRANSITIONS_SHOWN)
    for snapshot in breakers:
        snapshot["transitions"] = histories[snapshot["name"]]
    groups = reader.groups(breakers)
    return {"now": now, "breakers": breakers, "groups": groups}


def event(kind: str, data: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _subscribe(client: Any, channel: str) -> Any:
    """A subscription in force when this returns: Redis has confirmed it, so a
    change published after the next frame is read cannot be missed."""
    pubsub = client.pubsub()
    try:
        pubsub.subscribe(channel)
        ends = time.monotonic() + 2
        while time.monotonic() < ends:
            message = pubsub.get_message(timeout=max(0.0, ends - time.monotonic()))
            if message is not None and message["type"] == "subscribe":
                return pubsub
        raise redis.exceptions.TimeoutError("no confirmation of the subscription")
    except BaseException:
        pubsub.close()
        raise


def _wait_for_change(pubsub: Any, seconds: float) -> None:
    """Until a message is published on the channel (then every one already
    received: one frame for a burst) or ``seconds`` have passed."""
    ends = time.monotonic() + seconds
    while (left := ends - time.monotonic()) > 0:
        message = pubsub.get_message(timeout=left)
        if message is not None and message["type"] == "message":
            while pubsub.get_message(timeout=0) is not None:
                pass
            return


def stream_events(state: AppState, seconds: float | None = None, retry_ms: int = 0) -> Iterator[str]:
    """A snapshot now, then one a second and one right after each published change,
    for ``seconds`` (``STREAM_SECONDS``); ``retry_ms`` tells the page how long to
    wait before it asks again once the stream ends."""
    client, channel = state.breakers.client, state.breakers.channel
    yield f"retry: {retry_ms}\n\n"
    pubsub: Any = None
    ends = time.monotonic() + (STREAM_SECONDS if seconds is None else seconds)
    try:
        while True:
            try:
                if pubsub is None and seconds != 0:
                    pubsub = _subscribe(client, channel)
                yield event("snapshot", frame(state))
            except REDIS_DOWN as exc:
                if pubsub is not None:
                    pubsub.close()
                    pubsub = None
                yield event("problem", {"error": f"Redis does not answer: {exc}"})
            left = ends - time.monotonic()
            if left <= 0:
                return
            wait = min(FRAME_SECONDS, left)
            try:
                if pubsub is None:
                    time.sleep(wait)
                else:
                    _wait_for_change(pubsub, wait)
            except REDIS_DOWN:
                pubsub.close()
                pubsub = None
    finally:
        if pubsub is not None:
            pubsub.close()


def install_dashboard(app: Flask, state: AppState, base: str, gate: Gate) -> None:
    page = _asset("dashboard.html").replace("{{base}}", html.escape(base, quote=True))

    def dashboard() -> Response:
        response = Response(page, content_type="text/html; charset=utf-8", headers=PAGE_HEADERS)
        return response if gate.authorized() else gate.denied(response)

    def static(filename: str) -> Response:
        if filename not in STATIC_TYPES:
            abort(404)
        return Response(
            _asset(filename), content_type=f"{STATIC_TYPES[filename]}; charset=utf-8", headers=HEADERS
        )

    def stream() -> Response:
        # A server with one request per process at a time (gunicorn's sync worker)
        # sends one frame and the page asks again a second later: an open page
        # never holds such a worker, nor runs into its timeout.
        if request.environ.get("wsgi.multithread"):
            events = stream_events(state)
        else:
            events = stream_events(state, seconds=0, retry_ms=POLL_MS)
        return Response(
            events,
            content_type="text/event-stream",
            headers={**HEADERS, "X-Accel-Buffering": "no"},  # nginx: pass each event on at once
        )

    app.add_url_rule(f"{base}/", "breaker_redis.dashboard", dashboard, methods=["GET"])
    app.add_url_rule(f"{base}/static/<filename>", "breaker_redis.dashboard_static", static, methods=["GET"])
    app.add_url_rule(f"{base}/stream", "breaker_redis.dashboard_stream", gate.guard(stream), methods=["GET"])
