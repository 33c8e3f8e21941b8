"""The count window (``window_calls``) with 4 worker processes, on redis-server and on
the embedded server: the trip with batching on and off (docs/boundary.md, "The count
window").

A fixed sequence of calls is dealt round-robin to the processes, each call answered
before the next is sent, so the test fixes the real-time order; the rule applied to
the last N outcomes of that order says where the trip comes. With every outcome sent
at once, the trip comes there, always. With batching too: a batch says when each of
its successes ended, and the ring places them by it, before the other workers'
failures that reached Redis after they ended (lua/includes/ring.lua, "Order").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from breaker_redis import BreakerConfig
from tests.support.mp_workers import Team, Worker, deal, emptied_server_url

pytestmark = pytest.mark.multiprocess

PROCESSES = 4
RING = BreakerConfig(trip="rate", failure_rate=0.5, minimum_calls=20, window_calls=100, open_seconds=600)


@pytest.fixture(params=["real", "embedded"])
def url(request: pytest.FixtureRequest) -> str:
    return emptied_server_url(request)


@pytest.fixture
def team(url: str) -> Iterator[Any]:
    made = Team(url)

    def start(name: str, config: BreakerConfig, batch_successes: bool) -> list[Worker]:
        return made.start(name, config, PROCESSES, batch_successes)

    yield start
    made.stop_all()


def trip_by_the_rule(outcomes: list[str], config: BreakerConfig) -> tuple[int, int, int]:
    """(index of the call that trips, window calls, window failures), the outcomes in order."""
    n = config.window_calls or 0
    for index in range(len(outcomes)):
        last = outcomes[max(0, index + 1 - n) : index + 1]
        calls, failures = len(last), last.count("failure")
        if calls >= min(n, config.minimum_calls) and failures / calls >= config.failure_rate:
            return index, calls, failures
    raise AssertionError("the rule never holds")


def both_ways(
    team: Any, url: str, label: str, outcomes: list[str], config: BreakerConfig
) -> dict[bool, tuple[int, int, int]]:
    found = {}
    for batching in (True, False):
        name = f"{label}-{batching}"
        workers = team(name, config, batching)
        found[batching] = deal(url, workers, name, outcomes, config)
        for worker in workers:
            worker.stop()
    return found


def test_before_anything_slid_out_the_trip_comes_at_the_same_call(team, url):
    wide = BreakerConfig(trip="rate", failure_rate=0.5, minimum_calls=20, window_calls=1000, open_seconds=600)
    outcomes = ["failure" if i % 20 == 7 else "success" for i in range(400)] + ["failure"] * 600
    expected = trip_by_the_rule(outcomes, wide)
    assert expected == (759, 760, 380)  # 20 + 360 failures of 760: the window is not full
    assert both_ways(team, url, "wide", outcomes, wide) == {True: expected, False: expected}


def test_healthy_then_failing_trips_at_the_same_call(team, url):
    outcomes = ["success"] * 400 + ["failure"] * 200
    expected = trip_by_the_rule(outcomes, RING)
    assert expected == (449, 100, 50)
    assert both_ways(team, url, "healthy", outcomes, RING) == {True: expected, False: expected}


def test_five_percent_then_failing_trips_at_the_same_call(team, url):
    outcomes = ["failure" if i % 20 == 7 else "success" for i in range(400)] + ["failure"] * 200
    expected = trip_by_the_rule(outcomes, RING)
    assert both_ways(team, url, "five", outcomes, RING) == {True: expected, False: expected}
