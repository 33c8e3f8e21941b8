"""What an acknowledged change costs the call that makes it, with 0 to 64 workers listening.

A call that changes a breaker (a trip, a reset, a live-config write) returns
only once every listening worker has applied the change's notice and
counted it (HINCRBY on ``<prefix>:{NAME}:acks``), or after the lease
(breaker_redis/storage/acks.py): it polls the count with HMGET. Before, it
sent one PING (the "barrier") and returned whatever the workers were doing.
The wait grows with the workers that must answer, so this bench measures the
tripping call's wall time with 0, 1, 8 and 64 workers listening, and what it
sends to Redis; ``--against REV`` runs the same measurement on the code of
commit REV (the PING barrier, for a commit before acknowledgements) in the
same run, on the same server.

``python bench/acks.py [--against REV] [--valkey PATH]`` starts a fresh
redis-server (PATH's) on a free loopback port, and with ``--valkey`` also that
server started with ``--io-threads 4``; per server, per worker count, per code:

1. Workers: ``Breakers.from_url(url)`` each, every one with its own
   subscription connection and listener thread, holding the breaker; up to
   WORKERS_PER_PROCESS of them per process (64 full processes do not fit a
   small machine; 64 workers are 8 processes of 8), started before the
   measurement and ready once each is subscribed (``invalidator.healthy``) and,
   where the code has leases, leased (``invalidator.trust_until`` ahead).
2. The tripping worker, a process of its own: ``Breakers(client,
   listen=False)`` (it does not listen itself, so the workers listening are
   exactly the ones counted), a breaker with ``trip="consecutive"``,
   ``failure_threshold=1``, ``open_seconds=30``; ``acquire().failure()`` trips
   it, timed, TRIPS rounds after WARMUP; between rounds an operator
   (``Breakers.from_url(url, listen=False)``, in the same process, on a client
   of its own) resets it, timed too (a reset is acknowledged as well). A
   pause of PAUSE_SECONDS after each, so the workers' listeners are idle when
   the next change comes, as they are between two real changes.
3. Commands of the tripping call: counted on the client (a connection class
   that counts what it sends, on the tripping client only: EVALSHA or FCALL
   of the scripts, HMGET of the acknowledgements' poll, PING of the old
   barrier), and on the server (``INFO commandstats`` deltas around each trip,
   from a third client; they include the commands the scripts run, which the
   0 workers row shows: beyond those, HMGET is the tripping call's polls and
   HINCRBY the workers' acknowledgements).

Worker counts run in turn; the codes alternate from one count to the next
(this checkout first, then REV first), each with workers of its own code.
Prints one markdown table per server; the figures are wall times on a
shared machine (the load average is printed), so read medians, and p90 for
the tail a poll's back-off adds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Any

import redis

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
WORKER_COUNTS = (0, 1, 8, 64)
WORKERS_PER_PROCESS = 8
TRIPS = 50  # timed rounds (trip, then reset) per worker count and code
WARMUP = 3  # rounds first, not timed
PAUSE_SECONDS = 0.02  # after each timed change
READY_SECONDS = 60.0  # workers subscribed and leased by then, or the bench stops
NAME_PREFIX = "bench-acks"
# commands the tripping call sends, as the server counts them (INFO commandstats)
SERVER_COMMANDS = ("evalsha", "fcall", "hmget", "hincrby")


# -- the worker processes (--role workers) ------------------------------------


def listening(breakers: Any) -> bool:
    """Subscribed and, where the code has leases (storage/acks.py), leased."""
    invalidator = breakers.invalidator
    if invalidator is None or not invalidator.healthy:
        return False
    trust_until = getattr(type(invalidator), "trust_until", None)
    return trust_until is None or float(invalidator.trust_until) > time.monotonic()


def run_workers(url: str, name: str, count: int) -> int:
    """``count`` workers (Breakers) in this process, each listening and holding the breaker;
    prints "ready" once all are, then runs until its stdin closes."""
    from breaker_redis import Breakers

    made = [Breakers.from_url(url) for _ in range(count)]
    try:
        for breakers in made:
            breakers.get(name, tripping_config())
            breakers.ensure_process()
        deadline = time.monotonic() + READY_SECONDS
        while not all(listening(breakers) for breakers in made):
            if time.monotonic() > deadline:
                print("not listening", flush=True)
                return 1
            time.sleep(0.01)
        print("ready", flush=True)
        sys.stdin.read()  # until the bench closes it
    finally:
        for breakers in made:
            breakers.close()
    return 0


def tripping_config() -> Any:
    from breaker_redis import BreakerConfig

    return BreakerConfig(trip="consecutive", failure_threshold=1, open_seconds=30)


# -- the tripping process (--role trips) ----------------------------------------


class Sent:
    """Commands packed by the connections of one client, by name (the tripping client's)."""

    counts: Counter[str] = Counter()

    @classmethod
    def note(cls, args: Sequence[Any]) -> None:
        head = args[0]
        cls.counts[(head.decode() if isinstance(head, bytes) else str(head)).split()[0].upper()] += 1


class CountingConnection(redis.Connection):
    """redis-py's connection, counting each command as it sends it: one at a time
    (send_command) or a pipeline's (pack_commands)."""

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        Sent.note(args)
        connection: Any = super()  # redis-py's methods are untyped
        connection.send_command(*args, **kwargs)

    def pack_commands(self, commands: Iterable[Sequence[Any]]) -> Any:
        commands = list(commands)
        for args in commands:
            Sent.note(args)
        connection: Any = super()
        return connection.pack_commands(commands)


def command_calls(control: redis.Redis) -> Counter[str]:
    stats = control.info("commandstats")
    return Counter({key.removeprefix("cmdstat_"): int(value["calls"]) for key, value in stats.items()})


def subscribers(control: redis.Redis) -> int:
    """Subscribers of every channel under the default prefix (the workers' channel, whatever
    the code calls it)."""
    channels = control.pubsub_channels("breaker:*")
    return sum(int(n) for _channel, n in control.pubsub_numsub(*channels)) if channels else 0


def run_trips(url: str, name: str, trips: int) -> int:
    """Trip and reset the breaker ``trips`` times after WARMUP; prints one JSON line."""
    import breaker_redis
    from breaker_redis import Breakers
    from breaker_redis.urls import client_from_url

    client = client_from_url(url)
    assert isinstance(client, redis.Redis)  # a redis:// URL
    client.connection_pool.connection_class = CountingConnection  # before its first connection
    tripper = Breakers(client, listen=False)
    operator = Breakers.from_url(url, listen=False)
    control = redis.Redis.from_url(url)
    breaker = tripper.get(name, tripping_config())
    reset = operator.get(name, tripping_config())
    trip_ms: list[float] = []
    reset_ms: list[float] = []
    sent: Counter[str] = Counter()
    server: Counter[str] = Counter()
    try:
        for round_ in range(WARMUP + trips):
            timed = round_ >= WARMUP
            before = command_calls(control)
            Sent.counts.clear()
            start = time.perf_counter()
            breaker.acquire().failure()
            took = time.perf_counter() - start
            if timed:
                sent += Sent.counts
                server += command_calls(control) - before
                trip_ms.append(took * 1000)
            state = str(getattr(reset.state, "value", reset.state))
            if state != "open":
                raise SystemExit(f"the failure left the breaker {state}, not open")
            time.sleep(PAUSE_SECONDS)
            start = time.perf_counter()
            reset.reset()
            took = time.perf_counter() - start
            if timed:
                reset_ms.append(took * 1000)
            time.sleep(PAUSE_SECONDS)
        heard = subscribers(control)
    finally:
        tripper.close()
        operator.close()
        control.close()
    print(
        json.dumps(
            {
                "module": str(Path(breaker_redis.__file__).parent),
                "trip_ms": trip_ms,
                "reset_ms": reset_ms,
                "sent": dict(sent),
                "server": {key: server[key] for key in SERVER_COMMANDS},
                "subscribers": heard,
            }
        )
    )
    return 0


# -- the bench -------------------------------------------------------------------


def child(role: str, root: str, *args: str) -> list[str]:
    return [sys.executable, str(HERE), "--role", role, "--root", root, *args]


def processes_for(count: int) -> list[int]:
    """Workers per process: ``count`` split into processes of WORKERS_PER_PROCESS at most."""
    full, rest = divmod(count, WORKERS_PER_PROCESS)
    return [WORKERS_PER_PROCESS] * full + ([rest] if rest else [])


def described(count: int) -> str:
    shape = processes_for(count)
    if not shape:
        return "0"
    if len(set(shape)) == 1:
        return f"{count} ({len(shape)} x {shape[0]})"
    return f"{count} ({' + '.join(map(str, shape))})"


@contextmanager
def workers(root: str, url: str, name: str, count: int) -> Iterator[None]:
    """``count`` workers of the code under ``root``, listening, until the block ends."""
    with ExitStack() as stack:
        started: list[subprocess.Popen[str]] = []
        for size in processes_for(count):
            argv = child("workers", root, "--url", url, "--name", name, "--count", str(size))
            process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            stack.callback(stop, process)
            started.append(process)
        for process in started:
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            if line != "ready":
                raise SystemExit(f"a worker process did not get ready: {line or 'it exited'}")
        yield


def stop(process: subprocess.Popen[str]) -> None:
    stdin: IO[str] | None = process.stdin
    if stdin is not None:
        stdin.close()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def measure(url: str, roots: dict[str, str], counts: Sequence[int], trips: int) -> list[dict[str, Any]]:
    results = []
    for index, count in enumerate(counts):
        order = list(roots) if index % 2 == 0 else list(reversed(roots))
        for code in order:
            name = f"{NAME_PREFIX}-{count}-{list(roots).index(code)}"
            with workers(roots[code], url, name, count):
                argv = child("trips", roots[code], "--url", url, "--name", name, "--trips", str(trips))
                out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            if not Path(result["module"]).is_relative_to(roots[code]):
                raise SystemExit(f"{code}: measured the code at {result['module']}, not under {roots[code]}")
            results.append({"code": code, "workers": count, **result})
    return results


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def table(title: str, results: list[dict[str, Any]], trips: int) -> str:
    lines = [
        f"## {title}\n",
        "| workers (processes x Breakers) | subscribers | code | trip, median ms | trip, p90 ms "
        "| reset, median ms | reset, p90 ms | commands sent per trip (client) "
        "| per trip at the server (scripts' own included): EVALSHA+FCALL / HMGET / HINCRBY |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        sent = result["sent"]
        per = ", ".join(f"{name} {n / trips:.2f}" for name, n in sorted(sent.items()))
        server = result["server"]
        scripts = (server["evalsha"] + server["fcall"]) / trips
        lines.append(
            f"| {described(result['workers'])} | {result['subscribers']} | {result['code']} "
            f"| {statistics.median(result['trip_ms']):.2f} | {p90(result['trip_ms']):.2f} "
            f"| {statistics.median(result['reset_ms']):.2f} | {p90(result['reset_ms']):.2f} "
            f"| {sum(sent.values()) / trips:.2f} ({per}) "
            f"| {scripts:.2f} / {server['hmget'] / trips:.2f} / {server['hincrby'] / trips:.2f} |"
        )
    lines.append(
        "\nAt the server: INFO commandstats deltas around each trip, which count the commands the "
        "scripts run too (their HMGET and HINCRBY: the 0 workers row); beyond those, HMGET is the "
        "tripping call's polls and HINCRBY the workers' acknowledgements."
    )
    return "\n".join(lines)


def bench(args: argparse.Namespace) -> int:
    from overhead import code_of, redis_server

    counts = [int(n) for n in args.workers.split(",")]
    servers: list[tuple[str | None, tuple[str, ...]]] = [(None, ())]
    if args.valkey:
        servers.append((args.valkey, ("--io-threads", "4")))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-acks-") as folder:
        roots = {"this checkout": str(ROOT)}
        if args.against:
            sha = subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "--short", args.against],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            roots[f"commit {sha}"] = str(code_of(args.against, Path(folder)))
        for binary, extra in servers:
            with redis_server(binary, extra) as url:
                info = redis.Redis.from_url(url).info("server")
                results = measure(url, roots, counts, args.trips)
            kind = "Valkey" if "valkey_version" in info else "redis-server"
            version = info.get("valkey_version", info["redis_version"])
            title = (
                f"The tripping call with workers listening ({kind} {version}"
                f"{' ' + ' '.join(extra) if extra else ''}, Python {sys.version.split()[0]}, "
                f"{args.trips} trips and resets per row, load average {os.getloadavg()[0]:.1f})"
            )
            print(table(title, results, args.trips))
            print()
    print(
        f"workers: up to {WORKERS_PER_PROCESS} Breakers per process, each with its own subscription "
        "and listener thread; the tripping worker and the operator: listen=False, in one more process"
    )
    print(f"finished in {time.monotonic() - started:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the tripping call's wait for acknowledgements (docstring)")
    parser.add_argument("--against", metavar="REV", help="also measure the code of commit REV")
    parser.add_argument("--valkey", metavar="PATH", help="also on this valkey-server, with --io-threads 4")
    parser.add_argument(
        "--workers",
        default=",".join(map(str, WORKER_COUNTS)),
        help="worker counts, comma separated (default: %(default)s)",
    )
    parser.add_argument("--trips", type=int, default=TRIPS, help="timed trips per row (default: %(default)s)")
    # the children's side: this file run with the code under --root first on sys.path
    parser.add_argument("--role", choices=("workers", "trips"), help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role is None:
        return bench(args)
    sys.path.insert(0, args.root)
    if args.role == "workers":
        return run_workers(args.url, args.name, args.count)
    return run_trips(args.url, args.name, args.trips)


if __name__ == "__main__":
    sys.exit(main())
