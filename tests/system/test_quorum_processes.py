"""One sick host with worker processes (docs/one-sick-host.md): three reporters
a, b and c (hosts), each two processes with a Breakers of their own, on a real
redis-server and on the embedded server. Each call is answered before the next
is sent, round-robin over the processes, so the test fixes the real-time order;
time is the test clock, moved in every process at once.

- min_reporters=2: a's calls all fail, b's and c's succeed for 10 s: b and c
  are never refused, a is isolated at its 5th failure (its processes make no
  call after it), the shared state stays closed; then b fails too: the breaker
  trips for everyone, and c is refused.
- min_reporters=1: a alone trips the shared breaker.
- A true outage (every reporter failing), min_reporters 2 against 1: the calls
  made before everyone refuses.
- An isolated reporter recovers by itself when its own probe succeeds, and a
  reset from the CLI ends an isolation too.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from click.testing import CliRunner

from breaker_redis import BreakerConfig, Breakers
from breaker_redis.ops import cli
from tests.support.mp_workers import Team, Worker

pytestmark = pytest.mark.multiprocess

# The test clock starts at the real time, whole seconds (the window's buckets): the CLI,
# which runs on Redis's clock, must not find the breaker idle for the key TTL and sweep it.
T0 = int(time.time()) * 1000
STEP_MS = 500  # one round: every process makes one call


def count_rule(min_reporters: int) -> BreakerConfig:
    return BreakerConfig(
        trip="count", failure_threshold=5, window_seconds=10, open_seconds=30, min_reporters=min_reporters
    )


def hosts(team: Team, config: BreakerConfig, per_host: int = 2) -> dict[str, list[Worker]]:
    return {host: team.start("pay", config, per_host, reporter=host, now_ms=T0) for host in "abc"}


def snapshot(url: str, name: str, config: BreakerConfig, now_ms: int) -> dict[str, Any]:
    """A snapshot read by a process of its own at the test clock's ``now_ms``."""
    breakers = Breakers.from_url(url, listen=False, clock=lambda: now_ms)
    try:
        return breakers.get(name, config).snapshot()
    finally:
        breakers.close()


def set_clock(workers: dict[str, list[Worker]], now_ms: int) -> None:
    for worker in (w for group in workers.values() for w in group):
        assert worker(f"clock {now_ms}")


def rounds(
    workers: dict[str, list[Worker]], plan: dict[str, str], count: int, start_ms: int
) -> dict[str, int]:
    """``count`` rounds from ``start_ms``, STEP_MS apart: in each, every process of each host
    in ``plan`` calls once ('success' or 'failure'), a's first. Returns the calls admitted
    (upstream calls) and refused per host."""
    seen = {f"{host}_{what}": 0 for host in plan for what in ("admitted", "refused")}
    for i in range(count):
        set_clock(workers, start_ms + i * STEP_MS)
        for host, outcome in plan.items():
            for worker in workers[host]:
                seen[f"{host}_{'admitted' if worker(outcome) else 'refused'}"] += 1
    return seen


def test_a_sick_host_is_isolated_and_the_others_are_never_refused(team, url):
    config = count_rule(2)
    workers = hosts(team, config)
    seen = rounds(workers, {"a": "failure", "b": "success", "c": "success"}, 20, T0)
    # a: 2 calls in each of rounds 1 and 2, then the 5th failure in round 3; every call after is refused
    assert seen == {
        "a_admitted": 5,
        "a_refused": 35,
        "b_admitted": 40,
        "b_refused": 0,
        "c_admitted": 40,
        "c_refused": 0,
    }
    snap = snapshot(url, "pay", config, T0 + 9_500)
    assert (snap["state"], snap["trips"], snap["isolated"], snap["isolations"]) == ("closed", 0, ["a"], 1)
    assert (snap["failures"], snap["window_failures"]) == (5, 5)  # (b's and c's successes may be batched)
    # 20 s on (a's failures slid out of the window; a is isolated until 31 s): b fails too
    seen = rounds(workers, {"b": "failure", "c": "success"}, 3, T0 + 20_000)
    assert seen == {"b_admitted": 5, "b_refused": 1, "c_admitted": 4, "c_refused": 2}
    snap = snapshot(url, "pay", config, T0 + 21_000)
    assert (snap["state"], snap["trips"], snap["isolated"]) == ("open", 1, [])


def test_with_min_reporters_1_the_sick_host_trips_the_breaker_for_everyone(team, url):
    config = count_rule(1)
    workers = hosts(team, config)
    seen = rounds(workers, {"a": "failure", "b": "success", "c": "success"}, 4, T0)
    # the 5th failure (round 3, a's first process) trips: a's second process, b and c refused from then on
    assert seen == {
        "a_admitted": 5,
        "a_refused": 3,
        "b_admitted": 4,
        "b_refused": 4,
        "c_admitted": 4,
        "c_refused": 4,
    }
    snap = snapshot(url, "pay", config, T0 + 21_000)
    assert (snap["state"], snap["trips"], snap["isolated"]) == ("open", 1, [])


@pytest.mark.parametrize(
    ("min_reporters", "order", "calls"),
    [
        (1, "abc", 5),
        (2, "abc", 5),  # every host failing at once, interleaved
        (1, "aaaaabc", 5),
        (2, "aaaaabc", 6),  # a's failures first: a is isolated, b's 1st trips
    ],
)
def test_a_true_outage_trips_for_everyone(team, url, min_reporters, order, calls):
    """Every reporter failing: upstream calls made until every process refuses (the
    figures of docs/one-sick-host.md)."""
    config = count_rule(min_reporters)
    workers = {host: team.start("pay", config, 1, reporter=host, now_ms=T0) for host in "abc"}
    made = 0
    for _ in range(4):
        for host in order:
            made += workers[host][0]("failure")
    assert made == calls
    assert [workers[host][0]("failure") for host in "abc"] == [False, False, False]
    assert snapshot(url, "pay", count_rule(min_reporters), T0)["state"] == "open"


def test_an_isolated_host_recovers_by_its_own_probe_and_a_cli_reset_ends_an_isolation(team, url):
    config = count_rule(2)
    workers = hosts(team, config)
    a1, a2 = workers["a"]
    for _ in range(5):
        assert a1("failure")
    assert (a1("success"), a2("success")) == (False, False)
    set_clock(workers, T0 + 30_000)  # the isolation is over: a's first call is its probe
    assert a2("success")
    assert (a1("success"), a2("success"), workers["b"][0]("success")) == (True, True, True)
    assert snapshot(url, "pay", config, T0 + 30_000)["isolated"] == []
    for _ in range(5):
        assert a2("failure")
    assert (a1("success"), a2("success")) == (False, False)
    result = CliRunner().invoke(cli.main, ["--url", url, "reset", "pay"])
    assert result.exit_code == 0, result.output
    assert (a1("success"), a2("success")) == (True, True)
    snap = snapshot(url, "pay", config, T0 + 30_000)
    assert (snap["state"], snap["isolated"], snap["isolations"]) == ("closed", [], 2)
