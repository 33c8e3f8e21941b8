"""The event subscription of an asyncio worker (see breaker_redis/storage/invalidation.py).

The sync side's boundary rests on one ordering: by the time the call that
made a change returns, the change's message is in every subscriber's
socket, and a worker delivers what its socket holds before it decides from
memory. On an event loop nothing may read a socket synchronously, so the
subscription here is an ``asyncio.Protocol``: the loop hands it every chunk
the moment it reads one, and it parses and delivers the messages in that
same callback, with no buffer in between that a reader task has yet to
empty. Before deciding from memory a worker then only has to ask whether
anything is still unread: bytes in the kernel socket (one ``poll(0)``) or a
message cut in half. If so, it asks Redis instead (``pending``); it never
waits for the loop to get round to the read.

The connection is made by redis-py (AUTH, TLS and unix sockets as the
client has them) and then taken over: its transport is given this protocol
before SUBSCRIBE is sent. A client that is not a plain redis-py asyncio
client (a fake server) gets no subscription: its workers ask Redis at
every call, which is exact. On Redis Cluster the subscription is one per
master, on sharded channels (breaker_redis/asyncio/sharded.py).
"""

from __future__ import annotations

import asyncio
import logging
import select
from typing import Any, Protocol

from breaker_redis.base.background import LoopTask
from breaker_redis.storage.acks import PING_WORD, Lease, is_lease_pong, pong_payload
from breaker_redis.storage.internals import detach_stream
from breaker_redis.storage.invalidation import EventSubscriber
from breaker_redis.storage.scripts import text

log = logging.getLogger("breaker_redis")


class _Resp:
    """Just enough RESP2/RESP3 to read pub/sub messages: arrays (or pushes) of
    bulk strings, integers and simple strings."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[list[Any]]:
        self.buffer += data
        messages: list[list[Any]] = []
        while True:
            parsed = self._array(0)
            if parsed is None:
                return messages
            message, end = parsed
            del self.buffer[:end]
            messages.append(message)

    def _line(self, at: int) -> tuple[bytes, int] | None:
        end = self.buffer.find(b"\r\n", at)
        return None if end < 0 else (bytes(self.buffer[at:end]), end + 2)

    def _array(self, at: int) -> tuple[list[Any], int] | None:
        header = self._line(at)
        if header is None:
            return None
        line, at = header
        if line[:1] == b"$" and line[1:].isdigit():
            # a lone bulk string (a PING's answer on RESP3), as a lone simple string reads
            size = int(line[1:])
            if len(self.buffer) < at + size + 2:
                return None
            return ["+" + bytes(self.buffer[at : at + size]).decode("utf-8", "replace")], at + size + 2
        if line[:1] not in (b"*", b">"):
            # an error reply or a lone value (a server that refused SUBSCRIBE): surface it
            return [line.decode("utf-8", "replace")], at
        items: list[Any] = []
        for _ in range(int(line[1:])):
            item = self._line(at)
            if item is None:
                return None
            line, at = item
            if line[:1] == b"$":
                size = int(line[1:])
                if size < 0:
                    items.append(None)
                    continue
                if len(self.buffer) < at + size + 2:
                    return None
                items.append(bytes(self.buffer[at : at + size]))
                at += size + 2
            else:
                items.append(line[1:])
        return items, at


class SubscriptionOwner(Protocol):
    """Who a subscription delivers to: AsyncInvalidator here, or per master on a cluster
    (breaker_redis/asyncio/sharded.py)."""

    def handle(self, subscription: Subscription, message: list[Any]) -> None: ...
    def finished(self, subscription: Subscription) -> None: ...


class Subscription(asyncio.Protocol):
    """One subscription connection, taken over from redis-py (``take_over``)."""

    def __init__(self, owner: SubscriptionOwner, transport: Any) -> None:
        self._owner = owner
        self._resp = _Resp()
        self.transport = transport
        self.stream: Any = None
        self.lost: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        self._poller: Any = None
        self.lease = Lease()  # how long what it delivered may be trusted (storage/acks.py)
        raw = transport.get_extra_info("socket")
        if raw is not None:
            self._poller = select.poll()
            self._poller.register(raw.fileno(), select.POLLIN)

    def data_received(self, data: bytes) -> None:
        try:
            messages = self._resp.feed(data)
        except ValueError as exc:  # not RESP: nothing it says can be trusted
            self.transport.close()
            self._finish(exc)
            return
        for message in messages:
            self._owner.handle(self, message)

    def eof_received(self) -> bool | None:
        return None  # close

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(exc or ConnectionError("the subscription's connection was closed"))

    def _finish(self, exc: BaseException | None) -> None:
        self.lease.ended()
        self._owner.finished(self)
        if not self.lost.done():
            self.lost.set_result(exc)

    def send(self, *args: str) -> None:
        """Write one command (SUBSCRIBE, SSUBSCRIBE) on the connection."""
        parts = [arg.encode() for arg in args]
        bulks = b"".join(b"$%d\r\n%s\r\n" % (len(part), part) for part in parts)
        self.transport.write(b"*%d\r\n%s" % (len(parts), bulks))

    def ping(self) -> None:
        """Send the lease's PING, unless too many are unanswered."""
        if not self.lost.done() and self.lease.sending():
            self.send("PING", PING_WORD)

    def pong(self, data: Any) -> None:
        """A PONG was read: if it answers the lease's PING, the lease runs on."""
        if is_lease_pong(data):
            self.lease.answered()

    async def watch(self) -> BaseException | None:
        """Until the connection ends (what ended it), pinging it when the lease asks."""
        while True:
            done, _ = await asyncio.wait([self.lost], timeout=self.lease.wait())
            if done:
                return self.lost.result()
            self.ping()

    def unread(self) -> bool:
        """Whether something received is not delivered yet (see the module's docstring)."""
        if self._resp.buffer:
            return True
        if self._poller is None:
            return True
        try:
            return bool(self._poller.poll(0))  # readable, hung up, or closed (POLLNVAL)
        except (OSError, ValueError):
            return True


class AsyncInvalidator(EventSubscriber):
    """The one subscription of an event loop on a single Redis (or a Sentinel's master)."""

    def __post_init__(self) -> None:
        self._subscription: Subscription | None = None
        self.keeper = LoopTask(self._keep)

    def ensure_running(self) -> None:
        self.keeper.start()

    def pending(self) -> bool:
        """Whether a message may have arrived that is not delivered yet: then memory does not decide."""
        subscription = self._subscription
        return subscription is not None and subscription.unread()

    def resubscribe(self) -> None:
        """Leave the subscription (its server stopped being the master: Sentinel named
        another). Workers ask Redis until the keeper task has subscribed again, on the
        master the pool names now."""
        self.healthy = False
        subscription = self._subscription
        if subscription is not None:
            subscription.transport.close()
        self.on_subscribed()

    def reset(self) -> None:
        """A new event loop or process: the old subscription belongs to the old one."""
        self.keeper.forget()
        self._subscription = None
        self.healthy = False

    async def close(self) -> None:
        subscription, self._subscription = self._subscription, None
        self.healthy = False
        if subscription is not None:
            subscription.transport.close()
        await self.keeper.stop()

    # -- the keeper task -------------------------------------------------------

    async def _keep(self) -> None:
        delay = 0.1
        while True:
            try:
                subscription = await self._subscribe()
                exc = await subscription.watch()
                if self._subscription is subscription:
                    self._subscription = None
                if exc is not None:
                    log.info("event subscription lost (%s); asking Redis at every call", exc)
                delay = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.healthy = False
                log.debug("could not subscribe to events (%s)", exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _subscribe(self) -> Subscription:
        subscription = await take_over(self.client.connection_pool.make_connection(), self)
        subscription.send("SUBSCRIBE", self.channel, self.legacy_channel)
        subscription.ping()  # its PONG starts the lease
        self._subscription = subscription
        return subscription

    def listener(self, name: str) -> AsyncInvalidator:
        """What a breaker checks: on one server, the one subscription."""
        return self

    def finished(self, subscription: Subscription) -> None:
        self.healthy = False

    def handle(self, subscription: Subscription, message: list[Any]) -> None:
        kind = text(message[0]).lower() if message else ""
        pong = pong_payload(kind, message)
        if pong is not None:
            subscription.pong(pong)
            if subscription is self._subscription:
                self.leased(subscription.lease)
            return
        whole = kind != "message" or len(message) >= 3  # a message: kind, channel, data
        channel = text(message[1]) if len(message) > 1 else ""
        if (whole and self.event(kind, message[-1] if message else None, channel)) or kind == "unsubscribe":
            return
        log.info("the event subscription got %r; asking Redis at every call", message)
        subscription.transport.close()


async def take_over(connection: Any, owner: SubscriptionOwner) -> Subscription:
    """Connect a redis-py connection (AUTH, TLS, a unix socket, the Sentinel's master:
    as the client has them) and give its transport to a Subscription."""
    await connection.connect()
    # the transport is the subscription's from now on; the redis-py connection lets go of it
    writer = detach_stream(connection)
    transport = writer.transport
    subscription = Subscription(owner, transport)
    # a StreamWriter closes its transport when it is collected: keep it while the transport lives
    subscription.stream = writer
    transport.set_protocol(subscription)
    return subscription


def can_listen(client: Any) -> bool:
    """Whether the client's connections are real sockets this module can take over."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or not hasattr(pool, "make_connection"):
        return False
    from redis.asyncio.connection import AbstractConnection

    connection_class = getattr(pool, "connection_class", None)
    if not (isinstance(connection_class, type) and issubclass(connection_class, AbstractConnection)):
        return False
    # an in-process fake has no socket (a Sentinel-managed connection is followed to
    # the new master by breaker_redis/asyncio/failover.py)
    return not connection_class.__module__.startswith("fakeredis")
