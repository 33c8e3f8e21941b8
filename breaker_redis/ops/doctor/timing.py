"""The round-trip checks: pub/sub ordering and latency.

Ordering across connections is no longer what the boundary rests on: a change
waits until every worker listening has acknowledged its notice, and a worker
decides from memory only while its own subscription keeps answering PINGs
(breaker_redis/storage/acks.py, docs/boundary.md). The check still measures
it, the way the boundary once relied on it: PUBLISH (on a cluster SPUBLISH, on
each master), a PING on the publisher's connection, then one non-blocking poll
of the subscriber's socket. Late messages say the server (I/O threads) or a
proxy reorders connections: it changes how long a change waits for the
acknowledgements, not what the workers decide. A message that never arrives
is a problem: a path that drops a message yet answers the PINGs after it
keeps a worker deciding from what it knew.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from redis.crc import key_slot

from breaker_redis.ops.doctor.checkup import OK, PROBLEM, SKIP, WARN, Checkup, Lines
from breaker_redis.ops.doctor.permissions import confirmed
from breaker_redis.storage.internals import connection_socket
from breaker_redis.storage.invalidation import _poll_for
from breaker_redis.storage.scripts import text

ORDERING_ROUNDS = 200
ORDERING_ENOUGH_LATE = 20  # a clear answer: stop there rather than wait for more late ones
ORDERING_SECONDS = 3.0  # at most this long in all
MESSAGE_WAIT = 1.0  # a message not there after this long is lost
LATENCY_PINGS = 100
LATENCY_WARN_MS = 2.0  # median above this: warn
# what still relies on the order (docs/boundary.md, "A migration under way")
MIGRATING = ", except a change made while its cluster slot migrates"


def check_ordering(up: Checkup) -> Lines:
    """On one server, PUBLISH to a subscriber; on a cluster, SPUBLISH on a channel of
    each master to a subscriber there (the workers' sharded channels: sharded.py)."""
    if up.cluster is None:
        channel = f"{up.prefix}:doctor"  # in the prefix's channel pattern; no worker listens to it
        return [
            (status, line.replace(MIGRATING, ""))
            for status, line in _ordering(up, up.client, channel, sharded=False)
        ]
    lines: Lines = []
    for server in up.servers:
        found = _ordering(up, server.client, _channel_served_by(up, server.label), sharded=True)
        lines += [(status, f"{server.label}: {line}") for status, line in found]
    return lines


def _channel_served_by(up: Checkup, master: str) -> str:
    """A channel in the prefix's pattern whose slot that master serves."""
    assert up.cluster is not None
    slots = up.cluster.nodes_manager.slots_cache
    for tag in range(100_000):
        channel = f"{up.prefix}:doctor:{{{tag}}}"
        nodes = slots.get(int(key_slot(channel.encode())))
        if nodes and nodes[0].name == master:
            return channel
    raise RuntimeError(f"no slot served by {master}")


def _ordering(up: Checkup, client: Any, channel: str, *, sharded: bool) -> Lines:
    publish, kind = ("SPUBLISH", "smessage") if sharded else ("PUBLISH", "message")
    pubsub = client.pubsub()
    try:
        if sharded:
            pubsub.ssubscribe(channel)
        else:
            pubsub.subscribe(channel)
        confirmed(pubsub, "ssubscribe" if sharded else "subscribe")
        sock = connection_socket(pubsub.connection)
        if sock is None:
            return [(SKIP, "the subscription's socket cannot be polled here")]
        readable = _poll_for(sock)
        rounds = late = 0
        deadline = time.monotonic() + ORDERING_SECONDS / len(up.servers)
        while rounds < ORDERING_ROUNDS and late < ORDERING_ENOUGH_LATE and time.monotonic() < deadline:
            payload = f"doctor {rounds}"
            client.execute_command(publish, channel, payload)
            client.ping()  # the publisher's next reply
            in_time = readable(0)
            if not _received(pubsub, payload, kind):
                return [
                    (
                        PROBLEM,
                        f"a message published on {channel} did not reach its subscriber "
                        f"within {MESSAGE_WAIT:g} s: workers would miss changes; "
                        "look for a proxy in the way that drops pub/sub messages",
                    )
                ]
            rounds += 1
            late += not in_time
    finally:
        pubsub.close()
    if late:
        threads = " (this server runs I/O threads)" if _io_threads(up) else ""
        return [
            (
                OK,
                f"{late} of {rounds} messages reached the subscriber after the publisher's next reply "
                f"was answered{threads}; not relied on: every change waits for the workers' "
                f"acknowledgements{MIGRATING}",
            )
        ]
    return [
        (
            OK,
            f"{rounds} of {rounds} messages were in the subscriber's socket when the publisher's next "
            f"reply was answered; not relied on: every change waits for the workers' "
            f"acknowledgements{MIGRATING}",
        )
    ]


def _received(pubsub: Any, payload: str, kind: str) -> bool:
    """Read until ``payload`` arrives (anything before it is dropped); False after MESSAGE_WAIT."""
    deadline = time.monotonic() + MESSAGE_WAIT
    while (left := deadline - time.monotonic()) > 0:
        message = pubsub.get_message(timeout=left)
        if message is None or text(message.get("type")) != kind:
            continue
        if text(message.get("data")) == payload:
            return True
    return False


def _io_threads(up: Checkup) -> bool:
    return any(str(s.info.get("io_threads_active", 0)) not in ("0", "") for s in up.servers)


def check_latency(up: Checkup) -> Lines:
    client = up.servers[0].client
    times = []
    for _ in range(LATENCY_PINGS):
        began = time.perf_counter()
        client.ping()
        times.append((time.perf_counter() - began) * 1000)
    times.sort()
    median, p99 = statistics.median(times), times[math.ceil(0.99 * len(times)) - 1]
    to = f" to {up.servers[0].label}" if up.cluster is not None else ""
    line = f"{len(times)} PINGs{to}: median {median:.2f} ms, p99 {p99:.2f} ms"
    if median > LATENCY_WARN_MS:
        return [
            (
                WARN,
                f"{line}: above {LATENCY_WARN_MS:g} ms, and every armed outcome waits one round "
                "trip, every change a few; run Redis closer to the workers",
            )
        ]
    return [(OK, line)]
