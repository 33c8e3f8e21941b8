"""Prometheus metrics read from Redis: every breaker, as all workers of all
hosts share it, with no multiprocess directory and nothing kept per process.

``BreakerCollector(client, prefix)`` is a prometheus-client collector: register
it on your own registry, or let the Flask extension serve it at
``<admin path>/metrics`` (behind the token) or ``breaker-redis metrics`` print
or serve it. Each scrape reads every breaker as the CLI's ``status`` does
(reader.py: lua/read.lua, one pipelined round trip per 500 breakers), and
every breaker group (one more round trip when there is one). The
metric names are fixed (docs/design.md section 9). When Redis cannot be read,
a scrape shows ``breaker_redis_up 0`` and nothing else, and says why once in
the log.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import acl
from .reader import Reader
from .snapshot import OUTCOME_COUNTERS

log = logging.getLogger("breaker_redis")

STATES = ("closed", "open", "half_open")
_PERMISSIONS_SAID: set[str] = set()  # once per process, however many collectors (exposition())


class BreakerCollector(Collector):
    def __init__(self, client: Any, prefix: str = "breaker") -> None:
        self._reader = Reader(client, prefix, owns_client=False)
        self._failing = False
        self._permission = acl.PermissionLog(client, prefix, "metrics", _PERMISSIONS_SAID)

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("breaker_redis_up", "1 if the breakers' Redis could be read by this scrape")
        try:
            snapshots = self._reader.snapshots()
            if not snapshots:  # none listed: maybe the workers' scripts are refused a permission too
                self._reader.check_readable()
            groups = self._reader.groups(snapshots)
        except Exception as exc:
            # a permission Redis refuses is an error of its own, logged once with the ACL rule
            # that grants it (acl.PermissionLog), and named by breaker_redis_up_error
            missing = acl.missing_rule(exc, self._reader.prefix)
            if missing is not None:
                self._permission.note(exc)
            elif not self._failing:
                log.warning("metrics cannot read Redis (%s: %s)", type(exc).__name__, exc)
            self._failing = True
            up.add_metric([], 0)
            yield up
            why = GaugeMetricFamily(
                "breaker_redis_up_error", "1 for why breaker_redis_up is 0: unavailable, or permission "
                "(missing: the ACL rule to grant)", labels=["reason", "missing"]
            )
            why.add_metric(["unavailable" if missing is None else "permission", missing or ""], 1)
            yield why
            return
        self._failing = False
        up.add_metric([], 1)
        yield up
        yield from _families(snapshots)
        yield from _group_families(groups)


def _gauge(name: str, documentation: str, *labels: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=["breaker", *labels])


def _counter(name: str, documentation: str, *labels: str) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, labels=["breaker", *labels])  # exposed as <name>_total


def _families(snapshots: list[dict[str, Any]]) -> Iterator[Metric]:
    state = _gauge("breaker_redis_state", "1 for the breaker's current state, else 0", "state")
    forced = _gauge("breaker_redis_forced", "1 while an operator forces the breaker")
    calls = _counter("breaker_redis_calls", "Recorded outcomes", "outcome")
    slow = _counter("breaker_redis_slow_calls", "Calls at or over slow_call_seconds")
    rejected = _counter("breaker_redis_rejected", "Calls refused by the breaker")
    trips = _counter("breaker_redis_trips", "Times the breaker opened")
    lost = _counter(
        "breaker_redis_state_lost", "Times a worker found the state it knew gone (evicted, flushed)"
    )
    window_calls = _gauge("breaker_redis_window_calls", "Calls in the sliding window")
    window_failures = _gauge("breaker_redis_window_failures", "Failures in the sliding window")
    retry_after = _gauge(
        "breaker_redis_retry_after_seconds", "Seconds until an open breaker lets a probe through (0: none)"
    )
    # min_reporters > 1 (README, "One sick host"); a reporter's series only while it failed in
    # the window or is isolated, so the label's values stay as few as the failing hosts
    isolated = _gauge("breaker_redis_isolated_reporters", "Reporters (hosts) isolated now")
    failing = _gauge("breaker_redis_failing_reporters", "Distinct reporters failing in the window")
    reporter_failures = _gauge(
        "breaker_redis_reporter_failures", "Failures of a reporter failing in the window", "reporter"
    )
    for snap in snapshots:
        name = str(snap["name"])
        for each in STATES:
            state.add_metric([name, each], 1 if snap["state"] == each else 0)
        forced.add_metric([name], 1 if snap["forced"] else 0)
        for outcome, field in OUTCOME_COUNTERS.items():
            calls.add_metric([name, outcome], snap[field])
        slow.add_metric([name], snap["slow"])
        rejected.add_metric([name], snap["rejected"])
        trips.add_metric([name], snap["trips"])
        lost.add_metric([name], snap["state_lost"])
        window_calls.add_metric([name], snap["window_calls"])
        window_failures.add_metric([name], snap["window_failures"])
        retry_after.add_metric([name], snap["retry_after"] or 0)
        isolated.add_metric([name], len(snap["isolated"]))
        failing.add_metric([name], snap["failing_reporters"])
        for reporter, seen in snap["reporters"].items():
            reporter_failures.add_metric([name, reporter], seen["failures"])
    yield from (state, forced, calls, slow, rejected, trips, lost, window_calls, window_failures, retry_after)
    yield from (isolated, failing, reporter_failures)


def _group_families(groups: list[dict[str, Any]]) -> Iterator[Metric]:
    """Breaker groups (breaker_redis/groups.py): members, how many may be open, how many are."""
    members = GaugeMetricFamily(
        "breaker_redis_group_members", "Member breakers of the group", labels=["group"]
    )
    cap = GaugeMetricFamily(
        "breaker_redis_group_max_open", "Members of the group that may be open at once", labels=["group"]
    )
    opened = GaugeMetricFamily(
        "breaker_redis_group_open", "Members of the group open or half-open now", labels=["group"]
    )
    held = CounterMetricFamily(
        "breaker_redis_group_held_back", "Trips the group held back at its cap", labels=["group"]
    )
    for group in groups:
        name = str(group["name"])
        members.add_metric([name], len(group["members"]))
        cap.add_metric([name], group["cap"])
        opened.add_metric([name], len(group["open"]))
        held.add_metric([name], group["held"])
    if groups:
        yield from (members, cap, opened, held)


def exposition(client: Any, prefix: str = "breaker") -> bytes:
    """The text exposition of every breaker under prefix, for one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BreakerCollector(client, prefix))
    return generate_latest(registry)
