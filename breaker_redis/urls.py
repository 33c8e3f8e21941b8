"""Storage URLs -> redis-py clients with timeouts suited to a breaker.

A breaker that waits 5 s on a dead Redis (redis-py's default) or retries ten
times has stopped protecting anything, so clients made here answer or fail in
well under a second and never retry: the store-health gate decides what
happens next. That holds for every connection a client makes: a Sentinel
client's connections to the sentinels, and a Redis Cluster client's
connections to every node (and its own retry loop, which redis-py sets to
ten attempts with backoff).

The URLs it takes, and how they are checked: breaker_redis/url_parsing.py
(what a URL says, no client made); here, the clients made from it.

Keyword overrides (``client_from_url(url, socket_timeout=2)``, as the CLI does)
go to every connection's options, the sentinels' timeouts included, and are
not checked: code that passes them knows what it asks for.

``memory://`` gives a fakeredis client on a server of its own (fakeredis
runs the same Lua scripts, as the local fallback store does: storage/store.py):
no socket, so no timeout and nothing to retry, and no override applies.

Every client connects at first use. redis-py's RedisCluster reads the slot
map in its constructor, so a ``redis+cluster://`` URL gives a ``LazyCluster``
that builds it at the first command: an app starts while its cluster is down
(its breakers decide locally until the cluster answers) instead of failing
at import.
"""

from __future__ import annotations

import threading
from typing import Any, TypeAlias

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel

from breaker_redis.url_parsing import TLS_OPTIONS, ParsedURL, parse

SOCKET_TIMEOUT = 0.25
CONNECT_TIMEOUT = 0.25

RedisClient: TypeAlias = "redis.Redis | RedisCluster | LazyCluster"


def no_retry() -> Retry:
    return Retry(NoBackoff(), 0)


def client_from_url(url: str, **overrides: Any) -> RedisClient:
    """A client for url (see the module's docstring); ValueError for a bad URL."""
    parsed = parse(url)
    if parsed.memory:
        import fakeredis  # imported only when a process asks for it

        return fakeredis.FakeRedis(server=fakeredis.FakeServer())
    if parsed.cluster:
        return _cluster(parsed, overrides)
    if parsed.sentinel:
        return _sentinel_master(parsed, overrides)
    return redis.Redis(**_connection_options(parsed, overrides))


def async_client_from_url(url: str, **overrides: Any) -> Any:
    """The same client as client_from_url, on redis-py's asyncio side (breaker_redis.asyncio).

    redis-py's asyncio cluster client reads the slot map at its first command,
    not when it is built, so no lazy wrapper is needed there.
    """
    import redis.asyncio
    from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.asyncio.retry import Retry as AsyncRetry
    from redis.asyncio.sentinel import Sentinel as AsyncSentinel

    parsed = parse(url)
    if parsed.memory:
        import fakeredis

        return fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    options = _connection_options(parsed, overrides)
    options["retry"] = AsyncRetry(NoBackoff(), 0)
    if parsed.cluster:
        return AsyncRedisCluster(
            startup_nodes=[AsyncClusterNode(host, port) for host, port in parsed.hosts], **options
        )
    if parsed.sentinel:
        sentinel_options = _sentinel_options(parsed, options, AsyncRetry(NoBackoff(), 0))
        assert parsed.service is not None
        sentinel = untyped(AsyncSentinel)(parsed.hosts, sentinel_kwargs=sentinel_options)
        return sentinel.master_for(parsed.service, **options)
    return redis.asyncio.Redis(**options)


# -- clients ---------------------------------------------------------------------


def untyped(function: Any) -> Any:
    """A redis-py callable, seen by mypy as untyped (Any). Some of redis-py's
    constructors and methods gain type hints from one release to the next (the
    Sentinel classes in 8.2); a ``type: ignore[no-untyped-call]`` on them becomes
    an "unused ignore" error under mypy strict once they do, so that every release
    of the supported range type-checks, such calls go through this seam."""
    return function


def _connection_options(parsed: ParsedURL, overrides: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {
        "socket_timeout": SOCKET_TIMEOUT,
        "socket_connect_timeout": CONNECT_TIMEOUT,
        "retry": no_retry(),
    }
    if parsed.unix_path is not None:
        options["unix_socket_path"] = parsed.unix_path
    elif not (parsed.cluster or parsed.sentinel):
        options["host"], options["port"] = parsed.hosts[0]
    if parsed.username is not None:
        options["username"] = parsed.username
    if parsed.password is not None:
        options["password"] = parsed.password
    if parsed.db is not None:
        options["db"] = parsed.db
    if parsed.tls:
        options["ssl"] = True
    options.update(parsed.options)
    options.update(overrides)
    return options


def _cluster(parsed: ParsedURL, overrides: dict[str, Any]) -> LazyCluster:
    """RedisCluster over every node listed. redis-py gives each node connection
    no retry of its own; its cluster-level loop (10 attempts with backoff by
    default, each reloading the slot map) gets none either: one failed
    command is one error, and the gate takes over."""
    options = _connection_options(parsed, overrides)
    retry = options.pop("retry")  # the cluster's own loop; node connections get Retry(NoBackoff(), 0)
    return LazyCluster(
        startup_nodes=[untyped(ClusterNode)(host, port) for host, port in parsed.hosts],
        retry=retry,
        **options,
    )


class LazyCluster:
    """A RedisCluster made at its first use, with the arguments given here.

    Until a node answers, every use raises ``redis.exceptions.ConnectionError``
    (a RedisError, which the store gate counts as Redis unavailable; redis-py's
    own RedisClusterException is not one), and the next use tries again.
    Attributes are the cluster client's once it exists.
    """

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._client: RedisCluster | None = None
        self._lock = threading.Lock()

    def connected(self) -> RedisCluster:
        """The cluster client, made now if it is not yet."""
        client = self._client
        if client is None:
            with self._lock:
                client = self._client
                if client is None:
                    try:
                        client = RedisCluster(**self._kwargs)
                    except redis.exceptions.RedisClusterException as exc:
                        nodes = ", ".join(f"{n.host}:{n.port}" for n in self._kwargs["startup_nodes"])
                        raise redis.exceptions.ConnectionError(
                            f"Redis Cluster not reachable at {nodes}: {exc}"
                        ) from exc
                    self._client = client
        return client

    def built(self) -> RedisCluster | None:
        """The cluster client if it is made, else None (no I/O)."""
        return self._client

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.connected(), name)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def __repr__(self) -> str:
        state = "connected" if self._client is not None else "not connected yet"
        return f"<LazyCluster {state}>"


def _sentinel_master(parsed: ParsedURL, overrides: dict[str, Any]) -> redis.Redis:
    """The master client of a Sentinel. It asks the sentinels for the master's
    address only when it opens a connection: after a failover it keeps using the
    old master until that one closes its connections or answers READONLY (when
    Sentinel demotes it, about 10 s after the switch: tests/storage/test_failover.py)."""
    master = _connection_options(parsed, overrides)
    sentinel = untyped(Sentinel)(parsed.hosts, sentinel_kwargs=_sentinel_options(parsed, master, no_retry()))
    assert parsed.service is not None
    client: redis.Redis = sentinel.master_for(parsed.service, **master)
    return client


def _sentinel_options(parsed: ParsedURL, master: dict[str, Any], retry: Any) -> dict[str, Any]:
    """The options of the connections to the sentinels (either side's): the master's
    timeouts and TLS, without its user and password, and ``retry`` (none)."""
    options: dict[str, Any] = {
        "socket_timeout": master["socket_timeout"],
        "socket_connect_timeout": master["socket_connect_timeout"],
        "retry": retry,
    }
    if parsed.tls:
        options["ssl"] = True
        options.update({key: value for key, value in master.items() if key in TLS_OPTIONS})
    return options


def describe(client: Any) -> str:
    """Where a client points, for messages and thread names (never its password; no
    I/O: a cluster client not made yet is named by its startup nodes)."""
    if isinstance(client, LazyCluster):
        if client.built() is None:
            startup = client._kwargs["startup_nodes"]
            return "cluster " + ",".join(sorted(f"{n.host}:{n.port}" for n in startup))
        client = client.built()
    if type(client).__module__.startswith("fakeredis"):
        return "memory://"
    nodes = getattr(client, "get_nodes", None)
    if callable(nodes):  # Redis Cluster
        return "cluster " + ",".join(sorted(f"{n.host}:{n.port}" for n in nodes()))
    pool = getattr(client, "connection_pool", None)
    service = getattr(pool, "service_name", None)
    if service:  # a Sentinel master
        return f"sentinel service {service!r}"
    kwargs = getattr(pool, "connection_kwargs", {}) or {}
    if "path" in kwargs:
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"
