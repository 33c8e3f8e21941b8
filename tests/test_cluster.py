"""Breakers over redis+cluster:// on three cluster masters (tests/topologies.py).

Each breaker's keys share the hash tag {NAME}, so every script touches one
slot; the names used here are chosen so that their slots are served by
different masters. On a cluster a worker never decides from memory (it does not
subscribe: a message published on one master reaches a subscription on another
only after the script's reply), so every call asks the breaker's master and the
boundary stays exact.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster, key_slot

from breaker_redis import BreakerConfig, BreakerOpen, Breakers, State
from breaker_redis.urls import CONNECT_TIMEOUT, SOCKET_TIMEOUT, client_from_url
from tests.redis_server import wait_until
from tests.topologies import ClusterGroup, started
from tests.workers import TRIP_AT_3, admits, fail, trips_at_3


def slot_of(name: str) -> int:
    return int(key_slot(f"{{{name}}}".encode()))


@pytest.fixture(scope="module")
def spread(cluster: ClusterGroup) -> dict[int, str]:
    """One breaker name per master: {master port: name}, checked with CLUSTER KEYSLOT."""
    names: dict[int, str] = {}
    for i in range(200):
        name = f"svc-{i}"
        names.setdefault(cluster.owner(slot_of(name)), name)
        if len(names) == len(cluster.ports):
            break
    node = cluster.node(cluster.ports[0])
    for name in names.values():
        assert node.cluster("keyslot", f"breaker:{{{name}}}:state") == slot_of(name)
    assert len(names) == 3
    return names


@pytest.fixture
def made(cluster: ClusterGroup) -> Iterator[list[Breakers]]:
    cluster.flushall()
    breakers: list[Breakers] = []
    yield breakers
    for b in breakers:
        b.close()


def test_the_url_gives_a_cluster_client_with_breaker_timeouts_and_no_retry(cluster):
    client = client_from_url(cluster.url).connected()
    assert isinstance(client, RedisCluster)
    assert sorted(node.port for node in client.startup_nodes) == sorted(cluster.ports)
    assert client.retry._retries == 0  # redis-py's default: 10 attempts with backoff
    assert sorted(node.port for node in client.get_primaries()) == sorted(cluster.ports)
    for node in client.get_nodes():
        kwargs = node.redis_connection.connection_pool.connection_kwargs
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (
            SOCKET_TIMEOUT,
            CONNECT_TIMEOUT,
        )
        assert kwargs["retry"]._retries == 0
    assert client.ping()
    client.close()


def test_breakers_trip_and_reset_on_every_master(cluster, spread, made):
    made.append(breakers := Breakers.from_url(cluster.url, listen=False))
    for port, name in spread.items():
        pay = breakers.get(name, TRIP_AT_3)
        snap = trips_at_3(pay)
        assert (snap["store"], snap["state"], snap["trips"], snap["failures"], snap["successes"]) == (
            "redis",
            "open",
            1,
            3,
            1,
        )
        owner = cluster.node(port)  # the keys live on the master serving the name's slot
        assert owner.hget(f"breaker:{{{name}}}:state", "state") == b"open"
        assert owner.exists(*(f"breaker:{{{name}}}:{suffix}" for suffix in ("state", "stats"))) == 2
        pay.reset()
        assert pay.state is State.CLOSED
        assert admits(pay)
    assert breakers.names() == sorted(spread.values())
    assert breakers.store_healthy


def test_forces_and_live_config_on_every_master(cluster, spread, made):
    made.append(breakers := Breakers.from_url(cluster.url, listen=False))
    for name in spread.values():
        pay = breakers.get(name, TRIP_AT_3)
        pay.force_open()
        with pytest.raises(BreakerOpen) as info:
            pay.acquire()
        assert info.value.reason == "forced_open"
        pay.clear_force()
        assert breakers.configure(name, failure_threshold=1)["failure_threshold"] == "1"
        fail(pay, 1)
        assert pay.state is State.OPEN


def test_a_second_process_sees_the_same_state(cluster, spread, made):
    made.extend(workers := [Breakers.from_url(cluster.url, listen=False) for _ in range(2)])
    for name in spread.values():
        a, b = (w.get(name, TRIP_AT_3) for w in workers)
        fail(a, 2)
        fail(b, 1)  # the third consecutive failure, from the other worker
        assert a.snapshot()["state"] == "open"
        with pytest.raises(BreakerOpen):
            b.acquire()


def test_workers_on_a_cluster_ask_redis_at_every_call_and_keep_the_exact_boundary(cluster, spread):
    """tests/test_boundary.py's first test, on every master. A script's PUBLISH reaches
    a subscription held on another master through the cluster bus, after the script's
    reply: a worker deciding from memory would admit the call right after a trip (about
    1 in 9 when measured). So on a cluster a worker never decides from memory: it
    does not subscribe, and every call runs the acquire script on the breaker's master."""
    workers = [Breakers.from_url(cluster.url) for _ in range(2)]  # listen left to its default
    try:
        assert [w.invalidator for w in workers] == [None, None]
        for name in spread.values():
            a, b = (w.get(name, TRIP_AT_3) for w in workers)
            for _ in range(20):
                a.reset()
                assert admits(b)  # right after the reset
                fail(a, 3)
                assert not admits(b)  # right after the trip
    finally:
        for w in workers:
            w.close()


def test_a_dead_master_never_makes_a_call_wait(made, monkeypatch):
    """One master killed (no replicas): a command to it fails (connection refused,
    one slot-map reload, no retry) and the gate falls back to the local store, for
    the breakers on the live masters too. From then on no call reaches the cluster
    client at all (only the gate's probe does), so no call can wait on it."""
    with started(ClusterGroup()) as group:
        made.append(breakers := Breakers.from_url(group.url, listen=False))
        names: dict[int, str] = {}
        for i in range(200):
            names.setdefault(group.owner(slot_of(f"svc-{i}")), f"svc-{i}")
        calm = BreakerConfig(failure_threshold=1_000_000)  # every failure is one record script run
        pays = {port: breakers.get(name, calm) for port, name in names.items()}
        for pay in pays.values():
            assert admits(pay)
        default = breakers.client.get_default_node().port
        victim = next(port for port in names if port != default)
        group.crash(group.children[group.ports.index(victim)])

        def every_breaker_called_once() -> bool:
            for pay in pays.values():
                pay.acquire().failure()  # counted in Redis or locally; never raises
            return breakers.gate.kind == "local"

        # the probe's key may live on a live master: it would bring the gate back (and
        # the next call to the dead one would send it away again); held off here
        monkeypatch.setattr(breakers.gate, "_probe", dead_probe)
        wait_until(every_breaker_called_once, timeout=30, what="the gate to fall back to the local store")
        reached: list[str] = []
        real_run = breakers.gate.remote.run
        monkeypatch.setattr(breakers.gate.remote, "run",
                            lambda operation, *args: reached.append(operation) or real_run(operation, *args))
        for _ in range(20):
            for pay in pays.values():
                pay.acquire().failure()
        assert reached == [] and breakers.gate.kind == "local"


def dead_probe() -> None:
    raise redis.exceptions.ConnectionError("held off by the test")


def test_an_app_starts_while_its_cluster_is_down_and_joins_it_when_it_answers(made):
    """The client reads the slot map at its first use, not when the app starts: with
    every node hung, making the Breakers succeeds, calls decide on the local store
    (which trips), and once the nodes answer the gate moves every call to the cluster."""
    with started(ClusterGroup()) as group:
        pids = [child.pid for child in group.children]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            made.append(breakers := Breakers.from_url(group.url, listen=False))  # no I/O
            pay = breakers.get("pay", TRIP_AT_3)
            fail(pay, 3)  # the first call finds the cluster down; the local breaker trips
            assert breakers.gate.kind == "local"
            with pytest.raises(BreakerOpen):
                pay.acquire()
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        wait_until(lambda: breakers.store_healthy, timeout=30, what="the gate to reach the cluster")
        assert admits(pay)  # the cluster's breaker: closed, the local trip stays local
        fail(pay, 3)
        owner = group.node(group.owner(slot_of("pay")))
        assert owner.hget("breaker:{pay}:state", "state") == b"open"
