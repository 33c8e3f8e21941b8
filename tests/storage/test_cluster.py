"""Breakers over redis+cluster:// on three cluster masters (tests/support/topologies.py).

Each breaker's keys share the hash tag {NAME}, so every script touches one
slot; the names used here are chosen so that their slots are served by
different masters. Workers decide from memory as on a single server: the
scripts also publish on the breaker's sharded channel (SPUBLISH, in its slot),
each process subscribes once per master, and the barrier goes to the
breaker's master, so the boundary is exact per master (docs/boundary.md). A
slot that moves (a resharding here) makes the workers subscribe again on the
new master; a dead master sends only its own breakers to the local store.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from redis.cluster import RedisCluster, key_slot

from breaker_redis import BreakerConfig, BreakerOpen, Breakers, State
from breaker_redis.storage.keys import KEY_SUFFIXES
from breaker_redis.urls import CONNECT_TIMEOUT, SOCKET_TIMEOUT, client_from_url
from tests.support.hostile import hostile
from tests.support.mp_asyncio import serve_asyncio
from tests.support.mp_workers import Team, Worker, serve
from tests.support.redis_server import wait_until
from tests.support.replay import replayed
from tests.support.topologies import HOST, ClusterGroup, started
from tests.support.workers import TRIP_AT_3, admits, admitted, counting, fail, spent, subscribed, trips_at_3


def slot_of(name: str) -> int:
    return int(key_slot(f"{{{name}}}".encode()))


def spread_over(group: ClusterGroup) -> dict[int, str]:
    """One breaker name per master: {master port: name}."""
    names: dict[int, str] = {}
    for i in range(200):
        names.setdefault(group.owner(slot_of(f"svc-{i}")), f"svc-{i}")
    assert len(names) == group.size
    return names


ROUND_TRIPS = {f"cmdstat_{name}" for name in ("evalsha", "eval", "fcall", "ping")}


def commands(group: ClusterGroup, ports: list[int] | None = None) -> int:
    """Script calls and PINGs every node (or those on ports) has served so far (INFO
    commandstats; the commands a script runs count there too, and are left out)."""
    return sum(
        int(stats["calls"])
        for port in (group.ports if ports is None else ports)
        for command, stats in group.node(port).info("commandstats").items()
        if command in ROUND_TRIPS
    )


def shard_subscribers(group: ClusterGroup, port: int) -> list[int]:
    """How many sharded channels each client of one node subscribes to (those with any)."""
    counts = []
    for client in group.node(port).client_list():
        if int(client.get("ssub", 0)):
            counts.append(int(client["ssub"]))
    return counts


def shard_numsub(group: ClusterGroup, port: int, channel: str) -> int:
    return int(group.node(port).execute_command("PUBSUB", "SHARDNUMSUB", channel)[1])


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


def test_one_subscription_per_master_and_the_boundary_is_exact_on_every_master(cluster, spread, made):
    """tests/system/test_boundary.py's first test, on every master, with workers deciding from
    memory: right after a reset the other worker admits, right after the trip it refuses.
    Each process holds one sharded subscription connection per master, whatever the
    number of breakers there."""
    made.extend(workers := [Breakers.from_url(cluster.url) for _ in range(2)])  # listen by default
    names = [*spread.values(), *(f"more-{i}" for i in range(6))]
    for w in workers:
        for name in names:
            w.get(name, TRIP_AT_3)
    subscribed(workers)
    for port in cluster.ports:
        served = [name for name in names if cluster.owner(slot_of(name)) == port]
        assert sorted(shard_subscribers(cluster, port)) == [len(served), len(served)]
    for name in spread.values():
        a, b = (w.get(name) for w in workers)
        for _ in range(20):
            a.reset()
            assert admits(b)  # right after the reset
            fail(a, 3)
            assert not admits(b)  # right after the trip


def test_a_healthy_calm_call_costs_no_redis_command(cluster, spread, made):
    """2,000 healthy calls over breakers on every master: the successes travel in
    batches (one record script per breaker per 50 ms), nothing else reaches a node."""
    made.append(breakers := Breakers.from_url(cluster.url))
    pays = [breakers.get(name, TRIP_AT_3) for name in spread.values()]
    subscribed([breakers])
    for pay in pays:
        for _ in range(50):
            pay.call(lambda: "ok")
    breakers.flush()
    before = commands(cluster)
    for i in range(2000):
        assert pays[i % 3].call(lambda: "ok") == "ok"
    breakers.flush()
    sent = commands(cluster) - before
    assert sent <= 20, f"{sent} commands for 2,000 healthy calls"  # at most 1 % of a command per call
    for index, pay in enumerate(pays):
        snap = pay.snapshot()
        assert (snap["state"], snap["successes"]) == ("closed", 50 + len(range(index, 2000, 3)))


def test_asyncio_workers_decide_from_memory_on_a_cluster(cluster, spread):
    """The asyncio side: the boundary on every master, and no command for healthy calls."""
    from breaker_redis.asyncio import Breakers as AsyncBreakers

    cluster.flushall()

    async def main() -> None:
        workers = [AsyncBreakers.from_url(cluster.url) for _ in range(2)]
        try:
            for w in workers:
                for name in spread.values():
                    w.get(name, TRIP_AT_3)
                w.ensure_loop()
            deadline = time.monotonic() + 10
            while not all(w.invalidator is not None and w.invalidator.healthy for w in workers):
                assert time.monotonic() < deadline, "the sharded subscriptions did not come up within 10 s"
                await asyncio.sleep(0.005)
            for port in cluster.ports:
                assert sorted(shard_subscribers(cluster, port)) == [1, 1]
            for name in spread.values():
                a, b = (w.get(name) for w in workers)
                for _ in range(20):
                    await a.reset()
                    assert await admitted(b)
                    for _ in range(3):
                        await (await a.acquire()).failure()
                    assert not await admitted(b)
                await a.reset()
            pays = [workers[1].get(name) for name in spread.values()]
            for pay in pays:
                assert await pay.call(lambda: "ok") == "ok"
            await workers[1].flush()
            before = commands(cluster)
            for i in range(2000):
                assert await pays[i % 3].call(lambda: "ok") == "ok"
            await workers[1].flush()
            sent = commands(cluster) - before
            assert sent <= 20, f"{sent} commands for 2,000 healthy calls"
        finally:
            for w in workers:
                await w.aclose()

    asyncio.run(main())


def on_master(message: str, name: str) -> str:
    """A message of tests/support/hostile.py written for breaker 'pay', about breaker ``name``."""
    return message.replace('"pay"', json.dumps(name))


HOSTILE_SETTINGS = replayed(8)
HOSTILE_ON_MASTERS = st.lists(st.tuples(st.integers(0, 2), hostile("pay")), min_size=1, max_size=6)


@HOSTILE_SETTINGS
@given(messages=HOSTILE_ON_MASTERS)
def test_forged_sharded_notices_cost_at_most_one_round_trip_and_never_end_a_subscription(
    cluster, spread, caplog, messages
):
    """tests/system/test_boundary.py's hostile messages, SPUBLISHed on the breakers' own notices
    channels on every master: a plain hint costs each worker exactly one round trip for that
    breaker, a message dropped none, and every channel stays on the same connection, healthy,
    with nothing logged about losing it."""
    caplog.set_level(logging.INFO, logger="breaker_redis")
    cluster.flushall()
    names = list(spread.values())
    workers = [Breakers.from_url(cluster.url) for _ in range(2)]
    try:
        for w in workers:
            for name in names:
                w.get(name, TRIP_AT_3)
        subscribed(workers)
        counts = counting(workers)
        for name in names:
            assert all(admits(w.get(name)) for w in workers)
        channels = [[w.invalidator.listener(n) for n in names] for w in workers]
        held = [[(c.connection, c.healthy) for c in row] for row in channels]
        for index, (message, round_trips) in messages:
            name = names[index]
            node = cluster.node(cluster.owner(slot_of(name)))
            before = [c["acquire"] for c in counts]
            node.execute_command("SPUBLISH", f"breaker:{{{name}}}:notices", on_master(message, name))
            node.ping()  # then the message is in every subscriber's socket (Breakers.barrier)
            for _ in range(3):
                assert all(admits(w.get(name)) for w in workers)
            assert spent(counts, before) == [round_trips] * 2, message[:300]
            assert [[(c.connection, c.healthy) for c in row] for row in channels] == held
    finally:
        for w in workers:
            w.close()
    assert "subscription lost" not in caplog.text


@HOSTILE_SETTINGS
@given(messages=HOSTILE_ON_MASTERS)
def test_forged_sharded_notices_never_end_an_async_subscription(cluster, spread, caplog, messages):
    """The same on the asyncio side, whose sharded subscriptions read in the event loop's
    protocol callback: nothing logged by breaker_redis or asyncio either."""
    from breaker_redis.asyncio import Breakers as AsyncBreakers

    caplog.set_level(logging.INFO, logger="breaker_redis")
    cluster.flushall()
    names = list(spread.values())

    async def main() -> None:
        workers = [AsyncBreakers.from_url(cluster.url) for _ in range(2)]
        try:
            for w in workers:
                for name in names:
                    w.get(name, TRIP_AT_3)
                w.ensure_loop()
            deadline = time.monotonic() + 10
            while not all(w.invalidator is not None and w.invalidator.healthy for w in workers):
                assert time.monotonic() < deadline, "the sharded subscriptions did not come up within 10 s"
                await asyncio.sleep(0.005)
            counts = counting(workers)
            for name in names:
                for w in workers:
                    assert await admitted(w.get(name))
            channels = [[w.invalidator.listener(n) for n in names] for w in workers]
            held = [[(c.connection, c.healthy) for c in row] for row in channels]
            for index, (message, round_trips) in messages:
                name = names[index]
                node = cluster.node(cluster.owner(slot_of(name)))
                before = [c["acquire"] for c in counts]
                node.execute_command("SPUBLISH", f"breaker:{{{name}}}:notices", on_master(message, name))
                node.ping()  # then the message is in every subscriber's socket
                deadline = time.monotonic() + 10
                while any(row[index].pending() for row in channels):  # read and handled by the loop
                    assert time.monotonic() < deadline, "a published message was not read within 10 s"
                    await asyncio.sleep(0.001)
                for _ in range(3):
                    for w in workers:
                        assert await admitted(w.get(name))
                assert spent(counts, before) == [round_trips] * 2, message[:300]
                assert [[(c.connection, c.healthy) for c in row] for row in channels] == held
        finally:
            for w in workers:
                await w.aclose()

    asyncio.run(main())
    assert "subscription lost" not in caplog.text
    assert "Fatal error" not in caplog.text


@pytest.mark.multiprocess
def test_the_call_right_after_a_trip_is_refused_by_another_process(cluster, spread):
    """tests/system/test_boundary_processes.py's first test on the cluster: two worker
    processes per breaker, one breaker per master, 102 trips, none admitted after."""
    cluster.flushall()
    ctx = multiprocessing.get_context("spawn")
    admin = Breakers.from_url(cluster.url, listen=False)  # an operator's process: it does not listen
    workers: list[Worker] = []
    admitted = 0
    try:
        for name in spread.values():
            pair = (Worker(ctx, cluster.url, name, TRIP_AT_3), Worker(ctx, cluster.url, name, TRIP_AT_3))
            workers.extend(pair)
        for worker in workers:
            worker.ready()
        for index, name in enumerate(spread.values()):
            a, b = workers[2 * index], workers[2 * index + 1]
            for _ in range(34):
                admin.get(name, TRIP_AT_3).reset()
                assert b("admits")  # the reset's notice was in b's socket before reset() returned
                for _ in range(3):
                    a("failure")
                admitted += b("admits")
    finally:
        admin.close()
        for worker in workers:
            if worker.process.is_alive():
                worker.stop()
    assert admitted == 0


def test_a_resharded_slot_is_followed_and_the_boundary_holds_throughout(made):
    """The slot of a breaker migrates to another master (CLUSTER SETSLOT IMPORTING /
    MIGRATING, MIGRATE of its keys, SETSLOT NODE). While its keys are on the importing
    master, its scripts run there by ASK and publish there, where nobody listens yet:
    the worker whose call was redirected hints the migrating master, whose subscribers
    still hear it, so a worker deciding from memory refuses right after the trip. Once
    the slot is handed over, the old master unsubscribes the workers, every worker
    subscribes on the new one, and decides from memory again, exactly."""
    with started(ClusterGroup()) as group:
        made.extend(workers := [Breakers.from_url(group.url, batch_successes=True) for _ in range(2)])
        a, b = (w.get("pay", TRIP_AT_3) for w in workers)
        subscribed(workers)
        slot, channel = slot_of("pay"), "breaker:{pay}:notices"
        source = group.owner(slot)
        target = next(port for port in group.ports if port != source)
        assert shard_numsub(group, source, channel) == 2
        # A script reaches the importing master only if all seven of its keys are there
        # (else TRYAGAIN): a trip (events), a live override (config), a lease that never
        # expires (leases; no bulkhead is configured, so it limits nothing).
        fail(a, 3)
        a.reset()
        workers[0].configure("pay", failure_threshold=3)
        assert a.call(lambda: "ok") == "ok"
        workers[0].flush()  # the success reaches the window
        keys = [f"breaker:{{pay}}:{suffix}" for suffix in KEY_SUFFIXES]
        group.node(source).zadd(keys[2], {"kept-by-the-test": 2**52})
        assert group.node(source).exists(*keys) == len(keys)
        assert admits(b)  # b knows it closed, from its own reply

        ids = {port: group.node(port).cluster("myid") for port in group.ports}
        group.node(target).execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
        group.node(source).execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
        group.node(source).execute_command("MIGRATE", HOST, target, "", 0, 5000, "KEYS", *keys)
        before = commands(group)
        held = b.acquire()  # from memory: no command (recorded at the end: a record would go by ASK)
        assert commands(group) == before
        fail(a, 3)  # by ASK on the target, which publishes there: nobody hears it but the hint
        pipe = group.node(target).pipeline(transaction=False)  # the importing master answers after ASKING
        pipe.execute_command("ASKING").hget(keys[0], "state")
        assert pipe.execute()[1] == b"open"
        assert b.known is None  # the hint on the source made b forget
        assert not admits(b)  # right after the trip, though b's subscription is on the source
        assert shard_numsub(group, source, channel) == 2 and shard_numsub(group, target, channel) == 0
        held.ignore()

        # what the seven keys' migration left: the acknowledgements' hash, which only matters
        # while a change waits (the importing master has its own since the ASK)
        for key in group.node(source).execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            group.node(source).delete(key)
        for port in (target, source, *(p for p in group.ports if p not in (source, target))):
            group.node(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target])
        wait_until(
            lambda: shard_numsub(group, target, channel) == 2 and all(w.invalidator.healthy for w in workers),
            timeout=15,
            what="both workers subscribed on the new master",
        )
        assert shard_numsub(group, source, channel) == 0
        for _ in range(20):
            a.reset()
            assert admits(b)
            fail(a, 3)
            assert not admits(b)
        a.reset()
        assert admits(b)
        before = commands(group)
        for _ in range(500):
            assert b.call(lambda: "ok") == "ok"  # from memory again
        workers[1].flush()
        assert commands(group) - before <= 5
        assert group.owner(slot) == target


def test_a_dead_master_sends_only_its_own_breakers_to_the_local_store(made, monkeypatch):
    """With cluster-require-full-coverage no, the other masters keep serving when one
    dies: its breakers decide on local breakers, and no call of theirs reaches the
    cluster (only the gate's probe does); the other breakers keep deciding on Redis,
    from memory, and trip there."""
    with started(ClusterGroup()) as group:
        for port in group.ports:
            group.node(port).config_set("cluster-require-full-coverage", "no")
        made.append(breakers := Breakers.from_url(group.url))
        names = spread_over(group)
        pays = {port: breakers.get(name, TRIP_AT_3) for port, name in names.items()}
        subscribed([breakers])
        for pay in pays.values():
            assert admits(pay)
        default = breakers.client.get_default_node().port
        victim = next(port for port in names if port != default)
        group.crash(group.children[group.ports.index(victim)])
        dead, alive = pays[victim], [pay for port, pay in pays.items() if port != victim]

        monkeypatch.setattr(breakers.gate.of(dead.name), "_probe", dead_probe)  # it stays dead here
        # its first command fails: that call and every later one decide locally
        wait_until(lambda: admits(dead) and not dead.store_healthy, what="the dead master's breaker local")
        assert not breakers.store_healthy
        assert all(pay.store_healthy for pay in alive)
        reached: list[str] = []
        real_run = breakers.gate.remote.run

        def run(operation: str, name: str, *args: Any) -> Any:
            reached.append(name)
            return real_run(operation, name, *args)

        monkeypatch.setattr(breakers.gate.remote, "run", run)
        fail(dead, 3)  # its local breaker trips at its threshold
        assert not admits(dead) and dead.snapshot()["store"] == "local"
        assert reached == []
        for port, pay in pays.items():
            if pay is dead:
                continue
            fail(pay, 3)
            assert not admits(pay)
            snap = pay.snapshot()
            assert (snap["store"], snap["state"]) == ("redis", "open")
            assert group.node(port).hget(f"breaker:{{{pay.name}}}:state", "state") == b"open"
        assert dead.name not in reached and len(reached) > 0


def test_a_dead_master_never_makes_a_call_wait(made, monkeypatch):
    """One master killed (no replicas), with Redis's default cluster-require-full-coverage
    yes: its breakers go local at their first failed command (connection refused, no
    retry); once the cluster declares it failed (after the node timeout) the live
    masters refuse every command too and their breakers follow. From then on no call
    reaches the cluster client at all (only the gates' probes do), so no call can wait."""
    with started(ClusterGroup()) as group:
        made.append(breakers := Breakers.from_url(group.url, listen=False))
        names = spread_over(group)
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
            return not any(pay.store_healthy for pay in pays.values())

        # the probes would bring a gate back while the cluster is whole again for a moment
        # (the failure detection is gossip); held off here
        for gate in breakers.gate.gates():
            monkeypatch.setattr(gate, "_probe", dead_probe)
        wait_until(every_breaker_called_once, timeout=30, what="every gate to fall back to the local store")
        reached: list[str] = []
        real_run = breakers.gate.remote.run
        monkeypatch.setattr(
            breakers.gate.remote,
            "run",
            lambda operation, *args: reached.append(operation) or real_run(operation, *args),
        )
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


# -- failovers: a replica takes over its master's slots --------------------------------

WORKERS = [pytest.param(serve, id="sync"), pytest.param(serve_asyncio, id="asyncio")]
ROUNDS = 100  # trips, each checked by 2 other processes (the cluster test above: 102 trips)


def boundary_rounds(operator: Any, workers: list[Worker], rounds: int) -> int:
    """An operator's reset, then one worker (each in turn) trips the breaker: how many
    times another worker admitted the call it started after the tripping call returned."""
    admitted = 0
    for i in range(rounds):
        operator.reset()
        answers = [w("admits") for w in workers]  # the reset's notice was in every socket
        assert all(answers), f"refused right after a reset: {answers}, {[w.ask('store') for w in workers]}"
        tripping = workers[i % len(workers)]
        for _ in range(3):
            assert tripping("failure")
        assert not tripping("admits")  # its own reply told it
        admitted += sum(w("admits") for w in workers if w is not tripping)
    return admitted


def calm_cost(group: ClusterGroup, workers: list[Worker], calls: int = 1000) -> int:
    """Commands the masters served while each worker made calls healthy calls (and sent
    its batch); each worker made some first, so that its breaker is calm."""
    for w in workers:
        assert w("calm 50")
    masters = group.masters()
    before = commands(group, masters)
    for w in workers:
        assert w(f"calm {calls}")
    return commands(group, masters) - before


def patient(group: ClusterGroup) -> str:
    """The group's URL with the longest client timeouts the product allows (as
    tests/system/test_boundary.py's): on a busy machine a reply stalled past the default 0.25 s
    sends a worker to its local store, which sees no trip made on Redis."""
    return group.url + "?socket_timeout=0.9&socket_connect_timeout=0.9"


def keep_calling(workers: list[Worker], done: Any, timeout: float, what: str) -> list[list[Any]]:
    """Every worker calls (a healthy call, then says which store its breaker is on) until
    done() says True, and every call must be answered: an exception would end the
    worker's process. Returns each round's stores, worker by worker. done() returns
    (True or False, what it saw), for the message if the deadline passes."""
    seen: list[list[Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        seen.append([(w("success"), w.ask("store"))[1] for w in workers])
        finished, state = done()
        if finished:
            return seen
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:.0f} s: {state}"


def followed(group: ClusterGroup, workers: list[Worker], heir: int, slot: int) -> tuple[bool, Any]:
    """Whether heir serves slot in every node's view and every worker is back on Redis and
    subscribed there (its channel too), and what was seen."""
    state: dict[str, Any] = {"owners": group.owners(slot), "heir's role": group.role(heir)}
    if state["owners"] != {heir} or state["heir's role"] != "master":
        return False, state
    state["subscribers"] = shard_numsub(group, heir, "breaker:{pay}:notices")
    state["stores"] = [w.ask("store") for w in workers]
    state["listening"] = [w.ask("listening") for w in workers]
    done = state["subscribers"] == len(workers) and set(state["stores"]) == {"redis"}
    return done and all(state["listening"]), state


@pytest.mark.multiprocess
@pytest.mark.parametrize("target", WORKERS)
@pytest.mark.processes
def test_a_manual_failover_is_followed_and_the_boundary_holds_after_it(target):
    """CLUSTER FAILOVER to the replica of the breaker's master while three worker
    processes keep calling: the old master, now a replica, unsubscribes them from the
    breaker's channel (sunsubscribe), they subscribe on the promoted replica, decide from
    memory again (no command for a calm call) and the boundary is exact: 0 of 200 calls
    started after another process's tripping call returned are admitted."""
    with started(ClusterGroup(replicas=1)) as group:
        team = Team(patient(group))
        operator = Breakers.from_url(patient(group), listen=False)  # an operator's process
        try:
            workers = team.start("pay", TRIP_AT_3, 3, target=target)
            pay = operator.get("pay", TRIP_AT_3)
            slot, channel = slot_of("pay"), "breaker:{pay}:notices"
            old = group.owner(slot)
            new = group.replica_of(old)
            assert shard_numsub(group, old, channel) == 3
            assert boundary_rounds(pay, workers, 10) == 0
            pay.reset()

            group.failover(new)
            seen = keep_calling(
                workers,
                lambda: followed(group, workers, new, slot),
                30,
                "the workers subscribed on the promoted replica",
            )
            assert group.role(old) == "slave"
            # a worker that subscribed again there (its map a moment old) left when it saw
            # a replica answer (breaker_redis/storage/sharded.py); the node reads the close soon after
            wait_until(lambda: shard_numsub(group, old, channel) == 0, what="no subscriber on the old master")
            assert {store for stores in seen for store in stores} <= {"redis", "local"}

            assert boundary_rounds(pay, workers, ROUNDS) == 0
            assert group.node(new).hget("breaker:{pay}:state", "state") == b"open"
            pay.reset()
            sent = calm_cost(group, workers)
            assert sent <= 30, f"{sent} commands for 3,000 healthy calls"  # at most 1 % of a command per call
        finally:
            operator.close()
            team.stop_all()


@pytest.mark.multiprocess
@pytest.mark.parametrize("target", WORKERS)
@pytest.mark.processes
def test_a_killed_master_is_replaced_by_its_replica_and_the_workers_follow(target):
    """SIGKILL the breaker's master; its replica takes over after the node timeout (the
    cluster's automatic failover). Meanwhile every call is answered: the workers' calls
    for that master's breaker go to the local store (their gate), those of a breaker on
    another master stay on Redis. Once the replica is promoted they go back to Redis,
    subscribe there, decide from memory, and the boundary is exact again."""
    with started(ClusterGroup(replicas=1)) as group:
        for port in group.ports:  # the other masters keep serving while one is down
            group.node(port).config_set("cluster-require-full-coverage", "no")
        team = Team(patient(group))
        operator = Breakers.from_url(patient(group), listen=False)
        try:
            slot = slot_of("pay")
            victim = group.owner(slot)
            heir = group.replica_of(victim)
            other = next(name for port, name in spread_over(group).items() if port != victim)
            workers = team.start("pay", TRIP_AT_3, 3, target=target)
            (bystander,) = team.start(other, TRIP_AT_3, 1, target=target)
            pay = operator.get("pay", TRIP_AT_3)
            assert boundary_rounds(pay, workers, 10) == 0
            pay.reset()

            group.kill(victim)
            seen = keep_calling(
                [*workers, bystander],
                lambda: followed(group, workers, heir, slot),
                60,
                "the workers back on Redis, subscribed on the promoted replica",
            )
            assert all(stores[-1] == "redis" for stores in seen)  # the bystander, every time
            assert any(store == "local" for stores in seen for store in stores[:-1])

            assert boundary_rounds(pay, workers, ROUNDS) == 0
            assert group.node(heir).hget("breaker:{pay}:state", "state") == b"open"
            pay.reset()
            sent = calm_cost(group, workers)
            assert sent <= 30, f"{sent} commands for 3,000 healthy calls"
        finally:
            operator.close()
            team.stop_all()


def stale_maps(monkeypatch: pytest.MonkeyPatch, manager: Any, slot: int, old: str, used: list[bool]) -> None:
    """The next three slot maps the client reads name old as slot's master, as a node that
    has not heard of the failover yet answers (CLUSTER SLOTS comes from a startup node
    picked at random, and gossip takes a moment). used gets an item for each. Three: a
    subscription sent while the old master was still between roles is refused (MOVED)
    and made again with the next map."""
    real = type(manager).initialize
    node = manager.nodes_cache[old]  # a fresh map may not list the demoted master yet

    def stale(map_: Any) -> None:
        if map_ is manager and len(used) < 3:
            used.append(True)
            map_.nodes_cache.setdefault(old, node)
            map_.slots_cache[slot] = [map_.nodes_cache[old]]

    if asyncio.iscoroutinefunction(real):

        async def initialize(self: Any, *args: Any, **kwargs: Any) -> None:
            await real(self, *args, **kwargs)
            stale(self)

        monkeypatch.setattr(type(manager), "initialize", initialize)
    else:

        def initialize_sync(self: Any, *args: Any, **kwargs: Any) -> None:
            real(self, *args, **kwargs)
            stale(self)

        monkeypatch.setattr(type(manager), "initialize", initialize_sync)


@pytest.mark.parametrize("side", ["sync", "asyncio"])
def test_a_worker_never_trusts_a_subscription_on_the_demoted_master(side, made, monkeypatch):
    """After a failover the old master unsubscribes the workers; a worker whose next slot
    map is a moment out of date subscribes again on the old master, now a replica, which
    accepts (a replica serves sharded pub/sub for its master's slots) but hears the new
    master's notices over the cluster bus, after the tripping call returned. So the
    worker trusts a subscription only once its node says it is a master (ROLE): here it
    leaves the replica, subscribes on the new master, and the boundary is exact."""
    from breaker_redis.asyncio import Breakers as AsyncBreakers

    with started(ClusterGroup(replicas=1)) as group:
        made.append(operator := Breakers.from_url(patient(group), listen=False))
        pay = operator.get("pay", TRIP_AT_3)
        slot, channel = slot_of("pay"), "breaker:{pay}:notices"
        old = group.owner(slot)
        new = group.replica_of(old)
        used: list[bool] = []

        def moved_to_the_new_master(healthy: Any) -> None:
            wait_until(
                lambda: group.promoted(new, slot) and used and healthy(),
                timeout=20,
                what="the worker subscribed again after the failover",
            )
            assert shard_numsub(group, new, channel) == 1  # not on the replica it tried first
            wait_until(lambda: shard_numsub(group, old, channel) == 0, what="the replica left")

        if side == "sync":
            made.append(worker := Breakers.from_url(patient(group)))
            mine = worker.get("pay", TRIP_AT_3)
            subscribed([worker])
            stale_maps(monkeypatch, worker.client.connected().nodes_manager, slot, f"{HOST}:{old}", used)
            group.failover(new)
            moved_to_the_new_master(lambda: worker.invalidator.healthy)
            for _ in range(20):
                pay.reset()
                assert admits(mine)
                fail(pay, 3)
                assert not admits(mine)  # right after the trip
            return

        async def main() -> None:
            worker = AsyncBreakers.from_url(patient(group))
            try:
                mine = worker.get("pay", TRIP_AT_3)
                assert await admitted(mine)
                deadline = time.monotonic() + 10
                while not (worker.invalidator is not None and worker.invalidator.healthy):
                    assert time.monotonic() < deadline, "the subscription did not come up within 10 s"
                    await asyncio.sleep(0.005)
                stale_maps(monkeypatch, worker.client.nodes_manager, slot, f"{HOST}:{old}", used)
                await asyncio.to_thread(group.failover, new)
                await asyncio.to_thread(moved_to_the_new_master, lambda: worker.invalidator.healthy)
                for _ in range(20):  # the operator's blocking calls in a thread, not on the loop
                    await asyncio.to_thread(pay.reset)
                    assert await admitted(mine)
                    await asyncio.to_thread(fail, pay, 3)
                    assert not await admitted(mine)
            finally:
                await worker.aclose()

        asyncio.run(main())


def served(group: ClusterGroup, port: int) -> int:
    """Script calls and PINGs one node has run or refused (MOVED) so far."""
    return sum(
        int(stats.get("calls", 0)) + int(stats.get("rejected_calls", 0))
        for command, stats in group.node(port).info("commandstats").items()
        if command in ROUND_TRIPS
    )


def test_a_process_that_does_not_listen_follows_a_failover_at_its_first_call(made):
    """An operator's process (listen=False) never reads the slot map again by itself:
    its first call after a failover meets MOVED at the old master, and from then on its
    scripts and its barrier go to the new master, none to the old one (a replica now,
    whose subscribers are not the slot's). So a worker refuses the call right after a
    trip and admits the one right after a reset, both made by such processes."""
    with started(ClusterGroup(replicas=1)) as group:
        made.append(operator := Breakers.from_url(patient(group), listen=False))
        made.append(tripper := Breakers.from_url(patient(group), listen=False))
        made.append(worker := Breakers.from_url(patient(group)))
        pay, tripping, mine = (b.get("pay", TRIP_AT_3) for b in (operator, tripper, worker))
        subscribed([worker])
        slot, channel = slot_of("pay"), "breaker:{pay}:notices"
        fail(tripping, 3)
        pay.reset()
        old = group.owner(slot)
        new = group.replica_of(old)
        group.failover(new)
        wait_until(
            lambda: (
                group.promoted(new, slot)
                and shard_numsub(group, new, channel) == 1
                and worker.invalidator.healthy
            ),
            timeout=20,
            what="the worker subscribed on the promoted replica",
        )
        pay.reset()  # the first calls after the failover: MOVED, once each
        fail(tripping, 1)
        assert admits(mine)
        before = served(group, old)
        for _ in range(20):
            pay.reset()
            assert admits(mine)
            fail(tripping, 3)
            assert not admits(mine)
        assert served(group, old) - before == 0


async def done(result: Any) -> Any:
    """A sync Breakers' result, or what an asyncio Breakers' awaitable gives."""
    return await result if inspect.isawaitable(result) else result


@pytest.mark.parametrize("side", ["sync", "asyncio"])
def test_an_operator_follows_a_killed_master_after_one_failed_action(side, made):
    """An operator's process (listen=False) sends its actions straight to the breaker's
    master as its slot map names it, and reads that map only when told to. SIGKILL that
    master; once its replica is promoted, the operator's first action still goes to the
    dead master and raises (a connection error: nothing told the process of the
    failover). That failure has the map read again, so every later action, and a
    snapshot, reaches the promoted replica. Every action first adds the name to the
    listing set, which lives on another master here and keeps answering: only the
    action's own failure can have the map read again."""
    from breaker_redis.asyncio import Breakers as AsyncBreakers

    with started(ClusterGroup(replicas=1)) as group:
        for port in group.ports:  # the other masters keep serving while one is down
            group.node(port).config_set("cluster-require-full-coverage", "no")
        listing = group.owner(int(key_slot(b"breaker:names")))
        name = next(name for port, name in spread_over(group).items() if port != listing)
        slot, state = slot_of(name), f"breaker:{{{name}}}:state"
        victim = group.owner(slot)
        heir = group.replica_of(victim)

        async def main() -> None:
            made_here = Breakers if side == "sync" else AsyncBreakers
            operator: Any = made_here.from_url(patient(group), listen=False)
            if side == "sync":
                made.append(operator)
            try:
                pay = operator.get(name, TRIP_AT_3)
                await done(pay.reset())
                assert operator.gate.master_of(name) == f"{HOST}:{victim}"

                group.kill(victim)
                wait_until(lambda: group.promoted(heir, slot), timeout=30, what="the replica promoted")
                assert operator.gate.master_of(name) == f"{HOST}:{victim}"  # nothing told it
                with pytest.raises(redis.exceptions.ConnectionError):  # refused, or closed (asyncio)
                    await done(pay.reset())
                assert operator.gate.master_of(name) == f"{HOST}:{heir}"  # read again after it

                await done(pay.force_open())
                assert group.node(heir).hget(state, "forced") == b"open"
                snap = await done(pay.snapshot())
                assert (snap["store"], snap["state"], snap["forced"]) == ("redis", "open", "open")
                configured = await done(operator.configure(name, failure_threshold=1))
                assert configured["failure_threshold"] == "1"
                await done(pay.reset())
                snap = await done(pay.snapshot())
                assert (snap["store"], snap["state"], snap["forced"]) == ("redis", "closed", None)
                assert group.node(heir).hget(state, "state") == b"closed"
            finally:
                if side == "asyncio":
                    await operator.aclose()

        asyncio.run(main())
