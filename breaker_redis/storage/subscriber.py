"""What a subscription does with what it reads, whichever side reads it: no I/O here.

The seam: the listeners read their connections in two ways that really
differ (a thread polling a socket on the sync side, invalidation.py and
sharded.py; the event loop's protocol callback on the asyncio one,
breaker_redis/asyncio/invalidation.py and sharded.py), and do the same
with each message. This module is that same part for a process's one
subscription on a single server (``EventSubscriber``), and the trust both
it and a breaker's channel on a cluster (channels.py) give memory
(``Trusted``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from breaker_redis.storage.acks import Lease
from breaker_redis.storage.notices import Notice, parse_notice


class Trusted:
    """What memory decides by while it is ``healthy``: a process's subscription on one
    server (EventSubscriber), a breaker's channel on a cluster (channels.Channel).
    ``trust_until``, until when memory may decide (time.monotonic), is a plain attribute
    (the healthy call reads it), kept in step with ``healthy`` by each one's ``_trust``."""

    _healthy: bool
    trust_until: float

    @property
    def healthy(self) -> bool:
        """Subscribed, and confirmed: memory may decide while the lease runs."""
        return self._healthy

    @healthy.setter
    def healthy(self, value: bool) -> None:
        self._healthy = value
        self._trust()

    def _trust(self) -> None:
        raise NotImplementedError


OnMessage = Callable[[Notice], None]  # given each event, read by parse_notice (storage/notices.py)


@dataclass(eq=False)
class EventSubscriber(Trusted):
    """What a process's subscription to the workers' channel does with what it reads,
    the same on both sides: ``Invalidator`` here reads it in a thread,
    ``AsyncInvalidator`` (breaker_redis/asyncio/invalidation.py) in the event loop's
    protocol callback."""

    client: Any
    channel: str
    on_message: OnMessage
    on_subscribed: Callable[[], None]  # told when what was learned may have missed messages
    # Until when memory may decide (time.monotonic): the subscription's lease while it is
    # healthy, else 0.0. A plain attribute, kept by the setters below: the healthy call reads it.
    trust_until: float = field(default=0.0, init=False)
    _healthy: bool = field(default=False, init=False)

    def _trust(self) -> None:
        """Healthy means subscribed (confirmed): trusted from its lease's next PONG on."""
        if not self._healthy:
            self.trust_until = 0.0

    def leased(self, lease: Lease) -> None:
        """The subscription's lease ran on (a PONG of its own)."""
        if self._healthy:
            self.trust_until = lease.until
            if not self._healthy:  # left meanwhile (another thread): not trusted after all
                self.trust_until = 0.0

    def __post_init__(self) -> None:
        """What each side adds (its thread, its task)."""

    @property
    def legacy_channel(self) -> str:
        """``<prefix>:events``, which the workers of earlier versions listen to and their
        scripts publish on: heard too, so that a worker hears the changes of workers not yet
        upgraded during a rolling deploy."""
        return self.channel.rpartition(":notices:")[0] + ":events"

    def event(self, kind: str, data: Any, channel: str) -> bool:
        """Act on one message read: the subscription confirmed (what was learned before
        may have missed messages), or an event (a hint: see knowledge.py). False for
        any other kind. A message on the legacy channel that carries a token comes on
        the workers' channel too, and is acted on there."""
        if kind == "subscribe":
            if channel == self.channel:
                self.healthy = True
                self.on_subscribed()
        elif kind == "message":
            notice = parse_notice(data)  # never raises: a hostile message must not end the subscription
            if notice is not None and not (notice.ack and channel != self.channel):
                self.on_message(notice)
        else:
            return False
        return True
