"""The trip boundary when the server's writes reach different connections out of order.

> A call that starts after the call that tripped the breaker has returned is
> refused by every worker (docs/boundary.md, "The boundary").

Each worker is a process of its own (tests/support/mp_workers.py), and every connection
goes through a JitterProxy (tests/support/jitter_proxy.py) that delivers what the server
writes to each connection late, in order within the connection but not across
connections, as a server with I/O threads (Valkey 8, Redis 8 with io-threads) or a
TCP proxy may. The delays here are the proxy's defaults:

- command connections: 0 ms plus a jitter of 0 to 1 ms;
- subscription connections (once they sent SUBSCRIBE, SSUBSCRIBE or PSUBSCRIBE):
  5 ms plus a jitter of 0 to 3 ms.

So a notice published by the tripping call reaches the other workers several ms
after the tripping call's reply, and after a PING that follows it: the boundary
cannot rest on the server's write order. The test sends one command at a time
and waits for its answer (a few hundred microseconds), so the real-time order of
the calls is the order of the commands. On a single redis-server and on the
embedded server, each through one proxy, and on a Redis Cluster with a proxy in
front of every node (CLUSTER SLOTS names the proxies).

The cases: a trip from calm (the count rule, threshold 1: no arming notice comes
first), 40 times, the other process calling as soon as the tripping call returned;
a burst of four failing processes against a threshold of 2, the other process
calling as soon as the call whose reply opened the breaker returned; the
half-open state: exactly ``half_open_max_calls`` probes for processes asking at
once, a failed probe refusing every other process's very next call, and the
probes' successes closing the breaker for every process's very next call; the
trip from calm on the cluster. A process learns that its own call opened the
breaker from its ``on_transition`` callback (mp_workers.serve, "failure-opens").
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from multiprocessing.connection import wait
from typing import Any

import pytest
import redis

from breaker_redis import BreakerConfig, Breakers
from breaker_redis.storage.acks import LEASE_SECONDS
from tests.support.jitter_proxy import SUBSCRIPTION_DELAYS, Delays, Proxies
from tests.support.mp_workers import Team, Worker, at_once
from tests.support.redis_server import emptied, wait_until
from tests.support.topologies import ClusterGroup, started

pytestmark = pytest.mark.multiprocess

ROUNDS = 40
# a trip from calm: the count rule arms on no failure, so no notice comes before the trip's
TRIP_AT_1 = BreakerConfig(trip="count", failure_threshold=1, window_seconds=10, open_seconds=30)
TRIP_AT_2 = BreakerConfig(trip="count", failure_threshold=2, window_seconds=10, open_seconds=30)
# two probes, both needed to close; every open period as long as the first
PROBES = 2
HALF_OPEN = replace(
    TRIP_AT_1, open_seconds=10, open_backoff=1.0, half_open_max_calls=PROBES, half_open_successes=PROBES
)
# the test clock starts at the real time (the keys' TTLs run on Redis's clock)
T0 = int(time.time()) * 1000


@pytest.fixture
def team(proxied_url: str) -> Iterator[Team]:
    made = Team(proxied_url)
    yield made
    made.stop_all()


@pytest.fixture
def operator(proxied_url: str) -> Iterator[Breakers]:
    """An operator's process: it does not listen."""
    breakers = Breakers.from_url(proxied_url, listen=False)
    yield breakers
    breakers.close()


def subscribed_through(proxies: Proxies, workers: list[Worker]) -> None:
    """Every worker's subscription goes through a proxy: the delays apply to it."""
    assert proxies.subscriptions >= len(workers), (proxies.subscriptions, len(workers))


def reset(operator: Breakers, name: str, config: BreakerConfig, workers: list[Worker]) -> None:
    """An operator's reset, then until every worker admits (the reset's notice may come
    later than its reply)."""
    operator.get(name, config).reset()
    for worker in workers:
        wait_until(
            lambda worker=worker: worker("admits"), timeout=10, what="a worker admitting after a reset"
        )


def trips_from_calm(operator: Breakers, name: str, a: Worker, b: Worker, rounds: int) -> int:
    """Each round: a reset, a's one failure trips, then b's call: how many b admitted."""
    admitted = 0
    for _ in range(rounds):
        reset(operator, name, TRIP_AT_1, [a, b])
        assert a.ask("failure-opens") == "opened"
        admitted += b("admits")
    return admitted


def test_the_proxy_keeps_each_connections_order_and_delays_subscriptions(redis_server, jitter_proxies):
    proxy = jitter_proxies(redis_server.port)
    client = redis.Redis(port=proxy.port)
    pubsub = client.pubsub()
    try:
        pipe = client.pipeline(transaction=False)
        for _ in range(1000):
            pipe.incr("proxied-order")
        assert pipe.execute() == list(range(1, 1001))
        pubsub.subscribe("proxied")
        assert (
            wait_until(lambda: pubsub.get_message(timeout=0), what="the subscription")["type"] == "subscribe"
        )
        sent = time.monotonic()
        assert client.publish("proxied", "hello") == 1  # on another connection (pubsub holds one)
        assert (proxy.connections, proxy.subscriptions) == (2, 1)
        message = wait_until(lambda: pubsub.get_message(timeout=0), what="the message")
        assert message["data"] == b"hello"
        assert time.monotonic() - sent >= SUBSCRIPTION_DELAYS.base_ms / 1000
    finally:
        client.delete("proxied-order")
        pubsub.close()
        client.close()


def test_a_trip_from_calm_refuses_the_next_call_of_another_process(team, operator, jitter_proxies):
    a, b = team.start("pay", TRIP_AT_1, 2)
    subscribed_through(jitter_proxies, [a, b])
    admitted = trips_from_calm(operator, "pay", a, b, ROUNDS)
    assert admitted == 0, f"{admitted} of {ROUNDS} calls started after the trip were admitted"


def test_a_burst_trip_refuses_the_call_right_after_the_tripping_call(team, operator, jitter_proxies):
    """Four processes fail at once against a threshold of 2; as soon as the call whose
    reply opened the breaker has returned, another process calls."""
    failing = team.start("pay", TRIP_AT_2, 4)
    b = team.start("pay", TRIP_AT_2, 1)[0]
    subscribed_through(jitter_proxies, [*failing, b])
    admitted = 0
    for _ in range(ROUNDS):
        reset(operator, "pay", TRIP_AT_2, [*failing, b])
        answers = []
        for worker in failing:
            worker.conn.send("failure-opens")
        pending: dict[Any, Worker] = {worker.conn: worker for worker in failing}
        while pending:
            ready = wait(list(pending), timeout=30)
            assert ready, f"{len(pending)} workers did not answer a failure within 30 s"
            for conn in ready:
                answers.append(pending.pop(conn).conn.recv())
                if answers[-1] == "opened":
                    admitted += b("admits")
        assert answers.count("opened") == 1, answers
    assert admitted == 0, f"{admitted} of {ROUNDS} calls started after the trip were admitted"


def test_half_open_hands_out_exactly_its_probes_and_their_outcome_reaches_everyone(team, jitter_proxies):
    """Each round: a trip; when the open period is over, five processes ask at once and
    exactly ``half_open_max_calls`` get a probe; a failed probe reopens the breaker and
    the very next call of every other process is refused; when the next open period is
    over, two probes again, both succeed: the breaker is closed and every process admits
    its very next call."""
    workers = team.start("pay", HALF_OPEN, 5, now_ms=T0)
    subscribed_through(jitter_proxies, workers)
    now = T0
    admitted_open = 0
    refused_closed = 0

    def race() -> list[Worker]:
        """After the open period every worker asks at once: those given a probe (holding it)."""
        nonlocal now
        now += int(HALF_OPEN.open_seconds * 1000) + 1_000
        assert all(at_once(workers, f"clock {now}"))
        got = at_once(workers, "hold")
        assert sum(got) == PROBES, f"{sum(got)} probes handed out for {PROBES}: {got}"
        return [worker for worker, probe in zip(workers, got, strict=True) if probe]

    for i in range(10):
        tripping = workers[i % len(workers)]
        assert tripping.ask("failure-opens") == "opened"
        others = [w for w in workers if w is not tripping]
        for worker in others:  # the trip's boundary is the tests' above: here, until each heard of it
            wait_until(lambda worker=worker: not worker("admits"), timeout=10, what="a worker refusing")

        probers = race()
        assert probers[0]("release-failure")  # reopens
        admitted_open += sum(w("admits") for w in workers if w is not probers[0])
        assert probers[1]("release-ignored")

        probers = race()
        assert all(w("release-success") for w in probers)  # the second closes
        refused_closed += sum(not w("admits") for w in workers)
    assert (admitted_open, refused_closed) == (0, 0), (
        f"{admitted_open} calls admitted after a failed probe, {refused_closed} refused after the close"
    )


@pytest.mark.processes
def test_a_trip_from_calm_on_a_cluster_through_proxies():
    with started(ClusterGroup(proxied=True)) as group:
        url = group.url + "?socket_timeout=0.9&socket_connect_timeout=0.9"
        team = Team(url)
        operator = Breakers.from_url(url, listen=False)
        try:
            a, b = team.start("pay", TRIP_AT_1, 2)
            assert sum(proxy.subscriptions for proxy in group.proxies) >= 2
            admitted = trips_from_calm(operator, "pay", a, b, ROUNDS)
        finally:
            operator.close()
            team.stop_all()
    assert admitted == 0, f"{admitted} of {ROUNDS} calls started after the trip were admitted"


def test_a_worker_that_cannot_acknowledge_is_waited_for_until_its_lease_ends(redis_server, jitter_proxies):
    """Worker b's subscription path becomes slower than the lease (3 s a reply, a path
    that stalls): b cannot acknowledge a's trip in time. a's tripping call waits for it
    until the lease ends (storage/acks.py LEASE_SECONDS), not longer; by then b, whose
    last answered PING was sent before the trip, no longer decides from memory: its very
    next call asks Redis and is refused, though the trip's notice has not reached it."""
    server_url = redis_server.url
    emptied(redis.Redis.from_url(server_url))
    proxy_a, proxy_b = jitter_proxies(redis_server.port), jitter_proxies(redis_server.port)
    suffix = "?socket_timeout=0.9&socket_connect_timeout=0.9"
    teams = [Team(proxy.url + suffix) for proxy in (proxy_a, proxy_b)]
    try:
        (a,), (b,) = (team.start("pay", TRIP_AT_1, 1) for team in teams)
        assert a("admits") and b("admits")
        wait_until(lambda: b.ask("trusted"), what="b deciding from memory")
        proxy_b.subscription_delays = Delays(base_ms=3000, jitter_ms=0)
        started = time.monotonic()
        assert a.ask("failure-opens") == "opened"
        waited = time.monotonic() - started
        assert not b("admits")
        assert LEASE_SECONDS <= waited < LEASE_SECONDS + 10, waited
    finally:
        for team in teams:
            team.stop_all()
