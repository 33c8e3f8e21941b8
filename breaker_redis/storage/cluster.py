"""Redis Cluster: where a breaker lives, and noticing that it moved.

A breaker's keys share the hash tag ``{NAME}``, so they live in one slot,
served by one master; its scripts also publish on the breaker's own sharded
channel ``<prefix>:{NAME}:notices`` (SPUBLISH, Redis 7), which is in that
slot too. That master writes the message to its subscribers in the same
event-loop pass as the script's reply, as a single server does, so the
boundary of a single server holds per master (docs/boundary.md): workers
subscribe on the breaker's master (breaker_redis/storage/sharded.py) and the
barrier goes to it (``Slots.barrier``).

A slot moves when the cluster is resharded or fails over. ``Slots.call``
sends each script straight to the master the client's slot map names, so
that a redirect is seen rather than followed silently:

- ``MOVED``: the slot has moved. The client's map is corrected, the
  listeners are told (the subscription forgets that breaker's notices and
  subscribes again on the new master), and the call is sent again.
- ``TRYAGAIN``: the slot is migrating and the breaker's keys are split
  between the two masters (its scripts take seven keys, some of which may
  not exist: they cannot run anywhere until the slot is handed over). On
  the sync side the error goes to the store gate at once, as any other
  (redis-py would retry for about half a second): that master's breakers
  decide locally until its probe passes.
- ``ASK``: the slot is migrating and the keys are on the importing master.
  The script runs there (redis-py follows the redirect) and publishes
  there, where nobody subscribes yet: subscribers are served by the
  migrating master until the migration ends. So the worker whose call was
  redirected forgets what it knew, and after a reply that reports a change
  its barrier first publishes a hint on the migrating master, which every
  subscriber of the slot still reads, then pings it (``barrier``).

A master that dies answers nothing, not even a redirect: once its replica is
promoted, only a slot map read again names the new master. redis-py reads it
again after a connection error or a timeout only on the commands it routes
itself, and from redis-py 8.2 not at once: the error asks for a refresh that
the client's next routed command runs, at most once a second
(``topology_refresh_min_interval``); up to 8.1 the sync client's commands and
pipelines read it again before raising (the asyncio client's next command
did). The scripts and the barrier go straight
to a node's client and never run that refresh, so a process whose map
nobody else reads again (one that does not listen: an operator's; a worker
listening on the slot reads it again when its subscription breaks) kept
sending them to the dead master for good. So a command sent here that gets no
answer (``following``) has the map read again at once (``refresh``), and its
error still goes on, as before: an operator's action (reset, force,
configure) raises, a call goes to its gate's local store, whose probe reads
the map again before each try. The next command goes to the master the fresh
map names: the promoted replica once the cluster has promoted it, else the
dead master again, and the map is read again after that one.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import redis
from redis.crc import key_slot

from breaker_redis.base.blocking import awaited, blocking, run_sync
from breaker_redis.urls import LazyCluster

T = TypeVar("T")

# A slot answered ASK this recently: its barrier carries a hint to the migrating master.
MOVING_SECONDS = 10.0
# A hint refused with MOVED: the migration is over, and the old master told its
# subscribers (sunsubscribe) before it answered anything about the slot.
_HINT_REFUSED = redis.exceptions.ResponseError
_MOVES = (redis.exceptions.MovedError, redis.exceptions.AskError)
# A node that gave no answer: refused, closed, reset, timed out (the map is read again;
# for the ConnectionErrors that are no node's failure, a refused AUTH or a full pool,
# that costs one CLUSTER SLOTS and changes nothing).
_NO_ANSWER = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
# Reading the map again failed: no node answered, or not with a map that covers every
# slot (RedisClusterException is no RedisError). The map the client has keeps serving.
_REREAD_FAILED = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError)


def notices_channel(prefix: str, name: str) -> str:
    """The breaker's sharded channel, in its keys' slot (lua/includes/notify.lua notify)."""
    return f"{prefix}:{{{name}}}:notices"


def is_cluster(client: Any) -> bool:
    """Whether client is a Redis Cluster client (redis-py's, sync or asyncio, or a LazyCluster)."""
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

    return isinstance(client, (RedisCluster, AsyncRedisCluster, LazyCluster))


class Slots:
    """The slot of each key and the master serving it, as the cluster client's
    map has it (read without I/O), and who to tell when a slot turns out to
    have moved: ``listeners`` are called with (slot, moved), moved False for
    an ASK (migrating). Shared by the sync and the asyncio side."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._slots: dict[str, int] = {}
        self._moving: dict[int, float] = {}
        self.listeners: list[Callable[[int, bool], None]] = []
        self._manager: Any = None  # the cluster client's NodesManager, once it is made

    def slot(self, key: str) -> int:
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = int(key_slot(key.encode("utf-8")))
        return slot

    def cluster(self) -> Any:
        """The cluster client, made now if it is a LazyCluster not made yet (I/O)."""
        client = self.client
        return client.connected() if isinstance(client, LazyCluster) else client

    def built(self) -> Any:
        """The cluster client if it has read its slot map, else None (no I/O)."""
        client = self.client
        return client.built() if isinstance(client, LazyCluster) else client

    def owner(self, slot: int) -> Any:
        """The master serving slot as the client knows it (a ClusterNode), or None."""
        manager = self._manager
        if manager is None:
            manager = self._manager = getattr(self.built(), "nodes_manager", None)
            if manager is None:
                return None
        nodes = manager.slots_cache.get(slot)
        return nodes[0] if nodes else None

    def located(self, key: str) -> tuple[int, Any]:
        """key's slot and its owner (None while not known): where call() and acall() send."""
        slot = self.slot(key)
        return slot, self.owner(slot)

    def owner_name(self, key: str) -> str:
        """'host:port' of the master serving key's slot, '' while not known."""
        node = self.owner(self.slot(key))
        return "" if node is None else str(node.name)

    def moving(self, slot: int) -> bool:
        """Whether a call to slot was redirected by ASK lately (a migration)."""
        return time.monotonic() - self._moving.get(slot, -1e18) < MOVING_SECONDS

    def redirected(self, slot: int, exc: BaseException) -> None:
        """A call to slot got MOVED or ASK: remember a migration on ASK and tell the
        listeners. The map itself is corrected by the cluster client, which the call
        goes through next and which meets the MOVED itself."""
        moved = isinstance(exc, redis.exceptions.MovedError)
        if not moved:
            self._moving[slot] = time.monotonic()
        for listener in list(self.listeners):
            listener(slot, moved)

    # -- the sync client --------------------------------------------------------------

    @contextlib.contextmanager
    def following(self) -> Iterator[None]:
        """Around commands of the sync side: one that gets no answer has the slot map
        read again before its error goes on (see the module's docstring)."""
        try:
            yield
        except _NO_ANSWER:
            self.refresh()
            raise

    def refresh(self) -> None:
        """Read the slot map again now, through the cluster client's public
        ``nodes_manager.initialize()`` (every redis-py from 5.0; the store gate's probe
        and the event subscription call it too). Nothing if the client is not made yet:
        its first command reads the map. A failure is left to the next command."""
        run_sync(self._rereading(blocking))

    async def _rereading(self, io: Callable[..., Awaitable[Any]]) -> None:
        """refresh()'s sequence, written once (engine/steps.py's way): ``io`` is each
        side's (base/blocking.py)."""
        manager = getattr(self.built(), "nodes_manager", None)
        if manager is not None:
            with contextlib.suppress(*_REREAD_FAILED):
                await io(manager.initialize)

    def call(self, key: str, send: Callable[[Any], T]) -> T:
        """send(client of the master of key's slot). A redirect is told (``redirected``)
        and the call is then sent through the cluster client, which follows it; no
        answer has the map read again (``following``)."""
        with self.following():
            cluster = self.cluster()
            slot, node = self.located(key)
            if node is not None:
                try:
                    return send(cluster.get_redis_connection(node))
                except redis.exceptions.MovedError as exc:
                    # first: redis-py's MovedError is an AskError. Taken for an ASK, a MOVED
                    # after a failover ran the script on the new master by ASKING and left the
                    # map naming the old one, a replica now, for good: every later call met
                    # MOVED first, and the barrier PINGed the replica, whose subscribers are
                    # not the slot's (a process that does not listen never read the map again)
                    self.redirected(slot, exc)
                except redis.exceptions.AskError as exc:
                    self.redirected(slot, exc)
                    importing = cluster.get_node(host=exc.host, port=exc.port)
                    if importing is not None:  # ASKING there, so that a TRYAGAIN is not retried
                        with _Asking(cluster.get_redis_connection(importing)) as asking:
                            return send(asking)
            return send(cluster)

    def target(self, key: str) -> Any:
        """A client of the master of key's slot (the cluster client while the map is unknown)."""
        cluster = self.cluster()
        node = self.owner(self.slot(key))
        return cluster if node is None else cluster.get_redis_connection(node)

    def barrier(self, key: str, channel: str, name: str) -> None:
        """After a reply that reports a change, while key's slot migrates: a hint on the
        migrating master, whose subscribers did not hear the change (see the module's
        docstring), and one round trip to it after. Nothing otherwise: the change's own
        notice is acknowledged (storage/acks.py)."""
        if self.moving(self.slot(key)):
            run_sync(self._barrier(key, channel, name, blocking, self.target))

    async def _barrier(
        self,
        key: str,
        channel: str,
        name: str,
        io: Callable[..., Awaitable[Any]],
        target_of: Callable[[str], Any],
    ) -> None:
        """barrier()'s sequence while key's slot migrates, written once (engine/steps.py's
        way): ``io`` and ``target_of`` (the client of key's master) are each side's."""
        try:
            target = target_of(key)
            with contextlib.suppress(_HINT_REFUSED):
                await io(target.execute_command, "SPUBLISH", channel, _moving_hint(name))
            await io(target.execute_command, "PING")
        except _NO_ANSWER:
            await self._rereading(io)
            raise

    # -- the asyncio client -----------------------------------------------------------

    @contextlib.asynccontextmanager
    async def afollowing(self) -> AsyncIterator[None]:
        """following() for the asyncio side: a node of redis-py's asyncio cluster client
        that gets no answer tells nobody, on any version of redis-py."""
        try:
            yield
        except _NO_ANSWER:
            await self.arefresh()
            raise

    async def arefresh(self) -> None:
        """refresh() for the asyncio cluster client (its map is read at its first command)."""
        await self._rereading(awaited)

    async def acall(self, key: str, send: Callable[[Any], Awaitable[T]]) -> T:
        """call() for redis-py's asyncio cluster client: send(node or client) is awaited;
        both take execute_command. After an ASK the call goes through the cluster client
        (an asyncio node does not keep one connection for ASKING and the command), which
        retries a TRYAGAIN for up to about half a second without blocking the loop."""
        async with self.afollowing():
            slot, node = self.located(key)
            if node is not None:
                try:
                    return await send(node)
                except _MOVES as exc:
                    self.redirected(slot, exc)
            return await send(self.client)

    async def abarrier(self, key: str, channel: str, name: str) -> None:
        """barrier() for the asyncio client."""
        if self.moving(self.slot(key)):
            await self._barrier(key, channel, name, awaited, self._async_target)

    def _async_target(self, key: str) -> Any:
        """target() for the asyncio client: its node of key's master (the cluster client
        while the map is unknown)."""
        node = self.owner(self.slot(key))
        return self.client if node is None else node


def _moving_hint(name: str) -> str:
    """A message about the breaker that announces nothing: every listener forgets it."""
    return json.dumps({"name": name, "kind": "moving"}, separators=(",", ":"))


class _Asking:
    """The importing master's client for one script call after an ASK: each command goes
    after ASKING on one connection of its own (ASKING holds for the next command only)."""

    def __init__(self, client: Any) -> None:
        self._client: Any = redis.Redis(connection_pool=client.connection_pool, single_connection_client=True)

    def evalsha(self, *args: Any) -> Any:
        self._client.execute_command("ASKING")
        return self._client.evalsha(*args)

    def eval(self, *args: Any) -> Any:
        self._client.execute_command("ASKING")
        return self._client.eval(*args)

    def __enter__(self) -> _Asking:
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()
