"""What the sync Breakers and the asyncio one share: everything they do without I/O.

The breakers built so far and their defaults, the clock, the transition hooks,
the store gate and the event subscription chosen for the client (one server,
or a gate and a subscription per master on a cluster), what a notice or a
master's switch makes the breakers forget, and configure()'s arguments and
reply. breaker_redis/engine/breakers.py adds the background threads and the
process's fork and exit hooks, breaker_redis/asyncio/breakers.py the event
loop's tasks. Each writes its own commands (a listing, a barrier, configure's
three steps), a few lines that differ by ``await`` only: shorter than a
driver each side would need to run them as data (the script call sequence,
run on every call, is data: storage/scripts.py says why).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

from breaker_redis.base.config import BreakerConfig, checked_changes
from breaker_redis.base.names import validate_name
from breaker_redis.engine.knowledge import about_another_database
from breaker_redis.engine.observers import CallObserver
from breaker_redis.engine.reporters import reporter_or_default
from breaker_redis.engine.transitions import TransitionCallback, TransitionHooks
from breaker_redis.storage.acks import acks_key
from breaker_redis.storage.args import ConfigureArgs
from breaker_redis.storage.masters import MasterGates
from breaker_redis.storage.notices import Notice
from breaker_redis.storage.scripts import Scripts, flat_pairs, text
from breaker_redis.storage.store import GateHealth

DEFAULT_TTL_SECONDS = 7 * 24 * 3600


class Built(Protocol):
    """What is used here of a breaker (engine/breaker.py's or asyncio/breaker.py's)."""

    config: BreakerConfig

    def forget(self) -> None: ...
    def hint(self, notice: Notice) -> bool: ...


B = TypeVar("B", bound=Built)  # the side's Breaker
G = TypeVar("G", bound=GateHealth)  # the side's store gate
R = TypeVar("R", bound=Scripts)  # the side's script runner


@dataclass(frozen=True)
class Parts(Generic[B, G, R]):
    """What a side (sync or asyncio) builds BreakersCore of."""

    runner: Callable[[Any, str, int], R]
    breaker: Callable[[Any, str, BreakerConfig], B]
    gate: Callable[..., G]  # a store gate: (runner, policy, on_switch=, per_master=)
    invalidator: Callable[..., Any]  # one server's subscription: (client, channel, on_message, on_forget)
    sharded: Callable[..., Any]  # a cluster's subscriptions: (runner, on_message, on_forget)
    follower: Any  # for_client(client, on_moved): follows a master Sentinel manages, or None


class BreakersCore(Generic[B, G, R]):
    """The breakers of one app on one Redis, under one key prefix (see the sides'
    ``Breakers`` for how to build and close one)."""

    parts: Parts[B, G, R]
    # one server's event subscription and Sentinel follower, or on a cluster the
    # subscriptions per master (the side's; None when this process does not listen)
    invalidator: Any
    follower: Any
    _lock: Any  # guards _breakers: a threading.Lock, or a null context on an event loop

    def __init__(
        self,
        client: Any,
        prefix: str = "breaker",
        *,
        on_store_error: str = "local",
        key_ttl_seconds: float = DEFAULT_TTL_SECONDS,
        defaults: BreakerConfig | None = None,
        clock: Callable[[], int] | None = None,
        listen: bool = True,
        batch_successes: bool | None = None,
        reporter: str | None = None,
    ) -> None:
        if not (isinstance(key_ttl_seconds, (int, float)) and key_ttl_seconds >= 1):
            raise ValueError(f"key_ttl_seconds must be >= 1 (got {key_ttl_seconds!r})")
        # who this process's outcomes come from (min_reporters, docs/one-sick-host.md): the host
        self.reporter = reporter_or_default(reporter)
        self.client = client
        self.prefix = prefix
        self.defaults = defaults or BreakerConfig()
        self._clock = clock
        # batches are stamped with the time they reach Redis: exact with the
        # real clock (50 ms late at most, see recorder.py), not with a test clock
        self.batch_successes = clock is None if batch_successes is None else batch_successes
        self._clock_offset_ms = 0.0
        parts = self.parts
        self._runner = runner = parts.runner(client, prefix, int(key_ttl_seconds * 1000))
        self._breakers: dict[str, B] = {}
        self._hooks = TransitionHooks()
        # told each call's outcome in process (observers.py): a tuple, replaced whole, so
        # a breaker reads it with one attribute test and never sees it half changed
        self.call_observers: tuple[CallObserver, ...] = ()
        self._lock = threading.Lock()
        self._listen = listen
        self.pid = os.getpid()
        self.invalidator = self.follower = None
        self.gate: G | MasterGates[G]
        if runner.slots is None:
            self.gate = parts.gate(runner, on_store_error, on_switch=self._forget_all)
            self._watch_server(listen)
        else:
            # Redis Cluster: a gate and a subscription connection per master (store.py,
            # sharded.py), and each breaker's notices on its own sharded channel.
            master_gate = functools.partial(self._master_gate, on_store_error)
            self.gate = MasterGates(runner, on_store_error, master_gate)
            if listen:
                self.invalidator = parts.sharded(runner, self._on_event, self._forget_names)
        self._started()

    def _watch_server(self, listen: bool) -> None:
        """One server's event subscription, and its Sentinel follower (failover.py)."""
        self.follower = self.parts.follower.for_client(self.client, self._master_moved)
        if listen:
            channel = self._runner.workers_channel
            self.invalidator = self.parts.invalidator(self.client, channel, self._on_event, self._forget_all)

    def _started(self) -> None:
        """The side's own state, once the shared state is made."""

    def _master_gate(self, on_store_error: str, master: str) -> G:
        """The store gate of one cluster master (MasterGates builds it at the master's first use)."""
        forget = functools.partial(self._forget_master, master)
        return self.parts.gate(self._runner, on_store_error, on_switch=forget, per_master=True)

    def get(self, name: str, config: BreakerConfig | None = None) -> B:
        """The breaker called name, created with config (or the defaults) on first use,
        without I/O.

        Asking again with a different config is an error: two configs for one
        name in one process would make its state machine depend on who asked.
        """
        validate_name(name)
        if config is not None and not isinstance(config, BreakerConfig):
            raise TypeError(f"config must be a BreakerConfig (got {type(config).__name__})")
        with self._lock:
            breaker = self._breakers.get(name)
            if breaker is None:
                breaker = self._breakers[name] = self.parts.breaker(self, name, config or self.defaults)
            elif config is not None and config != breaker.config:
                raise ValueError(f"breaker {name!r} already exists with another config: {breaker.config}")
        return breaker

    def built(self) -> list[B]:
        """The breakers this process has built so far (what a gauge of what this worker
        knows reads: breaker_redis.opentelemetry)."""
        return list(self._breakers.values())

    def __contains__(self, name: object) -> bool:
        """Whether this process has built a breaker of that name."""
        return name in self._breakers

    def gate_for(self, name: str) -> G:
        """The store gate of a breaker: the process's, or on a cluster its master's."""
        gate = self.gate
        return cast(G, gate.for_name(name)) if isinstance(gate, MasterGates) else gate

    def _gates(self) -> list[G]:
        """The store gates: the process's, or on a cluster each master's built so far."""
        gate = self.gate
        return gate.gates() if isinstance(gate, MasterGates) else [gate]

    def listener(self, name: str) -> Any:
        """The subscription a breaker drains and trusts (None when this process does not listen)."""
        return None if self.invalidator is None else self.invalidator.listener(name)

    @property
    def store_healthy(self) -> bool:
        """Whether scripts run on Redis now (False while on_store_error is in force)."""
        return self.gate.healthy

    @property
    def channel(self) -> str:
        """The pub/sub channel every transition and switch is published on."""
        return self._runner.channel

    def ensure_process(self) -> None:
        """This process's event subscription and Sentinel follower, started if they are not."""
        if self.invalidator is not None:
            self.invalidator.ensure_running()
        if self.follower is not None:
            self.follower.ensure_running()

    def _configure_args(self, name: str, overrides: dict[str, Any]) -> list[str]:
        """configure()'s arguments to lua/configure.lua: the overrides validated against
        the breaker's config (the defaults, for a breaker this process has not built)."""
        validate_name(name)
        base = self._breakers[name].config if name in self._breakers else self.defaults
        changes = tuple(part for pair in checked_changes(base, overrides).items() for part in pair)
        return ["", "0", *ConfigureArgs(changes).argv()]

    # -- time ---------------------------------------------------------------

    @property
    def clock(self) -> Callable[[], int] | None:
        """The clock the breakers were given (``clock=``), or None: Redis time. What reads
        them for the app (its metrics endpoint) counts time on it too."""
        return self._clock

    def clock_ms(self) -> int | None:
        """The now_ms given to scripts: None (Redis TIME) unless a test clock is set."""
        return None if self._clock is None else int(self._clock())

    def now_ms(self) -> int:
        """This process's estimate of the Redis clock, for decisions made from memory."""
        if self._clock is not None:
            return int(self._clock())
        return int(time.monotonic() * 1000 + self._clock_offset_ms)

    def wall_us(self) -> int:
        """When a batched success ended, for a count window (lua/includes/ring.lua): the
        host's clock, the one Redis TIME reads on the same host (so there the order is
        exact; hosts kept in step by NTP agree within its error), or the test clock."""
        if self._clock is not None:
            return int(self._clock()) * 1000
        return time.time_ns() // 1000

    def observe_clock(self, redis_now_ms: int) -> None:
        if self._clock is None:
            self._clock_offset_ms = redis_now_ms - time.monotonic() * 1000

    # -- transitions and notices -------------------------------------------------

    def on_transition(self, callback: TransitionCallback) -> TransitionCallback:
        """Call ``callback(Transition)`` once per state change of any breaker
        cluster-wide, in the process whose call made it (see transitions.py):
        the rules' and an operator's (``t.operator``), never an operator's
        action that left the state as it was (``reset()`` of a closed breaker).
        Usable as a decorator; exceptions in it are logged, never raised."""
        return self._hooks.add(self._hooks.changes, callback, "on_transition")

    def on_operator_action(self, callback: TransitionCallback) -> TransitionCallback:
        """Call ``callback(Transition)`` for every operator action (force_open(),
        force_closed(), clear_force(), reset(), trip(), half_open()) made in this
        process, whether it changed the state or not (``t.changed``): an audit log.
        Usable as a decorator; exceptions in it are logged, never raised."""
        return self._hooks.add(self._hooks.actions, callback, "on_operator_action")

    def observe_calls(self, observer: CallObserver) -> CallObserver:
        """Tell ``observer`` every call's outcome and every refusal of this process's
        breakers, as the call settles (engine/observers.py: what, when, at what cost)."""
        if not (callable(getattr(observer, "called", None)) and callable(getattr(observer, "refused", None))):
            raise TypeError(f"observe_calls needs an object with called() and refused() (got {observer!r})")
        with self._lock:
            self.call_observers = (*self.call_observers, observer)
        return observer

    def transitioned(self, name: str, events: str, epoch: int, at_ms: int) -> None:
        self._hooks.report(name, events, epoch, at_ms)

    def _on_event(self, notice: Notice) -> None:
        """A message of the events channel, read by storage/notices.py parse_notice."""
        if about_another_database(notice, self._runner.database):
            return
        breaker = self._breakers.get(notice.name)
        batched = breaker is not None and breaker.hint(notice)
        if notice.ack:  # applied: the call that made the change may return (storage/acks.py)
            self._acknowledge(acks_key(self.prefix, notice.name), notice.ack)
        if batched and breaker is not None:  # after: a send made here never waits for itself
            self._send_batch(breaker)

    def _acknowledge(self, key: str, token: str) -> None:
        """Count this worker's application of a notice (each side's I/O)."""
        raise NotImplementedError

    def _send_batch(self, breaker: B) -> None:
        """Send a breaker's batch now: a notice made it news (each side's I/O)."""
        raise NotImplementedError

    def _master_moved(self) -> None:
        """Sentinel named another master (failover.py): what this worker knew, and its
        event subscription, belong to the old one; the subscription is taken again there."""
        if self.invalidator is not None:  # (Sentinel: one server's Invalidator)
            self.invalidator.resubscribe()
        else:
            self._forget_all()

    def _group_releases(self, groups: Any, name: str, upto: int) -> list[tuple[str, int | None, list[Any]]]:
        """give_back_grant's calls: lua/group.lua release of member ``name``'s grant (every
        token up to ``upto`` revoked in its slot) in each group listed (``groups``: SMEMBERS)."""
        now_ms = self.clock_ms()
        return [(text(group), now_ms, ["", "", "release", name, upto]) for group in sorted(groups)]

    def _forget_all(self) -> None:
        for breaker in list(self._breakers.values()):
            breaker.forget()

    def _forget_names(self, names: list[str]) -> None:
        for name in names:
            breaker = self._breakers.get(name)
            if breaker is not None:
                breaker.forget()

    def _forget_master(self, master: str) -> None:
        """The gate of one cluster master switched store: its breakers forget what they knew."""
        gate = self.gate
        if isinstance(gate, MasterGates):
            self._forget_names([name for name in list(self._breakers) if gate.master_of(name) == master])


def configured(raw: Any) -> tuple[dict[str, str], str]:
    """configure()'s reply: the breaker's overrides now in Redis, and its notice's
    '<token> <workers>' (lua/configure.lua's last pair, ' ack': no field's name)."""
    overrides = {key: text(value) for key, value in flat_pairs(raw).items()}
    return overrides, overrides.pop(" ack", "")
