"""Reading many breakers at once: per breaker (as before) against pipelined (now).

``python bench/status.py [BREAKERS]`` starts its own redis-server (as
bench/overhead.py does), creates BREAKERS breakers (2,000 by default) with
some state (three configs with different window shapes, outcomes in their
windows, some tripped, some forced open, some with live overrides, each with
a few transitions), then times, alternating in one run, each of these read
the way breaker_redis read before (one stored-config GET, a window HMGET when
there was no config, and one snapshot script per breaker, through a Breakers
per config; one LRANGE per breaker for the history) and the way it reads now
(breaker_redis/ops/reader.py: lua/read.lua pipelined, 500 breakers a round trip,
the next 500 on their way while these are decoded):

- ``Reader.snapshots()``: what ``status``, ``metrics`` and the dashboard read;
- ``breaker-redis status`` and ``status --json``, whole commands in process;
- one Prometheus scrape (``metrics.exposition``: the Flask endpoint, ``breaker-redis
  metrics``), and the same through a registry (``BreakerCollector`` registered on one,
  written by prometheus-client's ``generate_latest``: ``metrics --port``, an app's own
  registry);
- the last 5 transitions of every breaker (the dashboard's frame, ``events``).

Each is timed as wall time, and as the CPU this process and the redis-server
process used meanwhile (from /proc: Linux only): on a busy machine the wall
time includes waiting for a core, the CPU times do not.

Before timing, both ways read every breaker at one fixed time (the scripts'
now_ms) and the snapshots are compared field by field. Prints one markdown
table: median of REPEATS, the ratio, and the target (2,000 breakers in under
0.3 s). Exits 0 unless the benchmark cannot run or the two ways disagree.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from click.testing import CliRunner
from overhead import Boom, fail, noop, redis_server_process
from prometheus_client import CollectorRegistry, generate_latest

from breaker_redis import BreakerConfig, BreakerOpen, Breakers
from breaker_redis.base.config import BreakerConfig as Config
from breaker_redis.metrics import BreakerCollector, exposition
from breaker_redis.ops import cli
from breaker_redis.ops.reader import Reader

BREAKERS = 2000
REPEATS = 5
PREFIX = "bench-status"
TARGET_SECONDS = 0.3  # 2,000 breakers
READ_HISTORIES = Reader.histories  # as it is now, whatever per_breaker() puts in its place
CONFIGS = (
    BreakerConfig(),  # consecutive, 10 s in 10 buckets
    BreakerConfig(trip="count", failure_threshold=3, window_seconds=60, window_buckets=6, open_seconds=60),
    BreakerConfig(trip="rate", minimum_calls=4, window_seconds=30, window_buckets=5, slow_call_seconds=0.5),
)


# -- the breakers ---------------------------------------------------------------


def populate(url: str, count: int) -> None:
    """count breakers with state; one in 40 with a live override, one in 50 forced open."""
    app = Breakers.from_url(url, PREFIX, listen=False, batch_successes=False)
    try:
        for i in range(count):
            breaker = app.get(f"svc-{i:05d}", CONFIGS[i % len(CONFIGS)])
            for _ in range(2):
                breaker.call(noop)
            failures = 5 if i % 10 == 0 else 1  # one in ten trips
            for _ in range(failures):
                with contextlib.suppress(Boom, BreakerOpen):
                    breaker.call(fail)
            if i % 40 == 0:
                app.configure(breaker.name, failure_threshold=7, window_seconds=20)
            if i % 50 == 0:
                breaker.force_open()
            elif i % 25 == 0:
                breaker.reset()
        # a name listed with overrides only: no state, no stored config yet
        app.configure("overrides-only", open_seconds=90)
    finally:
        app.close()
        app.client.close()


# -- the two ways ---------------------------------------------------------------


class PerBreaker:
    """How reader.py read before: a few round trips per breaker, through a Breakers per config."""

    def __init__(self, clock: Callable[[], int] | None = None) -> None:
        self.clock = clock
        self.made: dict[tuple[int, Config], Breakers] = {}

    def snapshots(self, reader: Reader, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        out = []
        for name in reader.names() if names is None else names:
            config = reader.stored_config(name) or reader.window_config(name)
            key = (id(reader), config)
            breakers = self.made.get(key)
            if breakers is None:
                breakers = self.made[key] = Breakers(
                    reader.client,
                    reader.prefix,
                    listen=False,
                    on_store_error="deny",
                    defaults=config,
                    clock=self.clock,
                )
            out.append(breakers.get(name).snapshot())
        return out

    def histories(self, reader: Reader, names: Iterable[str], count: int) -> dict[str, list[dict[str, str]]]:
        found: dict[str, list[dict[str, str]]] = {}
        for name in names:  # one LRANGE, one round trip each
            found.update(READ_HISTORIES(reader, [name], count))
        return found

    def close(self) -> None:
        for breakers in self.made.values():
            breakers.close()


@contextlib.contextmanager
def per_breaker() -> Iterator[None]:
    """Reader reads as before while inside (every entry point: CLI, collector)."""
    old = PerBreaker()
    now_snapshots, now_histories = Reader.snapshots, Reader.histories
    Reader.snapshots = lambda reader, names=None: old.snapshots(reader, names)  # type: ignore[method-assign]
    Reader.histories = lambda reader, names, count: old.histories(reader, names, count)  # type: ignore[method-assign]
    try:
        yield
    finally:
        Reader.snapshots, Reader.histories = now_snapshots, now_histories  # type: ignore[method-assign]
        old.close()


# -- what is timed --------------------------------------------------------------


def reads(url: str) -> dict[str, Callable[[], object]]:
    def snapshots() -> object:
        with contextlib.closing(Reader(redis.Redis.from_url(url), PREFIX)) as reader:
            return reader.snapshots()

    def command(*args: str) -> Callable[[], object]:
        def run() -> object:
            result = CliRunner().invoke(cli.main, ["--url", url, "--prefix", PREFIX, *args])
            if result.exit_code != 0:
                raise SystemExit(f"breaker-redis {' '.join(args)} failed: {result.output}")
            return result.stdout

        return run

    def scrape() -> object:
        with contextlib.closing(redis.Redis.from_url(url)) as client:
            return exposition(client, PREFIX)

    def registry_scrape() -> object:
        with contextlib.closing(redis.Redis.from_url(url)) as client:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(BreakerCollector(client, PREFIX))
            return generate_latest(registry)

    def history() -> object:
        with contextlib.closing(Reader(redis.Redis.from_url(url), PREFIX)) as reader:
            return Reader.histories(reader, reader.names(), 5)

    return {
        "Reader.snapshots()": snapshots,
        "breaker-redis status": command("status"),
        "breaker-redis status --json": command("status", "--json"),
        "one metrics scrape (exposition)": scrape,
        "one metrics scrape through a registry (generate_latest)": registry_scrape,
        "last 5 transitions of each (dashboard, events)": history,
    }


def server_cpu(pid: int) -> float:
    """Seconds of CPU the redis-server process has used (user + system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(read: Callable[[], object], pid: int) -> tuple[float, float, float]:
    """(wall, this process's CPU, redis-server's CPU) of one read, in seconds."""
    server, cpu, started = server_cpu(pid), time.process_time(), time.perf_counter()
    read()
    return time.perf_counter() - started, time.process_time() - cpu, server_cpu(pid) - server


def compare(url: str) -> tuple[int, list[str]]:
    """(breakers compared, the differences): both ways at one fixed script time."""
    client = redis.Redis.from_url(url)
    seconds, micros = client.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    reader = Reader(client, PREFIX, clock=lambda: now)
    old = PerBreaker(clock=lambda: now)
    try:
        before, after = old.snapshots(reader), reader.snapshots()
        histories = (old.histories(reader, reader.names(), 10), reader.histories(reader.names(), 10))
    finally:
        old.close()
        reader.close()
    differences = [
        f"{a['name']}.{key}: {a.get(key)!r} != {b.get(key)!r}"
        for a, b in zip(before, after, strict=True)
        for key in sorted(set(a) | set(b))
        if a.get(key) != b.get(key)
    ]
    if len(before) != len(after):
        differences.append(f"{len(before)} snapshots before, {len(after)} now")
    if histories[0] != histories[1]:
        differences.append("the transition histories differ")
    return len(after), differences


def seconds(value: float) -> str:
    return f"{value * 1000:,.0f} ms" if value < 10 else f"{value:,.1f} s"


def median(runs: list[tuple[float, float, float]], i: int) -> float:
    return statistics.median(run[i] for run in runs)


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else BREAKERS
    started = time.monotonic()
    with redis_server_process() as (url, process):
        control = redis.Redis.from_url(url)
        version = control.info("server")["redis_version"]
        populate(url, count)
        listed = len(control.smembers(f"{PREFIX}:names"))
        compared, differences = compare(url)
        runs: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
        for _ in range(REPEATS):  # alternating, so both see the same machine
            for label, read in reads(url).items():
                with per_breaker():
                    runs.setdefault((label, "before"), []).append(timed(read, process.pid))
                runs.setdefault((label, "now"), []).append(timed(read, process.pid))
        control.close()
    load = os.getloadavg()[0]
    print(
        f"# Reading {listed:,} breakers: per breaker (before) and pipelined (now) "
        f"(redis-server {version} on 127.0.0.1, Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} cores, load average {load:.1f}, median of {REPEATS})\n"
    )
    print("| read | before | now | before / now | now: CPU here + Redis's | target | result |")
    print("|---|---|---|---|---|---|---|")
    target = TARGET_SECONDS * listed / BREAKERS
    for label in reads(url):
        before, now = runs[(label, "before")], runs[(label, "now")]
        verdict = "PASS" if median(now, 0) < target else "MISS"
        print(
            f"| {label} | {seconds(median(before, 0))} | {seconds(median(now, 0))} "
            f"| {median(before, 0) / median(now, 0):.1f}x "
            f"| {seconds(median(now, 1))} + {seconds(median(now, 2))} | < {seconds(target)} | {verdict} |"
        )
    same = "the same" if not differences else f"{len(differences)} differences"
    print(
        "\nbefore, now: wall time. CPU here: this process (the CLI, the collector); Redis's: "
        "the redis-server process, both while the read ran. On a busy machine the wall time "
        "waits for a core; the CPU times do not."
    )
    print(f"snapshots and histories of {compared:,} breakers read both ways at one script time: {same}")
    for line in differences[:20]:
        print(f"  {line}")
    print(f"finished in {time.monotonic() - started:.1f} s")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
