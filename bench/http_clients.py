"""Cost of an outbound HTTP call through the breaker's adapter or transport.

``python bench/http_clients.py`` starts its own redis-server (as
bench/overhead.py does) and the demo's upstream (``python -m
demo_app.upstream``, its own process), then, alternating in one run, times
GET /stock through each client plainly and through the breaker:

- requests: a ``Session`` as it comes, and one with ``BreakerAdapter`` mounted;
- httpx: ``httpx.Client()`` and ``httpx.Client(transport=BreakerTransport(...))``;
- httpx async: ``httpx.AsyncClient`` with and without ``AsyncBreakerTransport``
  (one call awaited at a time);
- requests through a member of a ``BreakerGroup`` (a pool of four hosts);
- a refused call: the breaker forced open (no connection is made);
- the breaker alone, no adapter: ``acquire()`` and ``permit.success()`` by
  hand around a plain requests call, the share of the breaker's core.

The plain call and the call through the breaker alternate call by call, each
timed alone; a row is the median over ROUNDS of each round's median µs per
call (CALLS pairs a round), the difference, and the script calls and PINGs
the breaker sent Redis per call (``INFO commandstats``: FCALL, EVALSHA,
EVAL, PING; the commands a script runs are not sent). The breakers are healthy
and listen for events (the default), so admission is decided in memory and
successes are sent in batches. Prints one markdown table; exits 0 unless the
bench cannot run.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import redis
import requests
from overhead import redis_server_process

from breaker_redis import BreakerConfig, BreakerOpen, Breakers
from breaker_redis.asyncio import Breakers as AsyncBreakers
from breaker_redis.groups import BreakerGroup
from breaker_redis.httpx import AsyncBreakerTransport, BreakerTransport
from breaker_redis.requests import BreakerAdapter
from breaker_redis.web.clients import host_name
from demo_app import stack

CALLS = 500  # calls of each kind per round
ROUNDS = 5  # alternating rounds per row; the median is reported
WARMUP = 200
CONFIG = BreakerConfig(failure_threshold=5, open_seconds=60)


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1e6


def refused(call: Callable[[], object]) -> Callable[[], object]:
    def once() -> object:
        try:
            call()
        except BreakerOpen:
            return None
        raise RuntimeError("the breaker let a call through while forced open")

    return once


class AsyncLoop:
    """One event loop for all the async calls (the asyncio breakers bind to it)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def timed(self, client: httpx.AsyncClient, url: str) -> float:
        async def one() -> float:
            started = time.perf_counter()
            await client.get(url)
            return (time.perf_counter() - started) * 1e6

        return self.loop.run_until_complete(one())


def main() -> int:
    started = time.monotonic()
    upstream_url, upstream = stack.start_upstream()
    url = upstream_url + "/stock"
    try:
        with redis_server_process() as (redis_url, _process):
            rows, version = measure(redis_url, upstream_url, url)
    finally:
        upstream.stop()
        upstream.remove_log()
    load = os.getloadavg()[0]
    print(
        f"# Outbound HTTP through the breaker: µs per call, plain client and through it, same run "
        f"(redis-server {version}, the demo upstream on 127.0.0.1, Python {sys.version.split()[0]}, "
        f"requests {requests.__version__}, httpx {httpx.__version__}, {os.cpu_count()} cores, "
        f"load average {load:.1f}, median of {ROUNDS} rounds of {CALLS:,} interleaved calls of each)\n"
    )
    print(
        "| client | plain µs/call | through the breaker µs/call | added µs/call | ratio "
        "| Redis scripts + PINGs per call |"
    )
    print("|---|---|---|---|---|---|")
    for label, plain, guarded, commands in rows:
        print(
            f"| {label} | {plain:,.1f} | {guarded:,.1f} | {guarded - plain:+,.1f} | {guarded / plain:.3f} "
            f"| {commands:.4f} |"
        )
    print(
        "\nThe upstream is a Python ThreadingHTTPServer on the same machine (about a millisecond a "
        "call). A refused call makes no connection: its row compares it with a plain call that "
        "does; most of what remains is requests' own work before any adapter is asked (merging "
        "the environment's proxy settings, preparing the request). The last row is the breaker's "
        "core alone around the same call: the rest of an adapter's row is the adapter's own."
    )
    print(f"finished in {time.monotonic() - started:.1f} s")
    return 0


def measure(redis_url: str, upstream_url: str, url: str) -> tuple[list[tuple[str, float, float, float]], str]:
    control = redis.Redis.from_url(redis_url)
    version = control.info("server")["redis_version"]
    breakers = Breakers.from_url(redis_url, "bench-http")
    plain_session, session, refusing = requests.Session(), requests.Session(), requests.Session()
    session.mount("http://", BreakerAdapter(breakers, config=CONFIG))  # the upstream's host:port breaker
    refusing.mount("http://", BreakerAdapter(breakers, config=CONFIG, name="bench-refused"))
    breakers.get("bench-refused", CONFIG).force_open()
    plain_httpx = httpx.Client()
    guarded_httpx = httpx.Client(transport=BreakerTransport(breakers, config=CONFIG))
    # a pool of four hosts, the upstream's one of them (its breaker a member, on Breakers of their own)
    pool_breakers = Breakers.from_url(redis_url, "bench-pool")
    hosts = [upstream_url, "http://127.0.0.2:9", "http://127.0.0.3:9", "http://127.0.0.4:9"]
    pool = BreakerGroup(pool_breakers, "bench-pool", hosts, config=CONFIG)
    pool_session = requests.Session()
    pool_session.mount("http://", BreakerAdapter(pool_breakers, groups=[pool]))
    assert host_name(upstream_url) in pool
    loop = AsyncLoop()
    async_breakers = AsyncBreakers.from_url(redis_url, "bench-http-async")
    plain_async = httpx.AsyncClient()
    guarded_async = httpx.AsyncClient(transport=AsyncBreakerTransport(async_breakers, config=CONFIG))

    def scripts() -> int:
        """Script calls and PINGs the server ran: what a worker sends (INFO commandstats
        also counts the commands a script runs, which are not sent)."""
        stats = control.info("commandstats")
        return sum(
            int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
            for name in ("fcall", "evalsha", "eval", "ping")
        )

    def get(client: Any) -> Callable[[], float]:
        return lambda: timed(lambda: client.get(url))

    def get_async(client: httpx.AsyncClient) -> Callable[[], float]:
        return lambda: loop.timed(client, url)

    def get_refused() -> float:
        return timed(refused(lambda: refusing.get(url)))

    by_hand = breakers.get("bench-by-hand", CONFIG)

    def get_by_hand() -> float:  # the breaker alone: no adapter, acquire and success around the call
        def call() -> None:
            permit = by_hand.acquire()
            plain_session.get(url)
            permit.success()

        return timed(call)

    cases: list[tuple[str, Callable[[], float], Callable[[], float]]] = [
        ("requests (BreakerAdapter)", get(plain_session), get(session)),
        ("httpx (BreakerTransport)", get(plain_httpx), get(guarded_httpx)),
        ("httpx async (AsyncBreakerTransport)", get_async(plain_async), get_async(guarded_async)),
        ("requests, a member of a BreakerGroup", get(plain_session), get(pool_session)),
        ("requests, refused (forced open)", get(plain_session), get_refused),
        ("requests, no adapter: acquire() and success() by hand", get(plain_session), get_by_hand),
    ]
    for _label, plain, guarded in cases:  # warm up: connections, scripts loaded, subscriptions
        for _ in range(WARMUP):
            plain()
            guarded()
    rows = []
    for label, plain, guarded in cases:
        plain_runs: list[float] = []
        guarded_runs: list[float] = []
        sent = 0
        for _ in range(ROUNDS):
            # the two interleaved call by call: both see the same moment of the machine
            plain_times, guarded_times = [], []
            before = scripts()
            for _ in range(CALLS):
                plain_times.append(plain())
                guarded_times.append(guarded())
            sent += scripts() - before
            plain_runs.append(statistics.median(plain_times))
            guarded_runs.append(statistics.median(guarded_times))
        rows.append(
            (label, statistics.median(plain_runs), statistics.median(guarded_runs), sent / (ROUNDS * CALLS))
        )

    async def close_async() -> None:
        await plain_async.aclose()
        await guarded_async.aclose()
        await async_breakers.aclose()

    loop.loop.run_until_complete(close_async())
    loop.loop.close()
    for client in (plain_session, session, pool_session, refusing, plain_httpx, guarded_httpx):
        client.close()
    breakers.get("bench-refused").reset()
    for each in (breakers, pool_breakers):
        each.close()
    control.close()
    return rows, str(version)


if __name__ == "__main__":
    sys.exit(main())
