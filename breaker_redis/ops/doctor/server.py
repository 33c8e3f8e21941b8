"""The server checks: what Redis it is (version, Redis Functions, sharded
pub/sub) and how it is laid out (standalone, replica, Sentinel, Cluster)."""

from __future__ import annotations

import contextlib
from typing import Any

import redis

from breaker_redis.ops.doctor.checkup import NOTE, OK, PROBLEM, WARN, Checkup, Lines, count
from breaker_redis.storage.internals import sentinel_list
from breaker_redis.storage.scripts import text
from breaker_redis.urls import untyped

CLUSTER_SLOTS = 16384
# What running the scripts without Redis Functions costs (docs/benchmarks.md:
# the same calls replayed with EVALSHA and with FCALL on redis-server 7.0).
FUNCTIONS_COST = (
    "the scripts run with EVALSHA, which runs the shared prelude (lua/_lib.lua) again on every call: "
    "about 4 us more Redis time per call (measured: record 14.7 -> 19.2 us, acquire 7.9 -> 12.0 us)"
)


def check_server(up: Checkup) -> Lines:
    what = " / ".join(sorted({f"{s.product} {s.version or '(version unknown)'}" for s in up.servers}))
    if len(up.servers) > 1:
        what += f" on {len(up.servers)} masters"
    found = {s.has_functions() for s in up.servers}
    if False in found:
        return [
            (
                NOTE,
                f"{what}: no Redis Functions (they came with Redis 7): {FUNCTIONS_COST}; "
                "no sharded pub/sub (SPUBLISH) either",
            )
        ]
    if None in found:
        return [
            (
                NOTE,
                f"{what}: whether it has Redis Functions (FCALL) and sharded pub/sub (SPUBLISH) "
                "is unknown without its version; both came with Redis 7",
            )
        ]
    if up.cluster is not None:
        return [
            (
                OK,
                f"{what}: Redis Functions and sharded pub/sub (SPUBLISH) available; on a cluster the "
                "scripts run with EVALSHA (redis-py would find FCALL's keys with an extra round trip)",
            )
        ]
    return [(OK, f"{what}: Redis Functions (FCALL) and sharded pub/sub (SPUBLISH) available")]


def check_topology(up: Checkup) -> Lines:
    if up.cluster is not None:
        return _cluster(up)
    server = up.servers[0]
    if server.mode == "sentinel":
        return [
            (
                PROBLEM,
                f"{server.label} is a Redis Sentinel, not a data server: use "
                "redis+sentinel://HOST:PORT,HOST:PORT/SERVICE to reach the master it names",
            )
        ]
    if server.replica:
        info = server.info
        of = f" of {text(info.get('master_host'))}:{text(info.get('master_port'))}" if info else ""
        return [
            (
                PROBLEM,
                f"{server.label} is a replica{of}: the breakers' scripts write, so a read-only "
                "replica refuses every one (each worker then decides alone, by on_store_error) and a "
                "writable one loses them at its next resync; point the URL at the master, or use "
                "redis+sentinel://",
            )
        ]
    pool = getattr(up.client, "connection_pool", None)
    service = getattr(pool, "service_name", None)
    if service:
        return _sentinel(pool, str(service))
    replicas = server.info.get("connected_slaves")
    connected = "" if replicas is None else f", {count(int(replicas), 'replica')} connected"
    return [(OK, f"standalone {server.role or 'master'}{connected}")]


def _sentinel(pool: Any, service: str) -> Lines:
    manager = pool.sentinel_manager
    host, port = manager.discover_master(service)
    sentinels = sentinel_list(pool)
    answers = []
    for sentinel in sentinels:
        with contextlib.suppress(redis.exceptions.RedisError, OSError):
            answers.append(sentinel.sentinel_master(service))
    line = (
        f"Sentinel service {service!r}: master {text(host)}:{port}; {len(answers)} of "
        f"{len(sentinels)} sentinels in the URL answer"
    )
    if answers:
        state = answers[0]
        line += (
            f" (they know {int(state.get('num-other-sentinels', 0)) + 1}, quorum {state.get('quorum')}, "
            f"{count(int(state.get('num-slaves', 0)), 'replica')})"
        )
    if len(answers) < len(sentinels):
        return [
            (
                WARN,
                f"{line}: a worker asks the sentinels in the URL's order, so fix or remove the ones "
                "that do not answer",
            )
        ]
    return [(OK, line)]


def _cluster(up: Checkup) -> Lines:
    assert up.cluster is not None
    masters = len(untyped(up.cluster.get_primaries)())
    replicas = len(untyped(up.cluster.get_replicas)())
    served = len(up.cluster.nodes_manager.slots_cache)
    state = ""
    with contextlib.suppress(redis.exceptions.ResponseError):  # refused: the client's slot map says enough
        state = f" (cluster_state {text(up.cluster.cluster_info().get('cluster_state'))})"
    layout = f"Redis Cluster: {count(masters, 'master')}, {count(replicas, 'replica')}"
    if served < CLUSTER_SLOTS:
        return [
            (
                PROBLEM,
                f"{layout}, {CLUSTER_SLOTS - served} of {CLUSTER_SLOTS} slots served by no "
                f"node{state}: the breakers whose names hash there cannot reach Redis and decide alone; "
                "bring their master back or assign them (redis-cli --cluster fix)",
            )
        ]
    return [
        (
            OK,
            f"{layout}, all {CLUSTER_SLOTS} slots served{state}; each worker subscribes once per "
            "master, on the breakers' sharded channels",
        )
    ]
