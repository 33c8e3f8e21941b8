"""What the web integrations add to a request, beside a bare app, in one run.

Run ``python bench/integrations.py``. It starts a fresh redis-server on a free
loopback port (as bench/overhead.py does), builds each app twice, bare and
with its breaker integration, and times requests made straight through the
WSGI or ASGI interface (no HTTP client, no server, one process):

- Flask: a bare Flask app; the same app with ``FlaskBreakers`` on a route it
  does not protect (``/plain``) and on one behind ``@breakers.protect``
  (``/guarded``);
- the WSGI middleware (``breaker_redis.wsgi.BreakerMiddleware``) around a
  plain WSGI callable, the route ``/guarded`` in its ``routes``;
- the ASGI middleware (``breaker_redis.asgi.BreakerMiddleware``) around a
  plain ASGI callable;
- the FastAPI dependency (``breaker_redis.fastapi.protect``) on one path
  operation of a FastAPI app, beside a bare FastAPI app;
- the breaker call itself: ``Breaker.call`` of a calm, subscribed breaker
  deciding from memory, sync (the reference of Flask and WSGI) and asyncio
  (awaited; the reference of ASGI and FastAPI, which use asyncio breakers).

Each subject runs REQUESTS requests per round, ROUNDS rounds, the subjects in
a shuffled order every round so that drift and garbage collections hit all
alike; the figure is the median µs per request. The asyncio subjects run in
one event loop, kept for the whole run. Every protected route's breaker is
calm (closed, no failure) and its successes are counted: the run checks at
the end that each counted exactly the requests it was sent.

Targets (issue 17, docs/design.md section 11): a protected route adds at most
2x the breaker call's time to the bare app's request, and a route the
integration does not protect adds at most 1 µs. A missed target is reported,
not an error: the script exits 0 unless the benchmark itself cannot run.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # measure this checkout, installed or not

import redis  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from flask import Flask  # noqa: E402
from overhead import noop, redis_server, wait_until_subscribed  # noqa: E402
from werkzeug.test import create_environ  # noqa: E402

from breaker_redis import BreakerConfig, Breakers  # noqa: E402
from breaker_redis import asyncio as aio  # noqa: E402
from breaker_redis.asgi import BreakerMiddleware as AsgiMiddleware  # noqa: E402
from breaker_redis.fastapi import add_refusal_handler, protect  # noqa: E402
from breaker_redis.flask import FlaskBreakers  # noqa: E402
from breaker_redis.wsgi import BreakerMiddleware as WsgiMiddleware  # noqa: E402

REQUESTS = int(os.environ.get("BENCH_REQUESTS", 2000))  # requests per subject and round
ROUNDS = int(os.environ.get("BENCH_ROUNDS", 15))
WARMUP = 500
TARGET_PROTECTED_RATIO = 2.0  # protected route's added time <= this x the breaker call
TARGET_UNPROTECTED_USEC = 1.0  # unprotected route's added time <= this
# calm: a count rule far from its threshold never arms, so every success is batched
CALM_FIELDS: dict[str, Any] = {"trip": "count", "failure_threshold": 1_000_000, "window_seconds": 10}
CALM = BreakerConfig(**CALM_FIELDS)

CLOCK = getattr(time, os.environ.get("BENCH_CLOCK", "perf_counter"))
Timed = Callable[[int], float]  # run n requests, return the seconds they took


# -- the apps -------------------------------------------------------------------


def flask_app(breakers: Breakers | None) -> Flask:
    app = Flask(__name__)
    guard: Callable[[Any], Any] = lambda view: view  # noqa: E731
    if breakers is not None:
        extension = FlaskBreakers(app, breakers=breakers)
        guard = extension.protect("bench-flask", **CALM_FIELDS)

    @app.get("/plain")
    def plain() -> str:
        return "ok"

    @app.get("/guarded")
    @guard
    def guarded() -> str:
        return "ok"

    return app


def plain_wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]


async def plain_asgi(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def fastapi_app(breakers: aio.Breakers | None) -> FastAPI:
    app = FastAPI()
    dependencies = []
    if breakers is not None:
        add_refusal_handler(app, breakers)
        dependencies = [protect(breakers, "bench-fastapi", CALM)]

    @app.get("/plain")
    async def plain() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/guarded", dependencies=dependencies)
    async def guarded() -> dict[str, bool]:
        return {"ok": True}

    return app


# -- calling them ---------------------------------------------------------------------


class Statuses:
    """The statuses the subjects answered: every request must get a 200."""

    def __init__(self) -> None:
        self.bad: dict[str, int] = {}

    def check(self, subject: str, status: int | str) -> None:
        if status not in (200, "200 OK"):
            self.bad[subject] = self.bad.get(subject, 0) + 1


def wsgi_subject(app: Callable[..., Iterable[bytes]], path: str, name: str, statuses: Statuses) -> Timed:
    environ = create_environ(path, "http://localhost/")
    seen: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        seen.append(status)
        return None

    def run(n: int) -> float:
        seen.clear()
        start = CLOCK()
        for _ in range(n):
            result = app(environ.copy(), start_response)
            for _chunk in result:
                pass
            close = getattr(result, "close", None)
            if close is not None:
                close()
        elapsed = CLOCK() - start
        for status in seen:
            statuses.check(name, status)
        return elapsed

    return run


def asgi_scope(path: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"localhost")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
        "state": {},
    }


def asgi_subject(
    loop: asyncio.AbstractEventLoop, app: Callable[..., Any], path: str, name: str, statuses: Statuses
) -> Timed:
    scope = asgi_scope(path)
    request = {"type": "http.request", "body": b"", "more_body": False}
    seen: list[int] = []

    async def receive() -> dict[str, Any]:
        return request

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            seen.append(message["status"])

    async def requests(n: int) -> float:
        start = CLOCK()
        for _ in range(n):
            await app(dict(scope), receive, send)
        return CLOCK() - start

    def run(n: int) -> float:
        seen.clear()
        elapsed = loop.run_until_complete(requests(n))
        for status in seen:
            statuses.check(name, status)
        return elapsed

    return run


def sync_call_subject(breaker: Any) -> Timed:
    def run(n: int) -> float:
        call = breaker.call
        start = CLOCK()
        for _ in range(n):
            call(noop)
        return CLOCK() - start

    return run


async def anoop() -> None:
    return None


def async_call_subject(loop: asyncio.AbstractEventLoop, breaker: aio.Breaker) -> Timed:
    async def calls(n: int) -> float:
        call = breaker.call
        start = CLOCK()
        for _ in range(n):
            await call(anoop)
        return CLOCK() - start

    return lambda n: loop.run_until_complete(calls(n))


async def wait_until_subscribed_async(breakers: aio.Breakers, breaker: aio.Breaker) -> None:
    await breaker.call(anoop)
    deadline = time.monotonic() + 10
    while breakers.invalidator is not None and not breakers.invalidator.healthy:
        if time.monotonic() > deadline:
            raise RuntimeError("breaker_redis.asyncio: the invalidation listener did not subscribe")
        await asyncio.sleep(0.01)


# -- measuring ------------------------------------------------------------------------


def measure(subjects: dict[str, Timed]) -> tuple[dict[str, float], dict[str, int]]:
    """(median µs per request, requests made) of each subject, rounds interleaved."""
    made = dict.fromkeys(subjects, 0)
    for name, run in subjects.items():
        run(WARMUP)
        made[name] += WARMUP
    samples: dict[str, list[float]] = {name: [] for name in subjects}
    order = list(subjects)
    shuffle = random.Random(17)
    for _ in range(ROUNDS):
        shuffle.shuffle(order)
        for name in order:
            samples[name].append(subjects[name](REQUESTS) / REQUESTS * 1e6)
            made[name] += REQUESTS
    return {name: statistics.median(values) for name, values in samples.items()}, made


# -- the report -----------------------------------------------------------------------


@dataclass
class Integration:
    label: str
    key: str  # subject prefix
    reference: str  # the breaker call subject it is held to
    breaker: str  # the protected route's breaker


INTEGRATIONS = [
    Integration("Flask (`FlaskBreakers`, `@breakers.protect`)", "flask", "call-sync", "bench-flask"),
    Integration("WSGI middleware (`breaker_redis.wsgi`)", "wsgi", "call-sync", "bench-wsgi"),
    Integration("ASGI middleware (`breaker_redis.asgi`)", "asgi", "call-async", "bench-asgi"),
    Integration("FastAPI dependency (`breaker_redis.fastapi.protect`)", "fastapi", "call-async",
                "bench-fastapi"),
]
REFERENCES = {"call-sync": "sync `Breaker.call`", "call-async": "asyncio `Breaker.call`"}


def table(usec: dict[str, float]) -> tuple[str, list[str]]:
    header = [
        "integration",
        "bare app µs",
        "unprotected route µs (added)",
        "protected route µs (added)",
        "breaker call µs",
        "protected added ÷ breaker call (target <= 2)",
        "unprotected added µs (target <= 1)",
        "result",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    misses = []
    for each in INTEGRATIONS:
        bare_plain, bare_guarded = usec[f"{each.key}-bare-plain"], usec[f"{each.key}-bare-guarded"]
        plain, guarded = usec[f"{each.key}-plain"], usec[f"{each.key}-guarded"]
        call = usec[each.reference]
        added_plain, added_guarded = plain - bare_plain, guarded - bare_guarded
        ratio = added_guarded / call
        met_ratio = ratio <= TARGET_PROTECTED_RATIO
        met_plain = added_plain <= TARGET_UNPROTECTED_USEC
        verdict = "PASS" if met_ratio and met_plain else "MISS"
        if not met_ratio:
            misses.append(f"{each.key}: a protected request adds {ratio:.2f}x the breaker call")
        if not met_plain:
            misses.append(f"{each.key}: an unprotected request adds {added_plain:.1f} µs")
        lines.append("| " + " | ".join([
            each.label,
            f"{bare_plain:.1f}",
            f"{plain:.1f} ({added_plain:+.1f})",
            f"{guarded:.1f} ({added_guarded:+.1f})",
            f"{call:.1f} ({REFERENCES[each.reference]})",
            f"{ratio:.2f}",
            f"{added_plain:+.1f}",
            verdict,
        ]) + " |")
    return "\n".join(lines), misses


def main() -> int:
    started = time.monotonic()
    statuses = Statuses()
    loop = asyncio.new_event_loop()
    with redis_server() as url:
        control = redis.Redis.from_url(url)
        sync_breakers = Breakers.from_url(url)
        async_breakers = aio.Breakers.from_url(url)
        try:
            call_breaker = sync_breakers.get("bench-call", CALM)
            wait_until_subscribed(sync_breakers, call_breaker)
            acall_breaker = async_breakers.get("bench-call-async", CALM)
            loop.run_until_complete(wait_until_subscribed_async(async_breakers, acall_breaker))
            wsgi = WsgiMiddleware(plain_wsgi, sync_breakers,
                                  routes={"/guarded": {"breaker": "bench-wsgi", **CALM_FIELDS}})
            asgi = AsgiMiddleware(plain_asgi, async_breakers,
                                  routes={"/guarded": {"breaker": "bench-asgi", **CALM_FIELDS}})
            apps: dict[str, tuple[str, Any]] = {
                "flask-bare": ("wsgi", flask_app(None)),
                "flask": ("wsgi", flask_app(sync_breakers)),
                "wsgi-bare": ("wsgi", plain_wsgi),
                "wsgi": ("wsgi", wsgi),
                "asgi-bare": ("asgi", plain_asgi),
                "asgi": ("asgi", asgi),
                "fastapi-bare": ("asgi", fastapi_app(None)),
                "fastapi": ("asgi", fastapi_app(async_breakers)),
            }
            subjects: dict[str, Timed] = {}
            for key, (kind, app) in apps.items():
                for path in ("plain", "guarded"):
                    name = f"{key}-{path}"
                    if kind == "wsgi":
                        subjects[name] = wsgi_subject(app, f"/{path}", name, statuses)
                    else:
                        subjects[name] = asgi_subject(loop, app, f"/{path}", name, statuses)
            subjects["call-sync"] = sync_call_subject(call_breaker)
            subjects["call-async"] = async_call_subject(loop, acall_breaker)
            usec, made = measure(subjects)
            counted = checks(sync_breakers, async_breakers, loop, made)
            server = control.info("server")
        finally:
            sync_breakers.close()
            sync_breakers.client.close()
            loop.run_until_complete(async_breakers.aclose())
            loop.close()
            control.close()
    rendered, misses = table(usec)
    print(
        f"# Integration overhead (Python {sys.version.split()[0]}, Flask {version('flask')}, "
        f"FastAPI {version('fastapi')}, Starlette {version('starlette')}, redis-server "
        f"{server['redis_version']} on 127.0.0.1; median of {ROUNDS} interleaved rounds of "
        f"{REQUESTS:,} requests; {date.today().isoformat()})\n"
    )
    print(rendered)
    print()
    for each in INTEGRATIONS:
        print(f"- {each.key}: the bare app on the protected route's path: "
              f"{usec[f'{each.key}-bare-guarded']:.1f} µs")
    print(f"- breaker calls: sync {usec['call-sync']:.2f} µs, asyncio {usec['call-async']:.2f} µs "
          "(calm, subscribed, deciding from memory)")
    print(f"- {counted}")
    if statuses.bad:
        print(f"- requests answered other than 200: {statuses.bad}")
    for miss in misses:
        print(f"- missed: {miss}")
    print(f"- load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"\nfinished in {time.monotonic() - started:.1f} s")
    return 0


def checks(
    sync_breakers: Breakers,
    async_breakers: aio.Breakers,
    loop: asyncio.AbstractEventLoop,
    made: dict[str, int],
) -> str:
    """Each protected route's breaker counted exactly the requests sent to it, and stayed closed."""
    found = []
    for each in INTEGRATIONS:
        if each.reference == "call-sync":
            snapshot = sync_breakers.get(each.breaker).snapshot()
        else:
            snapshot = loop.run_until_complete(async_breakers.get(each.breaker).snapshot())
        sent = made[f"{each.key}-guarded"]
        ok = snapshot["state"] == "closed" and snapshot["successes"] == sent and not snapshot["failures"]
        found.append(f"{each.breaker} {snapshot['state']}, {snapshot['successes']:,} successes of "
                     f"{sent:,} requests{'' if ok else ' (MISMATCH)'}")
    return "protected routes' breakers after the run: " + "; ".join(found)


if __name__ == "__main__":
    sys.exit(main())
