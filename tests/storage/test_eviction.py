"""A Redis that evicts keys: the breaker keeps protecting, and says what is wrong.

Real redis-servers with ``maxmemory 3mb`` and another client filling them with
cache entries (1 KB each), as when breaker_redis shares the cache Redis a team
already has:

- ``volatile-lru`` (the cache's entries carry a TTL): the breaker's keys carry
  none, so Redis never evicts them. Thousands of evictions after a trip, every
  worker refuses, one that starts after the trip too, and nothing was lost.
- ``allkeys-lru``: Redis may evict a breaker's state. A worker that knew it open
  restores it at its next script call (on the way to flushing its refusals,
  once a second while it refuses), logs one WARNING naming the cause, and the
  loss is counted; from then on a worker that starts is refused again. A worker
  that starts before any knowing worker has restored it finds a fresh closed
  breaker (admitted), and hears of the restore like of any trip.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis

from breaker_redis import Breakers
from breaker_redis.engine import core as core_module
from breaker_redis.metrics import exposition
from breaker_redis.ops.reader import Reader
from breaker_redis.storage.scripts import database_of
from breaker_redis.urls import async_client_from_url, client_from_url
from tests.support.eviction import CONFIG, STATE, never_restores_another_databases_breaker, subscribed
from tests.support.prometheus import of, samples
from tests.support.redis_server import RedisServer, wait_until
from tests.support.workers import admits, fail

pytestmark = pytest.mark.real


class Filler:
    """Another client of the same Redis writing 1 KB cache entries as fast as it can."""

    def __init__(self, client: redis.Redis, ttl: bool) -> None:
        self.client, self.ttl = client, ttl
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        value, n = b"x" * 1024, 0
        while not self.stop.is_set():
            pipe = self.client.pipeline(transaction=False)
            for _ in range(50):
                n += 1
                pipe.set(f"cache:{n}", value, ex=3600 if self.ttl else None)
            with contextlib.suppress(redis.exceptions.ResponseError):  # OOM, nothing evictable: again
                pipe.execute()

    def __enter__(self) -> Filler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def evicted(client: redis.Redis) -> int:
    return int(client.info("stats")["evicted_keys"])


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    made = RedisServer().start()
    admin = made.client()
    # a server with the scripts' library loaded holds about 1.6 MB before any key (the library's
    # text, about 115 KB, is counted twice over and in jemalloc's size classes): 3 MB leaves the
    # cache 1.4 MB to turn over, where 2 MB left it so little that a new connection hit OOM
    admin.config_set("maxmemory", 3 * 1024 * 1024)
    admin.config_set("maxmemory-policy", request.param)
    admin.close()
    yield made
    made.stop()


@pytest.fixture
def workers(server: RedisServer) -> Iterator[list[Breakers]]:
    made: list[Breakers] = []
    yield made
    for breakers in made:
        breakers.close()


def trip(workers: list[Breakers], url: str) -> None:
    workers.extend(subscribed(Breakers.from_url(url)) for _ in range(3))
    fail(workers[0].get("pay", CONFIG), 5)
    for breakers in workers:
        assert not admits(breakers.get("pay", CONFIG))


@pytest.mark.parametrize("server", ["volatile-lru"], indirect=True)
def test_volatile_lru_never_evicts_a_breakers_keys(server: RedisServer, workers: list[Breakers]) -> None:
    admin = server.client()
    trip(workers, server.url)
    before = evicted(admin)
    with Filler(server.client(), ttl=True):
        wait_until(lambda: evicted(admin) - before >= 5_000, timeout=60, what="5,000 evictions")
        for breakers in workers:
            for _ in range(20):
                assert not admits(breakers.get("pay", CONFIG))
        newcomer = Breakers.from_url(server.url)  # a worker that starts after the trip
        workers.append(newcomer)
        assert not admits(newcomer.get("pay", CONFIG))
    assert admin.hget(STATE, "state") == b"open"
    assert newcomer.get("pay", CONFIG).snapshot()["state_lost"] == 0
    admin.close()


def evict_the_state(server: RedisServer) -> None:
    admin = server.client()
    with Filler(server.client(), ttl=False):
        wait_until(lambda: not admin.exists(STATE), timeout=60, what="Redis to evict the breaker's state")
    # the pressure ends: what follows (the restore) must not be evicted in turn before it is checked
    admin.config_set("maxmemory", 0)
    admin.close()


@pytest.mark.parametrize("server", ["allkeys-lru"], indirect=True)
def test_allkeys_lru_a_worker_that_knew_restores_the_open_state(
    server: RedisServer,
    workers: list[Breakers],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="breaker_redis")
    trip(workers, server.url)
    open_until = int(server.client().hget(STATE, "open_until"))
    evict_the_state(server)
    # refusals from memory go to Redis once a second; here at once, so the first call restores
    monkeypatch.setattr(core_module, "FLUSH_SECONDS", 0.0)
    assert not admits(workers[1].get("pay", CONFIG))
    admin = server.client()
    assert admin.hget(STATE, "state") == b"open"
    assert int(admin.hget(STATE, "open_until")) == open_until  # the same open period
    newcomer = Breakers.from_url(server.url)
    workers.append(newcomer)
    assert not admits(newcomer.get("pay", CONFIG))
    snap = newcomer.get("pay", CONFIG).snapshot()
    assert (snap["state"], snap["state_lost"]) == ("open", 1)
    assert of(samples(exposition(admin).decode()), "breaker_redis_state_lost_total", "pay") == 1
    lines = [r.getMessage() for r in caplog.records if "lost its state" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "restored" in lines[0] and "allkeys-lru" in lines[0] and "noeviction or volatile-*" in lines[0]
    history = [(e["from"], e["to"], e["cause"]) for e in Reader(admin, "breaker").transitions("pay", 10)]
    assert history[-1] == ("closed", "open", "restored")
    admin.close()


@pytest.mark.parametrize("server", ["allkeys-lru"], indirect=True)
def test_allkeys_lru_a_newcomer_first_finds_it_closed_when_its_history_is_gone_too(
    server: RedisServer,
    workers: list[Breakers],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trip(workers, server.url)
    evict_the_state(server)
    server.client().delete("breaker:{pay}:events")  # the last transition evicted as well
    newcomer = subscribed(Breakers.from_url(server.url))  # knows nothing: a fresh closed breaker
    workers.append(newcomer)
    assert admits(newcomer.get("pay", CONFIG))  # the gap docs/memory-and-permissions.md names
    monkeypatch.setattr(core_module, "FLUSH_SECONDS", 0.0)
    assert not admits(workers[0].get("pay", CONFIG))  # knew it open: restores it over the fresh one
    assert not admits(newcomer.get("pay", CONFIG))  # heard the restore, as it hears a trip
    admin = server.client()
    assert admin.hget(STATE, "state") == b"open"
    assert workers[0].get("pay", CONFIG).snapshot()["state_lost"] == 1
    admin.close()


@pytest.mark.parametrize("server", ["noeviction"], indirect=True)
def test_a_newcomer_restores_the_open_state_from_the_last_transition(
    server: RedisServer,
    workers: list[Breakers],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The state hash gone (deleted here as an eviction would take it), the events list
    kept: a worker that knows nothing restores what the last transition says."""
    caplog.set_level(logging.WARNING, logger="breaker_redis")
    trip(workers, server.url)
    admin = server.client()
    open_until = int(admin.hget(STATE, "open_until"))
    admin.delete(STATE)
    newcomer = Breakers.from_url(server.url, listen=False)
    workers.append(newcomer)
    assert not admits(newcomer.get("pay", CONFIG))
    assert (admin.hget(STATE, "state"), int(admin.hget(STATE, "open_until"))) == (b"open", open_until)
    lines = [r.getMessage() for r in caplog.records if "lost its state" in r.getMessage()]
    assert len(lines) == 1 and "its last transition said: open" in lines[0]
    assert newcomer.get("pay", CONFIG).snapshot()["state_lost"] == 1
    for breakers in workers[:3]:  # they hear of the restore (a transition) and refuse
        assert not admits(breakers.get("pay", CONFIG))
    admin.close()


@pytest.mark.parametrize("server", ["noeviction"], indirect=True)
def test_a_worker_that_only_heard_of_the_trip_restores_it(
    server: RedisServer, workers: list[Breakers]
) -> None:
    """A transition message makes a worker forget and ask at its next call; until it
    asks, what the message announced is what it knows, and what it restores."""
    config = CONFIG
    workers.extend(subscribed(Breakers.from_url(server.url)) for _ in range(2))
    fail(workers[0].get("pay", config), 5)  # worker 1 has the trip's message in its socket
    admin = server.client()
    open_until = int(admin.hget(STATE, "open_until"))
    admin.delete(STATE, "breaker:{pay}:events")  # everything that says open, gone
    assert not admits(workers[1].get("pay", config))  # heard it: restores it
    assert (admin.hget(STATE, "state"), int(admin.hget(STATE, "open_until"))) == (b"open", open_until)
    admin.close()


@pytest.mark.parametrize("server", ["allkeys-lru", "volatile-lru"], indirect=True)
def test_a_worker_warns_at_start_up_when_the_policy_can_evict_its_keys(
    server: RedisServer, workers: list[Breakers], caplog: pytest.LogCaptureFixture, request
) -> None:
    caplog.set_level(logging.WARNING, logger="breaker_redis")
    policy = request.node.callspec.params["server"]
    workers.append(breakers := Breakers.from_url(server.url, listen=False))
    for name in ("pay", "cart"):  # the check runs once (per Breakers and process)
        assert admits(breakers.get(name, CONFIG))
    lines = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    if policy == "volatile-lru":
        assert lines == []
    else:
        assert len(lines) == 1 and "noeviction or volatile-*" in lines[0]
        assert lines[0].startswith(
            "the breakers' Redis: maxmemory-policy allkeys-lru (maxmemory 3.0 MB) can evict a breaker's state"
        ), lines[0]


# -- what is never restored ----------------------------------------------------------------------


@pytest.mark.parametrize(("ours", "theirs", "side"), [(0, 1, "sync"), (1, 0, "sync"), (0, 1, "asyncio")])
def test_a_breaker_of_the_same_name_on_another_database_is_never_restored_here(
    redis_server: RedisServer, clock: Any, ours: int, theirs: int, side: str
) -> None:
    url = redis_server.url.removesuffix("/0")
    redis_server.client().flushall()
    try:
        never_restores_another_databases_breaker(f"{url}/{ours}", f"{url}/{theirs}", clock, side)
    finally:
        redis_server.client().flushall()


def test_the_database_a_worker_names_is_its_clients(redis_server: RedisServer) -> None:
    """What the scripts publish with every message (lua/_lib.lua ARGV 2), for each kind of
    client; a cluster's is 0, known without connecting (a LazyCluster connects at first use)."""
    clients = {
        "redis://127.0.0.1:1/3": 3,
        "rediss://127.0.0.1:1/5": 5,
        "unix:///tmp/no-such.sock?db=4": 4,
        "redis+sentinel://127.0.0.1:1/mymaster/2": 2,
        "redis+cluster://127.0.0.1:1": 0,
    }
    for url, db in clients.items():
        assert database_of(client_from_url(url)) == db, url
        assert database_of(async_client_from_url(url)) == db, url
    assert database_of(redis.Redis(port=redis_server.port, db=7)) == 7
    assert database_of(fakeredis.FakeRedis(db=6)) == 6


def test_a_forged_message_restores_nothing(redis_server: RedisServer, clock: Any) -> None:
    """Anyone may PUBLISH on the channel. A forged trip naming no database, or this one and
    an incarnation later than the current one or earlier than the worker's last reply,
    opens nothing: the breaker's keys were not lost (knowledge.Memory.floor_arg, and
    restore_lost in lua/_lib.lua)."""
    admin = redis_server.client()
    admin.flushall()
    ours = subscribed(Breakers.from_url(redis_server.url, clock=clock))
    try:
        pay = ours.get("pay", CONFIG)
        assert admits(pay)
        born = int(admin.hget(STATE, "born"))
        for db, forged_born in ((None, 1), (0, born + 10**6), (0, born - 1)):
            forged = {
                "name": "pay",
                "kind": "transition",
                "to": "open",
                "forced": "open",
                "born": forged_born,
                "epoch": forged_born + 1,
                "arms": 0,
                "open_until": 0,
                "at": 0,
            }
            if db is not None:
                forged["db"] = db
            admin.publish("breaker:notices:0", json.dumps(forged))
            for _ in range(3):
                assert admits(pay), forged
            snap = pay.snapshot()
            assert (snap["state"], snap["forced"], snap["state_lost"]) == ("closed", None, 0), forged
    finally:
        ours.close()
        admin.flushall()
        admin.close()


@pytest.fixture(params=["real", "embedded", "cluster"])
def topology(request: pytest.FixtureRequest) -> Iterator[tuple[str, redis.Redis]]:
    """(URL, an admin client) of the session's redis-server, embedded server or Redis Cluster, emptied."""
    if request.param == "cluster":
        url = request.getfixturevalue("cluster").url
        admin = client_from_url(url).connected()
    else:
        url = request.getfixturevalue("redis_server" if request.param == "real" else "embedded").url
        admin = redis.Redis.from_url(url)
    admin.flushall()
    yield url, admin
    admin.flushall()
    admin.close()


def test_a_worker_that_heard_of_a_later_incarnations_trip_restores_it(
    topology: tuple[str, redis.Redis], clock: Any
) -> None:
    """An evicting Redis's usual sequence: worker A learned the breaker from Redis; the keys
    were lost and created anew by worker B, which knew nothing, and B tripped them; A only
    heard of that trip (a message about a later incarnation than its last reply); the keys
    were lost again. A's next call restores the trip, for every worker."""
    url, admin = topology
    a = subscribed(Breakers.from_url(url, clock=clock))
    b = Breakers.from_url(url, listen=False, clock=clock)
    newcomer = Breakers.from_url(url, listen=False, clock=clock)
    try:
        admin.delete(STATE, "breaker:{pay}:events")
        clock.advance(1000)
        fail(b.get("pay", CONFIG), 5)  # a new incarnation trips; its message is in A's socket
        open_until = int(admin.hget(STATE, "open_until"))
        admin.delete(STATE, "breaker:{pay}:events")
        clock.advance(1000)
        assert not admits(a.get("pay", CONFIG))
        assert (admin.hget(STATE, "state"), int(admin.hget(STATE, "open_until"))) == (b"open", open_until)
        assert not admits(newcomer.get("pay", CONFIG))
        assert newcomer.get("pay", CONFIG).snapshot()["state_lost"] == 1
    finally:
        for breakers in (a, b, newcomer):
            breakers.close()


def test_a_worker_that_knew_less_than_the_history_restores_what_the_history_says(
    redis_server: RedisServer, clock
) -> None:
    """Worker B last heard 'closed' (no subscription); after the trip and the loss of the
    state, the history's newer line wins over what B knew."""
    admin = redis_server.client()
    admin.flushall()
    a = Breakers.from_url(redis_server.url, listen=False, clock=clock)
    b = Breakers.from_url(redis_server.url, listen=False, clock=clock)
    try:
        assert admits(b.get("pay", CONFIG))  # B knows it closed
        fail(a.get("pay", CONFIG), 5)
        admin.delete(STATE)
        assert not admits(b.get("pay", CONFIG))
        assert admin.hget(STATE, "state") == b"open"
    finally:
        a.close()
        b.close()
        admin.flushall()
        admin.close()


def test_a_lost_closed_breaker_leaves_a_line_in_its_history(redis_server: RedisServer, clock) -> None:
    """Nothing to restore (it was closed): the loss is counted and the history says so,
    so the breaker's older lines (its last trip) are never taken for its state."""
    admin = redis_server.client()
    admin.flushall()
    a = Breakers.from_url(redis_server.url, listen=False, clock=clock)
    try:
        pay = a.get("pay", CONFIG)
        fail(pay, 5)
        clock.advance(30_000)
        pay.acquire().success()  # the probe succeeds: closed again
        admin.delete(STATE)
        assert admits(pay)
        newest = admin.lindex("breaker:{pay}:events", 0).decode().split()
        assert newest[1:4] == ["lost", "closed", "created"], newest
        assert pay.snapshot()["state_lost"] == 1
        admin.delete(STATE)
        newcomer = Breakers.from_url(redis_server.url, listen=False, clock=clock)
        assert admits(newcomer.get("pay", CONFIG))
        newcomer.close()
    finally:
        a.close()
        admin.flushall()
        admin.close()


def test_an_operators_word_on_a_lost_state_is_not_undone(redis_server: RedisServer, clock) -> None:
    """breaker-redis open pay, the data flushed, breaker-redis auto pay --create: the
    worker that knew it forced open does not restore the force the operator cleared."""
    admin = redis_server.client()
    admin.flushall()
    worker = Breakers.from_url(redis_server.url, listen=False, clock=clock)
    operator = Breakers.from_url(redis_server.url, listen=False, clock=clock)
    try:
        pay = worker.get("pay", CONFIG)
        pay.force_open()
        assert not admits(pay)
        admin.flushall()
        operator.get("pay", CONFIG).clear_force()
        assert admits(pay)
        assert pay.snapshot()["forced"] is None
    finally:
        worker.close()
        operator.close()
        admin.flushall()
        admin.close()
