"""What every check of ``breaker-redis doctor`` works from: the client, the
servers behind it and what each says about itself, read once.

Facts are read best effort: a server whose INFO is refused still tells its
version, mode and role through HELLO (which every user may send), and a
check that needs what neither gives says so instead of failing the others.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import redis
from redis.cluster import RedisCluster

from breaker_redis.engine.breakers import DEFAULT_TTL_SECONDS
from breaker_redis.storage import acl
from breaker_redis.storage.scripts import Scripts, text
from breaker_redis.urls import LazyCluster, untyped

# A check's lines: PROBLEM alone makes the exit code 1; WARN is a figure worth a
# look, NOTE a fact with a cost, SKIP a check not possible here.
OK, NOTE, WARN, SKIP, PROBLEM = "OK", "NOTE", "WARN", "SKIP", "PROBLEM"
Lines: TypeAlias = "list[tuple[str, str]]"  # (status, text) for each line of one check


@dataclass(frozen=True)
class Finding:
    """One line of the report."""

    status: str
    check: str
    text: str


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int("".join(c for c in part if c.isdigit()) or 0) for part in version.split("."))


@dataclass
class Server:
    """One Redis the breakers' keys live on (a cluster has one per master)."""

    label: str
    client: Any
    info: dict[str, Any] = field(default_factory=dict)  # INFO server, replication, memory merged
    hello: dict[str, str] = field(default_factory=dict)  # when INFO is refused

    def read(self) -> None:
        try:
            for section in ("server", "replication", "memory"):
                self.info.update(self.client.info(section))
        except redis.exceptions.ResponseError:
            self.info.clear()
            with contextlib.suppress(redis.exceptions.ResponseError):
                reply = self.client.execute_command("HELLO")
                if isinstance(reply, (list, tuple)):  # RESP2: a flat list of pairs
                    reply = dict(zip(reply[::2], reply[1::2], strict=False))
                self.hello = {text(key): text(value) for key, value in dict(reply).items()}

    def _fact(self, *info_keys: str, hello: str) -> str | None:
        found = next((self.info[k] for k in info_keys if self.info.get(k)), None) or self.hello.get(hello)
        return text(found) if found else None

    @property
    def product(self) -> str:
        name = self._fact("server_name", hello="server") or "redis"
        return "Redis" if name.lower() == "redis" else name.capitalize()

    @property
    def version(self) -> str | None:
        return self._fact("valkey_version", "redis_version", hello="version")

    @property
    def mode(self) -> str | None:
        return self._fact("redis_mode", "server_mode", hello="mode")

    @property
    def role(self) -> str | None:
        return self._fact("role", hello="role")

    @property
    def replica(self) -> bool:
        return self.role in ("slave", "replica")

    def has_functions(self) -> bool | None:
        """Redis Functions (FCALL) and sharded pub/sub (SPUBLISH) came together in
        Redis 7.0 (every Valkey has both); None when the version is unknown."""
        if self.version is None:
            return None
        return self.product != "Redis" or version_tuple(self.version) >= (7, 0)


class MissingDatabase(Exception):
    """The URL names a database index the server does not have (its ``databases``
    setting, 16 by default): the client can log in, but every command fails."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


class Checkup:
    """The client and prefix under check, and the servers behind the client."""

    def __init__(self, client: Any, prefix: str, where: str) -> None:
        self.client = client
        self.prefix = prefix
        self.where = where
        self.user = acl.user_of(client)
        self.who = repr(self.user or "default")
        self.scripts = Scripts(client, prefix, DEFAULT_TTL_SECONDS * 1000)
        self.cluster: RedisCluster | None = None
        self.servers: list[Server] = []

    def connect(self) -> None:
        """Reach the server(s): raises redis's ConnectionError or TimeoutError when
        one does not answer. A refused command is an answer (the permissions check
        says more)."""
        if isinstance(self.client, LazyCluster):
            self.cluster = self.client.connected()
        elif isinstance(self.client, RedisCluster):
            self.cluster = self.client
        if self.cluster is not None:
            nodes = untyped(self.cluster.get_primaries)()
            nodes.sort(key=lambda n: (n.host, n.port))
            self.servers = [Server(f"{n.host}:{n.port}", self.cluster.get_redis_connection(n)) for n in nodes]
        else:
            self.servers = [Server(self.where, self.client)]
        for server in self.servers:
            try:
                server.client.ping()
            except redis.exceptions.ResponseError as exc:
                if "DB index is out of range" in str(exc):
                    raise MissingDatabase(self.database) from exc
            server.read()

    @property
    def database(self) -> int:
        pool = getattr(self.client, "connection_pool", None)
        return int(getattr(pool, "connection_kwargs", {}).get("db") or 0)

    @property
    def functions(self) -> bool:
        """Whether the workers would run the scripts as Redis Functions here (not
        on a cluster, and not on a server known to lack them)."""
        return self.cluster is None and all(s.has_functions() is not False for s in self.servers)

    def setuser_line(self) -> str:
        return acl.setuser_line(self.prefix, self.user or "breaker", functions=self.functions)


def count(number: int, what: str) -> str:
    """3 masters, 1 replica."""
    return f"{number} {what}{'' if number == 1 else 's'}"
