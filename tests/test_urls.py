"""client_from_url without servers: the client each scheme makes, its options
(sub-second timeouts and no retries on every connection), and every error."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.connection import SSLConnection, UnixDomainSocketConnection
from redis.sentinel import SentinelConnectionPool, SentinelManagedConnection, SentinelManagedSSLConnection

from breaker_redis import Breakers, urls
from breaker_redis.url_parsing import SCHEMES, parse, redact
from breaker_redis.urls import CONNECT_TIMEOUT, SOCKET_TIMEOUT, client_from_url

SECRET = "s3cret-pw"


def assert_no_retry(retry: Any) -> None:
    assert retry._retries == 0
    assert isinstance(retry._backoff, NoBackoff)


def assert_breaker_timeouts(kwargs: dict[str, Any]) -> None:
    assert kwargs["socket_timeout"] == SOCKET_TIMEOUT < 1
    assert kwargs["socket_connect_timeout"] == CONNECT_TIMEOUT < 1
    assert_no_retry(kwargs["retry"])


@pytest.fixture
def tls_files(tmp_path: Path) -> dict[str, str]:
    """Files for the TLS options (their content is not read until a connection is made)."""
    files = {}
    for key in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        path = tmp_path / f"{key}.pem"
        path.write_text("not read here\n")
        files[key] = str(path)
    return files


def query(options: dict[str, str]) -> str:
    return "&".join(f"{key}={value}" for key, value in options.items())


# -- redis://, rediss://, unix:// --------------------------------------------------------


def test_redis_url_makes_a_plain_client_with_breaker_timeouts_and_no_retry():
    client = client_from_url(f"redis://user:{SECRET}@db.example:6380/3?client_name=web")
    assert type(client) is redis.Redis
    pool = client.connection_pool
    assert pool.connection_class is redis.Connection
    kwargs = pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("db.example", 6380, 3)
    assert (kwargs["username"], kwargs["password"], kwargs["client_name"]) == ("user", SECRET, "web")
    assert_breaker_timeouts(kwargs)


@pytest.mark.parametrize(
    ("url", "host", "port", "db"),
    [
        ("redis://", "localhost", 6379, 0),
        ("redis://h", "h", 6379, 0),
        ("redis://h/", "h", 6379, 0),
        ("redis://h:7000/", "h", 7000, 0),
        ("redis://h?db=4", "h", 6379, 4),
        ("redis://h/4?db=4", "h", 6379, 4),
        ("REDIS://h:1/2", "h", 1, 2),
        ("redis://[::1]:7001/5", "::1", 7001, 5),
        ("redis://[::1]", "::1", 6379, 0),
    ],
)
def test_redis_url_host_port_and_db(url, host, port, db):
    kwargs = client_from_url(url).connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs.get("db", 0)) == (host, port, db)


@pytest.mark.parametrize(
    ("userinfo", "username", "password"),
    [
        (f":{SECRET}@", None, SECRET),
        (f"alice:{SECRET}@", "alice", SECRET),
        ("alice@", "alice", None),  # a user name alone, as redis-py reads it
        ("al%40ce:p%40ss%3Aw%2Fd@", "al@ce", "p@ss:w/d"),  # percent-encoded
        ("alice:p@ss@", "alice", "p@ss"),  # an unencoded @ in the password: the last @ ends it
    ],
)
def test_credentials_in_the_url(userinfo, username, password):
    kwargs = client_from_url(f"redis://{userinfo}h:1/0").connection_pool.connection_kwargs
    assert (kwargs["username"], kwargs["password"], kwargs["host"]) == (username, password, "h")


def test_rediss_url_passes_the_tls_options(tls_files):
    url = f"rediss://:{SECRET}@h:6390/1?{query(tls_files)}&ssl_cert_reqs=Required&ssl_check_hostname=false"
    pool = client_from_url(url).connection_pool
    assert pool.connection_class is SSLConnection
    kwargs = pool.connection_kwargs
    for key, path in tls_files.items():
        assert kwargs[key] == path
    assert (kwargs["ssl_cert_reqs"], kwargs["ssl_check_hostname"]) == ("required", False)
    assert (kwargs["host"], kwargs["port"], kwargs["db"], kwargs["password"]) == ("h", 6390, 1, SECRET)
    assert_breaker_timeouts(kwargs)
    connection = pool.make_connection()  # the options reach the SSL connection itself
    assert (connection.ca_certs, connection.certfile, connection.keyfile) == (
        tls_files["ssl_ca_certs"],
        tls_files["ssl_certfile"],
        tls_files["ssl_keyfile"],
    )
    assert connection.check_hostname is False


@pytest.mark.parametrize(("value", "expected"), [("none", "none"), ("OPTIONAL", "optional")])
def test_rediss_cert_reqs_values(value, expected):
    kwargs = client_from_url(f"rediss://h?ssl_cert_reqs={value}").connection_pool.connection_kwargs
    assert kwargs["ssl_cert_reqs"] == expected


def test_rediss_without_options_uses_redis_py_defaults():
    pool = client_from_url("rediss://h").connection_pool
    assert pool.connection_class is SSLConnection
    assert pool.connection_kwargs.get("ssl_ca_certs") is None
    assert_breaker_timeouts(pool.connection_kwargs)


def test_unix_url(tmp_path):
    client = client_from_url(f"unix://:{SECRET}@{tmp_path}/redis%20x.sock?db=2")
    pool = client.connection_pool
    assert pool.connection_class is UnixDomainSocketConnection
    kwargs = pool.connection_kwargs
    assert (kwargs["path"], kwargs["db"], kwargs["password"]) == (f"{tmp_path}/redis x.sock", 2, SECRET)
    assert kwargs["socket_timeout"] == SOCKET_TIMEOUT
    assert_no_retry(kwargs["retry"])


@pytest.mark.parametrize(("key", "value"), [("socket_timeout", 0.5), ("socket_connect_timeout", 0.05)])
def test_sub_second_timeouts_from_the_query(key, value):
    assert client_from_url(f"redis://h?{key}={value}").connection_pool.connection_kwargs[key] == value


def test_keyword_overrides_win_unchecked():
    """The CLI is not on a request path and asks for longer timeouts in code."""
    kwargs = client_from_url("redis://h?socket_timeout=0.5", socket_timeout=2.0, decode_responses=True)
    options = kwargs.connection_pool.connection_kwargs
    assert (options["socket_timeout"], options["decode_responses"]) == (2.0, True)
    assert options["socket_connect_timeout"] == CONNECT_TIMEOUT


def test_from_url_builds_breakers_on_that_client_and_connects_to_nothing():
    breakers = Breakers.from_url("redis+sentinel://127.0.0.1:1,127.0.0.1:2/svc", listen=False)
    try:
        assert isinstance(breakers.client.connection_pool, SentinelConnectionPool)
    finally:
        breakers.close()


# -- redis+sentinel:// ---------------------------------------------------------------------


def test_sentinel_url_makes_the_master_client_of_a_sentinel():
    client = client_from_url(f"redis+sentinel://alice:{SECRET}@s1:26380,s2,[::1]:26381/mymaster/2")
    assert type(client) is redis.Redis
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert (pool.service_name, pool.is_master) == ("mymaster", True)
    assert pool.connection_class is SentinelManagedConnection
    master = pool.connection_kwargs
    assert (master["db"], master["username"], master["password"]) == (2, "alice", SECRET)
    assert_breaker_timeouts(master)
    sentinels = pool.sentinel_manager.sentinels
    addresses = [
        (s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
        for s in sentinels
    ]
    assert addresses == [("s1", 26380), ("s2", 26379), ("::1", 26381)]
    for sentinel in sentinels:
        kwargs = sentinel.connection_pool.connection_kwargs
        assert_breaker_timeouts(kwargs)  # the sentinels' own connections too
        assert kwargs.get("password") is None  # the URL's credentials are the master's
        assert sentinel.connection_pool.connection_class is redis.Connection


@pytest.mark.parametrize(
    ("path", "service", "db"),
    [("/svc", "svc", 0), ("/svc/", "svc", 0), ("/svc/7", "svc", 7), ("/my%20svc/1", "my svc", 1)],
)
def test_sentinel_service_and_db(path, service, db):
    pool = client_from_url(f"redis+sentinel://s1{path}").connection_pool
    assert (pool.service_name, pool.connection_kwargs["db"]) == (service, db)


def test_sentinel_overrides_reach_the_sentinels_timeouts():
    pool = client_from_url(
        "redis+sentinel://s1/svc", socket_timeout=2.0, socket_connect_timeout=1.5
    ).connection_pool
    for kwargs in [
        pool.connection_kwargs,
        *(s.connection_pool.connection_kwargs for s in pool.sentinel_manager.sentinels),
    ]:
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (2.0, 1.5)


def test_rediss_sentinel_speaks_tls_to_the_sentinels_and_the_master(tls_files):
    pool = client_from_url(
        f"rediss+sentinel://s1,s2/svc?{query(tls_files)}&ssl_cert_reqs=required"
    ).connection_pool
    assert pool.connection_class is SentinelManagedSSLConnection
    assert pool.connection_kwargs["ssl_ca_certs"] == tls_files["ssl_ca_certs"]
    for sentinel in pool.sentinel_manager.sentinels:
        assert sentinel.connection_pool.connection_class is SSLConnection
        kwargs = sentinel.connection_pool.connection_kwargs
        assert {key: kwargs[key] for key in tls_files} == tls_files
        assert kwargs["ssl_cert_reqs"] == "required"
        assert_breaker_timeouts(kwargs)


# -- redis+cluster:// (a LazyCluster; the RedisCluster it makes is recorded here) ------------


class RecordedCluster:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


@pytest.fixture
def recorded(monkeypatch) -> None:
    monkeypatch.setattr(urls, "RedisCluster", RecordedCluster)


def test_cluster_url_lists_every_startup_node_and_never_retries(recorded):
    lazy = client_from_url(f"redis+cluster://:{SECRET}@n1:7000,n2:7001,[::1]:7002,n4")
    assert isinstance(lazy, urls.LazyCluster)
    made = lazy.connected()
    assert isinstance(made, RecordedCluster)
    kwargs = made.kwargs
    assert [(node.host, node.port) for node in kwargs["startup_nodes"]] == [
        ("n1", 7000),
        ("n2", 7001),
        ("::1", 7002),
        ("n4", 6379),
    ]
    assert_breaker_timeouts(kwargs)  # retry= is the cluster's own loop (default: 10 attempts)
    assert "db" not in kwargs  # RedisCluster refuses db, even 0
    assert "cluster_error_retry_attempts" not in kwargs  # deprecated; ignored when retry= is given
    assert kwargs["password"] == SECRET
    assert "ssl" not in kwargs


@pytest.mark.parametrize("path", ["", "/", "/0"])
def test_cluster_url_accepts_db_0_only(recorded, path):
    assert "db" not in client_from_url(f"redis+cluster://n1:7000{path}").kwargs


def test_rediss_cluster_speaks_tls_to_every_node(recorded, tls_files):
    kwargs = client_from_url(f"rediss+cluster://n1:7000,n2:7001?{query(tls_files)}").kwargs
    assert kwargs["ssl"] is True
    assert {key: kwargs[key] for key in tls_files} == tls_files


def test_cluster_overrides(recorded):
    kwargs = client_from_url("redis+cluster://n1:7000", socket_timeout=2.0).kwargs
    assert kwargs["socket_timeout"] == 2.0
    assert_no_retry(kwargs["retry"])


def test_a_cluster_client_connects_at_first_use_and_says_which_nodes_failed():
    """No cluster at all: making the client costs nothing (an app starts, its
    breakers decide locally); each use is one ConnectionError naming the nodes."""
    client = client_from_url("redis+cluster://127.0.0.1:1,127.0.0.1:2")
    assert repr(client) == "<LazyCluster not connected yet>"
    for _ in range(2):  # and the next use tries again
        with pytest.raises(redis.exceptions.ConnectionError, match=r"127\.0\.0\.1:1, 127\.0\.0\.1:2"):
            client.ping()
    client.close()


# -- memory:// ------------------------------------------------------------------------------


def test_memory_url_makes_a_store_of_its_own_in_this_process():
    """Each memory:// is a new, empty store: what one client writes another never sees."""
    one, other = client_from_url("memory://"), client_from_url("MEMORY://")
    assert type(one).__module__.startswith("fakeredis")
    one.set("k", "1")
    assert (one.get("k"), other.get("k")) == (b"1", None)
    assert urls.describe(one) == "memory://"
    assert parse("memory://").memory and not parse("redis://h").memory


def test_memory_url_on_the_asyncio_side():
    async def written_and_seen() -> tuple[Any, Any]:
        one, other = urls.async_client_from_url("memory://"), urls.async_client_from_url("memory://")
        await one.set("k", "1")
        return await one.get("k"), await other.get("k")

    assert asyncio.run(written_and_seen()) == (b"1", None)


def test_memory_breakers_run_the_scripts_on_that_store():
    breakers = Breakers.from_url("memory://", clock=lambda: 1_700_000_000_000)
    try:
        pay = breakers.get("pay")
        pay.force_open()
        assert breakers.names() == ["pay"]
        assert breakers.client.exists("breaker:{pay}:state") == 1
    finally:
        breakers.close()


# -- errors ----------------------------------------------------------------------------------


BAD_URLS = [
    ("127.0.0.1:6379", "has no scheme: use one of redis://, rediss://, unix://, redis+cluster://"),
    (f"http://:{SECRET}@h", "unsupported Redis URL scheme 'http://'"),
    (
        f"redis+foo://:{SECRET}@h",
        "use one of redis://, rediss://, unix://, redis+cluster://, rediss+cluster://, "
        "redis+sentinel://, rediss+sentinel://",
    ),
    (
        f"redis+sentinel://:{SECRET}@s1:26379,s2:26379",
        "has no service name: use redis+sentinel://host:port,host:port/SERVICE[/DB]",
    ),
    (f"redis+sentinel://:{SECRET}@s1/", "has no service name"),
    (f"redis+sentinel://:{SECRET}@s1//0", "has no service name"),
    (f"redis+sentinel://:{SECRET}@s1/svc/x", "bad database number 'x'"),
    (f"redis+sentinel://:{SECRET}@s1/svc/1/2", "too many path parts"),
    (f"redis+sentinel://:{SECRET}@/svc", "lists no host"),
    (f"redis+sentinel://:{SECRET}@s1/svc?db=1", "option 'db'"),
    (f"redis+cluster://:{SECRET}@", "lists no host: use redis+cluster://host:port,host:port"),
    (f"redis+cluster://:{SECRET}@n1:7000/2", "asks for database 2: a cluster has only db 0"),
    (f"redis+cluster://:{SECRET}@n1:7000?db=0", "option 'db'"),
    (f"redis+cluster://:{SECRET}@n1:7000,n2:x", "bad port 'x' for host 'n2'"),
    (f"redis+cluster://:{SECRET}@n1:7000,,n2:7001", "empty host"),
    (f"redis+cluster://:{SECRET}@n1:7000,:7001", "empty host"),
    (f"redis://:{SECRET}@h:abc/0", "bad port 'abc' for host 'h'"),
    (f"redis://:{SECRET}@h:0", "bad port '0'"),
    (f"redis://:{SECRET}@h:65536", "bad port '65536'"),
    (f"redis://:{SECRET}@h:", "bad port ''"),
    (f"redis://:{SECRET}@h:-1", "bad port '-1'"),
    (f"redis://:{SECRET}@[::1", "bad host '[::1'"),
    (f"redis://:{SECRET}@[::1]x", "bad host"),
    (f"redis://:{SECRET}@a:1,b:2", "lists 2 hosts: use one, or redis+cluster:// / redis+sentinel://"),
    (f"redis://:{SECRET}@h/x", "bad database number 'x'"),
    (f"redis://:{SECRET}@h/1/2", "too many path parts"),
    (f"redis://:{SECRET}@h/1?db=2", "database 1 in its path and 2 in db="),
    (f"redis://:{SECRET}@h?db=-1", "bad database number '-1'"),
    (f"redis://:{SECRET}@h?foo=1", "unknown option 'foo'"),
    (f"redis://:{SECRET}@h?foo=1", "redis:// takes client_name, socket_timeout, socket_connect_timeout, db"),
    (f"rediss://:{SECRET}@h?foo=1", "ssl_ca_certs, ssl_ca_path, ssl_certfile, ssl_keyfile, ssl_cert_reqs"),
    (f"redis://:{SECRET}@h?db=1&db=2", "option 'db' given twice"),
    (f"redis://:{SECRET}@h?retry_on_timeout=true", "breaker_redis clients never retry"),
    (f"redis://:{SECRET}@h?retry_on_error=x", "never retry"),
    (f"redis+cluster://:{SECRET}@h:1?cluster_error_retry_attempts=3", "never retry"),
    (f"redis://:{SECRET}@h?socket_timeout=5", "socket_timeout='5'"),
    (f"redis://:{SECRET}@h?socket_timeout=5", "above 0 and below 1"),
    (f"redis://:{SECRET}@h?socket_connect_timeout=0", "socket_connect_timeout='0'"),
    (f"redis://:{SECRET}@h?socket_timeout=abc", "socket_timeout='abc'"),
    (f"redis://:{SECRET}@h?ssl_ca_certs=/etc/hostname", "TLS option 'ssl_ca_certs'"),
    (f"redis://:{SECRET}@h?ssl_cert_reqs=none", "which is not a TLS URL: use rediss://"),
    (f"redis+cluster://:{SECRET}@h:1?ssl_cert_reqs=none", "use rediss+cluster://"),
    (f"redis+sentinel://:{SECRET}@h/s?ssl_cert_reqs=none", "use rediss+sentinel://"),
    (f"unix://:{SECRET}@/tmp/s?ssl_cert_reqs=none", "TLS needs a rediss scheme"),
    (f"rediss://:{SECRET}@h?ssl_cert_reqs=maybe", "ssl_cert_reqs='maybe' in 'rediss://:***@h?"),
    (f"rediss://:{SECRET}@h?ssl_cert_reqs=maybe", "use one of none, optional, required"),
    (f"rediss://:{SECRET}@h?ssl_check_hostname=perhaps", "ssl_check_hostname='perhaps'"),
    (
        f"rediss://:{SECRET}@h?ssl_ca_certs=/no/such/ca.pem",
        "ssl_ca_certs: no such file or directory '/no/such/ca.pem'",
    ),
    (f"rediss+sentinel://:{SECRET}@h/s?ssl_keyfile=/no/key", "ssl_keyfile: no such file"),
    (f"unix://:{SECRET}@", "has no socket path: use unix:///path/to/socket"),
    (f"unix://:{SECRET}@host/tmp/s", "names a host ('host')"),
    (f"memory://:{SECRET}@h", "has more after the scheme: use memory:// alone"),
    ("memory://localhost", "memory:// URL 'memory://localhost' has more after the scheme"),
    ("memory:///0", "use memory:// alone (each one is a new, empty store in this process)"),
    ("memory://?db=1", "use memory:// alone"),
]


@pytest.mark.parametrize(("url", "message"), BAD_URLS)
def test_bad_urls_say_what_is_wrong_and_never_show_the_password(url, message):
    with pytest.raises(ValueError) as info:
        client_from_url(url)
    text = str(info.value)
    assert message in text
    assert SECRET not in text
    assert info.value.__cause__ is None and info.value.__context__ is None  # no chained URL either


def test_every_scheme_is_named_in_the_unknown_scheme_error():
    with pytest.raises(ValueError) as info:
        client_from_url("memcached://h")
    assert all(f"{scheme}://" in str(info.value) for scheme in SCHEMES)
    assert "'memcached://'" in str(info.value)


def test_a_url_that_is_not_a_str():
    with pytest.raises(TypeError, match="must be a str"):
        client_from_url(b"redis://h")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://:{SECRET}@h:1/0", "redis://:***@h:1/0"),
        (f"redis://alice:{SECRET}@h", "redis://alice:***@h"),
        (f"redis://{SECRET}@h", "redis://***@h"),
        (f"redis+cluster://u:{SECRET}@a:1,b:2", "redis+cluster://u:***@a:1,b:2"),
        (f"redis://u:{SECRET[:3]}/{SECRET[3:]}@h", "redis://u:***@h"),  # a / in the password
        (f"redis://u:{SECRET}@h?ssl_certfile=/a@b", "redis://u:***@b"),  # hides more, never less
        ("redis://h:1/0", "redis://h:1/0"),
    ],
)
def test_redact(url, shown):
    assert redact(url) == shown


def test_parse_reports_what_the_url_asks_for():
    parsed = parse(f"rediss+sentinel://bob:{SECRET}@s1:1,s2/svc/3?client_name=x")
    assert (parsed.tls, parsed.sentinel, parsed.cluster) == (True, True, False)
    assert parsed.hosts == [("s1", 1), ("s2", 26379)]
    assert (parsed.service, parsed.db, parsed.username, parsed.password) == ("svc", 3, "bob", SECRET)
    assert parsed.options == {"client_name": "x"}
