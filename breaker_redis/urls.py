"""Storage URLs -> redis-py clients with timeouts suited to a breaker.

A breaker that waits 5 s on a dead Redis (redis-py's default) or retries ten
times has stopped protecting anything, so clients made here answer or fail in
well under a second and never retry: the store-health gate decides what
happens next. That holds for every connection a client makes: a Sentinel
client's connections to the sentinels, and a Redis Cluster client's
connections to every node (and its own retry loop, which redis-py sets to
ten attempts with backoff).

URLs (a password is never shown in an error message)::

    redis://[[user]:password@]host[:port][/db][?option=value&...]
    rediss://...                           TLS, options below
    unix://[[user]:password@]/path/to/socket[?db=N]
    redis+cluster://[[user]:password@]host:port,host:port[/0]
    rediss+cluster://...                   TLS to every node
    redis+sentinel://[[user]:password@]host:port,host:port/SERVICE[/db]
    rediss+sentinel://...                  TLS to the sentinels and to the master

A missing port is 6379 (26379 for a sentinel). With ``+sentinel`` the user and
password are the master's; the sentinels are asked without them. Query
options: ``client_name``; ``socket_timeout`` and ``socket_connect_timeout`` in
seconds, above 0 and below 1; ``db`` (``redis://``, ``rediss://``, ``unix://``);
with a ``rediss`` scheme ``ssl_ca_certs``, ``ssl_ca_path``, ``ssl_certfile``,
``ssl_keyfile`` (files that must exist), ``ssl_cert_reqs`` (none, optional,
required) and ``ssl_check_hostname`` (true or false). Anything else is refused
by name, retry options included: these clients never retry.

Keyword overrides (``client_from_url(url, socket_timeout=2)``, as the CLI does)
go to every connection's options, the sentinels' timeouts included, and are
not checked: code that passes them knows what it asks for.

Every client connects at first use. redis-py's RedisCluster reads the slot
map in its constructor, so a ``redis+cluster://`` URL gives a ``LazyCluster``
that builds it at the first command: an app starts while its cluster is down
(its breakers decide locally until the cluster answers) instead of failing
at import.
"""

from __future__ import annotations

import os
import threading
from typing import Any, TypeAlias
from urllib.parse import parse_qsl, unquote

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel

SOCKET_TIMEOUT = 0.25
CONNECT_TIMEOUT = 0.25
SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel")
DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379

TLS_FILES = ("ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile")
TLS_OPTIONS = (*TLS_FILES, "ssl_cert_reqs", "ssl_check_hostname")
TIMEOUT_OPTIONS = ("socket_timeout", "socket_connect_timeout")
CERT_REQS = ("none", "optional", "required")
_BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
_RETRY_OPTIONS = ("retry", "retry_on_timeout", "retry_on_error", "cluster_error_retry_attempts")

RedisClient: TypeAlias = "redis.Redis | RedisCluster | LazyCluster"


def no_retry() -> Retry:
    return Retry(NoBackoff(), 0)


def client_from_url(url: str, **overrides: Any) -> RedisClient:
    """A client for url (see the module's docstring); ValueError for a bad URL."""
    parsed = parse(url)
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
    options = _connection_options(parsed, overrides)
    options["retry"] = AsyncRetry(NoBackoff(), 0)
    if parsed.cluster:
        return AsyncRedisCluster(
            startup_nodes=[AsyncClusterNode(host, port) for host, port in parsed.hosts], **options
        )
    if parsed.sentinel:
        sentinel_options: dict[str, Any] = {
            "socket_timeout": options["socket_timeout"],
            "socket_connect_timeout": options["socket_connect_timeout"],
            "retry": AsyncRetry(NoBackoff(), 0),
        }
        if parsed.tls:
            sentinel_options["ssl"] = True
            sentinel_options.update({key: value for key, value in options.items() if key in TLS_OPTIONS})
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
    sentinel_options: dict[str, Any] = {
        "socket_timeout": master["socket_timeout"],
        "socket_connect_timeout": master["socket_connect_timeout"],
        "retry": no_retry(),
    }
    if parsed.tls:
        sentinel_options["ssl"] = True
        sentinel_options.update({key: value for key, value in master.items() if key in TLS_OPTIONS})
    sentinel = untyped(Sentinel)(parsed.hosts, sentinel_kwargs=sentinel_options)
    assert parsed.service is not None
    client: redis.Redis = sentinel.master_for(parsed.service, **master)
    return client


# -- parsing ---------------------------------------------------------------------


class ParsedURL:
    """What a storage URL says, checked; ``hosts`` as (host, port) pairs."""

    def __init__(self, scheme: str) -> None:
        self.scheme = scheme
        self.tls = scheme.startswith("rediss")
        self.cluster = scheme.endswith("+cluster")
        self.sentinel = scheme.endswith("+sentinel")
        self.hosts: list[tuple[str, int]] = []
        self.unix_path: str | None = None
        self.username: str | None = None
        self.password: str | None = None
        self.db: int | None = None
        self.service: str | None = None
        self.options: dict[str, Any] = {}


def redact(url: str) -> str:
    """url without its password: everything between :// and the last @ but the user name.

    Hides more than the password when a query value holds an @, never less.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    userinfo, _, tail = rest.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}://{user}:***@{tail}" if colon else f"{scheme}://***@{tail}"


def parse(url: str) -> ParsedURL:
    """Check url and say what it asks for; ValueError naming what is wrong."""
    if not isinstance(url, str):
        raise TypeError(f"a Redis URL must be a str (got {type(url).__name__})")
    shown = repr(redact(url))
    known = ", ".join(f"{scheme}://" for scheme in SCHEMES)
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"Redis URL {shown} has no scheme: use one of {known}")
    parsed = ParsedURL(scheme.lower())
    if parsed.scheme not in SCHEMES:
        raise ValueError(f"unsupported Redis URL scheme {scheme + '://'!r} in {shown}: use one of {known}")
    rest = rest.partition("#")[0]
    netloc_end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, rest = rest[:netloc_end], rest[netloc_end:]
    path, _, query = rest.partition("?")
    userinfo, at, hostlist = netloc.rpartition("@")
    if at:
        # "user@host": a user name alone, as redis-py reads it
        user, colon, password = userinfo.partition(":")
        parsed.username = unquote(user) or None
        parsed.password = unquote(password) if colon and password else None
    if parsed.scheme == "unix":
        _parse_unix(parsed, hostlist, path, shown)
    else:
        _parse_hosts(parsed, hostlist, shown)
        _parse_path(parsed, path, shown)
    _parse_query(parsed, query, shown)
    return parsed


def _parse_unix(parsed: ParsedURL, hostlist: str, path: str, shown: str) -> None:
    if hostlist:
        raise ValueError(f"unix:// URL {shown} names a host ({hostlist!r}): use unix:///path/to/socket")
    if not path or path == "/":
        raise ValueError(f"unix:// URL {shown} has no socket path: use unix:///path/to/socket")
    parsed.unix_path = unquote(path)


def _parse_hosts(parsed: ParsedURL, hostlist: str, shown: str) -> None:
    default_port = DEFAULT_SENTINEL_PORT if parsed.sentinel else DEFAULT_PORT
    many = parsed.cluster or parsed.sentinel
    if not hostlist:
        if many:
            raise ValueError(
                f"{parsed.scheme}:// URL {shown} lists no host: use {parsed.scheme}://host:port,host:port"
                + ("/SERVICE[/DB]" if parsed.sentinel else "")
            )
        parsed.hosts = [("localhost", default_port)]  # as redis-py reads redis://
        return
    items = hostlist.split(",")
    if len(items) > 1 and not many:
        raise ValueError(
            f"{parsed.scheme}:// URL {shown} lists {len(items)} hosts: use one, "
            f"or redis+cluster:// / redis+sentinel:// for several"
        )
    for item in items:
        parsed.hosts.append(_host_port(item, default_port, parsed.scheme, shown))


def _host_port(item: str, default_port: int, scheme: str, shown: str) -> tuple[str, int]:
    if item.startswith("["):  # [IPv6]:port
        host, bracket, after = item[1:].partition("]")
        if not bracket or (after and not after.startswith(":")):
            raise ValueError(f"bad host {item!r} in {shown}: write an IPv6 address as [::1]:6379")
        has_port, port_text = bool(after), after[1:]
    else:
        host, colon, port_text = item.partition(":")
        has_port = bool(colon)
    host = unquote(host)
    if not host:
        raise ValueError(f"empty host in {shown}: each of {scheme}:// hosts is host[:port]")
    if not has_port:
        return host, default_port
    if not (port_text.isdigit() and port_text.isascii() and 1 <= int(port_text) <= 65535):
        raise ValueError(f"bad port {port_text!r} for host {host!r} in {shown}: use a number from 1 to 65535")
    return host, int(port_text)


def _parse_path(parsed: ParsedURL, path: str, shown: str) -> None:
    parts = [unquote(part) for part in path.split("/")[1:]] if path else []
    if parts and parts[-1] == "":
        parts.pop()  # a trailing slash
    if parsed.sentinel:
        usage = f"use {parsed.scheme}://host:port,host:port/SERVICE[/DB]"
        if not parts or not parts[0]:
            raise ValueError(f"{parsed.scheme}:// URL {shown} has no service name: {usage}")
        if len(parts) > 2:
            raise ValueError(f"{parsed.scheme}:// URL {shown} has too many path parts: {usage}")
        parsed.service = parts[0]
        parsed.db = _db(parts[1], shown) if len(parts) == 2 else 0
        return
    if len(parts) > 1:
        raise ValueError(f"{parsed.scheme}:// URL {shown} has too many path parts: the path is /DB")
    if parts:
        parsed.db = _db(parts[0], shown)
    if parsed.cluster and parsed.db:
        raise ValueError(
            f"{parsed.scheme}:// URL {shown} asks for database {parsed.db}: a cluster has only db 0"
        )
    if parsed.cluster:
        parsed.db = None  # RedisCluster refuses a db argument, even 0


def _db(text: str, shown: str) -> int:
    if not (text.isdigit() and text.isascii()):
        raise ValueError(f"bad database number {text!r} in {shown}: use a number >= 0")
    return int(text)


def _parse_query(parsed: ParsedURL, query: str, shown: str) -> None:
    seen: set[str] = set()
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key in seen:
            raise ValueError(f"option {key!r} given twice in {shown}")
        seen.add(key)
        parsed.options.update(_option(parsed, key, value, shown))
    if "db" in parsed.options:
        db = parsed.options.pop("db")
        if parsed.db is not None and parsed.db != db:
            raise ValueError(f"{shown} names database {parsed.db} in its path and {db} in db=")
        parsed.db = db


def _option(parsed: ParsedURL, key: str, value: str, shown: str) -> dict[str, Any]:
    if key in TIMEOUT_OPTIONS:
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not 0 < seconds < 1:
            raise ValueError(
                f"{key}={value!r} in {shown}: a breaker's client must answer or fail in under "
                f"a second (use a number of seconds above 0 and below 1)"
            )
        return {key: seconds}
    if key == "client_name":
        return {key: value}
    if key == "db":
        if parsed.cluster or parsed.sentinel:
            where = "a cluster has only database 0" if parsed.cluster else "the path is /SERVICE[/DB]"
            raise ValueError(f"option 'db' in {shown} does not apply to {parsed.scheme}://: {where}")
        return {key: _db(value, shown)}
    if key in TLS_OPTIONS:
        if not parsed.tls:
            tls_scheme = parsed.scheme.replace("redis", "rediss", 1)
            hint = f"use {tls_scheme}://" if tls_scheme != parsed.scheme else "TLS needs a rediss scheme"
            raise ValueError(f"TLS option {key!r} in {shown}, which is not a TLS URL: {hint}")
        if key in TLS_FILES:
            if not os.path.exists(value):
                raise ValueError(f"{key}: no such file or directory {value!r} (in {shown})")
            return {key: value}
        if key == "ssl_cert_reqs":
            if value.lower() not in CERT_REQS:
                raise ValueError(f"ssl_cert_reqs={value!r} in {shown}: use one of {', '.join(CERT_REQS)}")
            return {key: value.lower()}
        if value.lower() not in _BOOLEANS:
            raise ValueError(f"{key}={value!r} in {shown}: use true or false")
        return {key: _BOOLEANS[value.lower()]}
    if key in _RETRY_OPTIONS:
        raise ValueError(
            f"option {key!r} in {shown}: breaker_redis clients never retry (the store-health gate "
            f"decides what happens after a failed command)"
        )
    known = ["client_name", *TIMEOUT_OPTIONS]
    if not (parsed.cluster or parsed.sentinel):
        known.append("db")
    if parsed.tls:
        known.extend(TLS_OPTIONS)
    raise ValueError(f"unknown option {key!r} in {shown}: {parsed.scheme}:// takes {', '.join(known)}")


def describe(client: Any) -> str:
    """Where a client points, for messages and thread names (never its password; no
    I/O: a cluster client not made yet is named by its startup nodes)."""
    if isinstance(client, LazyCluster):
        if client.built() is None:
            startup = client._kwargs["startup_nodes"]
            return "cluster " + ",".join(sorted(f"{n.host}:{n.port}" for n in startup))
        client = client.built()
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
