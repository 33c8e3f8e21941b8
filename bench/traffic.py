"""Round trips and µs per protected call under everyday traffic, on one Redis and
on a Redis Cluster, beside pybreaker with its Redis storage; and what the record
script costs the server against a trivial script.

Run ``python bench/traffic.py`` (``./dev bench`` runs it too). It starts a
redis-server and a 3-master Redis Cluster on free loopback ports, measures and
prints three markdown tables, then stops them. ``--record-only``: table 3
alone, on a redis-server alone.

1. Traffic mixes: healthy (consecutive and rate rule), 0.1 %, 1 % and 10 %
   failures against a rate rule of 50 % of at least 20, 1 % failures against a
   count rule of 50 in 10 s and against a consecutive rule of 5. Each case: one
   worker, 300 warm-up calls, then 3,000 counted calls; failures spread evenly
   (every 1,000th / 100th / 10th call). Round trips are the commands the worker
   sent (script calls, the PINGs that follow a change, batches sent by its
   background thread), counted in redis-py's connection; µs per call is the
   median of three timed runs of the same 3,000 calls. pybreaker (fail_max 5,
   its CircuitRedisState) runs the same calls on the single server.
   Target (docs/design.md, section 11): at most 0.05 round trips per call, or
   1.5x the failure fraction where failures are more common than that; µs per
   call at most 0.1x pybreaker's.
2. A healthy call against pybreaker's in-memory breaker: at most 2.2x (both
   timed in turn, 15 rounds of 3,000 calls, the least of each).
3. Server time of the record script (``usec_per_call`` of FCALL in INFO
   commandstats, the least of 15 interleaved rounds of 300 calls) for a success
   sent at once (an armed breaker's) and for a failure that only counts,
   against ``return 1`` called with as many keys and arguments in the same
   rounds: at most 6x.

A missed target is reported, not an error: the script exits 0 unless the
benchmark itself cannot run.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import pybreaker  # noqa: E402
import redis  # noqa: E402
from overhead import Boom, fail, load_trivial_function, make_pybreaker, noop, redis_server  # noqa: E402
from redis.connection import AbstractConnection  # noqa: E402

from breaker_redis import BreakerConfig, BreakerOpen, Breakers  # noqa: E402
from tests.support.topologies import ClusterGroup, started  # noqa: E402

WARMUP = 300
CALLS = 3000
TIMED_RUNS = 3
TARGET_ROUND_TRIPS = 0.05
TARGET_FAILURE_FACTOR = 1.5
TARGET_VS_PYBREAKER = 0.1
TARGET_VS_MEMORY = 2.2
TARGET_RECORD_RATIO = 6.0

CONSECUTIVE = BreakerConfig(trip="consecutive", failure_threshold=5, open_seconds=600)
RATE = BreakerConfig(trip="rate", failure_rate=0.5, minimum_calls=20, open_seconds=600)
COUNT = BreakerConfig(trip="count", failure_threshold=50, window_seconds=10, open_seconds=600)


@dataclass(frozen=True)
class Mix:
    label: str
    config: BreakerConfig
    every: int  # every n-th call fails; 0: none

    @property
    def failure_fraction(self) -> float:
        return 1 / self.every if self.every else 0.0

    @property
    def target(self) -> float:
        return max(TARGET_ROUND_TRIPS, TARGET_FAILURE_FACTOR * self.failure_fraction)


MIXES = [
    Mix("healthy, consecutive rule 5", CONSECUTIVE, 0),
    Mix("healthy, rate rule 50 % of at least 20", RATE, 0),
    Mix("0.1 % failures, rate rule 50 %", RATE, 1000),
    Mix("1 % failures, rate rule 50 %", RATE, 100),
    Mix("10 % failures, rate rule 50 %", RATE, 10),
    Mix("1 % failures, count rule 50 in 10 s", COUNT, 100),
    Mix("1 % failures, consecutive rule 5", CONSECUTIVE, 100),
]


# -- round trips, counted where redis-py sends them -------------------------------


class Sends:
    """Every command (or pipeline) any redis-py connection of this process sends."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()
        self._original = AbstractConnection.send_packed_command

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        original, sends = self._original, self

        def send(connection: Any, command: Any, check_health: bool = True) -> None:
            with sends._lock:
                sends.count += 1
            original(connection, command, check_health)

        AbstractConnection.send_packed_command = send  # type: ignore[method-assign]
        try:
            yield
        finally:
            AbstractConnection.send_packed_command = original  # type: ignore[method-assign]


def run_calls(protected: Callable[..., Any], every: int, calls: int) -> None:
    """``calls`` calls through ``protected`` (a breaker's call), every n-th one failing."""
    for i in range(1, calls + 1):
        if every and i % every == 0:
            with contextlib.suppress(Boom):
                protected(fail)
        else:
            protected(noop)


Subject = tuple[Callable[..., Any], Callable[[], None], Callable[[], None]]  # call, flush, close


def measure(make: Callable[[], Subject], every: int, sends: Sends) -> tuple[float, float]:
    """(round trips per call, median µs per call) of CALLS calls after WARMUP, each
    run on a breaker of its own (a count rule must not add up the runs' failures)."""
    trips, timings = 0.0, []
    for run in range(1 + TIMED_RUNS):
        call, flush, close = make()
        try:
            run_calls(call, every, WARMUP)
            flush()
            if run == 0:
                with sends.counting():
                    before = sends.count
                    run_calls(call, every, CALLS)
                    flush()
                    trips = (sends.count - before) / CALLS
                continue
            start = time.perf_counter()
            run_calls(call, every, CALLS)
            timings.append((time.perf_counter() - start) / CALLS * 1e6)
        finally:
            close()
    return trips, statistics.median(timings)


def subscribed_breakers(url: str, prefix: str) -> Breakers:
    """Breakers whose subscription is up (on one server), so calls decide from memory."""
    breakers = Breakers.from_url(url, prefix=f"{prefix}-{time.monotonic_ns()}")
    breakers.ensure_process()
    deadline = time.monotonic() + 10
    while breakers.invalidator is not None and not breakers.invalidator.healthy:
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return breakers


def ours(url: str, mix: Mix, sends: Sends, tag: str) -> tuple[float, float]:
    def make() -> Subject:
        breakers = subscribed_breakers(url, f"traffic-{tag}")
        breaker = breakers.get("svc", mix.config)

        def close() -> None:
            breakers.close()
            with contextlib.suppress(Exception):
                breakers.client.close()

        return breaker.call, breakers.flush, close

    return measure(make, mix.every, sends)


def theirs(url: str, mix: Mix, sends: Sends) -> tuple[float, float]:
    def make() -> Subject:
        client = redis.Redis.from_url(url)
        breaker = make_pybreaker(client, f"traffic-pb-{time.monotonic_ns()}", 5)
        return breaker.call, lambda: None, client.close

    return measure(make, mix.every, sends)


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def traffic_table(single: str, cluster: str, sends: Sends) -> list[str]:
    lines = [
        "| traffic | topology | round trips per call | µs per call | pybreaker round trips | pybreaker µs "
        "| µs vs pybreaker | target | |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mix in MIXES:
        pb_trips, pb_usec = theirs(single, mix, sends)
        for topology, url in (("single server", single), ("3-master cluster", cluster)):
            trips, usec = ours(url, mix, sends, topology.split()[0])
            ratio = usec / pb_usec
            ok = trips <= mix.target and ratio <= TARGET_VS_PYBREAKER
            lines.append(
                f"| {mix.label} | {topology} | {trips:.3f} | {usec:.1f} | {pb_trips:.3f} | {pb_usec:.1f} "
                f"| {ratio:.2f}x | <= {mix.target:.3f}, <= {TARGET_VS_PYBREAKER}x | {verdict(ok)} |"
            )
    return lines


MEMORY_ROUNDS = 15  # rounds of CALLS healthy calls, pybreaker and ours in turn; the least of each


def memory_table(single: str) -> list[str]:
    """A healthy call against pybreaker's in-memory breaker: both timed in turn in
    every round, the least of each (the machine's noise only adds)."""
    breakers = subscribed_breakers(single, "traffic-memory")
    try:
        breaker = breakers.get("svc", MIXES[0].config)
        in_memory = pybreaker.CircuitBreaker(fail_max=5)
        subjects = {"ours": breaker.call, "pybreaker": in_memory.call}
        for call in subjects.values():
            run_calls(call, 0, WARMUP)
        best = dict.fromkeys(subjects, float("inf"))
        for _ in range(MEMORY_ROUNDS):
            for label, call in subjects.items():
                start = time.perf_counter()
                run_calls(call, 0, CALLS)
                best[label] = min(best[label], (time.perf_counter() - start) / CALLS * 1e6)
    finally:
        breakers.close()
        breakers.client.close()
    usec, pb_usec = best["ours"], best["pybreaker"]
    ratio = usec / pb_usec
    return [
        "| healthy call | µs per call | pybreaker in memory | ratio | target | |",
        "|---|---|---|---|---|---|",
        f"| breaker_redis, single server | {usec:.2f} | {pb_usec:.2f} | {ratio:.2f}x "
        f"| <= {TARGET_VS_MEMORY}x | {verdict(ratio <= TARGET_VS_MEMORY)} |",
    ]


RECORD_ROUNDS, RECORD_CALLS = 15, 300  # the least of 15 rounds: the machine's noise only adds


def fcall_usec(control: redis.Redis, run: Callable[[], None]) -> float:
    """usec_per_call of FCALL (or EVALSHA) over RECORD_CALLS runs of ``run``."""
    control.config_resetstat()
    for _ in range(RECORD_CALLS):
        run()
    stats = control.info("commandstats")
    found = [stats[k] for k in ("cmdstat_fcall", "cmdstat_evalsha") if k in stats]
    return sum(float(s["usec"]) for s in found) / sum(int(s["calls"]) for s in found)


def record_table(single: str) -> list[str]:
    """Rounds of the trivial script and of each record case, interleaved; the least of each."""
    control = redis.Redis.from_url(single)
    keys = [f"traffic:{{svc}}:{k}" for k in ("state", "window", "leases", "config", "stats", "events", "cfg")]
    trivial_function = load_trivial_function(control)
    args = ["0"] * 18
    never = BreakerConfig(trip="count", failure_threshold=10**6, window_seconds=60)
    made = []

    def trivial() -> None:
        control.fcall(trivial_function, 7, *keys, *args)

    cases: dict[str, Callable[[], None]] = {"trivial": trivial}
    for label, config, outcome in (
        ("a success sent at once (armed)", RATE, lambda b: b.call(noop)),
        ("a failure (count rule)", never, _suppress),
    ):
        prefix = f"traffic-rec-{time.monotonic_ns()}"
        breakers = Breakers.from_url(single, prefix=prefix, batch_successes=False)
        breaker = breakers.get("svc", config)
        for _ in range(300):
            outcome(breaker)
        made.append(breakers)
        cases[label] = lambda outcome=outcome, breaker=breaker: outcome(breaker)
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(RECORD_ROUNDS):
        for label, run in cases.items():
            best[label] = min(best[label], fcall_usec(control, run))
    for breakers in made:
        breakers.close()
        breakers.client.close()
    control.close()
    floor = best.pop("trivial")
    lines = [
        "| record script | server µs per call | trivial script µs | ratio | target | |",
        "|---|---|---|---|---|---|",
    ]
    for label, usec in best.items():
        ratio = usec / floor
        lines.append(
            f"| {label} | {usec:.2f} | {floor:.2f} | {ratio:.1f}x | <= {TARGET_RECORD_RATIO}x "
            f"| {verdict(ratio <= TARGET_RECORD_RATIO)} |"
        )
    return lines


def _suppress(breaker: Any) -> None:
    with contextlib.suppress(Boom, BreakerOpen):
        breaker.call(fail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="breaker_redis under everyday traffic (module docstring)")
    parser.add_argument(
        "--record-only",
        action="store_true",
        help="only table 3, the record script's server time (no cluster is started)",
    )
    args = parser.parse_args(argv)
    if args.record_only:
        with redis_server() as single:
            version = redis.Redis.from_url(single).info("server")["redis_version"]
            print(f"# the record script's server time (redis-server {version})\n")
            print("\n".join(record_table(single)) + "\n")
        return 0
    sends = Sends()
    with redis_server() as single, started(ClusterGroup()) as cluster:
        version = redis.Redis.from_url(single).info("server")["redis_version"]
        print(
            f"# breaker_redis under everyday traffic (redis-server {version}; one worker, "
            f"{CALLS:,} calls after {WARMUP} warm-up calls)\n"
        )
        tables = (traffic_table(single, cluster.url, sends), memory_table(single))
        for table in (*tables, record_table(single)):
            print("\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
