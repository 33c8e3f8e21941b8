"""What breaker_redis.opentelemetry adds to a call, against the same call uninstrumented, in one run.

Run ``python bench/telemetry.py`` (not named after the package it measures, which it would
shadow on the path). It starts a fresh redis-server on a free
loopback port (as bench/overhead.py does) and builds two Breakers on it, one
instrumented (``instrument(breakers, meter_provider=...)`` on the SDK's
MeterProvider, read by an InMemoryMetricReader once at the end) and one not,
each with a calm breaker (closed, far from its threshold, subscribed, so
that it decides from memory and batches its successes) and an open one. The
subjects, each on both Breakers:

- ``call``: ``Breaker.call`` of a healthy call (guard()'s path, no permit);
- ``permit``: ``acquire()`` then ``success()``;
- ``refused``: ``Breaker.call`` of the open breaker, BreakerOpen caught; no
  span is current, so no event is made;
- ``refused in a span``: the same inside a recording span of the SDK's
  tracer (one span for the whole run, so what is measured is the event, not
  the span): the ``breaker.refusal`` event is added.

Each subject runs CALLS calls per round, ROUNDS rounds, the subjects of a
round in a shuffled order; a ratio is the median over the rounds of the
instrumented time over the uninstrumented one of the same round, so that
the load of a shared machine falls on both. The run checks at the end that
the instrumented counts are exact. ``BENCH_ROUNDS`` and ``BENCH_CALLS`` in
the environment change the numbers.

``python bench/telemetry.py --instructions`` counts instead of timing (it
needs valgrind): each subject runs alone under callgrind, instrumented only
while it makes COUNTED calls after a warm-up, and the table gives
instructions per call of the calling thread. Counts do not move with the
load of the machine.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import date
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # measure this checkout, installed or not

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from overhead import callgrind_stretch, callgrind_subject, noop, redis_server, wait_until_subscribed  # noqa: E402

from breaker_redis import BreakerConfig, BreakerOpen, Breakers  # noqa: E402
from breaker_redis.opentelemetry import instrument  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "15"))
CALLS = int(os.environ.get("BENCH_CALLS", "5000"))
WARMUP = 500
COUNTED = 2000  # calls counted per subject under callgrind
CALM = BreakerConfig(trip="rate", failure_rate=0.5, minimum_calls=20)
SUBJECTS = ("call", "permit", "refused", "refused in a span")


class Side:
    """One Breakers (instrumented or not), its calm breaker and its open one."""

    def __init__(self, url: str, tag: str, instrumented: bool) -> None:
        self.breakers = Breakers.from_url(url, prefix=f"bench-otel-{tag}")
        self.reader = InMemoryMetricReader()
        self.meters = MeterProvider(metric_readers=[self.reader])
        if instrumented:
            instrument(self.breakers, meter_provider=self.meters)
        self.calm = self.breakers.get("calm", CALM)
        wait_until_subscribed(self.breakers, self.calm)
        self.open = self.breakers.get("open", CALM)
        self.open.trip()
        self.tracer = TracerProvider().get_tracer("bench")

    def subject(self, name: str) -> Callable[[int], float]:
        """Run n calls of a subject, return the seconds they took."""
        calm, shut = self.calm, self.open

        def call(n: int) -> float:
            start = time.perf_counter()
            for _ in range(n):
                calm.call(noop)
            return time.perf_counter() - start

        def permit(n: int) -> float:
            start = time.perf_counter()
            for _ in range(n):
                calm.acquire().success()
            return time.perf_counter() - start

        def refused(n: int) -> float:
            start = time.perf_counter()
            for _ in range(n):
                try:  # noqa: SIM105 - a with statement would cost more than the call's refusal
                    shut.call(noop)
                except BreakerOpen:
                    pass
            return time.perf_counter() - start

        def refused_in_a_span(n: int) -> float:
            with self.tracer.start_as_current_span("request"):
                return refused(n)

        return {"call": call, "permit": permit, "refused": refused, "refused in a span": refused_in_a_span}[
            name
        ]

    def calls(self) -> dict[tuple[str, str], int]:
        data = self.reader.get_metrics_data()
        found = {}
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == "breaker.calls":
                        for point in metric.data.data_points:
                            attributes = point.attributes or {}
                            key = (str(attributes["breaker.name"]), str(attributes["breaker.outcome"]))
                            found[key] = int(point.value)  # type: ignore[union-attr]
        return found

    def close(self) -> None:
        self.breakers.close()
        self.meters.shutdown()


def timed(url: str) -> dict[str, tuple[float, float, float]]:
    """Per subject: (µs per call uninstrumented, instrumented, median ratio of the rounds)."""
    with ExitStack() as stack:
        plain, otel = Side(url, "plain", False), Side(url, "otel", True)
        stack.callback(plain.close)
        stack.callback(otel.close)
        sides = {"plain": plain, "otel": otel}
        runs = [(name, side, sides[side].subject(name)) for name in SUBJECTS for side in sides]
        for _, _, run in runs:
            run(WARMUP)
        usec: dict[tuple[str, str], list[float]] = {(name, side): [] for name, side, _ in runs}
        ratios: dict[str, list[float]] = {name: [] for name in SUBJECTS}
        for _ in range(ROUNDS):
            random.shuffle(runs)
            for name, side, run in runs:
                usec[(name, side)].append(run(CALLS) / CALLS * 1e6)
            for name in SUBJECTS:
                ratios[name].append(usec[(name, "otel")][-1] / usec[(name, "plain")][-1])
        expected = 2 * (WARMUP + ROUNDS * CALLS)  # call and permit; refused and refused in a span
        counted = otel.calls()
        want = {("calm", "success"): expected + 1, ("open", "refused"): expected}  # +1: the subscribing call
        if counted != want:
            raise SystemExit(f"the instrumented counts are not exact: {counted} (expected {want})")
        return {
            name: (
                statistics.median(usec[(name, "plain")]),
                statistics.median(usec[(name, "otel")]),
                statistics.median(ratios[name]),
            )
            for name in SUBJECTS
        }


# -- counting instructions (--instructions) ----------------------------------------------


def one_subject(name: str, side: str, url: str) -> int:
    """Under callgrind: warm one subject up, then make COUNTED calls of it between two
    lines read from stdin (the parent instruments that stretch)."""
    subject = Side(url, side, side == "otel")
    run = subject.subject(name)
    callgrind_subject(run, WARMUP, COUNTED)
    subject.close()
    return 0


def instructions(url: str, folder: str) -> dict[str, tuple[float, float, float]]:
    counts: dict[tuple[str, str], float] = {}
    for name in SUBJECTS:
        for side in ("plain", "otel"):
            command = [sys.executable, __file__, "--one", name, side, url]
            total = callgrind_stretch(command, f"{side}-{name.replace(' ', '-')}", folder, "a call failed")
            counts[(name, side)] = total / COUNTED
    return {
        name: (
            counts[(name, "plain")],
            counts[(name, "otel")],
            counts[(name, "otel")] / counts[(name, "plain")],
        )
        for name in SUBJECTS
    }


def table(figures: dict[str, tuple[float, float, float]], unit: str, digits: int) -> str:
    lines = [
        f"| subject | uninstrumented, {unit} | instrumented, {unit} | added, {unit} | ratio |",
        "|---|---|---|---|---|",
    ]
    for name, (plain, otel, ratio) in figures.items():
        lines.append(
            f"| {name} | {plain:,.{digits}f} | {otel:,.{digits}f} "
            f"| {otel - plain:+,.{digits}f} | {ratio:.2f} |"
        )
    return "\n".join(lines)


def main() -> int:
    if sys.argv[1:2] == ["--one"]:
        return one_subject(sys.argv[2], sys.argv[3], sys.argv[4])
    started = time.monotonic()
    counting = sys.argv[1:2] == ["--instructions"]
    versions = f"Python {sys.version.split()[0]}, opentelemetry-sdk {version('opentelemetry-sdk')}"
    with redis_server() as url:
        if counting:
            with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as folder:
                figures = instructions(url, folder)
            print(
                "# breaker_redis.opentelemetry: instructions per call "
                f"(callgrind, the calling thread; {versions};"
            )
            print(f"{COUNTED} calls per subject after {WARMUP}; {date.today().isoformat()})\n")
            print(table(figures, "instructions", 0))
        else:
            figures = timed(url)
            print(
                f"# breaker_redis.opentelemetry: µs per call ({versions}; {ROUNDS} rounds of {CALLS} calls;"
            )
            print(f"load average {os.getloadavg()[0]:.1f}; {date.today().isoformat()})\n")
            print(table(figures, "µs", 2))
    print(f"\nfinished in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
