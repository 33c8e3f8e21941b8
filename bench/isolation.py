"""Isolation during an outage: does a hung upstream behind /pay take /products down with it?

``python bench/isolation.py`` starts a redis-server (or the embedded server),
the demo's upstream and gunicorn (4 sync workers, bench/isolation_app.py),
then runs the same timeline twice, once with /pay behind a breaker and once
without:

- 0-10 s: healthy, half of the clients call /pay, half /products;
- 10-30 s: the upstream hangs on /pay (the app gives up after 1 s: 504);
- 30-40 s: the upstream is healthy again.

Each client is a closed loop (the next request when the last one answered),
in processes of their own; an answer counts in the second it arrived. The
script prints a table per run (requests/s
and errors per route and phase, /products during the outage against its
healthy rate, the target of docs/design.md section 11 being at least 0.9x) and draws
both runs over time, with the breaker's state, in docs/isolation.png
(matplotlib, installed from the package index when missing).
"""

from __future__ import annotations

import collections
import http.client
import multiprocessing
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo_app.stack import redis_and_upstream, start_gunicorn  # noqa: E402

HEALTHY_SECONDS, OUTAGE_SECONDS, RECOVERY_SECONDS = 10, 20, 10
CLIENT_PROCESSES = 4  # each runs one /pay and one /products client thread
TARGET_RATIO = 0.9
CHART = ROOT / "docs" / "isolation.png"


def client_process(port: int, seconds: float, started: float, out: Any) -> None:
    """One /pay and one /products closed-loop client until `seconds` after `started`:
    puts [(second, path, status)]."""
    answers: list[tuple[int, str, int]] = []
    lock = threading.Lock()

    def loop(path: str, method: str) -> None:
        mine = []
        while time.time() < started + seconds:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                connection.request(method, path)
                status = connection.getresponse().status
            except OSError:
                status = 0
            finally:
                connection.close()
            mine.append((int(time.time() - started), path, status))  # counted when answered
        with lock:
            answers.extend(mine)

    threads = [
        threading.Thread(target=loop, args=("/pay", "POST")),
        threading.Thread(target=loop, args=("/products", "GET")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put(answers)


def state_sampler(redis_url: str, prefix: str, seconds: float, started: float, states: list) -> None:
    client = redis.Redis.from_url(redis_url)
    while time.time() < started + seconds:
        value = client.hget(f"{prefix}:{{pay}}:state", "state")
        states.append((time.time() - started, (value or b"closed").decode()))
        time.sleep(0.1)
    client.close()


def serve_app(redis_url: str, upstream_url: str, env: dict[str, str], prefix: str) -> tuple[int, Any]:
    """gunicorn serving bench/isolation_app.py with ``env``, its breakers under ``prefix``:
    (its port, its child process). bench/recovery.py serves it too."""
    base, gunicorn = start_gunicorn(
        redis_url,
        upstream_url,
        extra_args=["--pythonpath", str(ROOT / "bench"), "--timeout", "60"],
        app="isolation_app:app",
        ready_path="/products",
        env={**env, "BREAKER_KEY_PREFIX": prefix},
    )
    return int(base.rsplit(":", 1)[1]), gunicorn


def one_run(redis_url: str, upstream_url: str, guarded: bool) -> dict[str, Any]:
    prefix = f"isolation{int(time.time())}{int(guarded)}"
    port, gunicorn = serve_app(
        redis_url, upstream_url, {"ISOLATION_BREAKER": "1" if guarded else "0"}, prefix
    )
    total = HEALTHY_SECONDS + OUTAGE_SECONDS + RECOVERY_SECONDS
    try:
        requests.post(upstream_url + "/_reset", timeout=5).raise_for_status()
        started = time.time() + 1.0
        queue: Any = multiprocessing.get_context("spawn").Queue()
        clients = [
            multiprocessing.get_context("spawn").Process(
                target=client_process, args=(port, total, started, queue)
            )
            for _ in range(CLIENT_PROCESSES)
        ]
        for proc in clients:
            proc.start()
        states: list[tuple[float, str]] = []
        sampler = threading.Thread(target=state_sampler, args=(redis_url, prefix, total, started, states))
        sampler.start()
        time.sleep(max(0.0, started + HEALTHY_SECONDS - time.time()))
        requests.post(upstream_url + "/_control", json={"path": "/pay", "hang": True}, timeout=5)
        time.sleep(max(0.0, started + HEALTHY_SECONDS + OUTAGE_SECONDS - time.time()))
        requests.post(upstream_url + "/_reset", timeout=5)  # healthy, hung calls released
        answers = [a for _ in clients for a in queue.get(timeout=total + 60)]
        for proc in clients:
            proc.join(30)
        sampler.join(10)
    finally:
        gunicorn.stop()
        gunicorn.remove_log()
    return {"answers": answers, "states": states, "seconds": total}


def phase(second: int) -> str:
    if second < HEALTHY_SECONDS:
        return "healthy"
    return "outage" if second < HEALTHY_SECONDS + OUTAGE_SECONDS else "recovery"


def summary(run: dict[str, Any]) -> dict[tuple[str, str], tuple[float, int]]:
    """{(path, phase): (requests/s, answers not 200 or 503)}."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    errors: collections.Counter[tuple[str, str]] = collections.Counter()
    for second, path, status in run["answers"]:
        key = (path, phase(second))
        counts[key] += 1
        errors[key] += status not in (200, 503)
    lengths = {"healthy": HEALTHY_SECONDS, "outage": OUTAGE_SECONDS, "recovery": RECOVERY_SECONDS}
    return {key: (counts[key] / lengths[key[1]], errors[key]) for key in counts}


def per_second(run: dict[str, Any], path: str, ok: bool) -> list[int]:
    series = [0] * run["seconds"]
    for second, p, status in run["answers"]:
        if p == path and 0 <= second < run["seconds"] and ((status in (200, 503)) == ok):
            series[second] += 1
    return series


def pyplot() -> Any:
    """matplotlib.pyplot drawing to files (the bench extra; installed from the package index
    when missing): the charts of this bench and bench/recovery.py."""
    try:
        import matplotlib
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"], check=True)
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def chart(runs: dict[str, dict[str, Any]]) -> None:
    plt = pyplot()
    figure, axes = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for ax, (title, run) in zip(axes, runs.items(), strict=True):
        seconds = list(range(run["seconds"]))
        ax.plot(seconds, per_second(run, "/products", True), label="/products answered", color="#2e7d32")
        ax.plot(seconds, per_second(run, "/pay", True), label="/pay answered (200 or 503)", color="#1565c0")
        ax.plot(seconds, per_second(run, "/pay", False), label="/pay errors (504 after 1 s)", color="#c62828")
        ax.axvspan(
            HEALTHY_SECONDS,
            HEALTHY_SECONDS + OUTAGE_SECONDS,
            color="#999999",
            alpha=0.12,
            label="upstream hangs on /pay",
        )
        opened = [t for t, state in run["states"] if state != "closed"]
        if opened:
            ax.scatter(opened, [0] * len(opened), marker="|", color="#c62828", label="pay breaker not closed")
        ax.set_title(title)
        ax.set_ylabel("requests/s")
        ax.set_yscale("symlog", linthresh=10)
        ax.legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("seconds")
    save(figure, CHART)


def save(figure: Any, chart: Path) -> None:
    """Write a chart of these benches into docs/."""
    figure.tight_layout()
    chart.parent.mkdir(exist_ok=True)
    figure.savefig(chart, dpi=90)


def main() -> int:
    runs: dict[str, dict[str, Any]] = {}
    with redis_and_upstream() as (redis_url, redis_kind, upstream_url):
        for guarded in (True, False):
            title = "with the breaker on /pay" if guarded else "without a breaker"
            runs[title] = one_run(redis_url, upstream_url, guarded)
    print(
        f"# Isolation: /pay's upstream hangs for {OUTAGE_SECONDS} s (gunicorn, 4 sync workers, "
        f"{CLIENT_PROCESSES} /pay and {CLIENT_PROCESSES} /products closed-loop clients, {redis_kind}, "
        f"{time.strftime('%Y-%m-%d')})\n"
    )
    print(
        "| run | route | healthy req/s | outage req/s | recovery req/s | errors (not 200/503) "
        "| outage / healthy |"
    )
    print("|---|---|---|---|---|---|---|")
    ratios = {}
    for title, run in runs.items():
        figures = summary(run)
        for path in ("/products", "/pay"):
            healthy, outage, recovery = (
                figures.get((path, p), (0.0, 0)) for p in ("healthy", "outage", "recovery")
            )
            ratio = outage[0] / healthy[0] if healthy[0] else 0.0
            if path == "/products":
                ratios[title] = ratio
            errors = healthy[1] + outage[1] + recovery[1]
            print(
                f"| {title} | {path} | {healthy[0]:,.0f} | {outage[0]:,.0f} | {recovery[0]:,.0f} | "
                f"{errors:,} | {ratio:.2f}x |"
            )
    chart(runs)
    guarded = ratios["with the breaker on /pay"]
    print(
        f"\n/products during the outage, with the breaker: {guarded:.2f}x its healthy rate "
        f"(target >= {TARGET_RATIO}: {'met' if guarded >= TARGET_RATIO else 'MISSED'}); "
        f"without: {ratios['without a breaker']:.2f}x. Chart: {CHART.relative_to(ROOT)}"
    )
    medians = statistics.median([len(r["answers"]) for r in runs.values()])
    print(f"({medians:,.0f} answers per run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
