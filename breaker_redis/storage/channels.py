"""The channels of the breakers a process uses on Redis Cluster, whatever reads them: no I/O here.

The seam: each side reads its masters' connections its own way (a thread
polling sockets, sharded.py; the event loop's protocol callbacks,
breaker_redis/asyncio/sharded.py), and keeps the same books: which breaker's
channel is wanted, on which connection, confirmed, verified on a master
(sharded.py's docstring says why), trusted, or to be subscribed again after
a MOVED, a ``sunsubscribe`` or a lost connection. This module is those books,
and the one sequence both run against a node (``_verifying``, written once in
engine/steps.py's way).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from breaker_redis.storage.acks import Leased
from breaker_redis.storage.cluster import notices_channel
from breaker_redis.storage.notices import parse_notice
from breaker_redis.storage.scripts import Scripts, text
from breaker_redis.storage.subscriber import OnMessage, Trusted

# the connection a channel is subscribed on: a Link here, a Subscription in asyncio
X = TypeVar("X", bound=Leased)


class Channel(Trusted, Generic[X]):
    """One breaker's subscription, as its breaker uses it: ``healthy`` once the master
    now serving the breaker confirmed it, and the ``connection`` it was made on."""

    __slots__ = ("_healthy", "channel", "connection", "name", "slot", "trust_until")

    def __init__(self, name: str, channel: str, slot: int) -> None:
        self.name = name
        self.channel = channel
        self.slot = slot
        self.connection: X | None = None
        # the lease of its master's connection while the channel is trusted there, else 0.0:
        # kept by leased()
        self.trust_until = 0.0
        self._healthy = False

    def _trust(self) -> None:
        self.leased()

    def leased(self) -> None:
        """Its connection's lease ran on, or the channel was trusted or left there."""
        connection = self.connection
        self.trust_until = connection.lease.until if connection is not None and self._healthy else 0.0


class Channels(Generic[X]):
    """The channels of the breakers one process uses on a cluster, and what happens to
    them whatever their connections are: what ShardedInvalidator and the asyncio
    one (breaker_redis/asyncio/sharded.py) share. ``_lock`` guards the bookkeeping
    (a threading.Lock on the sync side, a null context on an event loop)."""

    channel_class: type[Channel[X]] = Channel
    _connections: dict[str, X]  # each side's connections, by master ('host:port')
    _nodes: dict[str, Any]  # the node of each, by the same name

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
            for master in masters[masters.index(failed) :]:
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

    def _dropped(self, connection: X) -> None:
        """connection is no longer held for its master (it ended, or was left)."""
        with self._lock:
            for master, held in list(self._connections.items()):
                if held is connection:
                    del self._connections[master]

    # -- ROLE after a confirmation, written once (engine/steps.py's way) ---------------------

    async def _verifying(self) -> None:
        """ROLE to the node of each connection whose channels were confirmed: trusted if
        it is a master, else the connection is left (see sharded.py's docstring)."""
        for connection, channels in self._to_verify():
            master = next((name for name, held in self._connections.items() if held is connection), None)
            if master is None:
                continue  # lost meanwhile: its channels are wanted again
            try:
                role = await self._role(master)
            except BaseException:
                self._not_verified(channels)
                raise
            if not self._verified(connection, channels, role):
                self._leave(connection)  # its channels are wanted again
                raise ConnectionError(f"{master} is no longer a master; reading the slot map again")

    async def _role(self, master: str) -> Any:
        """The I/O: ROLE's reply from master's node."""
        raise NotImplementedError

    def _leave(self, connection: X) -> None:
        """Close connection, whose node is not a master: its channels are wanted again."""
        raise NotImplementedError
