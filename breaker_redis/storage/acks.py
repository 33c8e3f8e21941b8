"""Acknowledged notices: how a change is known to every worker before its call returns.

The boundary (docs/boundary.md): a call that starts after the call that
tripped the breaker returned is refused by every worker, including workers
that decide from memory. It must not rest on the order in which a server
writes to different connections: Redis 8 and Valkey 8 with I/O threads, a
proxy or a service mesh carry each connection on its own and may deliver the
trip's message to a worker after the tripping worker's next reply. Two
things hold on every path instead:

1. **Acknowledgements.** A script that publishes a notice (lua/includes/notify.lua
   ``notify``) puts a token in it and replies ``'<token> <workers>'``: how
   many subscribers of the workers' channel the PUBLISH (on a cluster,
   SPUBLISH) reached. Each worker's listener, once it has applied the notice
   (what it knew of the breaker is forgotten), counts it in
   ``<prefix>:{NAME}:acks`` (``acknowledge``). The call that made the change
   returns when that many have (``wait``).
2. **A lease on every subscription** (``Lease``). A worker decides from memory
   only while its subscription connection answered a PING sent less than
   ``LEASE_SECONDS`` ago; it pings every ``PING_SECONDS``. Within one
   connection every server and proxy keeps the order: a PONG read after the
   notice was published comes after the notice. So a worker that has not
   acknowledged a notice (stopped, partitioned, its listener starved, its
   subscription dropped by the server unnoticed) stops deciding from memory
   at most ``LEASE_SECONDS`` after the publish, and the changing call waits
   no longer than that for acknowledgements: when it returns, every worker
   has either applied the notice or stopped trusting its memory.

Only the rare call that changes something waits; a healthy call reads one
more number (``Lease.until``) where it already read the time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from breaker_redis.base.blocking import awaited, blocking, run_sync

log = logging.getLogger("breaker_redis")

# How long a worker trusts its memory after its subscription last answered a PING, and so
# the longest a change waits for a worker that does not acknowledge it. The same in every
# worker by construction (a constant, not a setting): a changing call's wait must outlast
# every other worker's lease.
LEASE_SECONDS = 2.0
# How often a listener pings its subscription: a quarter of the lease, so one late PONG
# (a busy server, a slow network) does not end the lease.
PING_SECONDS = LEASE_SECONDS / 4
# What the PINGs carry, so the listener knows their PONGs from any other (redis-py's
# health checks).
PING_WORD = "breaker-redis-lease"
# PINGs not yet answered, at most: a connection that stopped answering is not pinged more.
MAX_UNANSWERED = 8
# The acknowledgements' hash expires this long after the last one (lua/includes/notify.lua sets the
# same when it hands out a token).
ACKS_TTL_MS = 60000
# How often a changing call looks at the count, at first and at most (seconds): the
# workers' listeners answer within a round trip or two of the publish.
POLL_FIRST, POLL_MAX = 0.0005, 0.005


def acks_key(prefix: str, name: str) -> str:
    """``<prefix>:{NAME}:acks``: HASH token -> how many workers applied that notice."""
    return f"{prefix}:{{{name}}}:acks"


def parse_ack(field: str) -> tuple[str, int] | None:
    """A reply's ack field (``'<token> <workers>'``, docs/wire.md) as (token, workers); None when the call
    published nothing (``''``, or a reply of an older script)."""
    token, _, heard = field.partition(" ")
    if not token or not heard.isdigit():
        return None
    return token, int(heard)


class Lease:
    """How long one subscription connection may be trusted: until ``LEASE_SECONDS`` after
    the sending of the last PING it answered.

    PINGs are answered in the order they were sent (one connection), so the send times
    wait in a queue and each PONG takes the oldest. ``until`` is 0.0 until the first
    answer and after ``ended()``."""

    __slots__ = ("_sent", "due", "until")

    def __init__(self) -> None:
        self.until = 0.0
        self.due = 0.0  # when the next PING is due (time.monotonic)
        self._sent: deque[float] = deque()

    def sending(self) -> bool:
        """Note a PING about to be written (before it is: the lease never outlives the send).
        False when too many are unanswered: do not send it."""
        now = time.monotonic()
        self.due = now + PING_SECONDS
        if len(self._sent) >= MAX_UNANSWERED:
            return False
        self._sent.append(now)
        return True

    def answered(self) -> None:
        """A PONG of ours arrived: everything published before that PING was read is read."""
        if self._sent:
            self.until = self._sent.popleft() + LEASE_SECONDS

    def ended(self) -> None:
        """The connection is gone or left: nothing it said holds any more."""
        self.until = 0.0
        self.due = 0.0
        self._sent.clear()

    def wait(self) -> float:
        """Seconds until the next PING is due (0 when it is)."""
        return max(0.0, self.due - time.monotonic())


class Leased(Protocol):
    """A subscription connection with a lease (invalidation.Link, asyncio's Subscription)."""

    lease: Lease

    def pong(self, data: Any) -> None: ...


def pong_payload(kind: str, message: list[Any]) -> Any:
    """The payload of a PONG read by the asyncio subscriptions' parser (``kind``: its first
    element, lower case), or None if it is none: ``['pong', payload]`` on a subscribed
    connection, or the payload alone as a simple string (``'+payload'``), as some servers
    answer a PING on a connection that has just subscribed."""
    if kind == "pong":
        return message[-1]
    if kind == "+" + PING_WORD:
        return PING_WORD
    return None


def is_lease_pong(data: Any) -> bool:
    """Whether a PONG's payload is one of our PINGs' (bytes or str)."""
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    return bool(data == PING_WORD)


def acknowledge(client: Any, key: str, token: str) -> None:
    """Count one worker's application of notice ``token`` (one round trip). Never raises:
    a worker that cannot acknowledge is waited for until its lease ends, which is exact."""
    with contextlib.suppress(Exception):
        _acknowledgement(client, key, token).execute()


async def aacknowledge(client: Any, key: str, token: str) -> None:
    """acknowledge() for the asyncio client."""
    with contextlib.suppress(Exception):
        await _acknowledgement(client, key, token).execute()


def _acknowledgement(client: Any, key: str, token: str) -> Any:
    """The pipeline that counts one acknowledgement (either side's client)."""
    pipe = client.pipeline(transaction=False)
    pipe.hincrby(key, token, 1)
    pipe.pexpire(key, ACKS_TTL_MS)
    return pipe


def _count(raw: Any) -> int:
    value = raw[0] if isinstance(raw, list | tuple) and raw else raw
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def wait(client: Any, key: str, token: str, workers: int) -> int:
    """Return once ``workers`` acknowledgements of ``token`` are counted, or after
    LEASE_SECONDS (every worker that has not acknowledged has stopped trusting its
    memory by then). The number counted; never raises (Redis gone: after the lease)."""
    return run_sync(_waiting(blocking, client.hmget, time.sleep, key, token, workers))


async def await_acks(client: Any, key: str, token: str, workers: int) -> int:
    """wait() for the asyncio client: the event loop runs on while it waits."""
    return await _waiting(awaited, client.hmget, asyncio.sleep, key, token, workers)


async def _waiting(
    io: Callable[..., Awaitable[Any]], hmget: Any, sleep: Any, key: str, token: str, workers: int
) -> int:
    """wait()'s sequence, written once (engine/steps.py's way): ``io`` runs each side's
    ``hmget`` and ``sleep`` (base/blocking.py)."""
    deadline = time.monotonic() + LEASE_SECONDS
    pause = POLL_FIRST
    counted = 0
    while workers > 0:
        with contextlib.suppress(Exception):
            counted = _count(await io(hmget, key, [token]))
        left = deadline - time.monotonic()
        if counted >= workers or left <= 0:
            break
        await io(sleep, min(pause, left))
        pause = min(pause * 2, POLL_MAX)
    if counted < workers:
        # workers that did not acknowledge within the lease (stopped, partitioned, their
        # listener starved): the change was safe, and slow by the lease
        log.info(
            "%s: %d of %d listening workers acknowledged a change within %g s; the others "
            "stopped deciding from memory",
            key,
            counted,
            workers,
            LEASE_SECONDS,
        )
    return counted
