"""demo_app on a real gunicorn, seen from outside: the end-to-end tests' ``Stack``."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from breaker_redis.ops.reader import parse_event
from demo_app import stack
from demo_app.clock import ClockWriter
from tests.support.redis_server import wait_until

WORKERS = 4
OPEN_SECONDS = 3
FRIENDLY = "temporarily unavailable, please retry later"
_prefixes = itertools.count()


class Stack:
    """The running demo, seen from outside: HTTP to the app and the upstream, Redis for state."""

    def __init__(self, app_url: str, upstream_url: str, redis, prefix: str) -> None:
        self.app_url = app_url
        self.upstream_url = upstream_url
        self.redis = redis
        self.prefix = prefix
        self.statuses: Counter[int] = Counter()
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=16)
        self.clock: ClockWriter | None = None  # the workers' clock, when start_stack was given one

    def send(self, path: str, method: str = "GET", **kwargs) -> requests.Response:
        response = requests.request(method, self.app_url + path, timeout=10, **kwargs)
        with self.lock:
            self.statuses[response.status_code] += 1
        return response

    def pay(self, **kwargs) -> requests.Response:
        return self.send("/pay", "POST", **kwargs)

    def burst(self, calls: list[tuple[str, str]]) -> list[requests.Response]:
        """All calls at the same moment (a barrier releases them together)."""
        barrier = threading.Barrier(len(calls))

        def one(call):
            barrier.wait(10)
            return self.send(call[0], call[1])

        return list(self.pool.map(one, calls))

    def control(self, **body) -> None:
        requests.post(self.upstream_url + "/_control", json=body, timeout=5).raise_for_status()

    def reset_upstream(self) -> None:
        requests.post(self.upstream_url + "/_reset", timeout=5).raise_for_status()

    def upstream_stats(self) -> dict:
        return requests.get(self.upstream_url + "/_stats", timeout=5).json()

    def hits(self) -> int:
        return int(self.upstream_stats()["hits"].get("/pay", 0))

    def state(self) -> tuple[str, int]:
        state, open_until = self.redis.hmget(f"{self.prefix}:{{pay}}:state", "state", "open_until")
        return (state or b"").decode(), int(open_until or 0)

    def redis_now_ms(self) -> int:
        seconds, micros = self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def transitions(self) -> list[tuple[str, str, str]]:
        lines = reversed(self.redis.lrange(f"{self.prefix}:{{pay}}:events", 0, -1))  # newest first
        return [(e["from"], e["to"], e["cause"]) for e in map(parse_event, lines) if e is not None]

    def every_worker_answers(self, path: str, method: str) -> set[str]:
        """Send bursts until each of the 4 workers has answered; returns their pids."""
        pids: set[str] = set()

        def all_seen() -> bool:
            for response in self.burst([(path, method)] * 8):
                pids.add(response.headers["X-Worker-Pid"])
            return len(pids) >= WORKERS

        wait_until(all_seen, timeout=30, interval=0.01, what=f"all {WORKERS} workers to answer {path}")
        return pids

    def subscribed_workers(self) -> int:
        channel = f"{self.prefix}:notices:0"  # the workers' channel (docs/boundary.md)
        return int(dict(self.redis.pubsub_numsub(channel)).get(channel.encode(), 0))


def start_stack(
    redis_server, upstream_url: str, extra_args: list[str], clock_file: Path | None = None, **env
):
    """The demo on gunicorn; with ``clock_file``, every worker's breakers decide by the
    clock the test moves there (``Stack.clock``, demo_app/clock.py), started at the wall-clock time."""
    prefix = f"e2e{next(_prefixes)}"
    clock = None
    if clock_file is not None:
        clock = ClockWriter(clock_file)
        env["DEMO_CLOCK_FILE"] = str(clock_file)
    app_url, child = stack.start_gunicorn(
        redis_server.url,
        upstream_url,
        extra_args=extra_args,
        env={"DEMO_PAY_OPEN_SECONDS": str(OPEN_SECONDS), "BREAKER_KEY_PREFIX": prefix, **env},
    )
    s = Stack(app_url, upstream_url, redis_server.client(), prefix)
    s.clock = clock
    return s, child
