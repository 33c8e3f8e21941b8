"""One measurement for ``bench/overhead.py --against``: µs per healthy call of the
breaker_redis found under ``--root``.

Run by overhead.py in a child process once per round, alternately with the
checkout's own code and the code of an earlier commit, so both meet the same
machine, the same redis-server and the same drift. Prints one JSON line:
the median µs per call of ``Breaker.call`` on a healthy breaker (the guard's
path) and of ``acquire()`` then ``success()`` (the permit's path), each over
REPEATS runs of ITERATIONS calls after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

ITERATIONS = 5000
REPEATS = 5
WARMUP = 500


def noop() -> None:
    return None


def usec(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    for _ in range(ITERATIONS):
        call()
    return (time.perf_counter() - start) / ITERATIONS * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", required=True, help="the folder holding the code to measure")
    parser.add_argument("--url", required=True, help="the Redis both codes run on")
    parser.add_argument("--name", required=True, help="a breaker name of this round's own")
    args = parser.parse_args()
    sys.path.insert(0, args.root)
    from breaker_redis import BreakerConfig, Breakers

    breakers = Breakers.from_url(args.url)
    try:
        breaker = breakers.get(args.name, BreakerConfig(trip="rate", failure_rate=0.5, minimum_calls=20))
        for _ in range(WARMUP):
            breaker.call(noop)

        def permit() -> None:
            breaker.acquire().success()

        def guard() -> None:
            breaker.call(noop)

        samples: dict[str, list[float]] = {"call": [], "permit": []}
        for _ in range(REPEATS):
            samples["call"].append(usec(guard))
            samples["permit"].append(usec(permit))
    finally:
        breakers.close()
    print(json.dumps({name: statistics.median(values) for name, values in samples.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
