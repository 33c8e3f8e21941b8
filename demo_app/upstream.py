"""The flaky upstream: ``python -m demo_app.upstream --port P``.

Every path not starting with ``/_`` is a "service" (``/pay``, ``/cart``,
``/recommend``): it answers 200 JSON, or 500 when the current control says it
should fail. The control and the counters are what the demo and the tests
use to tell the story and to check it:

- ``POST /_control`` JSON ``{"fail_rate": 0..1, "latency_ms": n, "hang": bool}``
  and optionally ``"path"`` (only that path), ``"succeed_first": n`` (the
  first n hits of a path succeed: a service that breaks after a few good
  calls), ``"seed"`` (a fixed random sequence, so an 80 % failure run is
  reproducible), ``"fail_status"`` (what a failing call answers: 500 by
  default; 503, 429, or 404 and 400 for a client's mistakes) and
  ``"retry_after"`` (a ``Retry-After`` header on failing answers, "" for none);
- ``GET /_stats`` -> ``{"hits": {"/pay": n}, "max_concurrency": {"/pay": n},
  "max_concurrency_total": n, "in_flight": {...}}``;
- ``POST /_reset``: healthy again, counters zeroed, hung calls released.

Standard library only, one thread per connection, so a hung call does not
stop the others and concurrency is real.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HEALTHY: dict[str, Any] = {
    "fail_rate": 0.0,
    "latency_ms": 0,
    "hang": False,
    "succeed_first": 0,
    "fail_status": 500,
    "retry_after": "",
}
HANG_LIMIT_SECONDS = 60.0


class Upstream:
    """Control and counters, shared by the handler threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.default: dict[str, Any] = dict(HEALTHY)
            self.per_path: dict[str, dict[str, Any]] = {}
            self.random = random.Random()
            self.hits: Counter[str] = Counter()
            self.in_flight: Counter[str] = Counter()
            self.max_concurrency: Counter[str] = Counter()
            self.total_in_flight = 0
            self.max_total = 0
            old = getattr(self, "release", None)
            self.release = threading.Event()
        if old is not None:
            old.set()  # wake calls that hang on the old control

    def control(self, body: dict[str, Any]) -> dict[str, Any]:
        changes: dict[str, Any] = {k: body[k] for k in HEALTHY if k in body}
        fail_rate = float(changes.get("fail_rate", 0.0))
        if not 0.0 <= fail_rate <= 1.0:
            raise ValueError("fail_rate must be between 0 and 1")
        if not 100 <= int(changes.get("fail_status", 500)) <= 599:
            raise ValueError("fail_status must be an HTTP status (100-599)")
        if "retry_after" in changes:
            changes["retry_after"] = str(changes["retry_after"] or "")
        with self.lock:
            path = body.get("path")
            target = self.default if path is None else self.per_path.setdefault(str(path), dict(self.default))
            target.update(changes)
            if "seed" in body:
                self.random = random.Random(body["seed"])
            old, self.release = self.release, threading.Event()
            view = {"default": dict(self.default), "paths": {p: dict(c) for p, c in self.per_path.items()}}
        old.set()
        return view

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                "hits": dict(self.hits),
                "max_concurrency": dict(self.max_concurrency),
                "max_concurrency_total": self.max_total,
                "in_flight": {p: n for p, n in self.in_flight.items() if n},
            }

    def serve(self, path: str) -> tuple[int, dict[str, Any], dict[str, str]]:
        with self.lock:
            self.hits[path] += 1
            hit = self.hits[path]
            self.in_flight[path] += 1
            self.total_in_flight += 1
            self.max_concurrency[path] = max(self.max_concurrency[path], self.in_flight[path])
            self.max_total = max(self.max_total, self.total_in_flight)
            control = dict(self.per_path.get(path, self.default))
            release = self.release
            fails = hit > int(control["succeed_first"]) and self.random.random() < float(control["fail_rate"])
        try:
            if control["hang"]:
                release.wait(HANG_LIMIT_SECONDS)
            elif control["latency_ms"]:
                release.wait(float(control["latency_ms"]) / 1000.0)
            if fails:
                headers = {"Retry-After": control["retry_after"]} if control["retry_after"] else {}
                failure = {"ok": False, "service": path, "hit": hit, "error": "upstream failure"}
                return int(control["fail_status"]), failure, headers
            return 200, {"ok": True, "service": path, "hit": hit, **_payload(path)}, {}
        finally:
            with self.lock:
                self.in_flight[path] -= 1
                self.total_in_flight -= 1


def _payload(path: str) -> dict[str, Any]:
    if path.startswith("/cart"):
        return {"items": [{"sku": "tea-01", "qty": 2}, {"sku": "cup-07", "qty": 1}]}
    if path.startswith("/recommend"):
        return {"items": ["oolong", "matcha whisk", "gaiwan"]}
    return {"message": "payment accepted"}


class Server(ThreadingHTTPServer):
    # socketserver listens with a backlog of 5: 16 workers' threads connecting at
    # once (gunicorn gthread) would see refused connections, not the service
    request_queue_size = 128
    daemon_threads = True


def make_handler(upstream: Upstream) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # the headers and the body go out in two writes: with Nagle's algorithm the body
        # waited for the client's delayed ACK, about 40 ms on every call over a kept-alive
        # connection (a requests Session, an httpx Client)
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the demo prints its own story
            return

        def _send(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not raw:
                return {}
            value = json.loads(raw)
            if not isinstance(value, dict):
                raise ValueError("the body must be a JSON object")
            return value

        def _handle(self) -> None:
            path = self.path.split("?", 1)[0]
            try:
                body = self._body()
                if path == "/_control" and self.command == "POST":
                    self._send(200, upstream.control(body))
                elif path == "/_reset" and self.command == "POST":
                    upstream.reset()
                    self._send(200, {"ok": True})
                elif path == "/_stats":
                    self._send(200, upstream.stats())
                elif path.startswith("/_"):
                    self._send(404, {"error": "unknown control endpoint"})
                else:
                    self._send(*upstream.serve(path))
            except (ValueError, TypeError) as exc:
                self._send(400, {"error": str(exc)})

        do_GET = do_POST = do_PUT = do_DELETE = _handle

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo_app.upstream", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    server = Server((args.host, args.port), make_handler(Upstream()))
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"upstream listening on http://{args.host}:{args.port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
