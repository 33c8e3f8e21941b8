"""Partial outages: Redis answers PING but refuses the scripts.

Out of memory (maxmemory with noeviction), a read-only replica (as after a
failover) and a server busy with a long script. Each time the breaker keeps
deciding on its local store without flapping back to Redis: an upstream that
keeps failing trips it after the threshold, one warning says Redis is
unavailable, and once Redis runs scripts again the breaker is back on it.
A Redis that comes back and fails again at once keeps the local breakers.
"""

from __future__ import annotations

import contextlib
import logging
import threading

import pytest
import redis

from breaker_redis import BreakerOpen, Breakers
from breaker_redis.storage import store as store_module
from tests.support.redis_server import RedisServer, wait_until
from tests.support.workers import TRIP_AT_3, admits

pytestmark = pytest.mark.real


@pytest.fixture
def server():
    made = RedisServer().start()
    yield made
    made.stop()


def fail_until_refused(breaker, most: int) -> int:
    """Failures recorded until the breaker refuses; at most ``most`` calls."""
    for n in range(most):
        try:
            breaker.acquire().failure()
        except BreakerOpen:
            return n
    return most


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def scripts_refused(breakers: Breakers, admin: redis.Redis, refuse, allow, admitted: int) -> None:
    """Redis refuses scripts (``refuse``): the local breaker trips after 3 failures of
    16 failing calls, one warning; ``allow``: back on Redis."""
    pay = breakers.get("pay", TRIP_AT_3)
    assert admits(pay)  # on Redis, healthy
    refuse()
    assert admin.ping()  # it still answers PING
    assert fail_until_refused(pay, 16) == admitted  # tripped locally, on the local store
    assert not breakers.gate.healthy
    for _ in range(10):
        assert not admits(pay)  # stays on the local store: still open, no flapping
    allow()
    wait_until(lambda: breakers.gate.healthy, timeout=15, what="the gate to go back to Redis")
    assert admits(pay)  # Redis's own breaker: closed, it never saw those failures


@pytest.mark.parametrize(
    ("how", "admitted"),
    # Out of memory, Redis refuses every FCALL (a function that may write is refused
    # whole, where an EVAL script only had its writes refused: its first acquire ran
    # and the failure after it was lost). The replica holds its primary's data,
    # without this breaker: the acquire would create it and is refused. Busy, Redis
    # refuses every script.
    [("oom", 3), ("readonly", 3), ("busy", 3)],
)
def test_redis_that_answers_ping_but_refuses_scripts_trips_locally_without_flapping(
    server, caplog, how, admitted
):
    admin = server.client()
    breakers = Breakers.from_url(server.url, listen=False)
    primary: RedisServer | None = None
    busy: threading.Thread | None = None
    try:
        if how == "oom":
            admin.config_set("maxmemory-policy", "noeviction")

            def refuse() -> None:
                admin.config_set("maxmemory", "1")

            def allow() -> None:
                admin.config_set("maxmemory", "0")

        elif how == "readonly":
            primary = RedisServer().start()

            def refuse() -> None:
                admin.replicaof("127.0.0.1", primary.port)  # a failover's old master turned replica
                wait_until(
                    lambda: admin.info("replication")["master_link_status"] == "up",
                    timeout=15,
                    what="replication",
                )

            def allow() -> None:
                admin.replicaof("NO", "ONE")

        else:
            admin.config_set("busy-reply-threshold", "10")

            def refuse() -> None:
                nonlocal busy

                def spin() -> None:
                    with contextlib.suppress(redis.exceptions.ResponseError):  # killed
                        server.client().eval("while true do end", 0)

                busy = threading.Thread(target=spin, daemon=True)
                busy.start()

                def answers_busy() -> bool:
                    try:
                        server.client().ping()
                        return False
                    except redis.exceptions.ResponseError as exc:
                        return "BUSY" in str(exc)

                wait_until(answers_busy, timeout=10, what="Redis to answer BUSY")

            def allow() -> None:
                server.client().script_kill()
                busy.join(10)

            admin.ping = lambda: True  # PING itself answers BUSY here; SCRIPT KILL works

        with caplog.at_level(logging.WARNING, logger="breaker_redis"):
            scripts_refused(breakers, admin, refuse, allow, admitted)
        logged = warnings_of(caplog)
        assert len([m for m in logged if "Redis unavailable" in m]) == 1, logged
        assert len([m for m in logged if "answers again" in m]) == 1, logged
    finally:
        breakers.close()
        if primary is not None:
            admin.replicaof("NO", "ONE")
            primary.stop()


def test_a_redis_that_fails_again_at_once_keeps_the_local_breakers(monkeypatch, caplog):
    """It came back (a write went through) and failed at the next call: the local
    breaker tripped before is still tripped, and no second 'unavailable' line."""
    import fakeredis

    server = fakeredis.FakeServer()
    breakers = Breakers(fakeredis.FakeRedis(server=server), listen=False)
    gate = breakers.gate
    monkeypatch.setattr(gate, "_min_backoff", 0.01)
    monkeypatch.setattr(gate, "_delay", 0.01)
    try:
        pay = breakers.get("pay", TRIP_AT_3)
        assert admits(pay)
        with caplog.at_level(logging.WARNING, logger="breaker_redis"):
            server.connected = False
            assert fail_until_refused(pay, 10) == 3  # tripped on the local store
            server.connected = True
            wait_until(lambda: gate.healthy, timeout=10, what="the gate to go back to Redis")
            server.connected = False
            assert not admits(pay)  # the same local store: still open
            assert not gate.healthy
        logged = warnings_of(caplog)
        assert len([m for m in logged if "Redis unavailable" in m]) == 1, logged
        assert len([m for m in logged if "failed again" in m]) == 1, logged
        server.connected = True
        wait_until(lambda: gate.healthy, timeout=10, what="the gate to go back to Redis")
        monkeypatch.setattr(store_module, "STEADY_SECONDS", 0.0)  # a long healthy stretch later
        server.connected = False
        assert admits(pay)  # a new outage starts with a fresh local store
    finally:
        breakers.close()


def test_an_open_breaker_stays_open_on_the_local_store_when_redis_goes_away(server, caplog):
    """The local store starts with the open state the worker last had from Redis
    (lua/_lib.lua restore_lost), so an outage of Redis does not reopen the floodgates:
    the call is refused, not admitted to the failing upstream."""
    breakers = Breakers.from_url(server.url, listen=False)
    try:
        pay = breakers.get("pay", TRIP_AT_3)
        assert fail_until_refused(pay, 5) == 3  # open on Redis
        server.stop()
        with caplog.at_level(logging.WARNING, logger="breaker_redis"):
            for _ in range(10):
                assert not admits(pay)
        assert not breakers.gate.healthy
        assert not [m for m in warnings_of(caplog) if "lost its state" in m]  # local: nothing to say
    finally:
        breakers.close()
