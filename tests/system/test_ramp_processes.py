"""The ramp after a close (docs/recovery.md) across 4 worker processes, on a real
redis-server and on the embedded server.

- Driven time: every process decides by a clock the test sets (the scripts' now_ms
  and its memory alike), so each second of the ramp is one step: every worker
  admits exactly its share of its calls (its credit, breaker_redis/engine/ramp.py),
  the workers together the same share, and every call once the ramp is over.
- The same for 4 asyncio worker processes (breaker_redis.asyncio).
- A failure burst during the ramp reopens the breaker for every worker, for the
  open period after a failed probe (the backoff).
- The real clock: the workers call as fast as they can through a ramp of 2 s after
  an operator's ``auto``; the share each admits per slice of time follows the ramp
  within the credit's one call (and the few ms its estimate of the Redis time may be
  off), and every call is admitted once it is over.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from breaker_redis import BreakerConfig, Breakers
from tests.support.mp_asyncio import serve_asyncio
from tests.support.mp_workers import Worker, at_once, serve
from tests.support.workers import snapshot

pytestmark = pytest.mark.multiprocess

WORKERS = 4
RAMP = BreakerConfig(failure_threshold=2, open_seconds=10, ramp_seconds=10, ramp_from=0.1)
# 100 calls per worker and second at the share of each second: 0.1 + 0.09 t, then all
RISING = [10, 19, 28, 37, 46, 55, 64, 73, 82, 91, 100, 100]


def closed_at(workers: list[Worker], start: int) -> int:
    """Trip the breaker, let its open period pass and its probe succeed, all at the
    test's time: the time of the close."""
    first = workers[0]
    while first("failure"):
        pass  # refused: open
    at = start + RAMP.open_seconds * 1000
    assert at_once(workers, f"clock {at}") == [True] * WORKERS
    assert first("success")  # the probe: closed, the ramp starts
    return at


@pytest.mark.parametrize(
    "target", [pytest.param(serve, id="sync"), pytest.param(serve_asyncio, id="asyncio")]
)
def test_every_worker_admits_its_share_at_each_second_of_the_ramp(url, team, target):
    start = int(time.time() * 1000)
    workers = team.start("ramp", RAMP, WORKERS, now_ms=start, target=target)
    close = closed_at(workers, start)
    for second, expected in enumerate(RISING):
        assert at_once(workers, f"clock {close + 1000 * second}") == [True] * WORKERS
        answers = at_once(workers, "share 100")
        reasons = ["ramp"] if expected < 100 else []
        assert answers == [(expected, reasons)] * WORKERS, second
    snap = snapshot(url, "ramp", RAMP)
    assert snap["rejected"] == WORKERS * sum(100 - n for n in RISING) + 1  # and the call that found it open
    assert snap["successes"] == WORKERS * sum(RISING) + 1  # and the probe


def test_a_failure_burst_during_the_ramp_reopens_for_everyone_with_the_backoff(url, team):
    start = int(time.time() * 1000)
    workers = team.start("ramp", RAMP, WORKERS, now_ms=start)
    close = closed_at(workers, start)
    now = close + 3000  # a share of 0.37
    assert at_once(workers, f"clock {now}") == [True] * WORKERS
    for _ in range(100):  # each worker's failures, as far as the ramp admits them
        if snapshot(url, "ramp", RAMP)["state"] != "closed":
            break
        at_once(workers, "failure")
    assert at_once(workers, "admits") == [False] * WORKERS
    snap = snapshot(url, "ramp", RAMP)
    assert (snap["state"], snap["trips"]) == ("open", 2)
    # the open period after a failed probe: twice the last (10 s), plus up to 10 % jitter
    assert 20_000 <= snap["open_until_ms"] - now <= 22_000


def test_during_the_ramp_the_script_calls_are_the_batch_flushes(url, team):
    """Decided from memory: each second of the ramp a worker sends one record call (its
    batch, with its refusals), the script calls the same calls make with no ramp at all."""
    spent = {}
    for config in (RAMP, replace(RAMP, ramp_seconds=0)):
        start = int(time.time() * 1000)
        workers = team.start(f"trips-{config.ramp_seconds}", config, WORKERS, now_ms=start)
        close = closed_at(workers, start)
        assert at_once(workers, "count-scripts") == [True] * WORKERS
        seconds = []
        for second in range(len(RISING)):
            at_once(workers, f"clock {close + 1000 * second}")
            before = sum(at_once(workers, "scripts"))
            admitted = sum(answer[0] for answer in at_once(workers, "share 100"))
            assert admitted == WORKERS * (RISING[second] if config.ramp_seconds else 100)
            seconds.append(sum(at_once(workers, "scripts")) - before)
        spent[config.ramp_seconds] = seconds
        for worker in workers:
            worker.stop()
    assert spent[RAMP.ramp_seconds] == spent[0]
    # after the first (the workers that heard of the close ask Redis once), a flush each
    assert spent[0][1:] == [WORKERS] * (len(RISING) - 1)


SHORT = BreakerConfig(ramp_seconds=2, ramp_from=0.1)
SLICE_MS = 250


def test_on_the_real_clock_the_share_per_slice_of_time_follows_the_ramp(url, team):
    """Each worker calls flat out for 4 s while an operator's ``auto`` closes the breaker.
    Per slice of 250 ms, a worker admits the sum of the shares of its calls (each at the
    time it decided it) within its credit's one call, and one more for the few ms its
    estimate of the Redis time may differ from the script's when a reply decides; the
    workers together within as many; after the ramp, every call."""

    workers = team.start("clocked", SHORT, WORKERS)
    assert at_once(workers, "admits") == [True] * WORKERS  # their config is stored with the state
    operator = Breakers.from_url(url)
    breaker = operator.get("clocked", SHORT)
    try:
        breaker.force_open()
        for worker in workers:
            worker.conn.send("run 4")
        breaker.clear_force()  # closing a breaker that refused calls: the ramp starts
        seen = [worker.answer("run") for worker in workers]
        until = int(operator.client.hget("breaker:{clocked}:state", "ramp_until"))
    finally:
        operator.close()
    start = until - 2000
    slices: dict[int, list[float]] = {}  # slice -> [expected, admitted, calls] of every worker
    for histogram in seen:
        mine: dict[int, list[float]] = {}
        for at, (calls, admitted) in histogram.items():
            row = mine.setdefault((at - start) // SLICE_MS, [0.0, 0, 0])
            row[0] += calls * _share(at, until)
            row[1] += admitted
            row[2] += calls
        assert any(row[1] < row[2] for row in mine.values()), "a worker that saw no ramp"
        for index, (expected, admitted, calls) in sorted(mine.items()):
            assert abs(admitted - expected) <= 2, (index, expected, admitted, calls)
            if index > 2000 // SLICE_MS:  # the ramp is over (the slice after its end): every call
                assert admitted == calls, index
            total = slices.setdefault(index, [0.0, 0, 0])
            for i, value in enumerate((expected, admitted, calls)):
                total[i] += value
    for index, (expected, admitted, calls) in sorted(slices.items()):
        assert abs(admitted - expected) <= 2 * WORKERS, (index, expected, admitted, calls)
    assert slices[0][1] / slices[0][2] < 0.25  # the first slice: about 0.15 of the calls
    assert slices[2000 // SLICE_MS][1] == slices[2000 // SLICE_MS][2] > 0  # full traffic after


def _share(at: int, until: int) -> float:
    """SHORT's share at ``at`` (Redis ms), as docs/recovery.md states it."""
    left = until - at
    return 1.0 if left <= 0 else max(0.1, 1.0 - 0.9 * left / 2000)
