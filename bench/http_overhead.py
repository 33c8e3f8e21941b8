"""HTTP overhead of the breaker: requests/s, p50 and p99 of the same gunicorn app
(4 workers, an upstream answering in 2 ms) with and without a breaker on the route,
for sync and for gthread workers, measured by wrk.

Run as ``python bench/http_overhead.py`` (``./dev bench`` installs wrk from the
distribution's packages; without wrk the script says so and exits 1). It
starts a redis-server (or the embedded server), the demo's upstream and
gunicorn, drives ``/plain`` and ``/guarded`` (bench/http_app.py) in alternating
rounds (the machine is noisy: alternation spreads the noise over both), prints
one table and stops everything. The target (docs/design.md, section 11) is a ratio of
at least 0.85 of the requests/s without the breaker.
"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo_app.stack import start_gunicorn, start_redis, start_upstream  # noqa: E402

UPSTREAM_LATENCY_MS = 2
WRK_THREADS, WRK_CONNECTIONS = 2, 16
ROUND_SECONDS = 4
ROUNDS = 3
TARGET_RATIO = 0.85
WORKER_KINDS = {"sync": [], "gthread": ["-k", "gthread", "--threads", "4"]}


def wrk(url: str, seconds: int) -> tuple[float, float, float, int]:
    """(requests/s, p50 ms, p99 ms, non-2xx/3xx answers) of one wrk run."""
    out = subprocess.run(
        ["wrk", f"-t{WRK_THREADS}", f"-c{WRK_CONNECTIONS}", f"-d{seconds}s", "--latency", url],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 60,
    ).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    percentiles = {
        p: _ms(v, unit)
        for p, v, unit in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
    }
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return rate, percentiles["50"], percentiles["99"], int(bad.group(1)) if bad else 0


def _ms(value: str, unit: str) -> float:
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


Run = tuple[float, float, float, int]  # requests/s, p50 ms, p99 ms, errors


def one_kind(redis_url: str, upstream_url: str, kind: str) -> dict[str, list[Run]]:
    base, gunicorn = start_gunicorn(
        redis_url,
        upstream_url,
        extra_args=["--pythonpath", str(ROOT / "bench"), *WORKER_KINDS[kind]],
        app="http_app:app",
        ready_path="/plain",
    )
    try:
        for path in ("/plain", "/guarded"):
            wrk(base + path, 1)  # warm every worker
        runs: dict[str, list[Run]] = {"/plain": [], "/guarded": []}
        for _ in range(ROUNDS):
            for path in runs:
                runs[path].append(wrk(base + path, ROUND_SECONDS))
        return runs
    finally:
        gunicorn.stop()
        gunicorn.remove_log()


def main() -> int:
    if shutil.which("wrk") is None:
        print(
            "wrk is not installed: run ./dev bench, which installs it from the distribution's packages",
            file=sys.stderr,
        )
        return 1
    started = time.monotonic()
    redis_url, redis_child, redis_kind = start_redis()
    upstream_url, upstream_child = start_upstream()
    results = {}
    try:
        requests.post(upstream_url + "/_control", json={"latency_ms": UPSTREAM_LATENCY_MS}, timeout=5)
        for kind in WORKER_KINDS:
            results[kind] = one_kind(redis_url, upstream_url, kind)
    finally:
        upstream_child.stop()
        redis_child.stop()
        upstream_child.remove_log()
        redis_child.remove_log()
    print(
        f"# HTTP overhead: gunicorn, 4 workers, upstream {UPSTREAM_LATENCY_MS} ms, {redis_kind}, "
        f"wrk -t{WRK_THREADS} -c{WRK_CONNECTIONS}, {ROUNDS} alternating rounds of {ROUND_SECONDS} s "
        f"({time.strftime('%Y-%m-%d')})\n"
    )
    print("| workers | route | requests/s (median) | p50 ms | p99 ms | errors | with / without | result |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, runs in results.items():
        medians = {
            path: [statistics.median(r[i] for r in rows) for i in range(3)] for path, rows in runs.items()
        }
        errors = {path: sum(r[3] for r in rows) for path, rows in runs.items()}
        ratio = medians["/guarded"][0] / medians["/plain"][0]
        for path, label in (("/plain", "/plain (no breaker)"), ("/guarded", "/guarded (@breakers.protect)")):
            rate, p50, p99 = medians[path]
            verdict = " | "
            if path == "/guarded":
                result = "PASS" if ratio >= TARGET_RATIO else "MISS"
                verdict = f"{ratio:.2f} | {result} (target >= {TARGET_RATIO})"
            print(f"| {kind} | {label} | {rate:,.0f} | {p50:.2f} | {p99:.2f} | {errors[path]} | {verdict} |")
    print(f"\nfinished in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
