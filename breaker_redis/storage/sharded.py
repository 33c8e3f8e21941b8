"""The event subscription of a worker on Redis Cluster: one connection per master.

On a single server every worker subscribes to ``<prefix>:events``
(invalidation.py). On Redis Cluster a PUBLISH reaches a subscription held
on another master over the cluster bus, after the script's reply, which
would break the boundary. So each script also publishes on its breaker's
sharded channel (SPUBLISH on ``<prefix>:{NAME}:notices``, in the breaker's
slot: lua/_lib.lua ``notify``), and the breaker's master writes that message
to its own subscribers in the same event-loop pass as the reply: the single
server's ordering, per master (docs/boundary.md).

A process holds one subscription connection per master (a ``Link``, read
exactly as the single server's: drained by the deciding thread, read by one
listener thread, under one lock per connection), subscribed to the channels
of the breakers this process has built. Each breaker has a ``Channel``,
trusted once its master confirmed the SSUBSCRIBE; until then, and whenever
it is lost, the breaker asks Redis at every call.

Confirmed is not enough: a replica accepts SSUBSCRIBE for its master's
slots (Redis serves sharded pub/sub on every node of the shard), and hears
the master's messages over the cluster bus, after the publishing script's
reply. A worker whose slot map is a moment out of date after a failover
subscribes again on the old master, which by then is a replica, and would
trust a channel that hears a trip late. So a confirmed channel is trusted
only once its node, asked ``ROLE`` after it confirmed, says it is a master
(``Channels._verified``): a node that later loses the slot unsubscribes its
subscribers first (``sunsubscribe``, below), so from then on nothing of the
slot's is published where the worker does not hear it in order. A node
that says it is a replica is left, and the map read again.

The breaker forgets what it knew, and its channel is subscribed again on
the master the slot map names then, when:

- the master pushes ``sunsubscribe`` (it no longer serves the slot: a
  resharding or a failover moved it);
- SSUBSCRIBE is answered ``MOVED`` (the map was out of date; it is read again);
- a script call for its slot is answered ``MOVED`` (cluster.Slots);
- the connection fails, or the client re-made it by itself.

A script call answered ``ASK`` (a migration under way) makes it forget only:
cluster.py says why that is enough.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import redis

from breaker_redis.base.background import BackgroundThread
from breaker_redis.storage import acl, invalidation
from breaker_redis.storage.acks import Leased
from breaker_redis.storage.cluster import notices_channel
from breaker_redis.storage.internals import connection_socket, forget_shard_channel
from breaker_redis.storage.invalidation import Link, OnMessage
from breaker_redis.storage.notices import parse_notice
from breaker_redis.storage.scripts import Scripts, text

log = logging.getLogger("breaker_redis")


# the connection a channel is subscribed on: a Link here, a Subscription in asyncio
X = TypeVar("X", bound=Leased)


class Channel(Generic[X]):
    """One breaker's subscription, as its breaker uses it: ``healthy`` once the master
    now serving the breaker confirmed it, and the ``connection`` it was made on."""

    __slots__ = ("_healthy", "channel", "connection", "name", "slot", "trust_until")

    def __init__(self, name: str, channel: str, slot: int) -> None:
        self.name = name
        self.channel = channel
        self.slot = slot
        self.connection: X | None = None
        # Until when memory may decide (time.monotonic): the lease of its master's connection
        # while the channel is trusted there, else 0.0. A plain attribute (the healthy call reads
        # it), kept by the setter below and by leased().
        self.trust_until = 0.0
        self._healthy = False

    @property
    def healthy(self) -> bool:
        return self._healthy

    @healthy.setter
    def healthy(self, value: bool) -> None:
        self._healthy = value
        self.leased()

    def leased(self) -> None:
        """Its connection's lease ran on, or the channel was trusted or left there."""
        connection = self.connection
        self.trust_until = connection.lease.until if connection is not None and self._healthy else 0.0

    def drain(self) -> None:
        """Deliver, in this thread, what the connection of this breaker's master holds (sync)."""
        link = self.connection
        if isinstance(link, Link):
            link.drain()


class Channels(Generic[X]):
    """The channels of the breakers one process uses on a cluster, and what happens to
    them whatever their connections are: what ShardedInvalidator and the asyncio
    one (breaker_redis/asyncio/sharded.py) share. ``_lock`` guards the bookkeeping
    (a threading.Lock on the sync side, a null context on an event loop)."""

    channel_class: type[Channel[X]] = Channel

    def __init__(
        self,
        scripts: Scripts,
        on_message: OnMessage,
        on_forget: Callable[[list[str]], None],
    ) -> None:
        """The channels of the breakers of scripts (its client, slot map and key prefix)."""
        assert scripts.slots is not None
        self._lock: Any = self._new_lock()
        self._client, self._slots, self._scripts = scripts.client, scripts.slots, scripts
        self._on_message, self._on_forget = on_message, on_forget
        self._channels: dict[str, Channel[X]] = {}  # by breaker name
        self._by_channel: dict[str, Channel[X]] = {}  # by channel name
        self._wanted: set[str] = set()  # breaker names to subscribe (again)
        self._unverified: list[Channel[X]] = []  # confirmed; its node not yet seen a master since
        self._refresh = False  # read the slot map again before subscribing
        self._slots.listeners.append(self._redirected)
        self._started()

    def _new_lock(self) -> Any:
        return threading.Lock()

    def _started(self) -> None:
        """The side's own state, once the channels' is made."""

    def listener(self, name: str) -> Channel[X]:
        """The breaker's channel, subscribed in the background once that runs (no I/O here)."""
        with self._lock:
            channel = self._channels.get(name)
            if channel is None:
                slot = self._slots.slot(self._scripts.route_key(name))
                channel = self.channel_class(name, notices_channel(self._scripts.prefix, name), slot)
                self._channels[name] = self._by_channel[channel.channel] = channel
                self._wanted.add(name)
        self._wake()
        return channel

    @property
    def healthy(self) -> bool:
        """Every breaker built so far is subscribed on its master."""
        channels = list(self._channels.values())
        return bool(channels) and all(channel.healthy for channel in channels)

    def _wake(self) -> None:
        """The background subscriber has something to do."""

    def _forget_connections(self) -> None:
        """A new process or event loop: every channel is subscribed again there."""
        self._wanted = set(self._channels)
        self._unverified = []
        for channel in self._channels.values():
            channel.healthy, channel.connection = False, None

    def _unsubscribed(self, channel: Channel[X]) -> None:
        """Not trusted until subscribed again, on the master the map names then. Holds _lock."""
        channel.healthy, channel.connection = False, None
        self._wanted.add(channel.name)

    def _redirected(self, slot: int, moved: bool) -> None:
        """cluster.Slots: a script call for slot was answered MOVED (moved) or ASK."""
        channels = [c for c in list(self._channels.values()) if c.slot == slot]
        if moved:
            with self._lock:
                for channel in channels:
                    self._unsubscribed(channel)
                self._refresh = True
            self._wake()
        self._on_forget([channel.name for channel in channels])

    def _by_master(self, wanted: set[str]) -> tuple[dict[str, tuple[Any, list[Channel[X]]]], list[str]]:
        """The channels to subscribe grouped by the master serving them ({name: (node,
        channels)}), and the breakers whose slots no master serves."""
        by_master: dict[str, tuple[Any, list[Channel[X]]]] = {}
        unserved = []
        for name in wanted:
            channel = self._channels[name]
            node = self._slots.owner(channel.slot)
            if node is None:
                unserved.append(name)
            else:
                by_master.setdefault(node.name, (node, []))[1].append(channel)
        return by_master, unserved

    def _not_done(self, by_master: dict[str, tuple[Any, list[Channel[X]]]], failed: str) -> None:
        """Subscribing on master failed: its channels and those of the masters after it
        (in by_master's order) are wanted again."""
        masters = list(by_master)
        with self._lock:
            for master in masters[masters.index(failed):]:
                self._wanted.update(channel.name for channel in by_master[master][1])

    def _handled(self, connection: X, kind: str, channel_name: str, data: Any) -> bool:
        """A message, confirmation or unsubscription read on connection; False if it is
        none of those (an error, an unknown kind)."""
        if kind == "smessage":
            notice = parse_notice(data)  # never raises: a hostile message must not end the subscription
            if notice is not None:
                self._on_message(notice)
            return True
        if kind == "pong":
            connection.pong(data)
            for held in list(self._channels.values()):
                if held.connection is connection:
                    held.leased()
            return True
        if kind not in ("ssubscribe", "sunsubscribe"):
            return False
        channel = self._by_channel.get(channel_name)
        if channel is None or channel.connection is not connection:
            return True  # a channel since subscribed elsewhere
        if kind == "ssubscribe":  # trusted once its node says it is a master (_verified)
            with self._lock:
                self._unverified.append(channel)
            self._wake()
        else:  # the master no longer serves the slot
            with self._lock:
                self._unsubscribed(channel)
                self._refresh = True
            self._on_forget([channel.name])
            self._wake()
        return True

    def _to_verify(self) -> list[tuple[X, list[Channel[X]]]]:
        """The channels confirmed since the last check, by connection (those since
        subscribed elsewhere left out): each connection's node is then asked ROLE."""
        with self._lock:
            confirmed, self._unverified = self._unverified, []
        by_connection: dict[int, tuple[X, list[Channel[X]]]] = {}
        for channel in confirmed:
            connection = channel.connection
            if connection is not None and not channel.healthy:
                by_connection.setdefault(id(connection), (connection, []))[1].append(channel)
        return list(by_connection.values())

    def _verified(self, connection: X, channels: list[Channel[X]], role: Any) -> bool:
        """The node of connection answered ROLE after it confirmed channels: if it is a
        master, they are trusted from now on (see the module's docstring); False if not
        (the caller leaves the connection: its channels are subscribed again)."""
        if text(role[0] if isinstance(role, (list, tuple)) and role else role) != "master":
            return False
        # what was learned before may have missed messages: forgotten before trusting
        self._on_forget([channel.name for channel in channels])
        with self._lock:  # not trusted if it was unsubscribed meanwhile (_unsubscribed)
            for channel in channels:
                if channel.connection is connection:
                    channel.healthy = True
        return True

    def _idle(self, connections: list[X]) -> list[X]:
        """Those of connections that no channel uses any more: closed by the caller, so
        that a node left behind (a master demoted to replica, a subscription its channel
        since made elsewhere after a MOVED) does not keep subscribers that nobody reads."""
        with self._lock:
            used = {id(channel.connection) for channel in self._channels.values()}
        return [connection for connection in connections if id(connection) not in used]

    def _not_verified(self, channels: list[Channel[X]]) -> None:
        """Asking ROLE failed: the channels are checked again at the next attempt."""
        with self._lock:
            self._unverified.extend(channels)

    def _moved_away(self, connection: X, slot: int) -> list[Channel[X]]:
        """An SSUBSCRIBE answered MOVED: the channels of that slot on connection go where
        the map says once it is read again."""
        moved = []
        with self._lock:
            for channel in list(self._channels.values()):
                if channel.connection is connection and channel.slot == slot and not channel.healthy:
                    self._unsubscribed(channel)
                    moved.append(channel)
            self._refresh = True
        self._wake()
        return moved

    def _connection_ended(self, connection: X) -> list[Channel[X]]:
        """Its channels are subscribed again, where the map says; the breakers forget."""
        with self._lock:
            gone = [c for c in self._channels.values() if c.connection is connection]
            for channel in gone:
                self._unsubscribed(channel)
            self._refresh = True
        if gone:
            self._on_forget([channel.name for channel in gone])
            self._wake()
        return gone


class ShardedInvalidator(Channels[Link]):
    def _started(self) -> None:
        self.thread = BackgroundThread(self._loop, "breaker-redis-events", wake=self._wake)
        self._permission = acl.PermissionLog(self._client, self._scripts.prefix, "the event subscription")
        self.after_fork()

    def after_fork(self) -> None:
        """A new process: the parent's connections are the parent's; every channel is
        subscribed again by this process's listener."""
        self.thread.after_fork()
        self._lock = threading.Lock()  # the bookkeeping; never held while a socket is read
        self._links: dict[str, Link] = {}  # by master ('host:port')
        self._nodes: dict[str, Any] = {}  # the node of each link, by the same name
        self._forget_connections()
        self._retry_at, self._delay = 0.0, 0.1
        self._wake_r, self._wake_w = socket.socketpair()  # the listener's poll wakes on a byte
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    def ensure_running(self) -> None:
        self.thread.start()

    def drain(self) -> None:
        """Deliver what every connection holds (Channel.drain is one breaker's)."""
        for link in list(self._links.values()):
            link.drain()

    # -- the listener thread ---------------------------------------------------------

    def _loop(self) -> None:
        while not self.thread.stopped():
            try:
                self._subscribe_wanted()
                self._verify()
                for link in self._idle(list(self._links.values())):
                    self.lost(link, None)
            except Exception as exc:
                self._failed(exc)
            self._wait()
        for link in list(self._links.values()):
            self.lost(link, None)
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # full (it wakes anyway), closed, or not made yet
            self._wake_w.send(b"x")

    def _wait(self) -> None:
        """Until a connection is readable (then read it), a wake-up, or WAIT_SECONDS."""
        links = list(self._links.values())
        poller = select.poll()
        poller.register(self._wake_r.fileno(), select.POLLIN)
        by_fd: dict[int, Link] = {}
        for link in links:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                fd = link.socket.fileno()
                poller.register(fd, select.POLLIN)
                by_fd[fd] = link
        timeout = invalidation.WAIT_SECONDS  # a wake-up (close(), a breaker to subscribe) ends it
        for link in links:
            timeout = min(timeout, link.lease.wait())
        if self._wanted:
            timeout = min(timeout, max(0.0, self._retry_at - time.monotonic()))
        if len(by_fd) < len(links):
            timeout = min(timeout, 0.05)  # a transport this cannot poll: read it every 50 ms
        ready = {fd for fd, _ in poller.poll(timeout * 1000)}
        if self._wake_r.fileno() in ready:
            with contextlib.suppress(OSError):
                self._wake_r.recv(4096)
        polled = {id(link) for fd, link in by_fd.items() if fd not in ready}
        for link in links:
            if id(link) not in polled:  # readable, or not pollable
                with link.lock:
                    link.read_all()
            if link.lease.wait() == 0:
                with link.lock:
                    link.ping()

    def _subscribe_wanted(self) -> None:
        if not self._wanted or time.monotonic() < self._retry_at:
            return
        cluster = self._slots.cluster()
        if self._refresh:
            self._refresh = False
            cluster.nodes_manager.initialize()
        with self._lock:
            wanted, self._wanted = self._wanted, set()
        by_master, unserved = self._by_master(wanted)
        for master, (node, channels) in by_master.items():
            try:
                self._subscribe(cluster, master, node, channels)
            except BaseException:
                self._not_done(by_master, master)
                raise
        if unserved:  # a slot no master serves (yet): again after a backoff
            with self._lock:
                self._wanted.update(unserved)
            raise redis.exceptions.ClusterDownError(f"{len(unserved)} breakers' slots served by no master")
        self._delay = 0.1

    def _subscribe(self, cluster: Any, master: str, node: Any, channels: list[Channel[Link]]) -> None:
        link = self._links.get(master)
        if link is None or link.closed:
            pubsub = cluster.get_redis_connection(node).pubsub()
            link = self._links[master] = Link(pubsub, self, threading.Lock())
            self._nodes[master] = node
        with link.lock:
            for channel in channels:
                channel.healthy, channel.connection = False, link
            try:
                for channel in channels:  # one command each: SSUBSCRIBE takes channels of one slot
                    link.pubsub.ssubscribe(channel.channel)
            except Exception as exc:
                self.lost(link, exc)
                raise
            link.ping()  # its PONG (after the confirmations) starts the lease
            if link.socket is not connection_socket(link.pubsub.connection):
                link.attach()  # a new connection
            link.read_all()

    def _verify(self) -> None:
        """ROLE to the node of each connection whose channels were confirmed: trusted if
        it is a master, else the connection is left (see the module's docstring)."""
        for link, channels in self._to_verify():
            master = next((name for name, held in self._links.items() if held is link), None)
            if master is None:
                continue  # lost meanwhile: its channels are wanted again
            try:
                role = self._slots.cluster().get_redis_connection(self._nodes[master]).execute_command("ROLE")
            except Exception:
                self._not_verified(channels)
                raise
            if not self._verified(link, channels, role):
                self.lost(link, None)
                raise ConnectionError(f"{master} is no longer a master; reading the slot map again")

    def _failed(self, exc: BaseException) -> None:
        """Subscribing failed (a master down, a map out of date): again after a backoff."""
        self._permission.note(exc)
        self._refresh = True
        self._retry_at = time.monotonic() + self._delay
        self._delay = min(self._delay * 2, 5.0)
        log.debug("could not subscribe to the breakers' channels (%s)", exc)

    # -- what a link reports (under its lock) ------------------------------------------

    def handle(self, link: Link, message: dict[str, Any]) -> None:
        kind, channel = text(message.get("type")), text(message.get("channel"))
        if kind == "sunsubscribe":  # redis-py forgets only the channels it was asked to leave
            forget_shard_channel(link.pubsub, message.get("channel"))
        self._handled(link, kind, channel, message.get("data"))

    def refused(self, link: Link, exc: BaseException) -> bool:
        """An SSUBSCRIBE answered MOVED: the connection stays (Channels._moved_away).
        Anything else ends it."""
        if not isinstance(exc, redis.exceptions.MovedError):
            return False
        for channel in self._moved_away(link, exc.slot_id):
            forget_shard_channel(link.pubsub, channel.channel)
        return True

    def reconnected(self, link: Link) -> None:
        """The client re-made the connection by itself: start it afresh instead."""
        raise ConnectionError("the subscription's connection was re-made")

    def lost(self, link: Link, exc: BaseException | None) -> None:
        if exc is not None:
            if any(c.healthy and c.connection is link for c in self._channels.values()):
                log.info("event subscription lost (%s); asking Redis at every call", exc)
            self._permission.note(exc)
        with self._lock:
            for master, held in list(self._links.items()):
                if held is link:
                    del self._links[master]
        link.close()
        self._connection_ended(link)
