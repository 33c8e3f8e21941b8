"""breaker_redis/storage/internals.py, the one module that touches redis-py's and
fakeredis's internals: each function against the real thing (the session's
redis-server, fakeredis's server), what happens when the internal is gone (the
public fallback, or UnsupportedVersion naming the library, its version and the
supported range), and the warning for a library outside the declared range."""

from __future__ import annotations

import asyncio
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.sentinel

from breaker_redis.asyncio.invalidation import Subscription, take_over
from breaker_redis.storage import internals
from breaker_redis.storage.internals import UnsupportedVersion

ROOT = Path(__file__).resolve().parents[2]
REDIS = internals.installed_version("redis")
FAKEREDIS = internals.installed_version("fakeredis")


def said_unsupported(exc: UnsupportedVersion, library: str, version: str | None, needed: str) -> None:
    message = str(exc)
    assert message.startswith(f"{library} {version} has no ")
    assert needed in message
    assert f", which breaker_redis needs; this breaker_redis supports {library}>=" in message


# -- versions ------------------------------------------------------------------------


def test_the_declared_range_is_read_from_the_requirements():
    requires = ["redis>=5.0,<9", "fakeredis[lua] >= 2.26, <3", 'flask>=2.3; extra == "flask"']
    assert internals.declared_range("redis", requires) == ">=5.0,<9"
    assert internals.declared_range("fakeredis", requires) == ">=2.26,<3"
    assert internals.declared_range("flask", requires) == ">=2.3"
    assert internals.declared_range("lupa", requires) is None
    # installed metadata lists a range's clauses in its own order: the floor comes first
    assert internals.declared_range("redis", ["redis<9,>=5.0"]) == ">=5.0,<9"


def test_the_installed_libraries_are_in_the_range_breaker_redis_declares():
    for library in internals.LIBRARIES:
        spec = internals.declared_range(library)
        assert spec is not None and spec.startswith(">="), (library, spec)
        version = internals.installed_version(library)
        assert version is not None and internals.in_range(version, spec), (library, version, spec)
    assert internals.check_versions() == []


@pytest.mark.parametrize(
    ("version", "spec", "inside"),
    [
        ("5.0.0", ">=5.0,<9", True),
        ("8.9.12", ">=5.0,<9", True),
        ("4.6.0", ">=5.0,<9", False),
        ("9.0.0", ">=5.0,<9", False),
        ("9.0.0b1", ">=5.0,<9", False),
        ("2.39.0", ">=2.39", True),
        ("2.38.9", ">=2.39", False),
        ("5.3.1", ">=5.0,!=5.3.1", False),
        ("7.0.0", "", True),
    ],
)
def test_in_range(version, spec, inside):
    assert internals.in_range(version, spec) is inside


def test_a_library_outside_the_range_gets_one_warning_naming_both_versions(caplog):
    declared = {"redis": ">=5.0,<9", "fakeredis": ">=2.26,<3"}
    with caplog.at_level(logging.WARNING, logger="breaker_redis"):
        said = internals.check_versions(
            installed={"redis": "9.1.0", "fakeredis": "2.41.0"}.get, declared=declared.get
        )
    assert len(said) == 1
    assert [record.getMessage() for record in caplog.records] == said
    assert caplog.records[0].levelno == logging.WARNING
    assert said[0].startswith("redis 9.1.0 is installed; this breaker_redis supports redis>=5.0,<9.")
    inside = {"redis": "8.1.0", "fakeredis": "2.41.0"}
    assert internals.check_versions(installed=inside.get, declared=declared.get) == []


def test_importing_breaker_redis_with_redis_outside_the_range_warns_once_and_runs(tmp_path, redis_server):
    """A redis distribution whose metadata says 4.6.0, first on the path: the import
    says so once on stderr, and the product still works."""
    info = tmp_path / "redis-4.6.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: redis\nVersion: 4.6.0\n")
    program = (
        "import breaker_redis, redis\n"
        f"client = redis.Redis(port={redis_server.port})\n"
        "b = breaker_redis.Breakers(client, prefix='versions', listen=False)\n"
        "print(b.get('pay').state)\n"
        "b.close()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "closed"
    declared = internals.declared_range("redis")
    warning = f"redis 4.6.0 is installed; this breaker_redis supports redis{declared}."
    assert out.stderr.count(warning) == 1, out.stderr
    assert "fakeredis" not in out.stderr


def test_the_error_for_a_missing_internal_names_the_library_its_version_and_the_range(caplog):
    with caplog.at_level(logging.ERROR, logger="breaker_redis"):
        exc = internals.unsupported("redis", "Thing._gone (for a test)")
        again = internals.unsupported("redis", "Thing._gone (for a test)")
    said_unsupported(exc, "redis", REDIS, "Thing._gone (for a test)")
    assert str(again) == str(exc)
    assert [record.getMessage() for record in caplog.records] == [str(exc)]  # logged once


# -- redis-py, sync ------------------------------------------------------------------


def test_connection_socket_is_the_subscription_socket_and_changes_on_reconnect(redis_server):
    client = redis_server.client()
    pubsub = client.pubsub()
    assert internals.connection_socket(pubsub.connection) is None  # not connected yet
    pubsub.subscribe("internals-test")
    first = internals.connection_socket(pubsub.connection)
    assert isinstance(first, socket.socket)
    assert first.getpeername()[1] == redis_server.port
    pubsub.connection.disconnect()
    pubsub.connection.connect()
    second = internals.connection_socket(pubsub.connection)
    assert isinstance(second, socket.socket) and second is not first
    pubsub.close()
    client.close()


def test_connection_socket_of_other_connections():
    fake = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    pubsub = fake.pubsub()
    pubsub.subscribe("internals-test")
    assert internals.connection_socket(pubsub.connection) is not None  # fakeredis's FakeSocket
    assert not isinstance(internals.connection_socket(pubsub.connection), socket.socket)
    assert internals.connection_socket(object()) is None  # not redis-py's: unknown
    pubsub.close()


def test_connection_socket_gone_from_redis_py_is_a_clear_error():
    connection = redis.Connection(port=1)
    del connection._sock
    with pytest.raises(UnsupportedVersion) as raised:
        internals.connection_socket(connection)
    said_unsupported(raised.value, "redis", REDIS, "Connection._sock")


def test_fake_readable_sees_a_waiting_message_without_reading_it():
    fake = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    pubsub = fake.pubsub()
    pubsub.subscribe("internals-test")
    readable = internals.fake_readable(pubsub.connection)
    assert readable is not None
    assert readable(0)  # the confirmation waits
    assert readable(0)  # still: it was not read
    assert pubsub.get_message(timeout=0)["type"] == "subscribe"
    assert not readable(0)
    fake.publish("internals-test", "hello")
    assert readable(0)
    assert pubsub.get_message(timeout=0)["data"] == b"hello"
    assert internals.fake_readable(redis.Connection(port=1)) is None
    assert internals.fake_readable(None) is None
    pubsub.close()


def test_a_wait_of_fake_readable_ends_when_its_connection_closes():
    """How Breakers.close() wakes a listener waiting on fakeredis in process
    (Link.interrupt): a wait of an hour ends with the connection's close."""
    fake = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    pubsub = fake.pubsub()
    pubsub.subscribe("internals-test")
    assert pubsub.get_message(timeout=0)["type"] == "subscribe"
    readable = internals.fake_readable(pubsub.connection)
    assert readable is not None
    waited: list[Any] = []
    waiter = threading.Thread(target=lambda: waited.append(readable(3600)), daemon=True)
    waiter.start()
    time.sleep(0.1)  # in the wait now (or in a moment: then it finds the connection closed)
    pubsub.close()
    waiter.join(5)
    assert not waiter.is_alive() and waited == [False]


def test_fake_readable_without_the_selector_falls_back_to_can_read():
    """(This fakeredis's own can_read asks the same selector, so with it gone here
    can_read cannot answer either: what is checked is the choice of the fallback.)"""
    fake = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    pubsub = fake.pubsub()
    pubsub.subscribe("internals-test")
    connection = pubsub.connection
    connection._selector = None
    assert internals.fake_readable(connection) == connection.can_read
    pubsub.close()


def test_sentinel_list_is_redis_py_s_own_and_prefer_sentinel_reorders_it():
    manager = redis.sentinel.Sentinel([("127.0.0.1", 1), ("127.0.0.1", 2), ("127.0.0.1", 3)])
    pool = manager.master_for("svc").connection_pool
    sentinels = internals.sentinel_list(pool)
    assert sentinels is manager.sentinels
    ports = [s.connection_pool.connection_kwargs["port"] for s in sentinels]
    assert ports == [1, 2, 3]
    internals.prefer_sentinel(sentinels, sentinels[2])
    assert [s.connection_pool.connection_kwargs["port"] for s in manager.sentinels] == [3, 2, 1]
    internals.prefer_sentinel(sentinels, object())  # not one of them: nothing changes
    assert [s.connection_pool.connection_kwargs["port"] for s in manager.sentinels] == [3, 2, 1]


def test_sentinel_list_gone_is_a_clear_error():
    pool = redis.sentinel.Sentinel([("127.0.0.1", 1)]).master_for("svc").connection_pool
    pool.sentinel_manager.sentinels = tuple(pool.sentinel_manager.sentinels)  # not a list we can reorder
    with pytest.raises(UnsupportedVersion) as raised:
        internals.sentinel_list(pool)
    said_unsupported(raised.value, "redis", REDIS, "sentinel_manager.sentinels")


COMMANDS = [
    ("FCALL", "f_read", 2, "p:{ünï}:state", "p:{ünï}:cfg", "ünï", 1, 1.0, "1", b"1", b"", "", 0),
    ("FCALL", "f_read", 2, "p:{a}:state", "p:{a}:cfg", "a", 1.0, 1, b"1", "1", "", b"", 12345678901234),
    ("EVALSHA", "ab" * 20, 0, 2.5, -3, "ünï"),
]


def test_pack_writes_the_bytes_redis_py_packs():
    """Each distinct argument encoded once: the same bytes as redis-py's pack_commands,
    for arguments equal across types (1, 1.0, "1", b"1"), repeated, non-ASCII, empty,
    and with the client's own encoding."""
    for client in (redis.Redis(), redis.Redis(encoding="latin-1")):
        conn = client.connection_pool.make_connection()
        assert internals.pack(conn.encoder, COMMANDS) == [b"".join(conn.pack_commands(COMMANDS))]
    with pytest.raises(redis.exceptions.DataError):  # as redis-py: a bool is no argument
        internals.pack(redis.Redis().connection_pool.make_connection().encoder, [("FCALL", True)])


@pytest.mark.parametrize("encoder", ["its own", "gone"])
def test_send_commands_on_a_pooled_connection(redis_server, encoder):
    """Commands sent at once, replies read after: with the connection's encoder, or
    without one of that shape (the public pack_commands)."""
    client = redis_server.client()
    pool = client.connection_pool
    conn = internals.pooled_connection(pool)
    try:
        if encoder == "gone":
            conn.encoder = object()
        commands = [("SET", "internals:ünï", 1.5), ("GET", "internals:ünï"), ("ECHO", b"x")]
        internals.send_commands(conn, commands)
        assert [conn.read_response() for _ in range(3)] == [b"OK", b"1.5", b"x"]
    finally:
        pool.release(conn)
        client.close()


@pytest.mark.parametrize("decode", [False, True])
def test_forget_shard_channel(redis_server, decode):
    client = redis_server.client(decode_responses=decode)
    pubsub = client.pubsub()
    pubsub.ssubscribe("internals:{a}", "internals:{b}")
    assert len(pubsub.shard_channels) == 2
    internals.forget_shard_channel(pubsub, "internals:{a}")
    internals.forget_shard_channel(pubsub, None)
    assert list(pubsub.shard_channels) == ["internals:{b}" if decode else b"internals:{b}"]
    internals.forget_shard_channel(pubsub, b"internals:{b}")
    assert pubsub.shard_channels == {}
    internals.forget_shard_channel(object(), "internals:{a}")  # nothing to forget
    pubsub.close()
    client.close()


# -- redis-py, asyncio ---------------------------------------------------------------


class Received:
    def __init__(self) -> None:
        self.messages: list[list[Any]] = []
        self.ended = False

    def handle(self, subscription: Subscription, message: list[Any]) -> None:
        self.messages.append(message)

    def finished(self, subscription: Subscription) -> None:
        self.ended = True


def test_detach_stream_hands_the_connection_over(redis_server):
    async def run() -> None:
        client = redis.asyncio.Redis(port=redis_server.port)
        connection = client.connection_pool.make_connection()
        owner = Received()
        subscription = await take_over(connection, owner)  # connect, then detach_stream
        assert not connection.is_connected  # redis-py let go of it
        subscription.send("SUBSCRIBE", "internals-async")
        deadline = asyncio.get_running_loop().time() + 10
        while not owner.messages and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        assert owner.messages == [[b"subscribe", b"internals-async", b"1"]]
        await client.publish("internals-async", "hello")
        while len(owner.messages) < 2 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        assert owner.messages[1] == [b"message", b"internals-async", b"hello"]
        subscription.transport.close()
        assert await asyncio.wait_for(subscription.lost, 10) is not None
        assert owner.ended
        await client.aclose()

    asyncio.run(run())


def test_detach_stream_of_a_connection_not_connected_or_without_streams():
    connection = redis.asyncio.Connection(port=1)
    with pytest.raises(ConnectionError, match="not a plain stream"):
        internals.detach_stream(connection)  # not connected: no stream to hand over
    del connection._writer
    with pytest.raises(UnsupportedVersion) as raised:
        internals.detach_stream(connection)
    said_unsupported(raised.value, "redis", REDIS, "redis.asyncio.Connection._writer")


def test_forget_node_connections_leaves_them_open_and_the_node_makes_new_ones(redis_server):
    async def run() -> None:
        node = redis.asyncio.cluster.ClusterNode("127.0.0.1", redis_server.port)
        connection = node.acquire_connection()
        await connection.connect()
        node.release(connection)
        internals.forget_node_connections(node)
        assert connection.is_connected  # not closed: that needs the loop that opened it
        fresh = node.acquire_connection()
        assert fresh is not connection
        await connection.disconnect()

    asyncio.run(run())


def test_forget_node_connections_gone_is_a_clear_error():
    node = redis.asyncio.cluster.ClusterNode("127.0.0.1", 1)
    del node._free
    with pytest.raises(UnsupportedVersion) as raised:
        internals.forget_node_connections(node)
    said_unsupported(raised.value, "redis", REDIS, "ClusterNode._connections / _free")


# -- fakeredis: the embedded server --------------------------------------------------


def wire(server: fakeredis.FakeServer, out: list[tuple[str, bytes]], name: str) -> internals.FakeClient:
    holder: list[internals.FakeClient] = []
    address = {"addr": ("127.0.0.1", 1), "laddr": ("127.0.0.1", 2)}
    client = internals.FakeClient(server, address, lambda m: out.append((name, holder[0].encode(m))))
    holder.append(client)
    return client


def command(*args: str) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args)


def test_a_published_message_is_delivered_before_the_publisher_s_reply():
    server = fakeredis.FakeServer()
    out: list[tuple[str, bytes]] = []
    subscriber, publisher = wire(server, out, "subscriber"), wire(server, out, "publisher")
    subscriber.feed(command("SUBSCRIBE", "ch"))
    assert out == [("subscriber", b"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n")]
    out.clear()
    publisher.feed(command("PUBLISH", "ch", "hi"))
    message = b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n"
    assert out == [("subscriber", message), ("publisher", b":1\r\n")]
    out.clear()
    publisher.feed(command("HELLO", "3"))
    assert publisher.protocol() == 3
    publisher.feed(command("PING"))
    assert out[-1] == ("publisher", b"+PONG\r\n")
    subscriber.close()
    publisher.close()


def test_client_kill_marks_the_fake_client_killed():
    server = fakeredis.FakeServer()
    out: list[tuple[str, bytes]] = []
    victim, killer = wire(server, out, "victim"), wire(server, out, "killer")
    victim.feed(command("CLIENT", "ID"))
    victim_id = out[-1][1].strip(b":\r\n").decode()
    assert not victim.killed
    killer.feed(command("CLIENT", "KILL", "ID", victim_id))
    assert out[-1] == ("killer", b":1\r\n")
    assert victim.killed
    killer.close()


def test_a_fake_client_without_its_protocol_is_a_clear_error():
    client = wire(fakeredis.FakeServer(), [], "client")
    del client._socket._client_info
    with pytest.raises(UnsupportedVersion) as raised:
        client.protocol()
    said_unsupported(raised.value, "fakeredis", FAKEREDIS, "FakeSocket._client_info.protocol_version")
    assert f"supports fakeredis>={internals.EMBEDDED_FAKEREDIS}" in str(raised.value)


@pytest.mark.processes
def test_a_fakeredis_built_otherwise_stops_the_embedded_server_at_start():
    """A fakeredis without the modules the embedded server builds on (those before
    2.39): one clear error when the server starts, not at its first client."""
    program = (
        "import sys, fakeredis\n"
        "sys.modules['fakeredis._socket'] = None  # as if fakeredis had no such module\n"
        "from breaker_redis.embedded import EmbeddedServer\n"
        "from breaker_redis.storage.internals import UnsupportedVersion\n"
        "try:\n"
        "    EmbeddedServer(port=0).start()\n"
        "except UnsupportedVersion as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    needed = "fakeredis._clients and fakeredis._socket (the embedded server)"
    assert out.stdout.startswith(f"fakeredis {FAKEREDIS} has no {needed}, which breaker_redis needs; ")
    assert "this breaker_redis supports fakeredis>=2.39" in out.stdout


def test_the_embedded_server_serves_through_the_seam(embedded):
    """End to end over TCP: the subscriber's message is readable by the time the
    publisher has its reply (the embedded server's promise)."""
    publisher = redis.Redis.from_url(embedded.url)
    pubsub = redis.Redis.from_url(embedded.url).pubsub()
    pubsub.subscribe("internals-tcp")
    assert pubsub.get_message(timeout=5)["type"] == "subscribe"
    sock = internals.connection_socket(pubsub.connection)
    for i in range(20):
        publisher.publish("internals-tcp", str(i))
        readable, _, _ = select.select([sock], [], [], 0)  # no wait: it is there already
        assert readable == [sock], i
        assert pubsub.get_message(timeout=1)["data"] == str(i).encode()
    pubsub.close()
    publisher.close()
