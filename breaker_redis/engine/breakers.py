"""Breakers: the breakers of one app on one Redis, and the per-process machinery
they share: the store-health gate, the pub/sub listener, the success recorder,
and what happens at fork and at exit (background.py: the threads and the
process's hooks)."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from breaker_redis.engine.background import BackgroundThread, process_hooks, stop_all, thread_name
from breaker_redis.engine.breaker import Breaker
from breaker_redis.engine.config import BreakerConfig, checked_changes
from breaker_redis.engine.core import BreakerCore
from breaker_redis.engine.knowledge import about_another_database
from breaker_redis.engine.recorder import Recorder
from breaker_redis.engine.reporters import reporter_or_default
from breaker_redis.engine.transitions import TransitionCallback, TransitionHooks
from breaker_redis.storage.cluster import notices_channel
from breaker_redis.storage.failover import SentinelFollower
from breaker_redis.storage.invalidation import Invalidator
from breaker_redis.storage.scripts import ScriptRunner, flat_pairs, text, validate_name
from breaker_redis.storage.sharded import Channel, ShardedInvalidator
from breaker_redis.storage.store import ClusterStoreGate, MasterGates, StoreGate
from breaker_redis.urls import describe

DEFAULT_TTL_SECONDS = 7 * 24 * 3600


class Forgetting:
    """Making breakers forget what they knew, all of them or some: what the sync Breakers
    and the asyncio one (breaker_redis/asyncio/breakers.py) share."""

    _breakers: Mapping[str, BreakerCore[Any]]
    gate: Any

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


class Breakers(Forgetting):
    """The breakers of one app on one Redis, under one key prefix.

    Build one per process (or before the fork: nothing connects until first
    use, and a forked child drops its parent's threads and memory). Thread safe.
    """

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
        # who this process's outcomes come from (min_reporters, README "One sick host"): the host
        self.reporter = reporter_or_default(reporter)
        self.client = client
        self.prefix = prefix
        self.defaults = defaults or BreakerConfig()
        self._clock = clock
        # batches are stamped with the time they reach Redis: exact with the
        # real clock (50 ms late at most, see recorder.py), not with a test clock
        self.batch_successes = clock is None if batch_successes is None else batch_successes
        where = describe(client)
        self.recorder = Recorder(thread_name("recorder", prefix, where))
        self._clock_offset_ms = 0.0
        self._runner = runner = ScriptRunner(client, prefix, int(key_ttl_seconds * 1000))
        self._breakers: dict[str, Breaker] = {}
        self._hooks = TransitionHooks()
        self._lock = threading.Lock()
        self.follower: SentinelFollower | None = None
        self.invalidator: Invalidator | ShardedInvalidator | None = None
        self.gate: StoreGate | ClusterStoreGate
        if runner.slots is None:
            self.gate = StoreGate(runner, on_store_error, on_switch=self._forget_all)
            self.gate.thread.name = thread_name("probe", prefix, where)
            self.follower = SentinelFollower.for_client(client, self._master_moved)
            if self.follower is not None:
                self.follower.thread.name = thread_name("sentinel", prefix, where)
            if listen:
                self.invalidator = Invalidator(client, runner.channel, self._on_event, self._forget_all)
        else:
            # Redis Cluster: a gate and a subscription connection per master (store.py,
            # sharded.py), and each breaker's notices on its own sharded channel.
            def master_gate(master: str) -> StoreGate:
                forget = functools.partial(self._forget_master, master)
                gate = StoreGate(runner, on_store_error, on_switch=forget, per_master=True)
                gate.thread.name = thread_name("probe", prefix, f"{where}, master {master or '?'}")
                return gate

            self.gate = ClusterStoreGate(runner, on_store_error, master_gate)
            if listen:
                self.invalidator = ShardedInvalidator(
                    client, runner.slots, prefix, runner.route_key, self._on_event, self._forget_names
                )
        if self.invalidator is not None:
            self.invalidator.thread.name = thread_name("events", prefix, where)
        self._listen = listen
        self.pid = os.getpid()
        # a forked child resets what it inherited; at exit the batches are sent (until close())
        process_hooks.add(self, after_fork=self._after_fork, at_exit=self.flush)

    @classmethod
    def from_url(cls, url: str, prefix: str = "breaker", **kwargs: Any) -> Breakers:
        """Breakers on a client with sub-second timeouts and no retry loop (see urls.py)."""
        from breaker_redis.urls import client_from_url

        return cls(client_from_url(url), prefix, **kwargs)

    def get(self, name: str, config: BreakerConfig | None = None) -> Breaker:
        """The breaker called name, created with config (or the defaults) on first use.

        Asking again with a different config is an error: two configs for one
        name in one process would make its state machine depend on who asked.
        """
        validate_name(name)
        if config is not None and not isinstance(config, BreakerConfig):
            raise TypeError(f"config must be a BreakerConfig (got {type(config).__name__})")
        with self._lock:
            breaker = self._breakers.get(name)
            if breaker is None:
                breaker = self._breakers[name] = Breaker(self, name, config or self.defaults)
            elif config is not None and config != breaker.config:
                raise ValueError(f"breaker {name!r} already exists with another config: {breaker.config}")
        return breaker

    def __contains__(self, name: object) -> bool:
        """Whether this process has built a breaker of that name."""
        return name in self._breakers

    def gate_for(self, name: str) -> StoreGate:
        """The store gate of a breaker: the process's, or on a cluster its master's."""
        gate = self.gate
        return gate if isinstance(gate, StoreGate) else cast(StoreGate, gate.for_name(name))

    def listener(self, name: str) -> Invalidator | Channel[Any] | None:
        """The subscription a breaker drains and trusts (None with listen=False)."""
        return None if self.invalidator is None else self.invalidator.listener(name)

    @property
    def store_healthy(self) -> bool:
        """Whether scripts run on Redis now (False while on_store_error is in force)."""
        return self.gate.healthy

    @property
    def channel(self) -> str:
        """The pub/sub channel every transition and switch is published on."""
        return self._runner.channel

    def names(self) -> list[str]:
        """Every breaker name known to Redis under this prefix (from any worker)."""
        return sorted(text(n) for n in self.client.smembers(self._runner.names_key))

    def configure(self, name: str, **overrides: Any) -> dict[str, str]:
        """Write live overrides for a breaker; None removes one. Validated first."""
        validate_name(name)
        base = self._breakers[name].config if name in self._breakers else self.defaults
        as_text = checked_changes(base, overrides)
        args: list[str] = ["", "0"]
        for key, value in as_text.items():
            args += [key, value]
        self.register_name(name)
        raw = self.gate.run_remote("configure", name, self.clock_ms(), args)
        self.barrier(name)  # every worker applies it at its next call
        return {key: text(value) for key, value in flat_pairs(raw).items()}

    # -- time ---------------------------------------------------------------

    def clock_ms(self) -> int | None:
        """The now_ms given to scripts: None (Redis TIME) unless a test clock is set."""
        return None if self._clock is None else int(self._clock())

    def now_ms(self) -> int:
        """This process's estimate of the Redis clock, for decisions made from memory."""
        if self._clock is not None:
            return int(self._clock())
        return int(time.monotonic() * 1000 + self._clock_offset_ms)

    def observe_clock(self, redis_now_ms: int) -> None:
        if self._clock is None:
            self._clock_offset_ms = redis_now_ms - time.monotonic() * 1000

    # -- process life ---------------------------------------------------------

    def ensure_process(self) -> None:
        if self.invalidator is not None:
            self.invalidator.ensure_running()
        if self.follower is not None:
            self.follower.ensure_running()

    def register_name(self, name: str) -> None:
        with contextlib.suppress(Exception):  # listing is best effort; the gate notices outages
            self._runner.register_name(name, self.clock_ms())

    def barrier(self, name: str) -> None:
        """One round trip after a reply that made a change to breaker name, before the call returns.

        Redis writes a published message in the same event-loop pass as the
        publisher's reply, but may write the reply first; any later command is
        read after that pass, so once it answers, the change's message is in
        every subscriber's socket (see invalidation.py). Done whether or not
        this process listens: the other workers are the ones who need it. On a
        cluster it goes to the breaker's master, whose subscribers hear the
        breaker (cluster.Slots.barrier).
        """
        with contextlib.suppress(Exception):  # a lost barrier only weakens the hint's head start
            slots = self._runner.slots
            if slots is None:
                self.client.ping()
            else:
                slots.barrier(self._runner.route_key(name), notices_channel(self.prefix, name), name)

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

    def transitioned(self, name: str, events: str, epoch: int, at_ms: int) -> None:
        self._hooks.report(name, events, epoch, at_ms)

    def _on_event(self, payload: dict[str, Any]) -> None:
        if about_another_database(payload, self._runner.database):
            return
        breaker = self._breakers.get(str(payload.get("name", "")))
        if breaker is not None:
            breaker.hint(payload)

    def _master_moved(self) -> None:
        """Sentinel named another master: what this worker knew, and its event
        subscription, belong to the old one."""
        if isinstance(self.invalidator, Invalidator):
            self.invalidator.resubscribe()
        else:
            self._forget_all()


    def _after_fork(self) -> None:
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self.gate.after_fork()
        self.recorder.after_fork()
        if self.invalidator is not None:
            self.invalidator.after_fork()
        if self.follower is not None:
            self.follower.after_fork()
        for breaker in self._breakers.values():
            breaker.after_fork()

    def flush(self) -> None:
        """Send every breaker's batched successes and rejection counts now (close, exit)."""
        for breaker in list(self._breakers.values()):
            if breaker.store_healthy:  # what was counted under Redis cannot be replayed elsewhere
                breaker.flush_batch()

    def threads(self) -> list[BackgroundThread]:
        """The background threads this Breakers may run (each started at need)."""
        gate = self.gate
        threads = [self.recorder.thread, *([gate.thread] if isinstance(gate, StoreGate) else gate.threads())]
        threads += [part.thread for part in (self.invalidator, self.follower) if part is not None]
        return threads

    def close(self) -> None:
        """Stop the background threads, then send pending batches (a worker may simply
        exit: its batches are sent at exit). The threads are woken and joined together,
        for background.STOP_SECONDS at most: when it returns no notice is being handled
        (one can make the listener send a batch) and no batch is being sent, so the
        caller may close the client. This process's fork and exit hooks forget it."""
        process_hooks.discard(self)
        stop_all(self.threads())
        self.flush()

