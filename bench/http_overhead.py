"""HTTP overhead of the breaker: requests/s of the same gunicorn app (4 sync
workers, an upstream answering in 2 ms) with and without a breaker on the route.

Run as ``python bench/http_overhead.py``. It starts a redis-server (or the embedded
server), the demo's upstream and gunicorn, drives both routes in alternating
rounds from several client processes (the machine is noisy: alternation
spreads the noise over both), prints a table and stops everything. The target
(DESIGN.md section 9) is a ratio of at least 0.85.
"""

from __future__ import annotations

import http.client
import multiprocessing
import statistics
import sys
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo_app.stack import start_gunicorn, start_redis, start_upstream  # noqa: E402

UPSTREAM_LATENCY_MS = 2
CLIENT_PROCESSES = 4
THREADS_PER_PROCESS = 4
ROUND_SECONDS = 4.0
ROUNDS = 3
TARGET_RATIO = 0.85


def client_process(
    port: int, path: str, seconds: float, results: multiprocessing.Queue[tuple[int, int]]
) -> None:
    """Sends requests for `seconds` from a few threads; puts (answered, not 200)."""
    counts = [0, 0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def loop() -> None:
        done = bad = 0
        while time.monotonic() < deadline:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", path)
            status = connection.getresponse().status
            connection.close()
            done += 1
            bad += status != 200
        with lock:
            counts[0] += done
            counts[1] += bad

    threads = [threading.Thread(target=loop) for _ in range(THREADS_PER_PROCESS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put((counts[0], counts[1]))


def requests_per_second(port: int, path: str) -> tuple[float, int]:
    ctx = multiprocessing.get_context("fork")
    results: multiprocessing.Queue[tuple[int, int]] = ctx.Queue()
    procs = [
        ctx.Process(target=client_process, args=(port, path, ROUND_SECONDS, results))
        for _ in range(CLIENT_PROCESSES)
    ]
    started = time.monotonic()
    for proc in procs:
        proc.start()
    answered = bad = 0
    for _ in procs:
        done, failed = results.get(timeout=ROUND_SECONDS + 30)
        answered, bad = answered + done, bad + failed
    for proc in procs:
        proc.join()
    return answered / (time.monotonic() - started), bad


def main() -> int:
    started = time.monotonic()
    redis_url, redis_child, redis_kind = start_redis()
    upstream_url, upstream_child = start_upstream()
    try:
        base, gunicorn = start_gunicorn(
            redis_url,
            upstream_url,
            extra_args=["--pythonpath", str(ROOT / "bench")],
            app="http_app:app",
            ready_path="/plain",
        )
    except BaseException:
        upstream_child.stop()
        redis_child.stop()
        raise
    port = int(base.rsplit(":", 1)[1])
    try:
        requests.post(upstream_url + "/_control", json={"latency_ms": UPSTREAM_LATENCY_MS}, timeout=5)
        for path in ("/plain", "/guarded"):  # warm up every worker
            requests_per_second_brief(port, path)
        rates: dict[str, list[float]] = {"/plain": [], "/guarded": []}
        errors = 0
        for _ in range(ROUNDS):
            for path in rates:
                rate, bad = requests_per_second(port, path)
                rates[path].append(rate)
                errors += bad
        snapshot = redis_snapshot(redis_url)
    finally:
        gunicorn.stop()
        upstream_child.stop()
        redis_child.stop()
        for child in (gunicorn, upstream_child, redis_child):
            child.remove_log()
    plain, guarded = statistics.median(rates["/plain"]), statistics.median(rates["/guarded"])
    ratio = guarded / plain
    print(
        f"# HTTP overhead: gunicorn, 4 sync workers, upstream {UPSTREAM_LATENCY_MS} ms, {redis_kind}, "
        f"{CLIENT_PROCESSES}x{THREADS_PER_PROCESS} client threads, {ROUNDS} alternating rounds of "
        f"{ROUND_SECONDS:g} s\n"
    )
    print("| route | requests/s (median) | rounds | target | result |")
    print("|---|---|---|---|---|")
    print(f"| /plain (no breaker) | {plain:,.0f} | {', '.join(f'{r:,.0f}' for r in rates['/plain'])} | | |")
    print(
        f"| /guarded (@breakers.protect) | {guarded:,.0f} | "
        f"{', '.join(f'{r:,.0f}' for r in rates['/guarded'])} | "
        f"ratio >= {TARGET_RATIO} (got {ratio:.2f}) | {'PASS' if ratio >= TARGET_RATIO else 'MISS'} |"
    )
    print(f"\n- answers other than 200: {errors}")
    print(f"- the breaker after the run: {snapshot}")
    print(f"\nfinished in {time.monotonic() - started:.1f} s")
    return 0


def requests_per_second_brief(port: int, path: str) -> None:
    for _ in range(20):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", path)
        connection.getresponse().read()
        connection.close()


def redis_snapshot(redis_url: str) -> str:
    from breaker_redis import BreakerConfig, Breakers

    breakers = Breakers.from_url(redis_url, listen=False)
    try:
        snap = breakers.get(
            "bench", BreakerConfig(trip="rate", minimum_calls=100, failure_rate=0.5)
        ).snapshot()
    finally:
        breakers.close()
    return ", ".join(f"{key}={snap[key]}" for key in ("state", "calls", "successes", "failures", "trips"))


if __name__ == "__main__":
    sys.exit(main())
