"""Keeps every worker's knowledge honest without asking Redis before each call.

One subscription per process to ``<prefix>:events``: every script that changes
a breaker (a transition, the breaker arming, a force, a reset, a live-config
write) publishes there. A message is a hint (see knowledge.py): the worker
forgets what it knew about that breaker and asks Redis at its next call.

The trip boundary rests on one ordering: by the time the call that made a
change returns, the change's message is already in every subscriber's socket.
Redis writes a published message in the same event-loop pass as the
publisher's reply (the embedded server does the same), and the worker that
made the change runs one more round trip (``Breakers.barrier``) before it
returns, which that pass must have finished first. So a worker never waits
for its listener thread to be scheduled: before deciding from memory, the
deciding thread itself delivers whatever is readable (``drain``). The thread
only keeps an idle worker's socket empty and reconnects after a loss; while
the subscription is down, ``healthy`` is False and workers ask Redis.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from . import acl
from .background import ProcessThread
from .scripts import text

log = logging.getLogger("breaker_redis")


class Invalidator:
    def __init__(
        self,
        client: Any,
        channel: str,
        on_message: Callable[[dict[str, Any]], None],
        on_subscribed: Callable[[], None],
    ) -> None:
        self._client = client
        self._channel = channel
        self._on_message = on_message
        self._on_subscribed = on_subscribed
        self._listener = ProcessThread(self._loop, "breaker-redis-events")
        self._stop = self._listener.stop
        # Held by whoever reads the subscription, from before the read until the
        # messages read are delivered: "nothing readable and not held" means
        # nothing received is pending.
        self._read_lock = threading.Lock()
        self._pubsub: Any = None
        self._socket: Any = None
        self._readable: Callable[[float], bool] = _never
        self.healthy = False
        prefix = channel.removesuffix(":events")
        self._permission = acl.PermissionLog(client, prefix, "the event subscription")

    def ensure_running(self) -> None:
        """Start the listener once per process, whatever the concurrency of first calls."""
        self._listener.ensure_running()

    def drain(self) -> None:
        """Deliver, in this thread, every message received so far.

        Costs one non-blocking poll when nothing is waiting. Readability is
        checked before the lock: a message read by the listener but not yet
        delivered is covered by the lock it holds.
        """
        pubsub = self._pubsub
        if pubsub is None:
            return
        if not self._readable(0) and not self._read_lock.locked():
            return
        with self._read_lock:
            self._read_all(pubsub)

    def after_fork(self) -> None:
        self._listener.after_fork()
        self._read_lock = threading.Lock()
        self._pubsub = self._socket = None  # the parent's connection is the parent's
        self._readable = _never
        self.healthy = False

    def close(self) -> None:
        self._listener.close()

    def resubscribe(self) -> None:
        """Leave the current subscription (its server stopped being the master).

        Workers ask Redis at every call from now on; the listener thread,
        which owns the connection, closes it when it next wakes (within a
        second) and subscribes again, on whatever server the client reaches now.
        """
        with self._read_lock:
            self.healthy = False
            self._pubsub = self._socket = None
            self._readable = _never
        self._on_subscribed()

    # -- the listener thread --------------------------------------------------

    def _loop(self) -> None:
        delay = 0.1
        while not self._stop.is_set():
            pubsub = None
            try:
                with self._read_lock:
                    pubsub = self._client.pubsub()
                    pubsub.subscribe(self._channel)
                    self._attach(pubsub)
                    self._read_all(pubsub)
                while not self._stop.is_set() and self._pubsub is pubsub:
                    if self._readable(1.0):
                        with self._read_lock:
                            self._read_all(pubsub)
                    delay = 0.1 if self.healthy else delay
                if self._pubsub is not pubsub:  # left by resubscribe(): at once, on the new server
                    self._lost(pubsub, None)
                    delay = 0.05
            except Exception as exc:
                self._lost(pubsub, exc)
            self._stop.wait(delay)
            delay = min(delay * 2, 5.0)
        self._lost(self._pubsub, None)

    def _attach(self, pubsub: Any) -> None:
        """Remember the subscription and how to wait for it without reading it. Holds _read_lock."""
        connection = pubsub.connection
        sock = getattr(connection, "_sock", None)
        selector = getattr(connection, "_selector", None)
        if selector is not None and hasattr(selector, "check_can_read"):  # fakeredis in-process
            self._readable = selector.check_can_read
        elif isinstance(sock, socket.socket):
            self._readable = _poll_for(sock)
        else:  # unknown transport: let drain() read under the lock each time
            self._readable = _always
        self._socket = sock
        self._pubsub = pubsub

    def _read_all(self, pubsub: Any) -> None:
        """Read and deliver every message that has arrived. Holds _read_lock."""
        if pubsub is not self._pubsub:
            return
        try:
            while True:
                message = pubsub.get_message(timeout=0)
                if getattr(pubsub.connection, "_sock", None) is not self._socket:
                    # the client reconnected and re-subscribed by itself: messages
                    # may have been missed, so nothing known is trusted until the
                    # new subscription is confirmed (perhaps by this very message)
                    self.healthy = False
                    self._on_subscribed()
                    self._attach(pubsub)
                if message is not None:
                    self._handle(message)
                elif not _buffered(pubsub):
                    break  # None can also mean a health-check PONG with more behind it
        except Exception as exc:
            self._lost(pubsub, exc)

    def _handle(self, message: dict[str, Any]) -> None:
        kind = text(message.get("type"))
        if kind == "subscribe":
            self.healthy = True
            self._on_subscribed()  # what was learned before may have missed messages
        elif kind == "message":
            try:
                payload = json.loads(text(message.get("data")))
            except ValueError:
                return
            if isinstance(payload, dict):
                self._on_message(payload)

    def _lost(self, pubsub: Any, exc: BaseException | None) -> None:
        if self.healthy and exc is not None:
            log.info("event subscription lost (%s); asking Redis at every call", exc)
        if exc is not None:
            self._permission.note(exc)
        self.healthy = False
        if pubsub is not None and pubsub is self._pubsub:
            self._pubsub = self._socket = None
            self._readable = _never
        if pubsub is not None:
            with contextlib.suppress(Exception):
                pubsub.close()


def _buffered(pubsub: Any) -> bool:
    """Whether the client holds or can read more without waiting. Holds _read_lock."""
    connection = pubsub.connection
    return connection is not None and bool(connection.can_read(timeout=0))


def _never(timeout: float) -> bool:
    if timeout > 0:
        time.sleep(timeout)
    return False


def _always(timeout: float) -> bool:
    if timeout > 0:
        time.sleep(min(timeout, 0.05))
    return True


def _poll_for(sock: socket.socket) -> Callable[[float], bool]:
    """readable(timeout) for one subscription's socket. A poll(0) costs a third of
    a select(), and a worker checks twice per call; a poll object cannot serve two
    threads at once, so each thread gets its own."""
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
