"""What a storage URL says, checked: the URL grammar the product takes, no client made.

The seam with breaker_redis/urls.py: this module reads and checks a URL (no
redis-py here), urls.py turns what it says into a client with a breaker's
timeouts. The CLI checks a URL with it before it connects anywhere.

URLs (a password is never shown in an error message)::

    redis://[[user]:password@]host[:port][/db][?option=value&...]
    rediss://...                           TLS, options below
    unix://[[user]:password@]/path/to/socket[?db=N]
    redis+cluster://[[user]:password@]host:port,host:port[/0]
    rediss+cluster://...                   TLS to every node
    redis+sentinel://[[user]:password@]host:port,host:port/SERVICE[/db]
    rediss+sentinel://...                  TLS to the sentinels and to the master
    memory://                              a fresh store in this process (tests, scripts)

A missing port is 6379 (26379 for a sentinel). With ``+sentinel`` the user and
password are the master's; the sentinels are asked without them. Query
options: ``client_name``; ``socket_timeout`` and ``socket_connect_timeout`` in
seconds, above 0 and below 1; ``db`` (``redis://``, ``rediss://``, ``unix://``);
with a ``rediss`` scheme ``ssl_ca_certs``, ``ssl_ca_path``, ``ssl_certfile``,
``ssl_keyfile`` (files that must exist), ``ssl_cert_reqs`` (none, optional,
required) and ``ssl_check_hostname`` (true or false). Anything else is refused
by name, retry options included: these clients never retry.

``memory://`` (spelt as the ``limits`` library spells its in-process storage)
is an in-process store running the same Lua scripts, private to the client
made from it: every ``memory://`` is a new, empty store that no other process
or client sees. It is for tests and scripts, so it takes nothing after the
scheme: a host, a path or an option there would suggest a shared store.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qsl, unquote

SCHEMES = (
    "redis",
    "rediss",
    "unix",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
    "memory",
)
DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379

TLS_FILES = ("ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile")
TLS_OPTIONS = (*TLS_FILES, "ssl_cert_reqs", "ssl_check_hostname")
TIMEOUT_OPTIONS = ("socket_timeout", "socket_connect_timeout")
CERT_REQS = ("none", "optional", "required")
_BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
_RETRY_OPTIONS = ("retry", "retry_on_timeout", "retry_on_error", "cluster_error_retry_attempts")


class ParsedURL:
    """What a storage URL says, checked; ``hosts`` as (host, port) pairs."""

    def __init__(self, scheme: str) -> None:
        self.scheme = scheme
        self.tls = scheme.startswith("rediss")
        self.cluster = scheme.endswith("+cluster")
        self.sentinel = scheme.endswith("+sentinel")
        self.memory = scheme == "memory"
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
    if parsed.memory:
        if rest:
            raise ValueError(
                f"memory:// URL {shown} has more after the scheme: use memory:// alone (each one "
                f"is a new, empty store in this process)"
            )
        return parsed
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
