"""What the web integrations add to a request, beside a bare app, in one run.

Run ``python bench/integrations.py``. It starts a fresh redis-server on a free
loopback port (as bench/overhead.py does), builds each app bare and with its
breaker integration, and times requests made straight through the WSGI or
ASGI interface (no HTTP client, no server, one process; the ASGI apps on one
event loop, which runs for the whole run in a thread of its own as a server's
would, so that the asyncio breakers' background sends are never frozen
mid-way while the sync subjects run):

- Flask: a bare Flask app; the same app with ``FlaskBreakers``, on a route it
  does not protect (``/plain``) and on one behind ``@breakers.protect``
  (``/guarded``);
- the WSGI middleware (``breaker_redis.wsgi.BreakerMiddleware``) around a
  plain WSGI callable, ``/guarded`` in its ``routes``;
- the ASGI middleware (``breaker_redis.asgi.BreakerMiddleware``) around a
  plain ASGI callable;
- the FastAPI dependency (``breaker_redis.fastapi.protect``) on one path
  operation of a FastAPI app, beside a bare FastAPI app;
- the breaker call itself: ``Breaker.call`` of a calm, subscribed breaker
  deciding from memory, in a loop, sync (the reference of Flask and WSGI)
  and asyncio (awaited; the reference of ASGI and FastAPI).

Two more references, for reading the figures: the same breaker call made by
the bare app's own handler on ``/guarded`` (what the call costs inside a
request, where the app's work has pushed the breaker's code and data out of
the CPU caches that a loop of calls keeps warm), and, for FastAPI, an empty
yield dependency with the guard's signature and scope (what FastAPI charges
for any such dependency).

Each subject runs REQUESTS requests per round, ROUNDS rounds. A round runs
the integrations in a shuffled order, and each integration's subjects (bare
app, unprotected route, protected route, the breaker call in the bare app's
handler) back to back, in a shuffled order: an added time is the median over
the rounds of a subject's time less the bare app's in the same round, so
that the load of a shared machine, which moves from second to second, falls
on both sides of each difference. Times are medians of µs per request. Every protected route's
breaker is calm (closed, far from its threshold), and the run checks at the
end that each counted every request sent to it (a Redis that stalls on a busy
machine sends a worker to its local breaker for a while, and its counts with it).
``BENCH_ROUNDS`` and ``BENCH_REQUESTS`` in the environment change the numbers.

``python bench/integrations.py --instructions`` counts instead of timing (it
needs valgrind): each subject runs alone under callgrind, instrumented only
while it serves COUNTED requests after its warm-up, and the table gives
instructions per request of the thread that serves them (the recorder's
background sends are left out: under callgrind they come once per few
requests instead of once per thousand). Counts do not move with the load of
the machine, so they show a change of a few hundred instructions that the
timings of a shared machine cannot; they do not show what the CPU caches do
to those instructions.

Targets (docs/design.md, section 11): a protected route adds at most 2x the
breaker call's time to the bare app's request, and a route the integration
does not protect adds at most 1 µs. A missed target is reported, not an
error: the script exits 0 unless the benchmark itself cannot run.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
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
from fastapi import Depends, FastAPI, Request, Response  # noqa: E402
from flask import Flask  # noqa: E402
from overhead import callgrind_stretch, callgrind_subject, noop, redis_server, wait_until_subscribed  # noqa: E402
from werkzeug.test import create_environ  # noqa: E402

from breaker_redis import Breaker, BreakerConfig, Breakers  # noqa: E402
from breaker_redis import asyncio as aio  # noqa: E402
from breaker_redis.asgi import BreakerMiddleware as AsgiMiddleware  # noqa: E402
from breaker_redis.fastapi import add_refusal_handler, protect  # noqa: E402
from breaker_redis.flask import FlaskBreakers  # noqa: E402
from breaker_redis.wsgi import BreakerMiddleware as WsgiMiddleware  # noqa: E402

REQUESTS = int(os.environ.get("BENCH_REQUESTS", 1000))  # requests per subject and round
ROUNDS = int(os.environ.get("BENCH_ROUNDS", 31))
WARMUP = 500
TARGET_PROTECTED_RATIO = 2.0  # a protected route's added time <= this x the breaker call
TARGET_UNPROTECTED_USEC = 1.0  # an unprotected route's added time <= this
# calm: a count rule far from its threshold never arms, so every success is batched
CALM_FIELDS: dict[str, Any] = {"trip": "count", "failure_threshold": 1_000_000, "window_seconds": 10}
CALM = BreakerConfig(**CALM_FIELDS)

Timed = Callable[[int], float]  # run n requests, return the seconds they took
Run = Callable[[Awaitable[Any]], Any]  # await a coroutine on the event loop's thread, from this one
Sync = Callable[..., Iterable[bytes]]
Async = Callable[..., Any]


# -- the apps: "bare", "protected", "in-app" (the handler calls the breaker itself) ------


def flask_app(mode: str, breakers: Breakers, call: Breaker) -> Flask:
    app = Flask(__name__)
    guard: Callable[[Any], Any] = lambda view: view  # noqa: E731
    if mode == "protected":
        guard = FlaskBreakers(app, breakers=breakers).protect("bench-flask", **CALM_FIELDS)

    @app.get("/plain")
    def plain() -> str:
        return "ok"

    @app.get("/guarded")
    @guard
    def guarded() -> str:
        if mode == "in-app":
            call.call(noop)
        return "ok"

    return app


def plain_wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]


def wsgi_app(mode: str, breakers: Breakers, call: Breaker) -> Sync:
    if mode == "protected":
        routes = {"/guarded": {"breaker": "bench-wsgi", **CALM_FIELDS}}
        return WsgiMiddleware(plain_wsgi, breakers, routes=routes)
    if mode == "bare":
        return plain_wsgi

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ["PATH_INFO"] == "/guarded":
            call.call(noop)
        return plain_wsgi(environ, start_response)

    return app


START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")],
}
BODY = {"type": "http.response.body", "body": b"ok"}


async def plain_asgi(scope: dict[str, Any], receive: Async, send: Async) -> None:
    await send(START)
    await send(BODY)


async def anoop() -> None:
    return None


def asgi_app(mode: str, breakers: aio.Breakers, call: aio.Breaker) -> Async:
    if mode == "protected":
        routes = {"/guarded": {"breaker": "bench-asgi", **CALM_FIELDS}}
        return AsgiMiddleware(plain_asgi, breakers, routes=routes)
    if mode == "bare":
        return plain_asgi

    async def app(scope: dict[str, Any], receive: Async, send: Async) -> None:
        if scope["path"] == "/guarded":
            await call.call(anoop)
        await plain_asgi(scope, receive, send)

    return app


async def empty_dependency(request: Request, response: Response) -> AsyncIterator[None]:
    yield None  # the guard's signature and kind (a yield dependency), doing nothing


def fastapi_app(mode: str, breakers: aio.Breakers, call: aio.Breaker) -> FastAPI:
    app = FastAPI()
    dependencies: list[Any] = []
    if mode == "protected":
        add_refusal_handler(app, breakers)
        dependencies = [protect(breakers, "bench-fastapi", CALM)]
    elif mode == "empty-dependency":
        dependencies = [Depends(empty_dependency, scope="function")]

    @app.get("/plain")
    async def plain() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/guarded", dependencies=dependencies)
    async def guarded() -> dict[str, bool]:
        if mode == "in-app":
            await call.call(anoop)
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


def wsgi_subject(app: Sync, path: str, name: str, statuses: Statuses) -> Timed:
    environ = create_environ(path, "http://localhost/")
    seen: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        seen.append(status)
        return None

    def run(n: int) -> float:
        seen.clear()
        start = time.perf_counter()
        for _ in range(n):
            result = app(environ.copy(), start_response)
            for _chunk in result:
                pass
            close = getattr(result, "close", None)
            if close is not None:
                close()
        elapsed = time.perf_counter() - start
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


def asgi_subject(run_async: Run, app: Async, path: str, name: str, statuses: Statuses) -> Timed:
    scope = asgi_scope(path)
    request = {"type": "http.request", "body": b"", "more_body": False}
    seen: list[int] = []

    async def receive() -> dict[str, Any]:
        return request

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            seen.append(message["status"])

    async def requests(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            await app(dict(scope), receive, send)
        return time.perf_counter() - start

    def run(n: int) -> float:
        seen.clear()
        elapsed: float = run_async(requests(n))
        for status in seen:
            statuses.check(name, status)
        return elapsed

    return run


def sync_call_subject(breaker: Breaker) -> Timed:
    def run(n: int) -> float:
        call = breaker.call
        start = time.perf_counter()
        for _ in range(n):
            call(noop)
        return time.perf_counter() - start

    return run


def async_call_subject(run_async: Run, breaker: aio.Breaker) -> Timed:
    async def calls(n: int) -> float:
        call = breaker.call
        start = time.perf_counter()
        for _ in range(n):
            await call(anoop)
        return time.perf_counter() - start

    return lambda n: float(run_async(calls(n)))


async def wait_until_subscribed_async(breakers: aio.Breakers, breaker: aio.Breaker) -> None:
    await breaker.call(anoop)
    deadline = time.monotonic() + 10
    while breakers.invalidator is not None and not breakers.invalidator.healthy:
        if time.monotonic() > deadline:
            raise RuntimeError("breaker_redis.asyncio: the invalidation listener did not subscribe")
        await asyncio.sleep(0.01)


# -- measuring ------------------------------------------------------------------------


class Samples(dict[str, list[float]]):
    """µs per request of each subject, one sample a round."""

    def usec(self, name: str) -> float:
        return statistics.median(self[name])

    def added(self, name: str, bare: str) -> float:
        """The median over the rounds of name's time less bare's in the same round."""
        return statistics.median(x - y for x, y in zip(self[name], self[bare], strict=True))


def measure(blocks: dict[str, dict[str, Timed]]) -> tuple[Samples, dict[str, int]]:
    """(samples, requests made) of every subject; a block's subjects run back to back."""
    made: dict[str, int] = {}
    for block in blocks.values():
        for name, run in block.items():
            run(WARMUP)
            made[name] = WARMUP
    samples = Samples({name: [] for name in made})
    order = list(blocks)
    shuffle = random.Random(17)
    for _ in range(ROUNDS):
        shuffle.shuffle(order)
        for key in order:
            names = list(blocks[key])
            shuffle.shuffle(names)
            for name in names:
                samples[name].append(blocks[key][name](REQUESTS) / REQUESTS * 1e6)
                made[name] += REQUESTS
    return samples, made


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
    Integration(
        "FastAPI dependency (`breaker_redis.fastapi.protect`)", "fastapi", "call-async", "bench-fastapi"
    ),
]
REFERENCES = {"call-sync": "sync", "call-async": "asyncio"}


@dataclass
class Figures:
    bare: float
    added_plain: float
    added_guarded: float
    call: float
    added_in_app: float  # the breaker call made by the bare app's own handler

    @property
    def ratio(self) -> float:
        return self.added_guarded / self.call

    @property
    def met(self) -> tuple[bool, bool]:
        return self.ratio <= TARGET_PROTECTED_RATIO, self.added_plain <= TARGET_UNPROTECTED_USEC


def figures(samples: Samples, each: Integration) -> Figures:
    key = each.key
    return Figures(
        bare=samples.usec(f"{key}-bare-plain"),
        added_plain=samples.added(f"{key}-protected-plain", f"{key}-bare-plain"),
        added_guarded=samples.added(f"{key}-protected-guarded", f"{key}-bare-guarded"),
        call=samples.usec(each.reference),
        added_in_app=samples.added(f"{key}-in-app-guarded", f"{key}-bare-guarded"),
    )


def table(samples: Samples) -> tuple[str, list[str]]:
    header = [
        "integration",
        "bare app µs",
        "unprotected route: added µs (target <= 1)",
        "protected route: added µs",
        "breaker call µs",
        "protected added ÷ breaker call (target <= 2)",
        "breaker call in the bare app's handler: added µs",
        "protected added ÷ that",
        "result",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    misses = []
    for each in INTEGRATIONS:
        f = figures(samples, each)
        met_ratio, met_plain = f.met
        if not met_ratio:
            misses.append(f"{each.key}: a protected request adds {f.ratio:.2f}x the breaker call")
        if not met_plain:
            misses.append(f"{each.key}: an unprotected request adds {f.added_plain:.1f} µs")
        lines.append(
            "| "
            + " | ".join(
                [
                    each.label,
                    f"{f.bare:.1f}",
                    f"{f.added_plain:+.1f}",
                    f"{f.added_guarded:+.1f}",
                    f"{f.call:.1f} ({REFERENCES[each.reference]})",
                    f"{f.ratio:.2f}",
                    f"{f.added_in_app:+.1f}",
                    f"{f.added_guarded / f.added_in_app:.2f}",
                    "PASS" if met_ratio and met_plain else "MISS",
                ]
            )
            + " |"
        )
    return "\n".join(lines), misses


CASES = [
    ("bare", "plain"),
    ("bare", "guarded"),
    ("protected", "plain"),
    ("protected", "guarded"),
    ("in-app", "guarded"),
]


def cases(key: str) -> list[tuple[str, str]]:
    """(mode, path) of an integration's subjects, named f"{key}-{mode}-{path}"."""
    return CASES + ([("empty-dependency", "guarded")] if key == "fastapi" else [])


def build_blocks(
    sync_breakers: Breakers,
    async_breakers: aio.Breakers,
    call: Breaker,
    acall: aio.Breaker,
    run_async: Run,
    statuses: Statuses,
    only: str | None = None,
) -> dict[str, dict[str, Timed]]:
    """Every subject (or only those of the integration ``only``), by integration,
    and the breaker calls: name -> run n requests."""
    builders: dict[str, Callable[[str], Any]] = {
        "flask": lambda mode: flask_app(mode, sync_breakers, call),
        "wsgi": lambda mode: wsgi_app(mode, sync_breakers, call),
        "asgi": lambda mode: asgi_app(mode, async_breakers, acall),
        "fastapi": lambda mode: fastapi_app(mode, async_breakers, acall),
    }
    blocks: dict[str, dict[str, Timed]] = {}
    for key, build in builders.items():
        if only is not None and key != only:
            continue
        block = blocks[key] = {}
        for mode, path in cases(key):
            name = f"{key}-{mode}-{path}"
            if key in ("flask", "wsgi"):
                block[name] = wsgi_subject(build(mode), f"/{path}", name, statuses)
            else:
                block[name] = asgi_subject(run_async, build(mode), f"/{path}", name, statuses)
    blocks["calls"] = {
        "call-sync": sync_call_subject(call),
        "call-async": async_call_subject(run_async, acall),
    }
    return blocks


def loop_thread() -> tuple[asyncio.AbstractEventLoop, threading.Thread, Run]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="bench-event-loop", daemon=True)
    thread.start()

    def run_async(coro: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()  # type: ignore[arg-type]

    return loop, thread, run_async


def main() -> int:
    started = time.monotonic()
    statuses = Statuses()
    loop, thread, run_async = loop_thread()
    with redis_server() as url:
        control = redis.Redis.from_url(url)
        sync_breakers = Breakers.from_url(url)
        async_breakers = aio.Breakers.from_url(url)
        try:
            call = sync_breakers.get("bench-call", CALM)
            wait_until_subscribed(sync_breakers, call)
            acall = async_breakers.get("bench-call-async", CALM)
            run_async(wait_until_subscribed_async(async_breakers, acall))
            blocks = build_blocks(sync_breakers, async_breakers, call, acall, run_async, statuses)
            samples, made = measure(blocks)
            counted = checks(sync_breakers, async_breakers, run_async, made)
            server = control.info("server")
        finally:
            sync_breakers.close()
            sync_breakers.client.close()
            run_async(async_breakers.aclose())
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
            control.close()
    rendered, misses = table(samples)
    print(
        f"# Integration overhead (Python {sys.version.split()[0]}, Flask {version('flask')}, "
        f"FastAPI {version('fastapi')}, Starlette {version('starlette')}, redis-server "
        f"{server['redis_version']} on 127.0.0.1; {ROUNDS} interleaved rounds of {REQUESTS:,} "
        f"requests, medians; {date.today().isoformat()})\n"
    )
    print(rendered)
    print()
    for each in INTEGRATIONS:
        key = each.key
        bare_plain, bare_guarded = samples.usec(f"{key}-bare-plain"), samples.usec(f"{key}-bare-guarded")
        plain, guarded = samples.usec(f"{key}-protected-plain"), samples.usec(f"{key}-protected-guarded")
        print(
            f"- {key}: bare app {bare_plain:.1f} µs on /plain, {bare_guarded:.1f} µs on /guarded; "
            f"with the integration {plain:.1f} and {guarded:.1f} µs"
        )
    empty_added = samples.added("fastapi-empty-dependency-guarded", "fastapi-bare-guarded")
    fastapi = figures(samples, INTEGRATIONS[3])
    print(
        f"- FastAPI's own price for a yield dependency (an empty one with the guard's signature and "
        f"scope): +{empty_added:.1f} µs, {empty_added / fastapi.call:.2f}x the breaker call; the guard "
        f"adds {fastapi.added_guarded - empty_added:+.1f} µs on top of it"
    )
    print(
        f"- breaker calls in a loop: sync {samples.usec('call-sync'):.2f} µs, "
        f"asyncio {samples.usec('call-async'):.2f} µs "
        "(calm, subscribed, deciding from memory)"
    )
    print(f"- {counted}")
    if statuses.bad:
        print(f"- requests answered other than 200: {statuses.bad}")
    for miss in misses:
        print(f"- missed: {miss}")
    print(f"- load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"\nfinished in {time.monotonic() - started:.1f} s")
    return 0


# -- counting instructions (--instructions) ----------------------------------------------

COUNTED = 500  # requests counted per subject


def one_subject(name: str, url: str) -> int:
    """Under callgrind: build every subject, warm up one, then serve COUNTED requests
    of it between two lines read from stdin (the parent instruments that stretch)."""
    loop = asyncio.new_event_loop()  # in this thread: its requests are the main thread's
    statuses = Statuses()
    sync_breakers = Breakers.from_url(url)
    async_breakers = aio.Breakers.from_url(url)
    call = sync_breakers.get("bench-call", CALM)
    wait_until_subscribed(sync_breakers, call)
    acall = async_breakers.get("bench-call-async", CALM)
    loop.run_until_complete(wait_until_subscribed_async(async_breakers, acall))
    blocks = build_blocks(
        sync_breakers, async_breakers, call, acall, loop.run_until_complete, statuses, name.split("-")[0]
    )
    run = next(block[name] for block in blocks.values() if name in block)
    callgrind_subject(run, WARMUP, COUNTED)
    sync_breakers.close()
    loop.run_until_complete(async_breakers.aclose())
    return 1 if statuses.bad else 0


def count_instructions(url: str, names: list[str], folder: str) -> Samples:
    """Instructions per request of each subject's serving thread, one callgrind run each."""
    counts = Samples()
    for name in names:
        command = [sys.executable, __file__, "--one", name, url]
        total = callgrind_stretch(command, name, folder, "a request was answered other than 200")
        counts[name] = [total / COUNTED]
    return counts


def instruction_table(counts: Samples) -> str:
    header = [
        "integration",
        "bare app",
        "unprotected route: added",
        "protected route: added",
        "breaker call",
        "protected added ÷ breaker call (target <= 2)",
        "breaker call in the bare app's handler: added",
        "protected added ÷ that",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for each in INTEGRATIONS:
        f = figures(counts, each)
        lines.append(
            "| "
            + " | ".join(
                [
                    each.label,
                    f"{f.bare:,.0f}",
                    f"{f.added_plain:+,.0f}",
                    f"{f.added_guarded:+,.0f}",
                    f"{f.call:,.0f} ({REFERENCES[each.reference]})",
                    f"{f.ratio:.2f}",
                    f"{f.added_in_app:+,.0f}",
                    f"{f.added_guarded / f.added_in_app:.2f}",
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def instructions_main() -> int:
    started = time.monotonic()
    names = [f"{each.key}-{mode}-{path}" for each in INTEGRATIONS for mode, path in cases(each.key)]
    names += ["call-sync", "call-async"]
    with redis_server() as url, tempfile.TemporaryDirectory(prefix="bench-callgrind-") as folder:
        counts = count_instructions(url, names, folder)
    empty = counts.added("fastapi-empty-dependency-guarded", "fastapi-bare-guarded")
    fastapi = figures(counts, INTEGRATIONS[3])
    print(
        f"# Integration overhead in instructions per request (callgrind, the serving thread; "
        f"Python {sys.version.split()[0]}, Flask {version('flask')}, FastAPI {version('fastapi')}; "
        f"{COUNTED} requests per subject after {WARMUP}; {date.today().isoformat()})\n"
    )
    print(instruction_table(counts))
    print()
    print(
        f"- FastAPI's own price for a yield dependency (an empty one with the guard's signature and "
        f"scope): {empty:+,.0f}; the guard adds {fastapi.added_guarded - empty:+,.0f} on top of it"
    )
    print(f"\nfinished in {time.monotonic() - started:.1f} s")
    return 0


def checks(
    sync_breakers: Breakers,
    async_breakers: aio.Breakers,
    run_async: Run,
    made: dict[str, int],
) -> str:
    """Each protected route's breaker counted exactly the requests sent to it, and stayed closed."""
    found = []
    for each in INTEGRATIONS:
        if each.reference == "call-sync":
            snapshot = sync_breakers.get(each.breaker).snapshot()
        else:
            snapshot = run_async(async_breakers.get(each.breaker).snapshot())
        sent = made[f"{each.key}-protected-guarded"]
        ok = snapshot["state"] == "closed" and snapshot["successes"] == sent and not snapshot["failures"]
        found.append(
            f"{each.breaker} {snapshot['state']}, {snapshot['successes']:,} successes of "
            f"{sent:,} requests{'' if ok else ' (MISMATCH)'}"
        )
    return "protected routes' breakers after the run: " + "; ".join(found)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        sys.exit(one_subject(sys.argv[2], sys.argv[3]))
    sys.exit(instructions_main() if sys.argv[1:] == ["--instructions"] else main())
