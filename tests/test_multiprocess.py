"""Several processes on one real redis-server, as gunicorn workers are: no lost
count, exactly N probes, exactly one transition event."""

from __future__ import annotations

import json
import multiprocessing

import pytest

from breaker_redis import BreakerConfig, Breakers
from tests import mp_workers
from tests.workers import snapshot

PROCESSES = 8


@pytest.fixture
def spawn(redis_server):
    redis_server.client().flushall()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(PROCESSES) as pool:
        yield ctx, pool


def run_all(spawn, fn, *args):
    ctx, pool = spawn
    barrier = ctx.Manager().Barrier(PROCESSES)
    results = [pool.apply_async(fn, (*args, barrier)) for _ in range(PROCESSES)]
    return [r.get(timeout=120) for r in results]


def test_eight_processes_lose_no_count(spawn, redis_server):
    cfg = BreakerConfig(trip="count", failure_threshold=1_000_000, window_seconds=600)
    done = run_all(spawn, mp_workers.record_outcomes, redis_server.url, "count", cfg, 200)
    assert sum(done) == 1600
    snap = snapshot(redis_server.url, "count", cfg)
    assert (snap["window_failures"], snap["failures"], snap["successes"]) == (1600, 1600, 1600)
    assert (snap["window_calls"], snap["calls"]) == (3200, 3200)
    assert snap["state"] == "closed"


@pytest.mark.parametrize("max_calls", [1, 3])
def test_processes_racing_into_half_open_get_exactly_n_probes(spawn, redis_server, max_calls):
    cfg = BreakerConfig(
        trip="consecutive",
        failure_threshold=1,
        open_seconds=10,
        half_open_max_calls=max_calls,
        half_open_successes=max_calls,
    )
    t0 = 1_700_000_000_000
    breakers = Breakers.from_url(redis_server.url, clock=lambda: t0, listen=False)
    breakers.get("probe", cfg).acquire().failure()
    breakers.close()
    probes = run_all(spawn, mp_workers.race_for_probe, redis_server.url, "probe", cfg, t0 + 10_000)
    assert sum(probes) == max_calls
    snap = snapshot(redis_server.url, "probe", cfg)
    assert (snap["state"], snap["probes_in_flight"]) == ("half_open", max_calls)


def test_processes_racing_a_trip_produce_exactly_one_open_event(spawn, redis_server):
    cfg = BreakerConfig(trip="count", failure_threshold=5, window_seconds=60, open_seconds=60)
    listener = redis_server.client().pubsub()
    listener.subscribe("breaker:events")
    admitted = run_all(spawn, mp_workers.race_to_trip, redis_server.url, "trip", cfg, 20)
    assert sum(admitted) >= 5
    client = redis_server.client()
    client.publish("breaker:events", "end-of-test")  # everything published before this arrives first
    published = []
    while True:
        message = listener.get_message(timeout=10)
        assert message is not None, "the end-of-test marker never arrived"
        if message["type"] != "message":
            continue
        if message["data"] == b"end-of-test":
            break
        published.append(json.loads(message["data"]))
    listener.close()
    stream = client.xrange("breaker:{trip}:events")
    opened = [fields for _, fields in stream if fields[b"to"] == b"open"]
    assert len(opened) == 1
    assert [(m["from"], m["to"]) for m in published] == [("closed", "open")]
    snap = snapshot(redis_server.url, "trip", cfg)
    assert (snap["trips"], snap["window_failures"], snap["state"]) == (1, 5, "open")
    assert snap["failures"] == sum(admitted)  # every admitted call was counted, late ones as stale
    assert snap["stale"] == sum(admitted) - 5
    assert snap["rejected"] == PROCESSES * 20 - sum(admitted)  # refusals made in memory reach Redis too
