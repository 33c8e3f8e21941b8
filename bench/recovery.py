"""Recovery without a stampede: the traffic a service gets back when its breaker closes.

``python bench/recovery.py`` starts a redis-server (or the embedded server),
the demo's upstream and gunicorn (4 sync workers, bench/isolation_app.py's
/pay: 5 consecutive failures, open 5 s),
then runs the same timeline twice, once with ``ramp_seconds=0`` (the close
sends every worker's full traffic at once) and once with ``ramp_seconds=10``
(``ramp_from=0.1``):

- 0-6 s: healthy;
- 6-9 s: the upstream fails every call: the breaker trips at once and stays
  open 5 s;
- 9 s: the upstream is healthy again; the first call after the open period
  is the probe, which succeeds: the breaker closes (about 11 s);
- until 26 s: healthy.

Each client is a closed loop (the next request when the last one answered),
in processes of their own; an answer counts in the second it arrived,
reckoned from the close (read from the breaker's history: Redis time, the
same machine's clock). The script prints, for each run, the requests the
upstream served (200) and the ones refused (503) in each second from 3 s
before the close to 13 s after, and draws both runs in docs/recovery.png
(matplotlib: the ``bench`` extra, installed from the package index when
missing), as bench/isolation.py draws its chart.
"""

from __future__ import annotations

import http.client
import multiprocessing
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from isolation import pyplot, save, serve_app  # noqa: E402

from demo_app.stack import redis_and_upstream  # noqa: E402

HEALTHY_SECONDS, FAILING_SECONDS, TOTAL_SECONDS = 6, 3, 26
RAMP_SECONDS = 10
CLIENT_PROCESSES, CLIENT_THREADS = 4, 4
SHOWN = range(-3, 14)  # the seconds shown, from the close
CHART = ROOT / "docs" / "recovery.png"


def client_process(port: int, seconds: float, started: float, out: Any) -> None:
    """CLIENT_THREADS closed-loop /pay clients until ``seconds`` after ``started``:
    puts [(time since started, status)]."""
    answers: list[tuple[float, int]] = []
    lock = threading.Lock()

    def loop() -> None:
        mine = []
        while time.time() < started + seconds:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                connection.request("POST", "/pay")
                status = connection.getresponse().status
            except OSError:
                status = 0
            finally:
                connection.close()
            mine.append((time.time() - started, status))  # counted when answered
        with lock:
            answers.extend(mine)

    threads = [threading.Thread(target=loop) for _ in range(CLIENT_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put(answers)


def one_run(redis_url: str, upstream_url: str, ramp_seconds: int) -> dict[str, Any]:
    prefix = f"recovery{int(time.time())}{ramp_seconds}"
    port, gunicorn = serve_app(redis_url, upstream_url, {"BENCH_RAMP_SECONDS": str(ramp_seconds)}, prefix)
    try:
        requests.post(upstream_url + "/_reset", timeout=5).raise_for_status()
        started = time.time() + 1.0
        context = multiprocessing.get_context("spawn")
        queue: Any = context.Queue()
        clients = [
            context.Process(target=client_process, args=(port, TOTAL_SECONDS, started, queue))
            for _ in range(CLIENT_PROCESSES)
        ]
        for proc in clients:
            proc.start()
        time.sleep(max(0.0, started + HEALTHY_SECONDS - time.time()))
        requests.post(upstream_url + "/_control", json={"fail_rate": 1.0}, timeout=5).raise_for_status()
        time.sleep(max(0.0, started + HEALTHY_SECONDS + FAILING_SECONDS - time.time()))
        requests.post(upstream_url + "/_reset", timeout=5).raise_for_status()
        answers = [a for _ in clients for a in queue.get(timeout=TOTAL_SECONDS + 60)]
        for proc in clients:
            proc.join(30)
        closed_at = last_close(redis_url, prefix) - started
    finally:
        gunicorn.stop()
        gunicorn.remove_log()
    return {"answers": answers, "closed_at": closed_at}


def last_close(redis_url: str, prefix: str) -> float:
    """When the breaker last closed (its history's line: Redis ms, docs/wire.md), in seconds."""
    client = redis.Redis.from_url(redis_url)
    try:
        for line in client.lrange(f"{prefix}:{{pay}}:events", 0, -1):
            at, _old, new, *_ = line.decode().split(" ")
            if new == "closed":
                return int(at) / 1000.0
    finally:
        client.close()
    raise SystemExit("the breaker never closed: see the timeline in this file's docstring")


def per_second(run: dict[str, Any], status: int) -> list[int]:
    """Answers of ``status`` in each second of SHOWN, reckoned from the close."""
    series = [0] * len(SHOWN)
    for at, answered in run["answers"]:
        second = int((at - run["closed_at"]) // 1) - SHOWN.start
        if answered == status and 0 <= second < len(series):
            series[second] += 1
    return series


def share(served: int, refused: int) -> str:
    return f"{served / (served + refused):.2f}" if served + refused else "-"


def chart(runs: dict[str, dict[str, Any]]) -> None:
    plt = pyplot()
    figure, axes = plt.subplots(2, 1, figsize=(10, 7), sharex=True, sharey=True)
    seconds = list(SHOWN)
    for ax, (title, run) in zip(axes, runs.items(), strict=True):
        ax.step(
            seconds, per_second(run, 200), where="post", label="served by the upstream (200)", color="#1565c0"
        )
        ax.step(seconds, per_second(run, 503), where="post", label="refused (503)", color="#c62828")
        ax.axvline(0, color="#555555", linestyle=":", label="the breaker closes")
        ax.set(title=title, ylabel="requests/s")
        ax.legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("seconds after the close (gunicorn -w 4, the same closed-loop clients)")
    save(figure, CHART)


TITLES = {0: "ramp_seconds=0 (no ramp)", RAMP_SECONDS: f"ramp_seconds={RAMP_SECONDS}, ramp_from=0.1"}


def main() -> int:
    with redis_and_upstream() as (redis_url, redis_kind, upstream_url):
        runs = {title: one_run(redis_url, upstream_url, ramp) for ramp, title in TITLES.items()}
    print(
        f"# Recovery: requests/s the upstream served (200) and refused (503) in each second after "
        f"the close (gunicorn, 4 sync workers, {CLIENT_PROCESSES * CLIENT_THREADS} closed-loop clients, "
        f"{redis_kind}, {time.strftime('%Y-%m-%d')})\n"
    )
    # the share served of what was asked, and the ramp's share at the middle of the second
    print("| second | " + " | ".join(f"{title}: 200 | 503 | share" for title in runs) + " | the ramp's |")
    print("|---|" + "---|---|---|" * len(runs) + "---|")
    served = {title: per_second(run, 200) for title, run in runs.items()}
    refused = {title: per_second(run, 503) for title, run in runs.items()}
    for index, second in enumerate(SHOWN):
        cells = " | ".join(
            f"{served[t][index]:,} | {refused[t][index]:,} | {share(served[t][index], refused[t][index])}"
            for t in runs
        )
        ramp = 0.1 + 0.9 * (second + 0.5) / RAMP_SECONDS if 0 <= second < RAMP_SECONDS else None
        print(f"| {second:+d} | {cells} | {'-' if ramp is None else f'{ramp:.2f}'} |")
    chart(runs)
    print(f"\nChart: {CHART.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
