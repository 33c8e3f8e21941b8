"""The event subscription of a worker on Redis Cluster: one connection per master.

On a single server every worker subscribes to ``<prefix>:events``
(invalidation.py). On Redis Cluster a PUBLISH reaches a subscription held
on another master over the cluster bus, after the script's reply, which
would break the boundary. So each script also publishes on its breaker's
sharded channel (SPUBLISH on ``<prefix>:{NAME}:notices``, in the breaker's
slot: lua/includes/notify.lua ``notify``), and the breaker's master writes that message
to its own subscribers in the same event-loop pass as the reply: the single
server's ordering, per master (docs/boundary.md).

A process holds one subscription connection per master (a ``Link``, read
exactly as the single server's: drained by the deciding thread, read by one
listener thread, under one lock per connection), subscribed to the channels
of the breakers this process has built. Each breaker has a ``Channel``,
trusted once its master confirmed the SSUBSCRIBE; until then, and whenever
it is lost, the breaker asks Redis at every call. Those books are kept the
same way on the asyncio side: channels.py holds them; this module, the
thread and its sockets.

Confirmed is not enough: a replica accepts SSUBSCRIBE for its master's
slots (Redis serves sharded pub/sub on every node of the shard), and hears
the master's messages over the cluster bus, after the publishing script's
reply. A worker whose slot map is a moment out of date after a failover
subscribes again on the old master, which by then is a replica, and would
trust a channel that hears a trip late. So a confirmed channel is trusted
only once its node, asked ``ROLE`` after it confirmed, says it is a master
(``channels.Channels._verified``): a node that later loses the slot unsubscribes its
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
from typing import Any, cast

import redis

from breaker_redis.base.background import BackgroundThread
from breaker_redis.base.blocking import run_sync
from breaker_redis.storage import acl, invalidation
from breaker_redis.storage.channels import Channel, Channels
from breaker_redis.storage.internals import connection_socket, forget_shard_channel
from breaker_redis.storage.invalidation import Link
from breaker_redis.storage.scripts import text

log = logging.getLogger("breaker_redis")


class LinkChannel(Channel[Link]):
    __slots__ = ()

    def drain(self) -> None:
        """Deliver, in this thread, what the connection of this breaker's master holds."""
        link = self.connection
        if link is not None:
            link.drain()


class ShardedInvalidator(Channels[Link]):
    channel_class = LinkChannel

    def _started(self) -> None:
        self.thread = BackgroundThread(self._loop, "breaker-redis-events", wake=self._wake)
        self._permission = acl.PermissionLog(self._client, self._scripts.prefix, "the event subscription")
        self.after_fork()

    def after_fork(self) -> None:
        """A new process: the parent's connections are the parent's; every channel is
        subscribed again by this process's listener."""
        self.thread.after_fork()
        self._lock = threading.Lock()  # the bookkeeping; never held while a socket is read
        self._connections: dict[str, Link] = {}  # by master ('host:port')
        self._nodes: dict[str, Any] = {}  # the node of each link, by the same name
        self._forget_connections()
        self._retry_at, self._delay = 0.0, 0.1
        self._wake_r, self._wake_w = socket.socketpair()  # the listener's poll wakes on a byte
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    def listener(self, name: str) -> LinkChannel:
        return cast(LinkChannel, super().listener(name))  # channel_class makes them

    def ensure_running(self) -> None:
        self.thread.start()

    def drain(self) -> None:
        """Deliver what every connection holds (Channel.drain is one breaker's)."""
        for link in list(self._connections.values()):
            link.drain()

    # -- the listener thread ---------------------------------------------------------

    def _loop(self) -> None:
        while not self.thread.stopped():
            try:
                self._subscribe_wanted()
                run_sync(self._verifying())
                for link in self._idle(list(self._connections.values())):
                    self.lost(link, None)
            except Exception as exc:
                self._failed(exc)
            self._wait()
        for link in list(self._connections.values()):
            self.lost(link, None)
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # full (it wakes anyway), closed, or not made yet
            self._wake_w.send(b"x")

    def _wait(self) -> None:
        """Until a connection is readable (then read it), a wake-up, or WAIT_SECONDS."""
        links = list(self._connections.values())
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
        link = self._connections.get(master)
        if link is None or link.closed:
            pubsub = cluster.get_redis_connection(node).pubsub()
            link = self._connections[master] = Link(pubsub, self, threading.Lock())
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

    async def _role(self, master: str) -> Any:  # blocking: run by run_sync (_loop)
        return self._slots.cluster().get_redis_connection(self._nodes[master]).execute_command("ROLE")

    def _leave(self, link: Link) -> None:
        self.lost(link, None)

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
        self._dropped(link)
        link.close()
        self._connection_ended(link)
