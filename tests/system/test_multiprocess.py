"""Several processes on one real redis-server, and on a 3-master Redis Cluster,
as gunicorn workers are: no lost count, exactly N probes, exactly one
transition event."""

from __future__ import annotations

import json
import multiprocessing

import pytest
from redis.cluster import key_slot

from breaker_redis import BreakerConfig, Breakers
from breaker_redis.ops.reader import parse_event
from breaker_redis.urls import client_from_url
from tests.support import mp_workers
from tests.support.workers import snapshot

PROCESSES = 8


class Target:
    """Where the processes meet: the URL, and a client that reads any key and
    receives the breakers' published events."""

    def __init__(self, url: str, client, publisher) -> None:
        self.url = url
        self.client = client
        self.publisher = publisher  # publishes on the node the scripts of `name` publish on


@pytest.fixture(params=["real", "cluster"])
def target(request):
    if request.param == "real":
        server = request.getfixturevalue("redis_server")
        server.client().flushall()
        client = server.client()
        yield Target(server.url, client, lambda name: client)
    else:
        group = request.getfixturevalue("cluster")
        group.flushall()
        client = client_from_url(group.url).connected()

        def owner(name: str):
            return group.node(group.owner(key_slot(f"{{{name}}}".encode())))

        yield Target(group.url, client, owner)
    client.close()


@pytest.fixture
def spawn():
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(PROCESSES) as pool:
        yield ctx, pool


def run_all(spawn, fn, *args):
    ctx, pool = spawn
    barrier = ctx.Manager().Barrier(PROCESSES)
    results = [pool.apply_async(fn, (*args, barrier)) for _ in range(PROCESSES)]
    return [r.get(timeout=120) for r in results]


def test_eight_processes_lose_no_count(spawn, target):
    cfg = BreakerConfig(trip="count", failure_threshold=1_000_000, window_seconds=600)
    done = run_all(spawn, mp_workers.record_outcomes, target.url, "count", cfg, 200)
    assert sum(done) == 1600
    snap = snapshot(target.url, "count", cfg)
    assert (snap["window_failures"], snap["failures"], snap["successes"]) == (1600, 1600, 1600)
    assert (snap["window_calls"], snap["calls"]) == (3200, 3200)
    assert snap["state"] == "closed"


@pytest.mark.parametrize("max_calls", [1, 3])
def test_processes_racing_into_half_open_get_exactly_n_probes(spawn, target, max_calls):
    cfg = BreakerConfig(
        trip="consecutive",
        failure_threshold=1,
        open_seconds=10,
        half_open_max_calls=max_calls,
        half_open_successes=max_calls,
    )
    t0 = 1_700_000_000_000
    breakers = Breakers.from_url(target.url, clock=lambda: t0, listen=False)
    breakers.get("probe", cfg).acquire().failure()
    breakers.close()
    probes = run_all(spawn, mp_workers.race_for_probe, target.url, "probe", cfg, t0 + 10_000)
    assert sum(probes) == max_calls
    snap = snapshot(target.url, "probe", cfg)
    assert (snap["state"], snap["probes_in_flight"]) == ("half_open", max_calls)


def test_processes_racing_a_trip_produce_exactly_one_open_event(spawn, target):
    cfg = BreakerConfig(trip="count", failure_threshold=5, window_seconds=60, open_seconds=60)
    listener = target.client.pubsub()
    listener.subscribe("breaker:events")
    admitted = run_all(spawn, mp_workers.race_to_trip, target.url, "trip", cfg, 20)
    assert sum(admitted) >= 5
    client = target.client
    # everything published before this arrives first (on a cluster: published on the
    # breaker's own master, so the bus forwards it after the scripts' messages)
    target.publisher("trip").publish("breaker:events", "end-of-test")
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
    history = [parse_event(line) for line in client.lrange("breaker:{trip}:events", 0, -1)]
    opened = [event for event in history if event and event["to"] == "open"]
    assert len(opened) == 1
    assert [(m["from"], m["to"]) for m in published] == [("closed", "open")]
    snap = snapshot(target.url, "trip", cfg)
    assert (snap["trips"], snap["window_failures"], snap["state"]) == (1, 5, "open")
    assert snap["failures"] == sum(admitted)  # every admitted call was counted, late ones as stale
    assert snap["stale"] == sum(admitted) - 5
    assert snap["rejected"] == PROCESSES * 20 - sum(admitted)  # refusals made in memory reach Redis too
