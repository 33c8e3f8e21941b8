"""The breaker on a Redis that evicts: what an open breaker looks like 0.3 s after its trip.

``python bench/eviction.py [rounds]`` starts its own redis-server with ``maxmemory
2mb`` and, per policy (``allkeys-lru``, ``volatile-lru``), another client filling
it with 1 KB cache entries, 5,000 a second (with a TTL under volatile-lru, as a
cache sets them), so the whole cache turns over about every 0.4 s. Each round
three workers (``Breakers`` with their event subscription, in this process) use
a breaker of their own; one of them fails
until it is refused (``failures to trip``, 5 by the rule); 0.3 s later Redis is
read (``state open``) and the three workers make 120 calls (``admitted``); at
0.5 s a new worker makes its first call (``new worker admitted``), as gunicorn
starts workers all the time. ``BREAKER_BENCH_CODE=/path/to/checkout`` runs
another version of breaker_redis, e.g. an older commit, for a before/after in
one session. The figures depend on the eviction's randomness: a bench, not a test
(tests/storage/test_eviction.py holds the deterministic parts).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if os.environ.get("BREAKER_BENCH_CODE"):
    sys.path.insert(0, os.environ["BREAKER_BENCH_CODE"])

import redis
from overhead import redis_server

import breaker_redis
from breaker_redis import BreakerConfig, BreakerOpen, Breakers

CONFIG = BreakerConfig(trip="consecutive", failure_threshold=5, open_seconds=30)
CALLS = 120


FILL_PER_SECOND = 5_000  # cache entries written per second: the 2 MB cache turns over every ~0.4 s


class Filler:
    def __init__(self, url: str, ttl: bool) -> None:
        self.client = redis.Redis.from_url(url)
        self.ttl = ttl
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        value, n, start = b"x" * 1024, 0, time.monotonic()
        while not self.stop.is_set():
            ahead = n / FILL_PER_SECOND - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
            pipe = self.client.pipeline(transaction=False)
            for _ in range(50):
                n += 1
                pipe.set(f"cache:{n}", value, ex=3600 if self.ttl else None)
            try:
                pipe.execute()
            except redis.exceptions.ResponseError:
                time.sleep(0.001)

    def __enter__(self) -> Filler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.client.close()


def admitted(breaker: object) -> bool:
    try:
        breaker.acquire().ignore()  # type: ignore[attr-defined]
        return True
    except BreakerOpen:
        return False


def subscribed(url: str, name: str) -> Breakers:
    breakers = Breakers.from_url(url)
    admitted(breakers.get(name, CONFIG))
    deadline = time.monotonic() + 10
    while breakers.invalidator is not None and not breakers.invalidator.healthy:
        if time.monotonic() > deadline:
            raise RuntimeError("no subscription")
        time.sleep(0.005)
    return breakers


def one_round(url: str, admin: redis.Redis, name: str) -> dict[str, int]:
    workers = [subscribed(url, name) for _ in range(3)]
    try:
        tripping = workers[0].get(name, CONFIG)
        failures = 0
        while failures < 20:
            try:
                tripping.acquire().failure()
                failures += 1
            except BreakerOpen:
                break
        tripped_at = time.monotonic()
        time.sleep(max(0.0, tripped_at + 0.3 - time.monotonic()))
        state = admin.hget(f"breaker:{{{name}}}:state", "state")
        calls = sum(admitted(workers[i % 3].get(name, CONFIG)) for i in range(CALLS))
        time.sleep(max(0.0, tripped_at + 0.5 - time.monotonic()))
        newcomer = Breakers.from_url(url, listen=False)
        try:
            new_admitted = admitted(newcomer.get(name, CONFIG))
        finally:
            close(newcomer)
        return {
            "failures": failures,
            "open": int(state == b"open"),
            "admitted": calls,
            "new": int(new_admitted),
        }
    finally:
        for breakers in workers:
            close(breakers)


def close(breakers: Breakers) -> None:
    """Its threads and its connections: a client's buffers count toward maxmemory, and a
    2 MB Redis full of idle clients has nothing left that volatile-lru may evict."""
    breakers.close()
    breakers.client.close()


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    code = os.environ.get("BREAKER_BENCH_CODE") or str(Path(breaker_redis.__file__).parent.parent)
    print(
        f"# breaker_redis on an evicting Redis (maxmemory 2mb, {FILL_PER_SECOND:,} cache entries of "
        f"1 KB written a second; {rounds} rounds per policy; code: {code})\n"
    )
    print(
        "| policy | open 0.3 s after the trip | calls admitted at 0.3 s (of 120 per round) | "
        "new worker admitted at 0.5 s | trips needing more than 5 failures | keys evicted |"
    )
    print("|---|---|---|---|---|---|")
    for policy in os.environ.get("BREAKER_BENCH_POLICIES", "allkeys-lru volatile-lru").split():
        with redis_server() as url:
            admin = redis.Redis.from_url(url)
            admin.config_set("maxmemory", 2 * 1024 * 1024)
            admin.config_set("maxmemory-policy", policy)
            results = []
            with Filler(url, ttl=policy.startswith("volatile")):
                time.sleep(0.5)  # the cache is full: from here on every write evicts
                for n in range(rounds):
                    results.append(one_round(url, admin, f"pay-{n}"))
            evicted = int(admin.info("stats")["evicted_keys"])
            admin.close()
        opened = sum(r["open"] for r in results)
        calls = sum(r["admitted"] for r in results)
        new = sum(r["new"] for r in results)
        late = [r["failures"] for r in results if r["failures"] > 5]
        late_text = f"{len(late)} of {rounds}" + (f" ({min(late)}-{max(late)} failures)" if late else "")
        print(
            f"| {policy} | {opened} of {rounds} | {calls} of {CALLS * rounds} | {new} of {rounds} | "
            f"{late_text} | {evicted:,} |"
        )


if __name__ == "__main__":
    main()
