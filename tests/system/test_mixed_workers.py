"""End to end: async and sync workers share one breaker.

The FastAPI app (tests/support/fastapi_app.py) under ``gunicorn -k
uvicorn.workers.UvicornWorker -w 4`` and the Flask demo (``demo_app.app:app``)
under ``gunicorn -w 4`` sync workers, on one real redis-server, one key
prefix and one flaky upstream, protect ``/pay`` with the same breaker
(``pay``, the demo's BreakerConfig: 5 failures in 10 s, one probe, two
successes to close). Then, exactly:

- 5 failing upstream calls through the FastAPI app open the breaker (not 4);
  from then on every /pay request to every one of the 8 workers is refused
  (503, Retry-After, the same refusal from both frameworks) and the upstream
  sees no further call;
- half-open: a probe through the FastAPI app and one through the Flask app
  close it, and every worker of both admits again;
- 5 failing calls through the Flask app open it again, refused by all 8;
- no 500 anywhere, no traceback in either gunicorn's log.

Every wait is a condition with a deadline. The workers of both apps decide by a
clock the test moves (demo_app/clock.py): the open period lasts until the test
ends it, however long a busy machine takes to reach all 8 workers. The figures go to
test-artifacts/mixed-workers.json (or $BREAKER_TEST_ARTIFACTS).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from breaker_redis.ops.reader import parse_event
from demo_app import settings, stack
from demo_app.clock import ClockWriter
from tests.support.redis_server import wait_until

pytestmark = [pytest.mark.real, pytest.mark.multiprocess]

WORKERS = 4
OPEN_SECONDS = 10  # on the workers' clock, which the test moves (Mixed.clock)
THRESHOLD = int(settings.pay_config()["failure_threshold"])
ARTIFACTS = Path(
    os.environ.get("BREAKER_TEST_ARTIFACTS") or Path(__file__).resolve().parents[2] / "test-artifacts"
)
_prefixes = itertools.count()


class Side:
    """One gunicorn (4 workers) seen from outside."""

    def __init__(self, name: str, url: str, child: stack.Child) -> None:
        self.name = name
        self.url = url
        self.child = child
        self.statuses: Counter[int] = Counter()


class Mixed:
    """Both apps, the upstream and Redis."""

    def __init__(
        self, sides: dict[str, Side], upstream_url: str, redis: Any, prefix: str, clock: ClockWriter
    ) -> None:
        self.sides = sides
        self.clock = clock  # what every worker's breakers decide by
        self.upstream_url = upstream_url
        self.redis = redis
        self.prefix = prefix
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=24)

    def send(self, side: Side, path: str, method: str = "POST", **kwargs: Any) -> requests.Response:
        response = requests.request(method, side.url + path, timeout=10, **kwargs)
        with self.lock:
            side.statuses[response.status_code] += 1
        return response

    def burst(self, calls: list[tuple[Side, str]]) -> list[tuple[Side, str, requests.Response]]:
        """All calls at the same moment (a barrier releases them together), each on a new connection."""
        barrier = threading.Barrier(len(calls))

        def one(call: tuple[Side, str]) -> tuple[Side, str, requests.Response]:
            barrier.wait(10)
            side, path = call
            return side, path, self.send(side, path, "GET" if path == "/products" else "POST")

        return list(self.pool.map(one, calls))

    def control(self, **body: Any) -> None:
        requests.post(self.upstream_url + "/_control", json=body, timeout=5).raise_for_status()

    def reset_upstream(self) -> None:
        requests.post(self.upstream_url + "/_reset", timeout=5).raise_for_status()

    def hits(self) -> int:
        stats = requests.get(self.upstream_url + "/_stats", timeout=5).json()
        return int(stats["hits"].get("/pay", 0))

    def state(self) -> tuple[str, int]:
        state, open_until = self.redis.hmget(f"{self.prefix}:{{pay}}:state", "state", "open_until")
        return (state or b"").decode(), int(open_until or 0)

    def transitions(self) -> list[tuple[str, str, str]]:
        lines = reversed(self.redis.lrange(f"{self.prefix}:{{pay}}:events", 0, -1))  # newest first
        return [(e["from"], e["to"], e["cause"]) for e in map(parse_event, lines) if e is not None]

    def subscribers(self) -> int:
        channel = f"{self.prefix}:notices:0"  # the workers' channel (docs/boundary.md)
        return int(dict(self.redis.pubsub_numsub(channel)).get(channel.encode(), 0))

    def every_worker(self, path: str, check: Any, what: str, timeout: float) -> dict[str, set[str]]:
        """Bursts to both apps until each of the 8 workers has answered path; every
        answer is checked by ``check(side, response)``. Returns the pids per app."""
        seen: dict[str, set[str]] = {name: set() for name in self.sides}

        def all_seen() -> bool:
            calls = [(side, path) for side in self.sides.values() for _ in range(6)]
            calls += [(side, "/products") for side in self.sides.values()]
            for side, called, response in self.burst(calls):
                if called == "/products":
                    assert response.status_code == 200, (side.name, response.status_code)
                    continue
                check(side, response)
                seen[side.name].add(response.headers["X-Worker-Pid"])
            return all(len(pids) >= WORKERS for pids in seen.values())

        wait_until(all_seen, timeout=timeout, interval=0.01, what=what)
        return seen


def start(redis_server: Any, upstream_url: str, clock_file: Path) -> Mixed:
    prefix = f"mixed{next(_prefixes)}"
    clock = ClockWriter(clock_file)
    # the upstream's failures are its answers (fail_rate), never its time: a busy machine
    # that keeps it past the demo's 1 s would fail a probe the test expects to pass
    env = {
        "DEMO_PAY_OPEN_SECONDS": str(OPEN_SECONDS),
        "BREAKER_KEY_PREFIX": prefix,
        "DEMO_UPSTREAM_TIMEOUT": "30",
        "DEMO_CLOCK_FILE": str(clock_file),
    }
    sides: dict[str, Side] = {}
    try:
        url, child = stack.start_gunicorn(redis_server.url, upstream_url, env=env)
        sides["flask"] = Side("flask", url, child)
        url, child = stack.start_gunicorn(
            redis_server.url,
            upstream_url,
            env=env,
            app="tests.support.fastapi_app:app",
            extra_args=["-k", "uvicorn.workers.UvicornWorker"],
        )
        sides["fastapi"] = Side("fastapi", url, child)
    except BaseException:
        for side in sides.values():
            side.child.stop()
            side.child.remove_log()
        raise
    return Mixed(sides, upstream_url, redis_server.client(), prefix, clock)


def warm_up(m: Mixed) -> dict[str, Any]:
    """Every worker of both apps has used the pay breaker and listens to its events."""
    m.reset_upstream()
    m.control(latency_ms=30)  # overlapping requests spread over the sync workers

    def admitted(side: Side, response: requests.Response) -> None:
        assert response.status_code == 200, (side.name, response.status_code, response.text)

    pids = m.every_worker("/pay", admitted, f"all {2 * WORKERS} workers to answer /pay", timeout=60)
    wait_until(lambda: m.subscribers() >= 2 * WORKERS, timeout=20, what="all 8 workers to subscribe")
    m.reset_upstream()
    assert m.state()[0] == "closed" and m.transitions() == []  # successes alone never trip it
    return {name: sorted(found) for name, found in pids.items()}


def trip_and_refuse(m: Mixed, tripper: Side) -> dict[str, Any]:
    """Exactly THRESHOLD failing calls through one app open the breaker; then every
    worker of both apps refuses /pay, and the upstream is left alone."""
    m.reset_upstream()
    m.control(path="/pay", fail_rate=1.0)
    for n in range(THRESHOLD):
        assert m.state()[0] != "open", f"opened after {n} failures, before the {THRESHOLD}th"
        answer = m.send(tripper, "/pay")
        assert answer.status_code == 502, (tripper.name, answer.status_code, answer.text)
    state, open_until = m.state()
    assert state == "open", f"not open after {THRESHOLD} failures through {tripper.name}"  # recorded
    assert open_until == m.clock.now_ms + OPEN_SECONDS * 1000  # opened at the clock's time
    assert m.hits() == THRESHOLD  # before the response went out
    tripped_at = time.monotonic()

    refused: Counter[str] = Counter()
    retry_after: set[int] = set()

    def refuses(side: Side, response: requests.Response) -> None:
        assert response.status_code == 503, (side.name, response.status_code, response.text)
        seconds = int(response.headers["Retry-After"])
        assert seconds == OPEN_SECONDS, seconds  # the clock stands still
        assert response.headers["X-Breaker"] == "pay" and response.headers["X-Breaker-Reason"] == "open"
        assert response.text == settings.PAY_UNAVAILABLE + "\n"
        refused[side.name] += 1
        retry_after.add(seconds)

    # open until the clock moves: no time limit but a hang guard
    pids = m.every_worker("/pay", refuses, "every worker of both apps to refuse /pay", timeout=60)
    every_worker_seconds = time.monotonic() - tripped_at
    # the same refusal, as JSON, from both frameworks (and from the FastAPI dependency)
    documents = {}
    for name, path in (("flask", "/pay"), ("fastapi", "/pay"), ("fastapi", "/pay-guarded")):
        answer = m.send(m.sides[name], path, headers={"Accept": "application/json"})
        assert answer.status_code == 503 and answer.headers["Content-Type"] == "application/json"
        document = answer.json()
        assert document.pop("retry_after") == OPEN_SECONDS
        documents[f"{name} {path}"] = document
        refused[name] += 1
    assert len({json.dumps(d, sort_keys=True) for d in documents.values()}) == 1, documents
    assert m.state() == ("open", open_until)
    upstream_after_trip = m.hits() - THRESHOLD
    assert upstream_after_trip == 0, "a refused request reached the upstream"
    return {
        "tripped_by": tripper.name,
        "failing_calls_that_tripped_it": THRESHOLD,
        "state_after_the_last_failing_response": state,
        "upstream_calls": THRESHOLD + upstream_after_trip,
        "workers_refusing": {name: len(found) for name, found in pids.items()},
        "pay_requests_after_the_trip_all_refused_503": dict(refused),
        "upstream_calls_after_the_trip": upstream_after_trip,
        "retry_after_seen": sorted(retry_after),
        "seconds_until_all_8_workers_were_seen_refusing": round(every_worker_seconds, 3),
        "json_refusal": next(iter(documents.values())),
    }


def recover(m: Mixed) -> dict[str, Any]:
    """After the open period: one probe through each app closes it; then every worker admits."""
    _, open_until = m.state()
    m.control(path="/pay", fail_rate=0.0)
    m.reset_upstream()
    m.clock.advance_to(open_until)  # the open period ends: every worker reads the same time

    def probe(side: Side) -> None:
        answer = m.send(side, "/pay")
        assert answer.status_code == 200, (side.name, answer.status_code, answer.text)

    probe(m.sides["fastapi"])
    assert m.state()[0] == "half_open" and m.hits() == 1
    probe(m.sides["flask"])
    assert m.state()[0] == "closed" and m.hits() == 2

    def admitted(side: Side, response: requests.Response) -> None:
        assert response.status_code == 200, (side.name, response.status_code, response.text)

    m.every_worker("/pay", admitted, "every worker of both apps to admit /pay again", timeout=30)
    return {
        "probes": {"fastapi": 1, "flask": 1},
        "upstream_calls": 2,
        "state": m.state()[0],
    }


def test_fastapi_and_flask_workers_share_one_breaker(
    redis_server: Any, upstream_url: str, tmp_path: Path
) -> None:
    m = start(redis_server, upstream_url, tmp_path / "clock")
    figures: dict[str, Any] = {
        "apps": {
            "fastapi": "gunicorn -k uvicorn.workers.UvicornWorker -w 4 tests.support.fastapi_app:app",
            "flask": "gunicorn -w 4 demo_app.app:app (sync workers)",
        },
        "breaker": {
            "name": "pay",
            "prefix": m.prefix,
            "config": {**settings.pay_config(), "open_seconds": OPEN_SECONDS},
        },
    }
    logs: dict[str, str] = {}
    try:
        figures["workers"] = warm_up(m)
        figures["phases"] = [trip_and_refuse(m, m.sides["fastapi"])]
        figures["recovery"] = recover(m)
        figures["phases"].append(trip_and_refuse(m, m.sides["flask"]))
        figures["transitions"] = [" -> ".join(t[:2]) + f" ({t[2]})" for t in m.transitions()]
        assert m.transitions() == [
            ("closed", "open", "count"),
            ("open", "half_open", "open_elapsed"),
            ("half_open", "closed", "probes_succeeded"),
            ("closed", "open", "count"),
        ]
        figures["statuses"] = {name: dict(sorted(side.statuses.items())) for name, side in m.sides.items()}
        for name, side in m.sides.items():
            assert side.statuses[500] == 0, (name, side.statuses)
            assert set(side.statuses) <= {200, 502, 503}, (name, side.statuses)
    finally:
        for name, side in m.sides.items():
            side.child.stop()
            logs[name] = side.child.output()
            side.child.remove_log()
        m.pool.shutdown()
    for name, log in logs.items():
        assert "Traceback" not in log, (name, log[-3000:])
    figures["tracebacks_in_logs"] = 0
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "mixed-workers.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(f"\nmixed workers: {json.dumps(figures)}", file=sys.stderr)
