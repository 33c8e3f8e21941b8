"""Breakers over rediss:// against a redis-server that speaks only TLS and
requires a client certificate (tests/support/topologies.py makes the CA and both
certificates with openssl)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from redis.connection import SSLConnection

from breaker_redis import BreakerOpen, Breakers
from breaker_redis.storage.store import StoreUnavailable
from tests.support.topologies import TLSServer, started
from tests.support.workers import TRIP_AT_3, admits, fail, subscribed, trips_at_3


@pytest.fixture(scope="module")
def tls() -> Iterator[TLSServer]:
    with started(TLSServer()) as server:
        yield server


@pytest.fixture
def made(tls: TLSServer) -> Iterator[list[Breakers]]:
    tls.client().flushall()
    breakers: list[Breakers] = []
    yield breakers
    for b in breakers:
        b.close()


@pytest.mark.processes
def test_the_server_speaks_only_tls(tls):
    assert tls.client().config_get("port") == {"port": "0"}
    assert tls.client().config_get("tls-auth-clients") == {"tls-auth-clients": "yes"}


@pytest.mark.processes
def test_breakers_from_a_rediss_url_trip_a_breaker(tls, made):
    made.append(breakers := Breakers.from_url(tls.url()))
    assert breakers.client.connection_pool.connection_class is SSLConnection
    pay = breakers.get("pay", TRIP_AT_3)
    snap = trips_at_3(pay)
    assert (snap["store"], snap["state"], snap["trips"], snap["failures"]) == ("redis", "open", 1, 3)
    assert tls.client().hget("breaker:{pay}:state", "state") == b"open"
    assert breakers.names() == ["pay"]
    assert breakers.store_healthy


@pytest.mark.processes
def test_invalidation_over_tls_keeps_the_trip_boundary(tls, made):
    """The subscription is an SSL socket too: a worker that knew the breaker
    closed refuses the call right after another worker's trip."""
    made.extend(workers := [Breakers.from_url(tls.url()) for _ in range(2)])
    subscribed(workers)
    a, b = (w.get("pay", TRIP_AT_3) for w in workers)
    for _ in range(20):
        a.reset()
        assert admits(b)  # b learns "closed" and decides from memory from now on
        fail(a, 3)
        assert not admits(b)


@pytest.mark.processes
def test_a_wrong_ca_with_deny_refuses_every_call_at_once(tls, made, caplog, monkeypatch):
    """on_store_error='deny' (docs/failure-modes.md, "When Redis is unavailable"): BreakerOpen
    with reason 'open' and no retry_after; reads raise StoreUnavailable."""
    url = tls.url(ca=tls.certs.other_ca)
    made.append(breakers := Breakers.from_url(url, on_store_error="deny", listen=False))
    pay = breakers.get("pay", TRIP_AT_3)
    # The first call is refused at once: one TLS handshake, refused, no retry and no
    # timeout (counted, not timed: a busy machine stalls a thread for most of a second).
    connects: list[str] = []
    connect = SSLConnection._connect

    def counted_connect(connection: SSLConnection) -> object:
        if threading.current_thread() is threading.main_thread():
            connects.append("connect")
        return connect(connection)

    monkeypatch.setattr(SSLConnection, "_connect", counted_connect)
    with caplog.at_level(logging.WARNING, logger="breaker_redis"), pytest.raises(BreakerOpen) as info:
        pay.acquire()
    assert (info.value.reason, info.value.retry_after) == ("open", None)
    assert connects == ["connect"]
    assert "TimeoutError" not in caplog.text
    assert not breakers.store_healthy
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text
    # No call waits on Redis any more: none of the next 50 takes a connection (the
    # gate's background probe, on a thread of its own, may; it is not counted).
    pool = breakers.client.connection_pool
    taken: list[str] = []
    get_connection = pool.get_connection

    def counted(*args: object, **kwargs: object) -> object:
        if threading.current_thread() is threading.main_thread():
            taken.append("connection")
        return get_connection(*args, **kwargs)

    monkeypatch.setattr(pool, "get_connection", counted)
    for _ in range(50):
        with pytest.raises(BreakerOpen):
            pay.acquire()
    assert taken == []
    with pytest.raises(StoreUnavailable):
        pay.snapshot()
    assert not tls.client().exists("breaker:{pay}:state")  # nothing reached the server


@pytest.mark.processes
def test_a_wrong_ca_with_the_default_policy_keeps_a_local_breaker(tls, made):
    made.append(breakers := Breakers.from_url(tls.url(ca=tls.certs.other_ca), listen=False))
    pay = breakers.get("pay", TRIP_AT_3)
    fail(pay, 3)  # counted by this process's local breaker
    with pytest.raises(BreakerOpen):
        pay.acquire()
    snap = pay.snapshot()
    assert (snap["store"], snap["state"]) == ("local", "open")
    assert not tls.client().exists("breaker:{pay}:state")


@pytest.mark.processes
def test_no_client_certificate_is_refused_by_the_server(tls, made):
    made.append(
        breakers := Breakers.from_url(tls.url(client_cert=False), on_store_error="deny", listen=False)
    )
    with pytest.raises(BreakerOpen):
        breakers.get("pay", TRIP_AT_3).acquire()
    assert not breakers.store_healthy


@pytest.mark.processes
def test_cert_reqs_none_skips_the_server_check(tls, made):
    certs = tls.certs
    url = (
        f"rediss://127.0.0.1:{tls.port}/0?ssl_cert_reqs=none&ssl_check_hostname=false"
        f"&ssl_certfile={certs.client}&ssl_keyfile={certs.client_key}"
    )
    made.append(breakers := Breakers.from_url(url, listen=False))
    breakers.get("pay", TRIP_AT_3).acquire().success()
    assert breakers.store_healthy


@pytest.mark.processes
def test_a_server_that_cannot_start_is_reported_with_its_log(monkeypatch):
    import tests.support.topologies as topologies

    real = topologies._server_argv
    monkeypatch.setattr(topologies, "_server_argv", lambda *args: [*real(*args), "--no-such-directive", "1"])
    server = TLSServer()
    with pytest.raises(RuntimeError) as info:
        server.start()
    assert "redis-server-tls on port" in str(info.value)
    assert "no-such-directive" in str(info.value)  # redis-server's own complaint, from its log
    assert not server.dir.exists() and not server.children  # stopped and cleaned up
