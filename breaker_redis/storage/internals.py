"""The internals of redis-py and fakeredis that breaker_redis relies on, all in this module.

Their public APIs do not cover a few things the product needs: waiting on the event
subscription's socket without reading it, handing an asyncio connection's transport
to a protocol of our own, forgetting a cluster node's connections after a fork,
ordering the sentinels redis-py asks, packing a chunk of commands with each argument
encoded once, and fakeredis's server writing a published message before the
publisher's reply (the embedded server). Each function below says what it stands in
for and why nothing public does. Every other module calls these functions;
tests/system/test_packaging.py fails if one touches these internals itself.

Each function checks what it relies on. Where an internal is gone it uses the
public way when there is one (slower, or less exact, said in its docstring), or
raises ``UnsupportedVersion``, which names the library, the installed version and
the range breaker_redis declares (storage/versions.py, which reads the installed
metadata). At import of this module, a redis-py or fakeredis outside that range
(the requirements in pyproject.toml) gets one WARNING: a newer minor release
usually works, and the user is told plainly which versions this release was
tested with.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import redis

from breaker_redis.storage.versions import check_versions, declared_range, unsupported

# The first fakeredis whose TCP server the embedded server builds on (FakeRedisConnection
# in fakeredis._clients, FakeSocket in fakeredis._socket, encode_reply).
EMBEDDED_FAKEREDIS = "2.39"


# -- redis-py, sync ---------------------------------------------------------------------


def connection_socket(connection: Any) -> Any:
    """What a redis-py connection reads its replies from: its socket (a ``socket.socket``)
    on a real server, fakeredis's FakeSocket in process, None while not connected. A new
    object after every reconnect.

    Nothing public gives it. The event subscription waits for that socket to be
    readable (epoll) without reading it, so that "nothing readable and the lock free"
    means nothing received is undelivered (storage/invalidation.py), and it tells a
    reconnect redis-py made by itself (a new socket: messages may have been missed).
    redis-py's ``can_read()`` reads into the connection's buffer, which only the
    thread holding the subscription's lock may do."""
    if connection is None:
        return None
    if not isinstance(connection, redis.connection.AbstractConnection):
        return None  # not redis-py's: its socket is unknown, its callers read under the lock
    try:
        return connection._sock
    except AttributeError:
        raise unsupported("redis", "Connection._sock (the event subscription's socket)") from None


def fake_readable(connection: Any) -> Callable[[float], bool] | None:
    """For fakeredis's in-process connection (no socket to poll): whether a reply or
    message waits, without reading it; None for any other connection.

    fakeredis's selector answers from the connection's reply queue. Its public
    ``can_read`` gives the same answer but reconnects a closed connection, which a
    check made outside the subscription's lock must not do: it is the fallback only
    if the selector is gone. Either wait ends when the connection is closed (its
    socket's close wakes the selector), which is how ``Link.interrupt`` wakes a
    listener waiting on it (tests/storage/test_internals.py checks it)."""
    if connection is None or not type(connection).__module__.startswith("fakeredis"):
        return None
    check = getattr(getattr(connection, "_selector", None), "check_can_read", None)
    if callable(check):
        return check  # type: ignore[no-any-return]
    can_read: Callable[[float], bool] = connection.can_read
    return can_read


def sentinel_list(pool: Any) -> list[Any]:
    """The sentinels a Sentinel-managed pool asks for the master, in the order it asks
    them: redis-py's own list (``sentinel_manager.sentinels``), for ``prefer_sentinel``.

    No public API orders them; redis-py asks them in this list's order and moves the
    first that answers to its front (``Sentinel.discover_master``)."""
    sentinels = getattr(getattr(pool, "sentinel_manager", None), "sentinels", None)
    if not isinstance(sentinels, list):
        raise unsupported("redis", "SentinelConnectionPool.sentinel_manager.sentinels, a list")
    return sentinels


def prefer_sentinel(sentinels: list[Any], sentinel: Any) -> None:
    """Have redis-py ask ``sentinel`` first from now on (the one that announced a
    switch already knows the new master; another may lag a moment): the swap redis-py
    itself makes when a sentinel answers. Nothing when it is not in the list."""
    with contextlib.suppress(ValueError):
        index = sentinels.index(sentinel)
        sentinels[0], sentinels[index] = sentinels[index], sentinels[0]


def pooled_connection(pool: Any) -> Any:
    """A connection of a redis-py pool for a caller that sends and reads on it itself.
    ``get_connection`` takes no command name from redis-py 5.3 on; before, it needs one."""
    try:
        return pool.get_connection()
    except TypeError:  # redis-py < 5.3
        return pool.get_connection("FCALL")


def send_commands(connection: Any, commands: Iterable[Sequence[Any]]) -> None:
    """Write commands on a redis-py connection without reading their replies.

    They are packed here with the connection's encoder (its encoding, and how it
    turns a value into bytes), each distinct argument encoded once: the calls of one
    chunk share most of theirs (the function, the channel, the time, the config), and
    redis-py's ``pack_commands`` encoding each argument of 2,000 read calls anew took
    about a quarter of a Prometheus scrape's time. Without an encoder of that shape,
    ``pack_commands`` (the public way, the same bytes) packs them."""
    encoder = getattr(connection, "encoder", None)
    if all(hasattr(encoder, name) for name in ("encoding", "encoding_errors", "encode")):
        packed = pack(encoder, commands)
    else:
        packed = connection.pack_commands(list(commands))
    connection.send_packed_command(packed, False)


def pack(encoder: Any, commands: Iterable[Sequence[Any]]) -> list[bytes]:
    """The commands in Redis's protocol, the bytes redis-py's ``pack_commands`` writes."""
    encoding, errors = encoder.encoding, encoder.encoding_errors
    encoded: dict[Any, bytes] = {}  # by the str, or by (type, value): 1 and 1.0 are sent differently
    out = []
    for command in commands:
        out.append(b"*%d\r\n" % len(command))
        for arg in command:
            text_arg = type(arg) is str
            key = arg if text_arg else (type(arg), arg)
            piece = encoded.get(key)
            if piece is None:
                data = arg.encode(encoding, errors) if text_arg else encoder.encode(arg)
                piece = encoded[key] = b"$%d\r\n%s\r\n" % (len(data), data)
            out.append(piece)
    return [b"".join(out)]  # (send_packed_command takes a list of buffers)


def forget_shard_channel(pubsub: Any, channel: str | bytes | None) -> None:
    """Make redis-py forget a sharded channel it did not unsubscribe itself (the server
    dropped it: the slot moved), so it does not subscribe it again on a reconnect.

    redis-py forgets a channel only on the SUNSUBSCRIBE it sent; its record is the
    ``shard_channels`` dict, keyed as its ``_normalize_keys`` writes them. If it is
    gone, there is nothing to forget here (at worst a reconnect subscribes it again,
    and the server answers MOVED)."""
    channels = getattr(pubsub, "shard_channels", None)
    encoder = getattr(pubsub, "encoder", None)
    if isinstance(channels, dict) and encoder is not None and channel is not None:
        channels.pop(encoder.decode(encoder.encode(channel)), None)


# -- redis-py, asyncio --------------------------------------------------------------------


def detach_stream(connection: Any) -> asyncio.StreamWriter:
    """Take a connected redis-py asyncio connection's stream away from it: the returned
    writer's transport is the caller's (to give it a protocol of its own); the
    connection is left as if never connected, nothing closed.

    Nothing public hands over a connection made with the client's AUTH, TLS, unix
    socket or Sentinel master. The event subscription needs its bytes the moment the
    loop reads them (asyncio/invalidation.py); redis-py's reader delivers them only
    when a task awaits it."""
    try:
        writer, reader = connection._writer, connection._reader
    except AttributeError:
        raise unsupported("redis", "redis.asyncio.Connection._writer / _reader (its stream)") from None
    if not isinstance(writer, asyncio.StreamWriter) or not isinstance(reader, asyncio.StreamReader):
        raise ConnectionError("the connection for the subscription is not a plain stream")
    if len(getattr(reader, "_buffer", b"")):  # replies redis-py read and has not handed over
        raise ConnectionError("the connection for the subscription holds unread replies")
    connection._writer = connection._reader = None
    return writer


def forget_node_connections(node: Any) -> None:
    """Forget the connections of a redis-py asyncio cluster node without closing them:
    closing needs the event loop that opened them (gone, or the parent's after a fork).

    The node's pool is its own two lists; it offers only closing them (``disconnect``,
    a coroutine on the old loop)."""
    connections, free = getattr(node, "_connections", None), getattr(node, "_free", None)
    if not isinstance(connections, list) or not callable(getattr(free, "clear", None)):
        raise unsupported("redis", "redis.asyncio.cluster.ClusterNode._connections / _free")
    connections.clear()
    free.clear()  # type: ignore[union-attr]


# -- fakeredis: the embedded server ----------------------------------------------------


def embedded_range() -> str:
    """The fakeredis versions the embedded server runs on: from EMBEDDED_FAKEREDIS to the
    declared upper bound."""
    upper = [clause for clause in (declared_range("fakeredis") or "").split(",") if clause.startswith("<")]
    return ",".join([f">={EMBEDDED_FAKEREDIS}", *upper])


class FakeClient:
    """One TCP client's connection into a fakeredis server whose every reply, published
    message and notification goes to ``deliver`` the moment it is produced, from the
    thread that produced it (see breaker_redis/embedded.py for why).

    fakeredis's own TCP server queues them for the connection's thread. Its
    connection and socket classes are extended here: the socket's ``put_response``
    (the one place a connection is handed anything) calls ``deliver``."""

    def __init__(self, server: Any, client_info: dict[str, Any], deliver: Callable[[Any], None]) -> None:
        wire_socket, wire_connection, self._encode = fake_wire()
        self._connection = wire_connection(server=server, client_info=client_info, protocol=2)
        # Connecting runs redis-py's handshake (CLIENT SETINFO) through the queue;
        # only what comes after it goes to deliver.
        fake = self._socket = self._connection.get_socket()
        while self._connection.can_read():
            with contextlib.suppress(redis.exceptions.RedisError):
                self._connection.read_response()
        if not isinstance(fake, wire_socket) or not hasattr(fake, "_killed"):
            raise unsupported("fakeredis", "FakeSocket._killed", embedded_range())
        self.protocol()  # checked now, not in the thread of a published message
        fake.deliver = deliver

    def protocol(self) -> int:
        """The RESP version the client speaks now (2 until its HELLO 3)."""
        version = getattr(getattr(self._socket, "_client_info", None), "protocol_version", None)
        if not isinstance(version, int):
            raise unsupported("fakeredis", "FakeSocket._client_info.protocol_version", embedded_range())
        return version

    def encode(self, value: Any) -> bytes:
        """A reply or message in the client's protocol (TypeError for a value fakeredis cannot encode)."""
        return self._encode(value, self.protocol())

    @property
    def killed(self) -> bool:
        """CLIENT KILL named this client."""
        return bool(self._socket._killed)

    def feed(self, data: bytes) -> None:
        """Bytes from the client: the commands in them run, their replies go to deliver."""
        self._socket.sendall(data)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._connection.disconnect()


@functools.cache
def fake_wire() -> tuple[type[Any], type[Any], Callable[[Any, int], bytes]]:
    """fakeredis's socket and connection classes extended to deliver at once, and its
    reply encoder; UnsupportedVersion for a fakeredis whose server is built otherwise."""
    try:
        from fakeredis._clients._sync import FakeRedisConnection
        from fakeredis._clients._tcp_server import encode_reply
        from fakeredis._socket import FakeSocket
    except ImportError:
        raise unsupported(
            "fakeredis",
            "fakeredis._clients and fakeredis._socket (the embedded server)",
            embedded_range(),
        ) from None
    if not callable(getattr(FakeSocket, "put_response", None)) or not callable(
        getattr(FakeRedisConnection, "_connect", None)
    ):
        raise unsupported(
            "fakeredis", "FakeSocket.put_response and FakeRedisConnection._connect", embedded_range()
        )

    class WireSocket(FakeSocket):
        deliver: Any = None  # set once the internal handshake is done

        def put_response(self, msg: Any) -> None:
            deliver = self.deliver
            if deliver is None:
                super().put_response(msg)
            elif self.responses is not None:  # None once closed: a late message for a gone client
                deliver(msg)

    class WireConnection(FakeRedisConnection):
        def _connect(self) -> Any:
            assert self._server is not None  # given by the embedded server
            return WireSocket(
                self._server,
                client_class=self._client_class,
                db=self.db,
                lua_modules=self._lua_modules,
                client_info=self._client_info,
            )

    return WireSocket, WireConnection, encode_reply


check_versions()
