"""Breakers over redis+sentinel:// and through a Sentinel failover (one master,
one replica, three sentinels: tests/support/topologies.py).

What the failover test measured when written (2 cores, loopback): the
sentinels name the new master about 1.1 s after SENTINEL FAILOVER; the old
master keeps serving as a master until Sentinel demotes it (+convert-to-slave,
about 10 s after the switch), and a Breakers that was already connected keeps
using it until then, without an error and without leaving Redis; the demotion
closes its connections and the next command finds the new master through the
sentinels. A new Breakers reads the new master at once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
import redis
from redis.sentinel import SentinelConnectionPool

from breaker_redis import BreakerConfig, BreakerOpen, Breakers, State
from breaker_redis.urls import CONNECT_TIMEOUT, SOCKET_TIMEOUT, client_from_url
from tests.support.eviction import never_restores_another_databases_breaker
from tests.support.redis_server import wait_until
from tests.support.topologies import HOST, SentinelGroup, started
from tests.support.workers import TRIP_AT_3, admitted, fail, subscribed

pytestmark = pytest.mark.processes  # every test starts servers of its own

CALM = BreakerConfig(trip="consecutive", failure_threshold=1_000_000)


@pytest.fixture(scope="module")
def group() -> Iterator[SentinelGroup]:
    with started(SentinelGroup()) as sentinels:
        yield sentinels


@pytest.fixture
def made() -> Iterator[list[Breakers]]:
    breakers: list[Breakers] = []
    yield breakers
    for b in breakers:
        b.close()


def test_the_url_gives_the_master_client_with_breaker_timeouts(group):
    master = client_from_url(group.url(db=1))
    assert type(master) is redis.Redis
    assert isinstance(master.connection_pool, SentinelConnectionPool)
    assert master.ping()
    assert master.connection_pool.master_address == (HOST, group.master_port())
    assert master.connection_pool.connection_kwargs["db"] == 1
    for sentinel in master.connection_pool.sentinel_manager.sentinels:
        kwargs = sentinel.connection_pool.connection_kwargs
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (
            SOCKET_TIMEOUT,
            CONNECT_TIMEOUT,
        )
        assert kwargs["retry"]._retries == 0
    master.close()


def test_breakers_over_sentinel_trip_a_breaker_and_the_replica_has_it(group, made):
    made.append(breakers := Breakers.from_url(group.url()))
    pay = breakers.get("first", TRIP_AT_3)
    fail(pay, 3)
    with pytest.raises(BreakerOpen):
        pay.acquire()
    assert pay.snapshot()["state"] == "open"
    master = group.data(group.master_port(), timeout=5)
    assert master.execute_command("WAIT", 1, 0) == 1  # the replica has every write so far
    assert group.data(group.replica_port()).hget("breaker:{first}:state", "state") == b"open"


def test_a_breaker_of_the_same_name_on_another_database_is_never_restored_over_sentinel(group, clock):
    """Over Sentinel as on one server (tests/storage/test_eviction.py): messages name the database
    of the URL, and a worker drops those naming another."""
    for db in (0, 1):
        client_from_url(group.url(db=db)).flushdb()
    try:
        never_restores_another_databases_breaker(group.url(db=0), group.url(db=1), clock)
    finally:
        for db in (0, 1):
            client_from_url(group.url(db=db)).flushdb()


@dataclass
class Traffic:
    """Calls on one Breakers from a thread of their own, every 10 ms, and what each saw."""

    breakers: Breakers
    names: tuple[str, str]
    calls: list[tuple[float, float, str, str]] = field(default_factory=list)  # at, took, outcome, store
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        tripped, calm = (self.breakers.get(self.names[0], TRIP_AT_3), self.breakers.get(self.names[1], CALM))
        while not self.stop.is_set():
            began = time.monotonic()
            try:
                try:
                    tripped.acquire().ignore()
                    outcome = "tripped breaker admitted"
                except BreakerOpen:
                    outcome = "ok"
                calm.acquire().success()  # batch_successes=False: one record script per call
            except Exception as exc:
                outcome = f"{type(exc).__name__}: {exc}"
            self.calls.append((began, time.monotonic() - began, outcome, self.breakers.gate.kind))
            self.stop.wait(0.01)

    def __enter__(self) -> Traffic:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def test_a_tripped_breaker_survives_a_sentinel_failover(group, made, caplog):
    caplog.set_level(logging.WARNING, logger="breaker_redis")
    made.append(a := Breakers.from_url(group.url(), batch_successes=False))
    subscribed([a])
    pay = a.get("pay", TRIP_AT_3)
    fail(pay, 3)
    assert pay.state is State.OPEN
    old = group.master_port()
    assert group.data(old, timeout=5).execute_command("WAIT", 1, 0) == 1

    with Traffic(a, ("pay", "calm")) as traffic:
        wait_until(lambda: len(traffic.calls) >= 5, what="the traffic thread's first calls")
        old_port, new, took = group.failover()
        assert old_port == old
        switched_at = time.monotonic()

        # A new Breakers asks the sentinels and reads the new master: the trip is there.
        made.append(fresh := Breakers.from_url(group.url(), listen=False))
        snap = fresh.get("pay", TRIP_AT_3).snapshot()
        assert (snap["store"], snap["state"], snap["trips"], snap["failures"]) == ("redis", "open", 1, 3)
        assert fresh.client.connection_pool.master_address == (HOST, new)

        # The running Breakers keeps its connection to the old master until Sentinel demotes it.
        group.wait(lambda: group.role(old) == "slave", 30, f"Sentinel to demote the old master {old}")
        demoted_after = time.monotonic() - switched_at
        wait_until(
            lambda: a.client.connection_pool.master_address == (HOST, new),
            timeout=10,
            what="the running Breakers to reach the new master",
        )
        reached_at = time.monotonic()
        wait_until(lambda: any(at > reached_at for at, *_ in traffic.calls), what="a call on the new master")

    snap = pay.snapshot()
    assert (snap["store"], snap["state"], snap["trips"]) == ("redis", "open", 1)
    assert a.store_healthy
    errors = [call for call in traffic.calls if call[2] not in ("ok", "tripped breaker admitted")]
    assert errors == []  # nothing but BreakerOpen ever reached the caller
    # No call waited on Redis: none reached a client timeout (the gate logs each outage
    # with its error), and none was held until the demotion (about 10 s). A call's wall
    # time is not held to the 0.25 s timeouts themselves: a busy machine can keep a thread
    # waiting for the CPU for most of a second (0.82 s in a CI run, with no timeout logged).
    timeouts = [r.getMessage() for r in caplog.records if "TimeoutError" in r.getMessage()]
    assert timeouts == []
    assert max(took for _, took, *_ in traffic.calls) < min(5.0, demoted_after / 2)
    # Before the demotion every call went on in Redis, on the old master (no local fallback).
    assert {store for at, _, _, store in traffic.calls if at < switched_at + demoted_after - 0.5} == {"redis"}
    assert took < 10 and demoted_after > 1  # the sentinels switch fast; the old master lingers
    group.wait(lambda: group.link_up(old), 10, "the old master to sync from the new one")


def test_an_asyncio_worker_follows_a_failover_and_decides_from_memory_on_the_new_master(group, made):
    """breaker_redis/asyncio/failover.py: an asyncio worker on a Sentinel-managed client
    subscribes (on the master), hears +switch-master, and subscribes again on the new
    master within seconds, where it decides from memory with the exact boundary."""
    from breaker_redis.asyncio import Breakers as AsyncBreakers

    made.append(admin := Breakers.from_url(group.url(), listen=False))  # an operator's process

    async def until(condition: Callable[[], bool], what: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
            await asyncio.sleep(0.01)

    def subscribers(port: int) -> int:
        return int(group.data(port).execute_command("PUBSUB", "NUMSUB", "breaker:notices:0")[1])

    async def main() -> None:
        worker = AsyncBreakers.from_url(group.url())
        try:
            assert worker.follower is not None and worker.invalidator is not None
            pay = worker.get("async-pay", TRIP_AT_3)
            assert await admitted(pay)
            old = group.master_port()
            await until(lambda: worker.invalidator.healthy and subscribers(old) == 1, "the subscription")
            _, new, _ = await asyncio.to_thread(group.failover)
            # well before Sentinel demotes the old master (about 10 s), which would close
            # its connections and so move the subscription without the follower
            await until(
                lambda: worker.invalidator.healthy and subscribers(new) == 1,
                "the subscription on the new master",
                timeout=6,
            )
            tripping = admin.get("async-pay", TRIP_AT_3)
            for _ in range(10):  # the operator's blocking calls in a thread, not on the loop
                await asyncio.to_thread(tripping.reset)
                assert await admitted(pay)  # reset() returned once pay's listener acknowledged it
                await asyncio.to_thread(fail, tripping, 3)
                assert not await admitted(pay)  # right after the trip
            assert group.data(new).hget("breaker:{async-pay}:state", "state") == b"open"
            await asyncio.to_thread(tripping.reset)
            assert await admitted(pay)
            before = round_trips(group.data(new))
            for _ in range(200):
                assert await pay.call(lambda: "ok") == "ok"
            await worker.flush()
            assert round_trips(group.data(new)) - before <= 5  # from memory; successes in batches
        finally:
            await worker.aclose()

    asyncio.run(main())
    group.wait(lambda: group.link_up(group.replica_port()), 30, "the old master to sync from the new one")


def round_trips(server: redis.Redis) -> int:
    """Script calls and PINGs the server has served (INFO commandstats)."""
    stats = server.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "fcall", "ping"))
