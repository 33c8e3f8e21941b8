"""Keeps every worker's knowledge fresh without asking Redis before each call.

A daemon thread per process subscribes to ``<prefix>:events``; every script
that changes a breaker (a transition, a force, a reset, a live-config write)
publishes there, so a worker that is admitting or denying from memory hears of
it within milliseconds. While the subscription is down the listener reports
itself unhealthy and workers fall back to re-checking Redis every second.

Redis queues a transition's message to every subscriber before it replies to
the worker that made it, so by the time a client's next request reaches
another worker, the message is usually already in that worker's socket; only
its listener thread may not have run yet. ``settle()`` closes that gap: one
non-blocking poll per decision, and a short wait only when a message is
actually waiting.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import threading
import time
from collections.abc import Callable
from typing import Any

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
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._sock: Any = None
        # True from before the listener reads the socket until it has delivered
        # what it read: "not busy and nothing readable" means nothing pending.
        self._busy = False
        self.healthy = False

    def ensure_running(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="breaker-redis-events", daemon=True)
            self._thread.start()

    def settle(self, timeout: float = 0.05) -> None:
        """If a message is waiting or being handled, let the listener finish it first."""
        sock = self._sock
        if sock is None or not (self._busy or _readable(sock)):
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(0.0002)  # gives the listener thread the interpreter
            if not (self._busy or _readable(sock)):
                return

    def after_fork(self) -> None:
        self._thread = None
        self._sock = None
        self.healthy = False

    def close(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        delay = 0.1
        while not self._stop.is_set():
            pubsub = None
            try:
                pubsub = self._client.pubsub()
                pubsub.subscribe(self._channel)
                while not self._stop.is_set():
                    sock = self._sock
                    if sock is not None and not _readable(sock, 1.0):
                        continue
                    self._busy = sock is not None  # set before anything is read off the socket
                    try:
                        message = pubsub.get_message(timeout=0 if sock is not None else 1.0)
                        while message is not None:
                            delay = self._handle(pubsub, message, delay)
                            message = pubsub.get_message(timeout=0)
                    finally:
                        self._busy = False
            except Exception as exc:  # any failure: unhealthy, retry with backoff
                if self.healthy:
                    log.info(
                        "breaker_redis: event subscription lost (%s); re-checking Redis every second", exc
                    )
                self.healthy = False
                self._sock = None
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        pubsub.close()
            self._stop.wait(delay)
            delay = min(delay * 2, 5.0)

    def _handle(self, pubsub: Any, message: dict[str, Any], delay: float) -> float:
        kind = text(message.get("type"))
        if kind == "subscribe":
            sock = getattr(pubsub.connection, "_sock", None)
            self._sock = sock if hasattr(sock, "fileno") else None
            self.healthy = True
            self._on_subscribed()
            return 0.1
        if kind == "message":
            self._deliver(message.get("data"))
        return delay

    def _deliver(self, data: Any) -> None:
        try:
            payload = json.loads(text(data))
        except ValueError:
            return
        if isinstance(payload, dict):
            self._on_message(payload)


def _readable(sock: Any, timeout: float = 0) -> bool:
    try:
        return bool(select.select([sock], [], [], timeout)[0])
    except (OSError, ValueError):  # closed under us: the listener will notice
        return False
