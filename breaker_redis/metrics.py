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

prometheus-client is optional (the ``prometheus`` extra, which the ``flask``
one includes: docs/install.md); without it, importing this module fails
naming the extra.

``exposition()`` (the Flask endpoint, ``breaker-redis metrics``) writes the
text format itself (``render``): byte for byte what prometheus-client's
``generate_latest`` writes of the collector's families (tests/test_metrics.py
compares them), in a tenth of its time or less. 2,000 breakers make 32,000
samples, and generate_latest builds, validates and escapes every sample's
labels anew: that was more than half of such a scrape (bench/status.py). The
collector (a registry: yours, ``metrics --port``) and ``render`` write from
one list of ``Family``, so they cannot say different things.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, NamedTuple, get_args

from breaker_redis.ops import extras

try:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
    from prometheus_client.utils import floatToGoString
except ImportError as error:  # an optional dependency (ops/extras.py)
    raise extras.missing(__name__, "prometheus-client", "prometheus", error) from error

from breaker_redis.engine.snapshot import OUTCOME_COUNTERS, Count, Snapshot
from breaker_redis.ops.reader import Reader
from breaker_redis.storage import acl

log = logging.getLogger("breaker_redis")

STATES = ("closed", "open", "half_open")
_PERMISSIONS_SAID: set[str] = set()  # once per process, however many collectors (exposition())
_go_float: Callable[[Any], str] = floatToGoString  # how generate_latest writes a value (untyped there)


class Family(NamedTuple):
    """One metric family: per sample, its label values in ``labels``' order, then
    its value. A counter's samples are named ``<name>_total``."""

    name: str
    kind: str  # "gauge" or "counter"
    documentation: str
    labels: tuple[str, ...]
    rows: list[tuple[Any, ...]]


class BreakerCollector(Collector):
    """``clock``: the time the breakers decide by, if not Redis's (``Breakers(clock=...)``,
    a test's ManualClock): the seconds left of an open period are counted on it, as
    the workers count them, not on Redis's own."""

    def __init__(self, client: Any, prefix: str = "breaker", clock: Callable[[], int] | None = None) -> None:
        self._reader = Reader(client, prefix, owns_client=False, clock=clock)
        self._failing = False
        self._permission = acl.PermissionLog(client, prefix, "metrics", _PERMISSIONS_SAID)

    def collect(self) -> Iterator[Metric]:
        yield from map(_metric, self.families())

    def families(self) -> list[Family]:
        """What one scrape shows: every breaker and group, or why Redis could not be read."""
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
            why = "unavailable" if missing is None else "permission", missing or "", 1
            return [
                _up(0),
                Family(
                    "breaker_redis_up_error",
                    "gauge",
                    "1 for why breaker_redis_up is 0: unavailable, or "
                    "permission (missing: the ACL rule to grant)",
                    ("reason", "missing"),
                    [why],
                ),
            ]
        self._failing = False
        return [_up(1), *_families(snapshots), *_group_families(groups)]


def _up(value: int) -> Family:
    documentation = "1 if the breakers' Redis could be read by this scrape"
    return Family("breaker_redis_up", "gauge", documentation, (), [(value,)])


def _metric(family: Family) -> Metric:
    """The prometheus-client family of a Family, for a registry (collect())."""
    made = GaugeMetricFamily if family.kind == "gauge" else CounterMetricFamily
    metric = made(family.name, family.documentation, labels=list(family.labels))
    for *labels, value in family.rows:
        metric.add_metric(labels, value)
    return metric


# The snapshot keys sampled as they are, one sample per breaker.
Sampled = Literal[Count, "window_calls", "window_failures", "failing_reporters", "ramp_share"]

# The families of one sample per breaker, a snapshot key as it is: name, documentation, key. A
# family of one of the snapshot's counts is a counter, of anything else a gauge.
SAMPLED: tuple[tuple[str, str, Sampled], ...] = (
    ("breaker_redis_slow_calls", "Calls at or over slow_call_seconds", "slow"),
    ("breaker_redis_rejected", "Calls refused by the breaker", "rejected"),
    ("breaker_redis_trips", "Times the breaker opened", "trips"),
    ("breaker_redis_state_lost", "Times a worker found its known state gone (evicted)", "state_lost"),
    ("breaker_redis_window_calls", "Calls in the sliding window", "window_calls"),
    ("breaker_redis_window_failures", "Failures in the sliding window", "window_failures"),
    # min_reporters > 1 (docs/one-sick-host.md)
    ("breaker_redis_failing_reporters", "Distinct reporters failing in the window", "failing_reporters"),
    # ramp_seconds (docs/recovery.md)
    ("breaker_redis_ramp_share", "Share of calls admitted after a close (1: all)", "ramp_share"),
)
_COUNTS = frozenset(get_args(Count))


def _families(snapshots: Sequence[Snapshot]) -> list[Family]:
    each = [(str(snap["name"]), snap) for snap in snapshots]
    sampled = [
        Family(
            name,
            "counter" if key in _COUNTS else "gauge",
            documentation,
            ("breaker",),
            [(n, snap[key]) for n, snap in each],
        )
        for name, documentation, key in SAMPLED
    ]
    return [
        Family(
            "breaker_redis_state",
            "gauge",
            "1 for the breaker's current state, else 0",
            ("breaker", "state"),
            [(n, state, 1 if snap["state"] == state else 0) for n, snap in each for state in STATES],
        ),
        Family(
            "breaker_redis_forced",
            "gauge",
            "1 while an operator forces the breaker",
            ("breaker",),
            [(n, 1 if snap["forced"] else 0) for n, snap in each],
        ),
        Family(
            "breaker_redis_calls",
            "counter",
            "Recorded outcomes",
            ("breaker", "outcome"),
            [(n, outcome, snap[field]) for n, snap in each for outcome, field in OUTCOME_COUNTERS.items()],
        ),
        *sampled,
        Family(
            "breaker_redis_retry_after_seconds",
            "gauge",
            "Seconds until an open breaker lets a probe through (0: none)",
            ("breaker",),
            [(n, snap["retry_after"] or 0) for n, snap in each],
        ),
        # min_reporters > 1 (docs/one-sick-host.md); a reporter's series only while it failed in
        # the window or is isolated, so the label's values stay as few as the failing hosts
        Family(
            "breaker_redis_isolated_reporters",
            "gauge",
            "Reporters (hosts) isolated now",
            ("breaker",),
            [(n, len(snap["isolated"])) for n, snap in each],
        ),
        Family(
            "breaker_redis_reporter_failures",
            "gauge",
            "Failures of a reporter failing in the window",
            ("breaker", "reporter"),
            [
                (n, reporter, seen["failures"])
                for n, snap in each
                for reporter, seen in snap["reporters"].items()
            ],
        ),
    ]


def _group_families(groups: list[dict[str, Any]]) -> list[Family]:
    """Breaker groups (breaker_redis/groups.py): members, how many may be open, how many are."""
    if not groups:
        return []
    each = [(str(group["name"]), group) for group in groups]
    return [
        Family(
            "breaker_redis_group_members",
            "gauge",
            "Member breakers of the group",
            ("group",),
            [(n, len(group["members"])) for n, group in each],
        ),
        Family(
            "breaker_redis_group_max_open",
            "gauge",
            "Members of the group that may be open at once",
            ("group",),
            [(n, group["cap"]) for n, group in each],
        ),
        Family(
            "breaker_redis_group_open",
            "gauge",
            "Members of the group open or half-open now",
            ("group",),
            [(n, len(group["open"])) for n, group in each],
        ),
        Family(
            "breaker_redis_group_held_back",
            "counter",
            "Trips the group held back at its cap",
            ("group",),
            [(n, group["held"]) for n, group in each],
        ),
    ]


class _Escaped(dict[str, str]):
    """Label values as the text format writes them (backslash, newline and double quote
    escaped), each escaped at its first use: a breaker's name is in 16 samples."""

    def __missing__(self, value: str) -> str:
        escaped = self[value] = value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
        return escaped


class _Written(dict[Any, str]):
    """Sample values as generate_latest writes them (Go's float format), each formatted
    at its first use (1, 1.0 and True are one key, and each is written "1.0")."""

    def __missing__(self, value: Any) -> str:
        written = self[value] = _go_float(value)
        return written


def render(families: Iterable[Family]) -> bytes:
    """The text format (version 0.0.4) of families, exactly as prometheus-client's
    generate_latest writes their Metric (``_metric``): label names sorted, label
    values escaped, values as Go writes floats. The metric and label names are
    ours and need no escaping."""
    escaped, written = _Escaped(), _Written()
    out: list[str] = []
    for family in families:
        name = f"{family.name}_total" if family.kind == "counter" else family.name
        documentation = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {documentation}\n# TYPE {name} {family.kind}\n")
        labels, rows = family.labels, family.rows
        order = sorted(range(len(labels)), key=labels.__getitem__)
        if not order:
            out.extend(f"{name} {written[value]}\n" for (value,) in rows)
        elif order == [0]:  # most families: one sample per breaker
            start = f'{name}{{{labels[0]}="'
            out.extend(f'{start}{escaped[a]}"}} {written[value]}\n' for a, value in rows)
        elif order == [0, 1]:
            start, between = f'{name}{{{labels[0]}="', f'",{labels[1]}="'
            out.extend(
                f'{start}{escaped[a]}{between}{escaped[b]}"}} {written[value]}\n' for a, b, value in rows
            )
        else:
            line = name + "{" + ",".join(f'{labels[i]}="%s"' for i in order) + "} %s\n"
            out.extend(line % (*(escaped[row[i]] for i in order), written[row[-1]]) for row in rows)
    return "".join(out).encode("utf-8")


def exposition(client: Any, prefix: str = "breaker", clock: Callable[[], int] | None = None) -> bytes:
    """The text exposition of every breaker under prefix, for one scrape."""
    return render(BreakerCollector(client, prefix, clock).families())
