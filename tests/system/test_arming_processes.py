"""Batching stays exact with 8 worker processes (docs/boundary.md, "Calm and armed"),
on a real redis-server and on the embedded server.

- A steady 45 % failure rate against a 50 % rule, free-running for 20 s: never
  trips, and the window holds exactly what the workers did.
- A fixed sequence of calls dealt round-robin to the 8 processes (each call is
  answered before the next is sent, so the test fixes the real-time order), run
  once with batching and once with every outcome sent at once: the trip comes at
  the same call, on the same window, as the rule applied to the sequence in order
  says. Two sequences: 5 % failures then every call failing, and a rate climbing
  slowly from 10 % to 60 %.
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Iterator
from typing import Any

import pytest

from breaker_redis import BreakerConfig
from tests.support import mp_workers
from tests.support.mp_workers import Team, Worker, deal, emptied_server_url
from tests.support.workers import snapshot

pytestmark = pytest.mark.multiprocess

PROCESSES = 8
RATE = BreakerConfig(trip="rate", failure_rate=0.5, minimum_calls=20, window_seconds=600, open_seconds=60)


@pytest.fixture(params=["real", "embedded"])
def url(request: pytest.FixtureRequest) -> str:
    return emptied_server_url(request)


def test_a_steady_45_percent_against_50_never_trips_and_counts_exactly(url):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(PROCESSES) as pool:
        barrier = manager.Barrier(PROCESSES)
        args = (url, "steady", RATE, 0.45, 20.0, barrier)
        pending = [pool.apply_async(mp_workers.steady, args) for _ in range(PROCESSES)]
        results = [r.get(timeout=180) for r in pending]
    calls = sum(r[0] for r in results)
    failures = sum(r[1] for r in results)
    snap = snapshot(url, "steady", RATE)
    assert [r[2] for r in results] == [0] * PROCESSES  # no call refused
    assert (snap["state"], snap["trips"]) == ("closed", 0)
    assert (snap["window_calls"], snap["window_failures"]) == (calls, failures)
    assert (snap["successes"], snap["failures"]) == (calls - failures, failures)


def trip_by_the_rule(outcomes: list[str], config: BreakerConfig) -> tuple[int, int, int] | None:
    """(index of the call whose failure trips, window calls, window failures) when
    each outcome reaches Redis in order (no slide: the window outlasts the test)."""
    failures = 0
    for index, outcome in enumerate(outcomes):
        calls = index + 1
        failures += outcome == "failure"
        if calls >= config.minimum_calls and failures / calls >= config.failure_rate:
            return index, calls, failures
    return None


@pytest.fixture
def team(url: str) -> Iterator[Any]:
    made = Team(url)

    def start(name: str, batch_successes: bool) -> list[Worker]:
        return made.start(name, RATE, PROCESSES, batch_successes)

    yield start
    made.stop_all()


def five_percent_then_all_failing() -> list[str]:
    return ["failure" if i % 20 == 7 else "success" for i in range(800)] + ["failure"] * 1000


def climbing_from_10_to_60_percent() -> list[str]:
    """The failure rate climbs from 10 % to 60 % over 1,000 calls, then stays at 60 %;
    failures spread evenly (a call fails when the running sum of rates passes an integer)."""
    outcomes, total = [], 0.0
    for i in range(4000):
        rate = 0.1 + 0.5 * min(i, 1000) / 1000
        before, total = total, total + rate
        outcomes.append("failure" if math.floor(total) > math.floor(before) else "success")
    return outcomes


@pytest.mark.parametrize("sequence", [five_percent_then_all_failing, climbing_from_10_to_60_percent])
def test_the_trip_comes_where_the_rule_says_with_batching_on_and_off(team, url, sequence):
    outcomes = sequence()
    expected = trip_by_the_rule(outcomes, RATE)
    assert expected is not None
    found = {}
    for batching in (True, False):
        name = f"{sequence.__name__}-{batching}"
        workers = team(name, batching)
        found[batching] = deal(url, workers, name, outcomes, RATE)
        for worker in workers:
            worker.stop()
    assert found == {True: expected, False: expected}
