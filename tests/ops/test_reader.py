"""Reader: many breakers read in a few pipelined round trips (status, metrics, the
dashboard), each exactly as a snapshot script run for that breaker alone reads it."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from breaker_redis import BreakerConfig, Breakers
from breaker_redis.base.config import BreakerConfig as Config
from breaker_redis.ops import reader
from breaker_redis.ops.reader import Reader
from breaker_redis.storage.scripts import ScriptRunner
from tests.support.clock import Clock
from tests.support.stores import STORES, make_store
from tests.support.workers import fail

PREFIX = "rd"
CONSECUTIVE = BreakerConfig(trip="consecutive", failure_threshold=3, open_seconds=10)
COUNT = BreakerConfig(trip="count", failure_threshold=3, window_seconds=60, window_buckets=6, open_seconds=60)
RATE = BreakerConfig(trip="rate", minimum_calls=4, window_seconds=30, window_buckets=5, slow_call_seconds=0.5)
SHORT = BreakerConfig(
    trip="count",
    failure_threshold=50,
    window_seconds=1,
    window_buckets=5,
    failure_rate=1 / 3,
    open_seconds=600,
    max_concurrent_calls=4,
    half_open_max_calls=2,
)
CONFIGS = (CONSECUTIVE, COUNT, RATE, SHORT)


@pytest.fixture(params=[*STORES, "cluster"])
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """fakeredis[lua], the session's redis-server, or its Redis Cluster, emptied."""
    client = make_store(request)
    yield client
    client.close()


def per_breaker(client: Any, clock: Clock, names: list[str]) -> list[dict[str, Any]]:
    """The snapshots as read before (one snapshot script per breaker, through a
    Breakers whose config is the stored one, else one of the window's shape)."""
    lone = Reader(client, PREFIX, owns_client=False)
    made: dict[Config, Breakers] = {}
    out = []
    try:
        for name in names:
            config = lone.stored_config(name) or lone.window_config(name)
            if config not in made:
                made[config] = Breakers(
                    client, PREFIX, listen=False, on_store_error="deny", defaults=config, clock=clock
                )
            out.append(made[config].get(name).snapshot())
    finally:
        for breakers in made.values():
            breakers.close()
    return out


def populate(store: Any, clock: Clock) -> tuple[Breakers, dict[str, Any]]:
    """Breakers of four window shapes in every state, some with live overrides,
    probes and bulkhead slots held; returns the app and what it holds."""
    app = Breakers(store, PREFIX, clock=clock, listen=False, batch_successes=False)
    held: dict[str, Any] = {}
    for i in range(24):
        breaker = app.get(f"svc-{i:02d}", CONFIGS[i % len(CONFIGS)])
        for _ in range(i % 5):
            breaker.acquire().success()
        fail(breaker, 3 if i % 6 == 0 else 1)  # every 6th trips (not SHORT: threshold 50)
        if i % 7 == 0:
            app.configure(breaker.name, failure_threshold=9, window_seconds=20)
        if i % 8 == 1:
            breaker.force_open()
        if i % 8 == 5:
            breaker.force_closed()
        clock.advance(37)
    held["slot"] = app.get("svc-03").acquire()  # a bulkhead slot in use (SHORT)
    app.configure("svc-07", open_seconds=20)  # a live override of a SHORT breaker
    clock.advance(10_000)  # CONSECUTIVE breakers that tripped may probe now
    held["probe"] = app.get("svc-00").acquire()  # half_open, a probe in flight
    assert held["probe"].probe
    app.configure("overrides-only", failure_threshold=4)  # listed, no state, no stored config
    return app, held


def test_the_bulk_read_equals_each_breakers_own_snapshot(store, clock, monkeypatch):
    """Field by field, on fakeredis, a real redis-server and a Redis Cluster, with
    live overrides, four window shapes and several chunks (CHUNK 5)."""
    monkeypatch.setattr(reader, "CHUNK", 5)
    app, held = populate(store, clock)
    try:
        bulk = Reader(store, PREFIX, owns_client=False, clock=clock)
        names = bulk.names()
        assert len(names) == 25
        read = bulk.snapshots()
        assert [s["name"] for s in read] == names
        assert read == per_breaker(store, clock, names)
        # and what each app's own breaker says of itself (those whose config is stored)
        for snapshot in read:
            if snapshot["name"] != "overrides-only":
                assert snapshot == app.get(snapshot["name"]).snapshot()
        states = {(s["state"], s["forced"]) for s in read}
        assert states >= {
            ("closed", None),
            ("open", None),
            ("half_open", None),
            ("open", "open"),
            ("closed", "closed"),
        }
        by_name = {s["name"]: s for s in read}
        assert by_name["svc-00"]["probes_in_flight"] == 1
        assert by_name["svc-03"]["bulkhead_in_use"] == 1
        assert by_name["svc-07"]["overrides"] == {
            "failure_threshold": "9",
            "open_seconds": "20",
            "window_seconds": "20",
        }
        only = by_name["overrides-only"]  # read with the default config, the override on top
        assert (only["state"], only["config"]["failure_threshold"], only["config"]["window_buckets"]) == (
            "closed",
            4,
            10,
        )
        assert by_name["svc-06"]["state"] == "open"  # COUNT, tripped
        assert bulk.snapshots(["svc-05", "svc-01"]) == [by_name["svc-05"], by_name["svc-01"]]
        assert bulk.snapshot("svc-09") == by_name["svc-09"]
        assert bulk.histories(names, 10) == {name: bulk.transitions(name, 10) for name in names}
        assert [(e["from"], e["to"]) for e in bulk.histories(["svc-06"], 10)["svc-06"]] == [
            ("closed", "open")
        ]
        bulk.close()
    finally:
        for permit in held.values():
            permit.ignore()
        app.close()


def _edit(store: Any, name: str, suffix: str, value: Any) -> None:
    key = f"{PREFIX}:{{{name}}}:{suffix}"
    store.delete(key)
    if callable(value):
        value(key)
    else:
        store.set(key, value)


def test_a_stored_config_not_as_a_worker_writes_it_is_read_by_the_rules(store, clock, request):
    """A cfg edited by hand: not JSON (not on fakeredis, whose cjson.decode raises out
    of the script instead of failing the call), out of bounds, or the same config
    written otherwise (read again with the config it makes); read by each path alike."""
    app = Breakers(store, PREFIX, clock=clock, listen=False, batch_successes=False)
    garbled = "fake" not in request.node.callspec.id
    try:
        for name, config in (("garbled", COUNT), ("bounds", RATE), ("respelled", SHORT), ("plain", COUNT)):
            breaker = app.get(name, config)
            breaker.acquire().success()
            fail(breaker, 2)
        _edit(store, "garbled", "cfg", "not json" if garbled else json.dumps({"trip": 5}))
        _edit(store, "bounds", "cfg", json.dumps({**json.loads(RATE.to_lua()), "buckets": 0}))
        respelled = json.dumps(json.loads(SHORT.to_lua()), indent=1, sort_keys=True)
        _edit(store, "respelled", "cfg", respelled)
        bulk = Reader(store, PREFIX, owns_client=False, clock=clock)
        names = bulk.names()
        read = bulk.snapshots()
        assert read == per_breaker(store, clock, names)
        by_name = {s["name"]: s for s in read}
        assert by_name["respelled"] == app.get("respelled").snapshot()  # the same config, spelled otherwise
        assert (by_name["garbled"]["window_calls"], by_name["garbled"]["window_failures"]) == (3, 2)
        assert by_name["garbled"]["config"]["window_buckets"] == 6  # the window's shape
        bulk.close()
    finally:
        app.close()


def test_a_key_of_the_wrong_type_is_repaired_as_a_workers_read_repairs_it(store, clock, caplog):
    app = Breakers(store, PREFIX, clock=clock, listen=False, batch_successes=False)
    try:
        fail(app.get("broken", CONSECUTIVE), 3)
        fail(app.get("fine", CONSECUTIVE), 3)
        _edit(store, "broken", "leases", "a string where a sorted set belongs")
        bulk = Reader(store, PREFIX, owns_client=False, clock=clock)
        with caplog.at_level(logging.WARNING, logger="breaker_redis"):
            read = {s["name"]: s for s in bulk.snapshots()}
        assert "breaker 'broken' had a corrupted key" in caplog.text
        assert (read["broken"]["state"], read["broken"]["trips"]) == ("closed", 0)  # its keys were reset
        assert (read["fine"]["state"], read["fine"]["trips"]) == ("open", 1)
        bulk.close()
    finally:
        app.close()


@pytest.fixture(params=["real", "cluster"])
def server_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    client = make_store(request)
    yield client
    client.close()


def _flush_scripts(store: Any) -> None:
    nodes: Callable[[], Any] | None = getattr(store, "get_primaries", None)
    for client in [n.redis_connection for n in nodes()] if nodes else [store]:
        client.script_flush()
        client.function_flush()


def test_a_flushed_or_restarted_server_loads_the_read_script_once(server_store, clock):
    """FUNCTION FLUSH and SCRIPT FLUSH before a read: every call of the pipeline
    misses the script; it is loaded once and the pipeline sent again."""
    app = Breakers(server_store, PREFIX, clock=clock, listen=False, batch_successes=False)
    try:
        for i in range(12):
            fail(app.get(f"svc-{i}", CONFIGS[i % len(CONFIGS)]), 3)
        bulk = Reader(server_store, PREFIX, owns_client=False, clock=clock)
        before = bulk.snapshots()
        _flush_scripts(server_store)
        assert bulk.snapshots() == before
        bulk.close()
    finally:
        app.close()


def test_a_read_writes_nothing_and_builds_no_breakers(redis_server, clock):
    """Not a key for a name only declared; no Breakers (and so no fork and exit hooks) for reads."""
    client = redis_server.client()
    client.flushall()
    app = Breakers(client, PREFIX, clock=clock, listen=False, batch_successes=False)
    try:
        fail(app.get("pay", COUNT), 2)
        keys = sorted(client.keys("*"))
        bulk = Reader(client, PREFIX, owns_client=False, clock=clock)
        for _ in range(3):
            bulk.snapshots(["pay", "declared-only"])
            bulk.histories(["pay", "declared-only"], 5)
        assert sorted(client.keys("*")) == keys
        assert bulk._breakers is None
        bulk.close()
    finally:
        app.close()
        client.close()


def test_redis_down_fails_the_read(clock):
    from tests.support.redis_server import free_port

    bulk = Reader(redis.Redis(port=free_port(), socket_timeout=0.5), PREFIX, clock=clock)
    with pytest.raises(redis.exceptions.ConnectionError):
        bulk.snapshots(["pay"])
    bulk.close()


class CountingSends(redis.Connection):
    """A real connection that counts what it sends at once: one round trip each."""

    sent = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingSends.sent += 1
        super().send_packed_command(command, check_health)


def test_one_round_trip_per_chunk_once_the_config_texts_are_known(redis_server, clock, monkeypatch):
    pool = redis.ConnectionPool(port=redis_server.port, connection_class=CountingSends)
    client = redis.Redis(connection_pool=pool)
    client.flushall()
    app = Breakers(client, PREFIX, clock=clock, listen=False, batch_successes=False)
    try:
        for i in range(24):
            fail(app.get(f"svc-{i:02d}", CONFIGS[i % len(CONFIGS)]), 1)
        app.configure("overrides-only", failure_threshold=4)
        monkeypatch.setattr(reader, "CHUNK", 10)
        bulk = Reader(client, PREFIX, owns_client=False, clock=clock)
        names = bulk.names()
        CountingSends.sent = 0
        first = bulk.snapshots(names)
        # 3 chunks; the config in force of the four config texts (once per Reader);
        # the config text and a read for overrides-only
        assert CountingSends.sent == 3 + 1 + 2
        CountingSends.sent = 0
        assert bulk.snapshots(names) == first
        assert CountingSends.sent == 3 + 2
        CountingSends.sent = 0
        bulk.histories(names, 5)
        assert CountingSends.sent == 3
        bulk.close()
    finally:
        app.close()
        client.close()


def test_a_read_stopped_midway_leaves_no_reply_behind(redis_server, clock):
    """The next chunk is on its way while one is handed over; a caller that stops
    there (Ctrl-C in `watch`) must not leave its replies for the next command."""
    client = redis_server.client()
    client.flushall()
    app = Breakers(client, PREFIX, clock=clock, listen=False, batch_successes=False)
    try:
        for i in range(12):
            fail(app.get(f"svc-{i:02d}", CONSECUTIVE), 1)
        runner = ScriptRunner(client, PREFIX, 60_000)
        calls = [(f"svc-{i:02d}", clock.now, [b"", 0, "1"]) for i in range(12)]
        replies = runner.run_chunks("read", [calls[:4], calls[4:8], calls[8:]])
        assert len(next(replies)) == 4
        replies.close()
        assert client.echo("after") == b"after"
        chunks = runner.run_chunks("read", [calls[:4], calls[4:8], calls[8:]])
        assert [len(chunk) for chunk in chunks] == [4, 4, 4]
        assert client.echo("after again") == b"after again"
    finally:
        app.close()
        client.close()
