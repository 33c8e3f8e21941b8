"""Breakers: the breakers of one app on one Redis, and the per-process machinery
they share: the store-health gate, the pub/sub listener, the success recorder,
and what happens at fork and at exit (background.py: the threads and the
process's hooks). What it does without I/O is breakers_core.py's, shared with
the asyncio Breakers."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any

from breaker_redis.base.background import BackgroundThread, process_hooks, stop_all, thread_name
from breaker_redis.engine.breaker import Breaker
from breaker_redis.engine.breakers_core import DEFAULT_TTL_SECONDS, BreakersCore, Parts, configured
from breaker_redis.engine.recorder import Recorder
from breaker_redis.storage import acks
from breaker_redis.storage.acks import acks_key, parse_ack
from breaker_redis.storage.cluster import notices_channel
from breaker_redis.storage.failover import SentinelFollower
from breaker_redis.storage.invalidation import Invalidator
from breaker_redis.storage.masters import MasterGates
from breaker_redis.storage.scripts import ScriptRunner, text
from breaker_redis.storage.sharded import ShardedInvalidator
from breaker_redis.storage.store import StoreGate
from breaker_redis.urls import describe

log = logging.getLogger("breaker_redis")

__all__ = ["DEFAULT_TTL_SECONDS", "Breakers"]


class Breakers(BreakersCore[Breaker, StoreGate, ScriptRunner]):
    """The breakers of one app on one Redis, under one key prefix.

    Build one per process (or before the fork: nothing connects until first
    use, and a forked child drops its parent's threads and memory). Thread safe.
    """

    parts = Parts(
        runner=ScriptRunner,
        breaker=Breaker,
        gate=StoreGate,
        invalidator=Invalidator,
        sharded=ShardedInvalidator,
        follower=SentinelFollower,
    )
    invalidator: Invalidator | ShardedInvalidator | None
    follower: SentinelFollower | None

    def _started(self) -> None:
        self._where = describe(self.client)
        self.recorder = Recorder(self._named("recorder"))
        parts: list[tuple[str, Any]] = [("sentinel", self.follower), ("events", self.invalidator)]
        if not isinstance(self.gate, MasterGates):
            parts.append(("probe", self.gate))
        for job, part in parts:
            if part is not None:
                part.thread.name = self._named(job)
        # a forked child resets what it inherited; at exit the batches are sent (until close())
        process_hooks.add(self, after_fork=self._after_fork, at_exit=self.flush)

    def _named(self, job: str, where: str = "") -> str:
        return thread_name(job, self.prefix, where or self._where)

    def _master_gate(self, on_store_error: str, master: str) -> StoreGate:
        gate = super()._master_gate(on_store_error, master)
        gate.thread.name = self._named("probe", f"{self._where}, master {master or '?'}")
        return gate

    @classmethod
    def from_url(cls, url: str, prefix: str = "breaker", **kwargs: Any) -> Breakers:
        """Breakers on a client with sub-second timeouts and no retry loop (see urls.py)."""
        from breaker_redis.urls import client_from_url

        return cls(client_from_url(url), prefix, **kwargs)

    def names(self) -> list[str]:
        """Every breaker name known to Redis under this prefix (from any worker)."""
        return sorted(text(n) for n in self.client.smembers(self._runner.names_key))

    def configure(self, name: str, **overrides: Any) -> dict[str, str]:
        """Write live overrides for a breaker; None removes one. Validated first."""
        args = self._configure_args(name, overrides)
        self.register_name(name)
        overrides, ack = configured(self.gate.run_remote("configure", name, self.clock_ms(), args))
        self.barrier(name, ack)  # every worker has forgotten what it knew when this returns
        return overrides

    def register_name(self, name: str) -> None:
        with contextlib.suppress(Exception):  # listing is best effort; the gate notices outages
            self._runner.register_name(name, self.clock_ms())

    def barrier(self, name: str, ack: str = "") -> None:
        """After a reply that made a change to breaker ``name``, before the call returns:
        wait until every worker listening has applied the change's notice, or its lease
        ran out (storage/acks.py). ``ack`` is the reply's '<token> <workers>' ('' for a
        call that published nothing). Done whether or not this process listens: the other
        workers are the ones who need it. On a cluster, a breaker whose slot is migrating
        gets a hint on the migrating master first (cluster.Slots.barrier).
        """
        slots = self._runner.slots
        if slots is not None:
            with contextlib.suppress(Exception):  # the acknowledgements below still bound it
                slots.barrier(self._runner.route_key(name), notices_channel(self.prefix, name), name)
        wanted = parse_ack(ack)
        if wanted is not None:
            acks.wait(self.client, acks_key(self.prefix, name), *wanted)

    def _acknowledge(self, key: str, token: str) -> None:
        acks.acknowledge(self.client, key, token)

    def _send_batch(self, breaker: Breaker) -> None:
        breaker.flush_batch()

    def give_back_grant(self, name: str, upto: int) -> None:
        """Breaker ``name``, a group member, gave its grant back in its own slot as it closed
        (every token up to ``upto`` revoked, lua/includes/grants.lua give_back_grant): every breaker group
        listed under the prefix forgets it (lua/group.lua release; a group listing a later
        token, or none, is left as it is). Never raises: a group not told now has its grant
        taken back by a worker refused at its cap (groups.py)."""
        try:
            groups = self.client.smembers(self._runner.groups_key)
            for group, now_ms, args in self._group_releases(groups, name, upto):
                self.gate.run_remote("group", group, now_ms, args)
        except Exception as exc:  # an outage, a permission: the reclaim covers it
            log.warning("breaker %r gave its group grant back; a group could not be told (%s)", name, exc)

    # -- process life ---------------------------------------------------------

    def _after_fork(self) -> None:
        self.pid = os.getpid()
        self._lock = threading.Lock()
        for gate in self._gates():
            gate.after_fork()
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
        threads = [self.recorder.thread, *[gate.thread for gate in self._gates()]]
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
