"""One sick host: what a quorum of reporters costs in a true outage, and in memory.

``python bench/quorum.py`` starts its own redis-server. Three hosts (reporters
a, b, c: a ``Breakers`` each, in this process, on the test clock) call one
breaker whose service fails for all of them, until every host is refused; the
table gives the upstream calls made by then, for each trip rule with
``min_reporters`` 1, 2 and 3, in two orders: the hosts' calls interleaved (a, b,
c, a, ...) and one host's calls first (a alone until it is refused, then the
three interleaved), the worst order for a quorum. Then the Redis memory one
reporter costs (``MEMORY USAGE`` of the reporters hash, 10 to 40 reporters
named like hosts, 11 characters), failing in the window and isolated. The call
counts are exact, not timings: tests/system/test_quorum_processes.py asserts the count
rule's with worker processes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if os.environ.get("BREAKER_BENCH_CODE"):
    sys.path.insert(0, os.environ["BREAKER_BENCH_CODE"])

import redis
from overhead import redis_server

from breaker_redis import BreakerConfig, BreakerOpen, Breakers

RULES = {
    "count: 5 in 10 s": {"trip": "count", "failure_threshold": 5, "window_seconds": 10},
    "consecutive: 5": {"trip": "consecutive", "failure_threshold": 5},
    "rate: 50 % of at least 20": {"trip": "rate", "failure_rate": 0.5, "minimum_calls": 20},
}
HOSTS = "abc"
T0 = 1_700_000_000_000


def calls_until_everyone_refuses(
    client: redis.Redis, rule: dict[str, object], quorum: int, first: bool
) -> int:
    client.flushall()
    config = BreakerConfig(open_seconds=30, min_reporters=quorum, **rule)  # type: ignore[arg-type]
    made = [Breakers(client, listen=False, reporter=host, clock=lambda: T0) for host in HOSTS]
    breakers = dict(zip(HOSTS, (b.get("pay", config) for b in made), strict=True))
    refused: set[str] = set()
    calls = 0

    def call(host: str) -> None:
        nonlocal calls
        try:
            breakers[host].acquire().failure()
            calls += 1
        except BreakerOpen:
            refused.add(host)

    while first and "a" not in refused:
        call("a")
    while len(refused) < len(HOSTS) and calls < 10_000:
        for host in HOSTS:
            call(host)
    for b in made:
        b.close()
    return calls


def bytes_per_reporter(client: redis.Redis, isolated: bool) -> float:
    client.flushall()
    config = BreakerConfig(
        trip="count", failure_threshold=1 if isolated else 1000, window_seconds=60, min_reporters=100
    )
    sizes = {}
    for i in range(1, 41):
        breakers = Breakers(client, listen=False, reporter=f"web-{i:02d}.prod")
        breakers.get("pay", config).acquire().failure()
        breakers.close()
        sizes[i] = int(client.memory_usage("breaker:{pay}:reporters", samples=0) or 0)
    return (sizes[40] - sizes[10]) / 30


def main() -> None:
    with redis_server() as url:
        client = redis.Redis.from_url(url)
        print("## One sick host: upstream calls before every host refuses (3 hosts, all failing)\n")
        print("| rule | order | min_reporters=1 | 2 | 3 |")
        print("|---|---|---|---|---|")
        for label, rule in RULES.items():
            for first in (False, True):
                counts = [calls_until_everyone_refuses(client, rule, quorum, first) for quorum in (1, 2, 3)]
                order = "one host first" if first else "interleaved"
                print(f"| {label} | {order} | {' | '.join(map(str, counts))} |")
        print("\n## Redis memory per reporter (MEMORY USAGE, names of 11 characters)\n")
        print("| reporter | bytes |")
        print("|---|---|")
        print(f"| failing in the window | {bytes_per_reporter(client, False):.0f} |")
        print(f"| isolated | {bytes_per_reporter(client, True):.0f} |")


if __name__ == "__main__":
    main()
