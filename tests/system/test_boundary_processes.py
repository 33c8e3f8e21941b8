"""The boundary cases of test_boundary.py with each worker in its own process on
a real redis-server and on the embedded server, as gunicorn workers are. The
test sends one command at a time and waits for its answer, so the real-time
order of the calls is the order of the commands."""

from __future__ import annotations

import pytest

from breaker_redis import BreakerConfig, Breakers
from tests.support.mp_workers import Team, Worker, emptied_server_url
from tests.support.workers import RATE, TRIP_AT_3, TRIP_AT_5, snapshot

pytestmark = pytest.mark.multiprocess


@pytest.fixture(params=["real", "embedded"])
def url(request: pytest.FixtureRequest) -> str:
    return emptied_server_url(request)


@pytest.fixture
def two(url: str):
    team = Team(url)

    def start(name: str, config: BreakerConfig) -> tuple[Worker, Worker]:
        a, b = team.start(name, config, 2)
        return a, b

    yield start
    team.stop_all()


def test_the_call_right_after_a_trip_is_refused_by_the_other_process(two, url):
    a, b = two("pay", TRIP_AT_3)
    admin = Breakers.from_url(url, listen=False)  # an operator's process: it does not listen
    admitted = 0
    for _ in range(30):
        admin.get("pay", TRIP_AT_3).reset()
        assert b("admits")  # the reset's notice was in b's socket before reset() returned
        for _ in range(3):
            a("failure")
        admitted += b("admits")
    admin.close()
    assert admitted == 0


def test_rate_scenario_stays_closed_across_processes(two, url):
    a, b = two("rate", RATE)
    for _ in range(15):
        assert a("success")
    for _ in range(10):
        assert b("failure")
    a.stop()  # a's batch, if still held, is sent at close
    snap = snapshot(url, "rate", RATE)
    assert (snap["state"], snap["window_calls"], snap["window_failures"]) == ("closed", 25, 10)


def test_consecutive_scenario_stays_closed_across_processes(two, url):
    a, b = two("consec", TRIP_AT_5)
    assert a("hold")  # admitted while calm
    assert b("failure")
    assert a("release-success")  # finishes after B's first failure
    for _ in range(4):
        assert b("failure")
    assert a("success")
    for _ in range(4):
        assert b("failure")
    assert b("admits")
    snap = snapshot(url, "consec", TRIP_AT_5)
    assert (snap["state"], snap["consecutive_failures"]) == ("closed", 4)
