"""The event subscription of an asyncio worker on Redis Cluster: one connection per master.

The asyncio twin of breaker_redis/sharded.py (its docstring says why and
when a breaker's channel is subscribed again), built from the pieces of
breaker_redis/asyncio/invalidation.py: each master's connection is a
``Subscription`` that the loop hands every chunk the moment it reads one,
and a breaker trusts its memory only while its channel is confirmed and its
master's connection has nothing unread (``AsyncChannel.pending``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from ..cluster import Slots, notices_channel
from ..invalidation import parse_payload
from ..scripts import text
from .invalidation import Subscription, take_over

log = logging.getLogger("breaker_redis")


class AsyncChannel:
    """One breaker's subscription as its breaker uses it: ``healthy`` and ``pending()``."""

    __slots__ = ("channel", "healthy", "name", "slot", "subscription")

    def __init__(self, name: str, channel: str, slot: int) -> None:
        self.name = name
        self.channel = channel
        self.slot = slot
        self.healthy = False
        self.subscription: Subscription | None = None

    def pending(self) -> bool:
        """Whether its master's connection may hold a message not delivered yet."""
        subscription = self.subscription
        return subscription is not None and subscription.unread()


class AsyncShardedInvalidator:
    def __init__(
        self,
        client: Any,
        slots: Slots,
        prefix: str,
        route_key: Callable[[str], str],
        on_message: Callable[[dict[str, Any]], None],
        on_forget: Callable[[list[str]], None],
    ) -> None:
        self._client = client
        self._slots = slots
        self._prefix = prefix
        self._route_key = route_key
        self._on_message = on_message
        self._on_forget = on_forget
        self._channels: dict[str, AsyncChannel] = {}
        self._by_channel: dict[str, AsyncChannel] = {}
        slots.listeners.append(self._redirected)
        self._task: asyncio.Task[None] | None = None
        self.reset()

    def reset(self) -> None:
        """A new event loop or process: the old connections belong to the old one."""
        self._task = None
        self._subscriptions: dict[str, Subscription] = {}  # by master ('host:port')
        self._wanted = set(self._channels)
        self._refresh = False
        self._wake: asyncio.Event | None = None
        for channel in self._channels.values():
            channel.healthy, channel.subscription = False, None

    def listener(self, name: str) -> AsyncChannel:
        """The breaker's channel, subscribed by the keeper task (no I/O here)."""
        channel = self._channels.get(name)
        if channel is None:
            slot = self._slots.slot(self._route_key(name))
            channel = AsyncChannel(name, notices_channel(self._prefix, name), slot)
            self._channels[name] = self._by_channel[channel.channel] = channel
            self._wanted.add(name)
            self._poke()
        return channel

    @property
    def healthy(self) -> bool:
        channels = list(self._channels.values())
        return bool(channels) and all(channel.healthy for channel in channels)

    def ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._keep())

    async def close(self) -> None:
        task, self._task = self._task, None
        for subscription in list(self._subscriptions.values()):
            subscription.transport.close()
        self._subscriptions = {}
        for channel in self._channels.values():
            channel.healthy, channel.subscription = False, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _unsubscribed(self, channel: AsyncChannel) -> None:
        channel.healthy, channel.subscription = False, None
        self._wanted.add(channel.name)

    def _redirected(self, slot: int, moved: bool) -> None:
        """cluster.Slots: a script call for slot was answered MOVED (moved) or ASK."""
        channels = [c for c in self._channels.values() if c.slot == slot]
        if moved:
            for channel in channels:
                self._unsubscribed(channel)
            self._refresh = True
            self._poke()
        self._on_forget([channel.name for channel in channels])

    # -- the keeper task ---------------------------------------------------------------

    async def _keep(self) -> None:
        delay = 0.1
        while True:
            wake = self._wake
            assert wake is not None
            wake.clear()
            try:
                await self._subscribe_wanted()
                delay = 0.1
                timeout = None if not self._wanted else delay
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("could not subscribe to the breakers' channels (%s)", exc)
                self._refresh = True
                timeout, delay = delay, min(delay * 2, 5.0)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout)

    async def _subscribe_wanted(self) -> None:
        if not self._wanted:
            return
        if self._refresh:
            self._refresh = False
            await self._client.nodes_manager.initialize()
        wanted, self._wanted = self._wanted, set()
        if any(self._slots.owner(self._channels[name].slot) is None for name in wanted):
            await self._client.nodes_manager.initialize()  # not read yet (read at the first command)
        by_master: dict[str, tuple[Any, list[AsyncChannel]]] = {}
        for name in wanted:
            channel = self._channels[name]
            node = self._slots.owner(channel.slot)
            if node is None:  # a slot no master serves: again later
                self._wanted.add(name)
                continue
            by_master.setdefault(node.name, (node, []))[1].append(channel)
        for master, (node, channels) in by_master.items():
            subscription = self._subscriptions.get(master)
            if subscription is None or subscription.lost.done():
                try:
                    connection = node.connection_class(**node.connection_kwargs)
                    subscription = await take_over(connection, self)
                except BaseException:
                    self._wanted.update(channel.name for channel in channels)
                    raise
                self._subscriptions[master] = subscription
            for channel in channels:
                channel.healthy, channel.subscription = False, subscription
                subscription.send("SSUBSCRIBE", channel.channel)  # one each: SSUBSCRIBE takes one slot

    # -- what a subscription reports (from the loop's read callback) -------------------------

    def handle(self, subscription: Subscription, message: list[Any]) -> None:
        kind = text(message[0]).lower() if message else ""
        if kind == "smessage" and len(message) >= 3:
            payload = parse_payload({"data": message[2]})
            if payload is not None:
                self._on_message(payload)
            return
        if kind.startswith("-moved "):  # SSUBSCRIBE refused: the map was out of date
            self._refused_moved(subscription, kind)
            return
        if kind.startswith("-") or kind not in ("ssubscribe", "sunsubscribe", "pong"):
            log.info("the event subscription got %r; asking Redis at every call", message)
            subscription.transport.close()
            return
        channel = self._by_channel.get(text(message[1])) if len(message) > 1 else None
        if channel is None or channel.subscription is not subscription:
            return  # a channel since subscribed elsewhere
        if kind == "ssubscribe":
            self._on_forget([channel.name])  # what was learned before may have missed messages
            channel.healthy = True
        elif kind == "sunsubscribe":  # the master no longer serves the slot
            self._unsubscribed(channel)
            self._refresh = True
            self._on_forget([channel.name])
            self._poke()

    def _refused_moved(self, subscription: Subscription, line: str) -> None:
        try:
            slot = int(line.split()[1])
        except (IndexError, ValueError):
            subscription.transport.close()
            return
        for channel in self._channels.values():
            if channel.subscription is subscription and channel.slot == slot and not channel.healthy:
                self._unsubscribed(channel)
        self._refresh = True
        self._poke()

    def finished(self, subscription: Subscription) -> None:
        """The connection ended: its channels are subscribed again, where the map says."""
        for master, held in list(self._subscriptions.items()):
            if held is subscription:
                del self._subscriptions[master]
        gone = [c for c in self._channels.values() if c.subscription is subscription]
        if any(channel.healthy for channel in gone):
            log.info("event subscription lost; asking Redis at every call until subscribed again")
        for channel in gone:
            self._unsubscribed(channel)
        if gone:
            self._refresh = True
            self._on_forget([channel.name for channel in gone])
            self._poke()
