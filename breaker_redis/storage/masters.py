"""The store gates of a Redis Cluster: one per master, each breaker routed to its master's.

The seam with store.py: a gate (store.StoreGate, asyncio's AsyncStoreGate)
keeps one server's health and runs scripts there or on the fallback; this
module holds many of them and routes by the slot map, so that a dead master
sends only its own breakers to ``on_store_error`` while the others keep
deciding on Redis. The same for both sides: it does no I/O of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from breaker_redis.storage.scripts import Scripts
from breaker_redis.storage.store import GateHealth, check_policy

G = TypeVar("G", bound=GateHealth)


class MasterGates(Generic[G]):
    """The store gates of a Redis Cluster: one per master, so that a dead master sends
    only its own breakers to ``on_store_error`` while the others keep deciding on
    Redis. A breaker's gate is its master's as the slot map names it at each use
    (``for_name``): a resharding or a failover moves it to another gate, whose
    generation it never knew, so it asks Redis again. ``make(master)`` builds the
    gate of one master ('host:port'; '' while the map is not read yet)."""

    def __init__(self, remote: Scripts, policy: str, make: Callable[[str], G]) -> None:
        assert remote.slots is not None
        self.remote = remote
        self.slots = remote.slots
        self.policy = check_policy(policy)
        self._make = make
        self._gates: dict[str, G] = {}
        self._lock = threading.Lock()

    def master_of(self, name: str) -> str:
        return self.slots.owner_name(self.remote.route_key(name))

    def slot_of(self, name: str) -> int:
        return self.slots.slot(self.remote.route_key(name))

    def of(self, name: str) -> G:
        return self.at(self.slot_of(name))

    def at(self, slot: int) -> G:
        """The gate of the master serving slot now."""
        node = self.slots.owner(slot)
        master = "" if node is None else str(node.name)
        gate = self._gates.get(master)
        if gate is None:
            with self._lock:
                gate = self._gates.get(master)
                if gate is None:
                    gate = self._gates[master] = self._make(master)
        return gate

    def gates(self) -> list[G]:
        return list(self._gates.values())

    def for_name(self, name: str) -> BreakerGate:
        return BreakerGate(self, name)

    @property
    def healthy(self) -> bool:
        """Every master's breakers run on Redis."""
        return all(gate.healthy for gate in self.gates())

    @property
    def kind(self) -> str:
        return "redis" if self.healthy else self.policy

    @property
    def problem(self) -> str | None:
        return next((gate.problem for gate in self.gates() if gate.problem), None)

    def shared(self, generation: int) -> bool:
        """Whether generation is some master's on Redis, in use now (a reply that came
        back from another master than the map named when it was sent is still Redis's)."""
        return any(gate.shared(generation) for gate in self.gates())

    def run(self, operation: str, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.of(name).run(operation, name, *args, **kwargs)  # type: ignore[attr-defined]

    def run_remote(self, operation: str, name: str, *args: Any) -> Any:
        return self.of(name).run_remote(operation, name, *args)  # type: ignore[attr-defined]


class BreakerGate:
    """The store gate of one breaker on a cluster: its master's, looked up at each use."""

    __slots__ = ("_gates", "_slot")

    def __init__(self, gates: MasterGates[Any], name: str) -> None:
        self._gates = gates
        self._slot = gates.slot_of(name)

    @property
    def generation(self) -> int:
        return int(self._gates.at(self._slot).generation)

    @property
    def healthy(self) -> bool:
        return bool(self._gates.at(self._slot).healthy)

    def live(self, generation: int) -> bool:
        """Its master's gate's generation, or any master's on Redis: a permit admitted by
        Redis counts on Redis wherever the slot went; a local one only on its store."""
        return generation == self.generation or self._gates.shared(generation)

    def shared(self, generation: int) -> bool:
        return self._gates.shared(generation)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._gates.at(self._slot), attr)
