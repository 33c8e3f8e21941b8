"""Keeps every worker's knowledge honest without asking Redis before each call.

One subscription per process to the workers' channel, ``<prefix>:notices:<db>``:
every script that changes a breaker (a transition, the breaker arming, a
force, a reset, a live-config write) publishes there. A message is a hint
(see knowledge.py): the worker forgets what it knew about that breaker and
asks Redis at its next call; then it acknowledges the message, and the call
that made the change waits for those acknowledgements (storage/acks.py).

Memory decides only while the subscription's lease runs: the listener pings
the connection every ``acks.PING_SECONDS``, and each PONG of its own extends
the lease to ``acks.LEASE_SECONDS`` after that PING was sent. Whatever is
readable is also delivered by the deciding thread before it decides
(``drain``), so a message already received never waits for the listener
thread to be scheduled; while the subscription is down, ``healthy`` is False
and workers ask Redis.

Every wait of the listener ends the moment ``close()`` (or a master's switch)
asks it to: the socket it waits on is shut down, an in-process connection
(fakeredis) is closed, and its backoff is the thread's stop Event. It never
sits out a timeout.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis

from breaker_redis.base.background import BackgroundThread
from breaker_redis.storage import acl
from breaker_redis.storage.acks import PING_WORD, Lease, is_lease_pong
from breaker_redis.storage.internals import connection_socket, fake_readable
from breaker_redis.storage.scripts import text
from breaker_redis.storage.subscriber import EventSubscriber

log = logging.getLogger("breaker_redis")

# How long the listener waits on its subscription before it looks again. Nothing
# depends on it: whatever needs the listener (close(), a master's switch, on a
# cluster a breaker to subscribe) wakes it at once.
WAIT_SECONDS = 1.0


@dataclass(eq=False, repr=False)  # a link is itself, not its fields
class Link:
    """One subscription connection, and how it is read (steps 3 and 5 of the boundary).

    Read by the deciding thread (``drain``) and by a listener thread, always under
    ``lock``, held from before a read until what was read is delivered: "nothing
    readable and the lock free" means nothing received is pending. The owner
    (``Invalidator`` here, ``ShardedInvalidator`` per master) is given each message,
    and is told when the client reconnected by itself (the socket changed:
    messages may have been missed) or the connection failed.

    ``readable(timeout)`` waits until something can be read, and ``interrupt()``
    ends that wait at once, whatever the transport: see there.
    """

    pubsub: Any
    owner: LinkOwner
    lock: threading.Lock
    # what follows is the link's own state, not given
    closed: bool = field(default=False, init=False)
    socket: Any = field(init=False)  # both set by attach()
    readable: Callable[[float], Any] = field(init=False)
    # how long what it delivered may be trusted (storage/acks.py)
    lease: Lease = field(default_factory=Lease, init=False)
    # ends the wait of a transport that cannot be polled
    _interrupted: threading.Event = field(default_factory=threading.Event, init=False)
    # one close of the connection at a time (interrupt, close)
    _closing: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self.attach()

    def attach(self) -> None:
        """Remember the socket and how to wait for it without reading it. Holds lock."""
        connection = self.pubsub.connection
        sock = connection_socket(connection)
        readable = fake_readable(connection)
        if readable is None and isinstance(sock, socket.socket):
            readable = _poll_for(sock)
        if readable is None or readable is _always:
            readable = self._often  # unknown transport, or closed already: drain() reads under the lock
        self.readable = readable
        self.socket = sock

    def _often(self, timeout: float) -> bool:
        """readable() of a transport that cannot be polled: yes, every 50 ms at most (a
        listener waiting here is woken by interrupt())."""
        if timeout > 0:
            self._interrupted.wait(min(timeout, 0.05))
        return True

    def drain(self) -> None:
        """Deliver, in this thread, every message received so far.

        Costs one non-blocking poll when nothing is waiting. Readability is
        checked before the lock: a message read by the listener but not yet
        delivered is covered by the lock it holds.
        """
        if not self.readable(0) and not self.lock.locked():
            return
        with self.lock:
            self.read_all()

    def ping(self) -> None:
        """Send the lease's PING, if one is due and not too many are unanswered. Holds lock."""
        if not self.closed and self.lease.sending():
            self.pubsub.ping(PING_WORD)

    def pong(self, data: Any) -> None:
        """A PONG was read: if it answers the lease's PING, the lease runs on."""
        if is_lease_pong(data):
            self.lease.answered()

    def read_all(self) -> None:
        """Read and deliver every message that has arrived. Holds lock."""
        if self.closed:
            return
        pubsub = self.pubsub
        try:
            while True:
                try:
                    message = pubsub.get_message(timeout=0)
                except redis.exceptions.ResponseError as exc:  # an error reply, read whole
                    if self.owner.refused(self, exc):
                        continue
                    raise
                if connection_socket(pubsub.connection) is not self.socket:
                    # the client reconnected and re-subscribed by itself: messages
                    # may have been missed, so nothing known is trusted until the
                    # new subscription is confirmed (perhaps by this very message)
                    self.lease.ended()
                    self.owner.reconnected(self)
                    self.attach()
                if message is not None:
                    self.owner.handle(self, message)
                elif not _buffered(pubsub):
                    break  # None can also mean a health-check PONG with more behind it
        except Exception as exc:
            self.owner.lost(self, exc)

    def interrupt(self) -> None:
        """Stop reading it and wake a thread waiting for it to be readable, at once.

        Under the lock, so a message being handled is done first, and nothing reads
        it afterwards. A socket is then shut down, which ends a wait on it, but not
        closed (closing it under an epoll wait would leave the wait asleep): the
        waiting thread closes it. A connection without one (fakeredis in process,
        whose wait ends when its connection closes) is closed here."""
        with self.lock:
            self.closed = True
            self.readable = _never
            self.lease.ended()
            sock = self.socket
        self._interrupted.set()
        if isinstance(sock, socket.socket):
            shut_down(sock)
        else:
            self.close()

    def close(self) -> None:
        """Stop reading it (drain returns at once) and close the connection."""
        self.closed = True
        self.readable = _never
        self.lease.ended()
        with self._closing, contextlib.suppress(Exception):
            self.pubsub.close()


class LinkOwner(Protocol):
    def handle(self, link: Link, message: dict[str, Any]) -> None: ...
    def refused(self, link: Link, exc: BaseException) -> bool: ...
    def reconnected(self, link: Link) -> None: ...
    def lost(self, link: Link, exc: BaseException | None) -> None: ...


class Invalidator(EventSubscriber):
    """The one subscription of a process on a single Redis (or a Sentinel's master)."""

    def __post_init__(self) -> None:
        self.thread = BackgroundThread(self._loop, "breaker-redis-events", wake=self._interrupt)
        # Held by whoever reads the subscription (Link): the same lock for every
        # connection this process subscribes on in turn.
        self._read_lock = threading.Lock()
        self._link: Link | None = None
        prefix = self.channel.rpartition(":notices:")[0]
        self._permission = acl.PermissionLog(self.client, prefix, "the event subscription")

    def listener(self, name: str) -> Invalidator:
        """What a breaker drains and checks: on one server, the one subscription."""
        return self

    def ensure_running(self) -> None:
        """Start the listener once per process, whatever the concurrency of first calls."""
        self.thread.start()

    def drain(self) -> None:
        """Deliver, in this thread, every message received so far: Link.drain, written
        out here (the healthy call runs it twice)."""
        link = self._link
        if link is not None and (link.readable(0) or link.lock.locked()):
            with link.lock:
                link.read_all()

    def after_fork(self) -> None:
        self.thread.after_fork()
        self._read_lock = threading.Lock()
        self._link = None  # the parent's connection is the parent's
        self.healthy = False

    def _interrupt(self) -> None:
        """Wake the listener from its wait on the subscription (close): from now on
        workers ask Redis; the link is interrupted under the read lock, so a message
        being handled (a notice can make the listener send a breaker's batch) is done
        first, and the listener's wait returns at once (Link.interrupt); the thread
        closes the connection as it ends. Told to stop before this, the listener
        checks that before each wait, so a link it makes meanwhile is never waited on."""
        self.healthy = False
        link = self._link
        if link is not None:
            link.interrupt()

    def resubscribe(self) -> None:
        """Leave the current subscription (its server stopped being the master).

        Workers ask Redis at every call from now on; the listener thread is
        woken from its wait on the connection (Link.interrupt), closes it and
        subscribes again at once, on whatever server the client reaches now.
        """
        with self._read_lock:
            self.healthy = False
            link, self._link = self._link, None
            if link is not None:  # no longer read: drain() returns at once
                link.closed, link.readable = True, _never
        if link is not None:
            link.interrupt()
        self.on_subscribed()

    # -- the listener thread --------------------------------------------------

    def _loop(self) -> None:
        thread = self.thread
        delay = 0.1
        while not thread.stopped():
            link = None
            try:
                with self._read_lock:
                    pubsub = self.client.pubsub()
                    link = Link(pubsub, self, self._read_lock)
                    self._link = link
                    pubsub.subscribe(self.channel, self.legacy_channel)
                    link.ping()  # its PONG starts the lease
                    link.attach()
                    link.read_all()
                while not thread.stopped() and self._link is link and not link.closed:
                    if link.readable(min(WAIT_SECONDS, link.lease.wait())):
                        with self._read_lock:
                            link.read_all()
                    if link.lease.wait() == 0:
                        with self._read_lock:
                            link.ping()
                    delay = 0.1 if self.healthy else delay
                if self._link is not link:  # left by resubscribe(): at once, on the new server
                    self.lost(link, None)
                    delay = 0.05
            except Exception as exc:
                self._lost(link, exc)
            thread.wait(delay)
            delay = min(delay * 2, 5.0)
        self._lost(self._link, None)

    # -- what the link reports ------------------------------------------------

    def handle(self, link: Link, message: dict[str, Any]) -> None:
        kind = text(message.get("type"))
        if kind == "pong":
            link.pong(message.get("data"))
            if link is self._link:
                self.leased(link.lease)
        else:
            self.event(kind, message.get("data"), text(message.get("channel")))

    def refused(self, link: Link, exc: BaseException) -> bool:
        return False  # SUBSCRIBE refused (an ACL without the channel): the connection ends

    def reconnected(self, link: Link) -> None:
        self.healthy = False
        self.on_subscribed()

    def lost(self, link: Link, exc: BaseException | None) -> None:
        self._lost(link, exc)

    def _lost(self, link: Link | None, exc: BaseException | None) -> None:
        if self.healthy and exc is not None:
            log.info("event subscription lost (%s); asking Redis at every call", exc)
        if exc is not None:
            self._permission.note(exc)
        self.healthy = False
        if link is not None:
            if link is self._link:
                self._link = None
            link.close()


def shut_down(sock: Any) -> None:
    """Shut a subscription's socket down (a thread blocked reading or polling it wakes
    and sees it closed); nothing for a transport without one (an in-process fake)."""
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _buffered(pubsub: Any) -> bool:
    """Whether the client holds or can read more without waiting. Holds the link's lock."""
    connection = pubsub.connection
    return connection is not None and bool(connection.can_read(timeout=0))


def _never(timeout: float) -> bool:
    """readable() of a link no longer read (closed, interrupted or left): nothing, at
    once. Never a sleep: a listener that looked the function up just before close()
    set it would sit the sleep out. Nothing loops on it: a link is closed only once
    its listener is told to stop or has left it."""
    return False


def _always(timeout: float) -> bool:
    """readable() of a socket closed already (the doctor's check; a Link waits in
    Link._often instead): read it now, which says so."""
    return True


def _poll_for(sock: socket.socket) -> Callable[[float], Any]:
    """readable(timeout) for one subscription's socket: truthy when it is readable,
    hung up or in error.

    An epoll object where there is one: its wait copies nothing in per call
    (about two thirds of a poll(0), and a worker checks twice per call), and it
    serves every thread at once, so the workers' checks and the listener's
    wait share it. It is not closed here (a thread may be waiting on it); it
    goes with the last reference. A socket closed under it drops out of its
    interest list and reads as quiet, which is safe: every close of a
    subscription's socket happens under the link's lock (a reconnect inside
    ``read_all``, which attaches the new socket) or after ``readable`` was set
    to ``_never`` (``close``, ``interrupt``, ``resubscribe``).
    """
    if hasattr(select, "epoll"):
        try:
            waiter = select.epoll()
            waiter.register(sock.fileno(), select.EPOLLIN)
        except (OSError, ValueError):  # closed already: reading it will say so (and end the link)
            return _always
        return waiter.poll
    return _poll_per_thread(sock)


def _poll_per_thread(sock: socket.socket) -> Callable[[float], bool]:
    """Where there is no epoll: a poll object cannot serve two threads at once,
    so each thread gets its own."""
    pollers = threading.local()

    def readable(timeout: float) -> bool:
        poller = getattr(pollers, "poller", None)
        try:
            if poller is None:
                poller = select.poll()
                poller.register(sock, select.POLLIN)
                pollers.poller = poller
            return bool(poller.poll(timeout * 1000))  # readable, hung up, or closed (POLLNVAL)
        except (OSError, ValueError):  # closed under us: reading it will say so
            return True

    return readable
