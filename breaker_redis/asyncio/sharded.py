"""The event subscription of an asyncio worker on Redis Cluster: one connection per master.

The asyncio twin of breaker_redis/storage/sharded.py (its docstring says why and
when a breaker's channel is subscribed again): the same books
(breaker_redis/storage/channels.py), read by the event loop, built from the pieces of
breaker_redis/asyncio/invalidation.py: each master's connection is a
``Subscription`` that the loop hands every chunk the moment it reads one,
and a breaker trusts its memory only while its channel is confirmed and its
master's connection has nothing unread (``AsyncChannel.pending``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, cast

from breaker_redis.asyncio.invalidation import Subscription, take_over
from breaker_redis.base.background import cancelled
from breaker_redis.storage.acks import pong_payload
from breaker_redis.storage.channels import Channel, Channels
from breaker_redis.storage.scripts import text

log = logging.getLogger("breaker_redis")


class AsyncChannel(Channel[Subscription]):
    __slots__ = ()

    def pending(self) -> bool:
        """Whether the breaker's master's connection may hold a message not delivered yet."""
        subscription = self.connection
        return subscription is not None and subscription.unread()


class AsyncShardedInvalidator(Channels[Subscription]):
    channel_class = AsyncChannel

    def _new_lock(self) -> Any:
        return contextlib.nullcontext()  # one event loop runs all of it

    def _started(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self.reset()

    def reset(self) -> None:
        """A new event loop or process: the old connections belong to the old one."""
        self._task = None
        self._connections: dict[str, Subscription] = {}  # by master ('host:port')
        self._nodes: dict[str, Any] = {}  # the node of each subscription, by the same name
        self._forget_connections()
        self._wake_event: asyncio.Event | None = None

    def listener(self, name: str) -> AsyncChannel:
        return cast(AsyncChannel, super().listener(name))  # channel_class makes them

    def ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._wake_event = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._keep())

    async def close(self) -> None:
        task, self._task = self._task, None
        for subscription in list(self._connections.values()):
            subscription.transport.close()
        self._connections = {}
        self._forget_connections()
        await cancelled(task)

    def _wake(self) -> None:
        if self._wake_event is not None:
            self._wake_event.set()

    # -- the keeper task ---------------------------------------------------------------

    async def _keep(self) -> None:
        delay = 0.1
        while True:
            wake = self._wake_event
            assert wake is not None
            wake.clear()
            try:
                await self._subscribe_wanted()
                await self._verifying()
                held = self._connections
                for idle in self._idle(list(held.values())):
                    self._connections = held = {m: s for m, s in held.items() if s is not idle}
                    idle.transport.close()
                delay = 0.1
                timeout = None if not self._wanted else delay
                timeout = self._pinged(timeout)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("could not subscribe to the breakers' channels (%s)", exc)
                self._refresh = True
                timeout, delay = delay, min(delay * 2, 5.0)
            await woken(wake, timeout)

    def _pinged(self, timeout: float | None) -> float | None:
        """Ping each connection whose lease asks for it; the wait until the next is due
        (timeout at most)."""
        for subscription in list(self._connections.values()):
            if subscription.lease.wait() == 0:
                subscription.ping()
            due = subscription.lease.wait()
            timeout = due if timeout is None else min(timeout, due)
        return timeout

    async def _subscribe_wanted(self) -> None:
        if not self._wanted:
            return
        if self._refresh:
            self._refresh = False
            await self._client.nodes_manager.initialize()
        wanted, self._wanted = self._wanted, set()
        if any(self._slots.owner(self._channels[name].slot) is None for name in wanted):
            await self._client.nodes_manager.initialize()  # not read yet (read at the first command)
        by_master, unserved = self._by_master(wanted)
        for master, (node, channels) in by_master.items():
            subscription = self._connections.get(master)
            if subscription is None or subscription.lost.done():
                try:
                    connection = node.connection_class(**node.connection_kwargs)
                    subscription = await take_over(connection, self)
                except BaseException:
                    self._not_done(by_master, master)
                    raise
                self._connections[master] = subscription
                self._nodes[master] = node
            for channel in channels:
                channel.healthy, channel.connection = False, subscription
                subscription.send("SSUBSCRIBE", channel.channel)  # one each: SSUBSCRIBE takes one slot
            subscription.ping()  # its PONG (after the confirmations) starts the lease
        if unserved:  # a slot no master serves (yet): again after a backoff
            self._wanted.update(unserved)
            raise ConnectionError(f"{len(unserved)} breakers' slots served by no master")

    async def _role(self, master: str) -> Any:
        return await self._nodes[master].execute_command("ROLE")

    def _leave(self, subscription: Subscription) -> None:
        subscription.transport.close()  # finished() follows

    # -- what a subscription reports (from the loop's read callback) -------------------------

    def handle(self, subscription: Subscription, message: list[Any]) -> None:
        kind = text(message[0]).lower() if message else ""
        if kind.startswith("-moved "):  # SSUBSCRIBE refused: the map was out of date
            try:
                self._moved_away(subscription, int(kind.split()[1]))
                return
            except (IndexError, ValueError):
                pass
        pong = pong_payload(kind, message)
        if pong is not None:
            self._handled(subscription, "pong", "", pong)  # the lease, and its channels'
            return
        channel = text(message[1]) if len(message) > 1 else ""
        if not self._handled(subscription, kind, channel, message[2] if len(message) > 2 else None):
            log.info("the event subscription got %r; asking Redis at every call", message)
            subscription.transport.close()

    def finished(self, subscription: Subscription) -> None:
        """The connection ended: its channels are subscribed again, where the map says."""
        self._dropped(subscription)
        if any(c.healthy and c.connection is subscription for c in self._channels.values()):
            log.info("event subscription lost; asking Redis at every call until subscribed again")
        self._connection_ended(subscription)


async def woken(event: asyncio.Event, timeout: float | None) -> None:
    """Wait until event is set, for timeout seconds at most (None: no limit).

    Not ``asyncio.wait_for(event.wait(), timeout)``: before Python 3.12 it returns
    the event's result when a cancellation comes just as the event is set, and the
    keeper, its cancellation lost, subscribed again after aclose() and waited
    there for ever (aclose() waiting for it)."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait([waiter], timeout=timeout)
    finally:
        waiter.cancel()
