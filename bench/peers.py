"""breaker_redis side by side with the breakers users would otherwise pick.

Run ``python bench/peers.py``. It installs the peers it lacks into the running
interpreter (``python -m pip install -q``), starts one fresh redis-server on a
free loopback port, measures every library on it in one run, prints markdown
tables and stops the server. The peers, each set as close as it allows to
breaker_redis's ``trip="consecutive", failure_threshold=5, open_seconds=10``
and one half-open probe (the caveats column says what differs):

- ``circuitbreaker``: in-process only, the floor;
- ``pybreaker`` with ``CircuitRedisStorage``;
- ``interlock-cb`` with ``interlock.integrations.redis.RedisStorage``;
- ``nopanic-redis`` (``redis_circuit_breaker``);
- ``purgatory`` with its Redis unit of work.

Phases, each bounded in time:

1. µs per protected call while healthy (median of repeats, the repeats of all
   libraries interleaved), and per rejected call while open.
2. Redis commands per call, healthy and open, counted with MONITOR between two
   ECHO markers (``bench/overhead.py``'s ``Monitor``); commands run inside
   Lua scripts are not counted. Each phase is a time-bounded loop, so
   background polling is in the figure.
3. Counts lost: 8 spawned processes x 200 failures against one breaker whose
   threshold is never reached; the failures the shared state holds after.
4. Half-open race: 8 processes trip the breaker, wait out the open period
   (shortened to 1 s here for every library) and call at once (barrier) with
   a probe that takes 0.3 s; how many were admitted. Then upstream calls
   after a trip: 8 processes warm a breaker, the parent trips it, then each
   process makes 20 failing calls 10 ms apart; how many reached the function.
5. Redis down (SIGSTOP, then killed), on breakers built and used while it was
   up: successful calls 20 ms apart for 2 s (what the caller sees, ms per
   call), then 5 failing calls and one more (does it still trip?). WARNING+
   log records are counted, not shown.

Nothing is asserted: a library that cannot be installed or measured gets
"n/a" and the reason, and the script exits 0.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import logging
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for folder in (str(ROOT), str(HERE)):
    if folder not in sys.path:
        sys.path.insert(0, folder)  # this checkout, and bench/overhead.py for its helpers

import redis  # noqa: E402

from breaker_redis import BreakerConfig, BreakerOpen, Breakers  # noqa: E402

# (key, distribution on the package index, module to import)
PEERS = [
    ("circuitbreaker", "circuitbreaker", "circuitbreaker"),
    ("pybreaker", "pybreaker", "pybreaker"),
    ("interlock", "interlock-cb", "interlock"),
    ("nopanic-redis", "nopanic-redis", "nopanic_redis"),
    ("purgatory", "purgatory", "purgatory"),
]
OURS = "breaker_redis"
FLOOR = "circuitbreaker"
REDIS_PEER = "pybreaker"
IN_PROCESS = {"circuitbreaker"}

THRESHOLD = 5
OPEN_SECONDS = 10.0
RACE_OPEN_SECONDS = 1.0  # the half-open race waits this long instead of 10 s
HUGE = 1_000_000  # breaker_redis's largest failure_threshold

ITERATIONS = 2000  # calls per timing repeat
REPEATS = 5
WARMUP = 300
COUNT_SECONDS = 1.5  # each MONITOR phase: a loop at least this long
PROCESSES = 8
FAILURES_PER_PROCESS = 200
PROBE_SECONDS = 0.3
UPSTREAM_CALLS = 20
UPSTREAM_GAP = 0.01
DOWN_SECONDS = 2.0  # successful calls while Redis is down, for this long
DOWN_GAP = 0.02  # between them
PEER_SOCKET_TIMEOUT = 0.25  # what breaker_redis's from_url uses; peers keep redis-py's default retry
BARRIER_SECONDS = 30
POOL_SECONDS = 45

CONFIGS = {
    OURS: 'Breakers.from_url(url); trip="consecutive", failure_threshold=5, open_seconds=10',
    "circuitbreaker": "CircuitBreaker(failure_threshold=5, recovery_timeout=10)",
    "pybreaker": "CircuitBreaker(fail_max=5, reset_timeout=10, state_storage=CircuitRedisStorage(...))",
    "interlock": (
        "Config(failure_rate_threshold=1.0, minimum_number_of_calls=5, window_size=5, "
        "permitted_calls_in_half_open=1, max_concurrent_probes=1, wait_duration_in_open=10), "
        "storage=RedisStorage(client)"
    ),
    "nopanic-redis": (
        "redis_circuit_breaker(client, failure_threshold=1.0, min_calls=5, window=10, "
        "reset_timeout=10, half_open_max_calls=1)"
    ),
    "purgatory": (
        "SyncCircuitBreakerFactory(default_threshold=5, default_ttl=10, uow=SyncRedisUnitOfWork(url))"
    ),
}
CAVEATS = {
    OURS: (
        "the reference; successes are batched (sent within 50 ms), failures sent at once; with Redis "
        'down (default on_store_error="local") each process goes on with a local breaker of the same config'
    ),
    "circuitbreaker": (
        "in-process only: each process has its own state; half-open admits every call, "
        "not one probe; counts failures since the last success (consecutive); only its decorator "
        "checks the state (`CircuitBreaker.call()` never rejects), so the bench checks `opened` first "
        "as the decorator does"
    ),
    "pybreaker": (
        "state and failure counter in Redis (GET/INCR/SET, no script): reads the state on every call; "
        "half-open is a shared flag, not a probe budget; Redis errors are logged and it falls back "
        "to `closed`"
    ),
    "interlock": (
        "no consecutive rule: a 5-call count window at 100 % failures is the same trip on a single "
        "process, but the window is per process; only OPEN/HALF_OPEN and the probe lease are shared, "
        "read from a view polled every 1 s, trips written in the background"
    ),
    "nopanic-redis": (
        "failure *rate* over a 10 s time window, no consecutive rule: 100 % with min_calls=5 trips on 5 "
        "failures only when the window holds no success; two scripts (before, after) per call; "
        "fail_open=True by default; time is the caller's wall clock"
    ),
    "purgatory": (
        "3.0.1's sync Redis repository builds a redis.asyncio client and fails on the first call "
        "(TypeError); the bench swaps in redis.Redis (its async flavour is the supported one); state is "
        "JSON read-modify-write (GET+SET) with an INCR counter; half-open admits every caller"
    ),
}

NOTES = [
    "Real time throughout (no test clock); one machine, one run: µs figures move with the load "
    "average in the header, the ratios less so.",
    "The healthy rows are what each library does per call; breaker_redis and interlock answer from "
    "memory and write in the background, pybreaker, nopanic-redis and purgatory ask Redis on every call.",
    "Counts lost reads each library's own shared counter (breaker_redis consecutive_failures, pybreaker "
    "fail_counter, nopanic-redis window failures, purgatory failure_count) after every process is done.",
    "The half-open race shortens the open period to 1 s for every library; a library that opens per "
    "process lets one probe per process through.",
    "Redis down: the peers' clients get breaker_redis's 0.25 s socket timeouts (redis-py's default is "
    "no timeout: a SIGSTOPped server would block them forever) and keep redis-py's default retry.",
]


class Boom(Exception):
    """The failure the protected functions raise."""


def noop() -> None:
    return None


def fail() -> None:
    raise Boom


# -- installing the peers -------------------------------------------------------


def ensure_installed() -> dict[str, str]:
    """{peer key: reason} for the peers that cannot be imported after pip."""
    missing: dict[str, str] = {}
    for key, dist, module in PEERS:
        try:
            version(dist)
        except PackageNotFoundError:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "install", "-q", dist],
                capture_output=True,
                text=True,
                timeout=180,
                check=False,
            )
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
                missing[key] = f"pip install {dist} failed: {tail[0][:120]}"
                continue
            importlib.invalidate_caches()
        try:
            importlib.import_module(module)
        except Exception as exc:
            missing[key] = f"import {module} failed: {type(exc).__name__}: {exc}"[:160]
    return missing


def peer_version(key: str) -> str:
    if key == OURS:
        import breaker_redis

        return breaker_redis.__version__
    dist = next(d for k, d, _ in PEERS if k == key)
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


# -- the server -------------------------------------------------------------------


def peer_client(url: str) -> redis.Redis:
    """The client handed to a peer: breaker_redis's timeouts, redis-py's default retry."""
    return redis.Redis.from_url(
        url, socket_timeout=PEER_SOCKET_TIMEOUT, socket_connect_timeout=PEER_SOCKET_TIMEOUT
    )


# -- one breaker of each library, behind one shape --------------------------------------


@dataclass
class Built:
    """One library's breaker: `call(fn)` runs fn behind it."""

    call: Callable[[Callable[[], Any]], Any]
    rejected: tuple[type[BaseException], ...]
    held: Callable[[], int] | None = None  # failures the shared state holds; None: not shared
    local: Callable[[], int] | None = None  # failures this process holds
    settle: Callable[[], None] = lambda: None  # send what the library still holds
    ready: Callable[[], None] = lambda: None  # wait for the steady state
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for closer in self.closers:
            bounded(closer, 3.0)


def bounded(fn: Callable[[], Any], seconds: float) -> bool:
    """Runs fn in a daemon thread for at most `seconds`; whether it finished."""
    thread = threading.Thread(target=_quiet, args=(fn,), daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive()


def _quiet(fn: Callable[[], Any]) -> None:
    with contextlib.suppress(Exception):
        fn()


def build(
    peer: str, url: str, name: str, threshold: int = THRESHOLD, open_seconds: float = OPEN_SECONDS
) -> Built:
    return BUILDERS[peer](url, name, threshold, open_seconds)


def build_ours(url: str, name: str, threshold: int, open_seconds: float) -> Built:
    breakers = Breakers.from_url(url)
    config = BreakerConfig(
        trip="consecutive", failure_threshold=min(threshold, HUGE), open_seconds=open_seconds
    )
    breaker = breakers.get(name, config)

    def ready() -> None:
        """As overhead.wait_until_subscribed, but another process may have tripped it already."""
        with contextlib.suppress(BreakerOpen):
            breaker.call(noop)
        deadline = time.monotonic() + 10
        while breakers.invalidator is not None and not breakers.invalidator.healthy:
            if time.monotonic() > deadline:
                raise RuntimeError("breaker_redis: the invalidation listener did not subscribe")
            time.sleep(0.01)

    def held() -> int:
        return int(breaker.snapshot()["consecutive_failures"])

    return Built(
        call=breaker.call,
        rejected=(BreakerOpen,),
        held=held,
        local=held,
        settle=breaker.flush_batch,
        ready=ready,
        closers=[breakers.close, breakers.client.close],
    )


def build_circuitbreaker(url: str, name: str, threshold: int, open_seconds: float) -> Built:
    import circuitbreaker

    breaker = circuitbreaker.CircuitBreaker(
        failure_threshold=threshold, recovery_timeout=open_seconds, name=name
    )

    def call(fn: Callable[[], Any]) -> Any:
        # what its decorator does: CircuitBreaker.call() itself never checks the state
        if breaker.opened:
            raise circuitbreaker.CircuitBreakerError(breaker)
        return breaker.call(fn)

    return Built(
        call=call,
        rejected=(circuitbreaker.CircuitBreakerError,),
        local=lambda: int(breaker.failure_count),
    )


def build_pybreaker(url: str, name: str, threshold: int, open_seconds: float) -> Built:
    import pybreaker

    client = peer_client(url)
    storage = pybreaker.CircuitRedisStorage(pybreaker.STATE_CLOSED, client, namespace=f"peers-{name}")
    breaker = pybreaker.CircuitBreaker(fail_max=threshold, reset_timeout=open_seconds, state_storage=storage)
    return Built(
        call=breaker.call,
        rejected=(pybreaker.CircuitBreakerError,),
        held=lambda: int(storage.counter),
        local=lambda: int(storage.counter),
        closers=[client.close],
    )


def build_interlock(url: str, name: str, threshold: int, open_seconds: float) -> Built:
    from interlock import CircuitBreaker, CircuitOpenError, Config
    from interlock.integrations.redis import RedisStorage

    client = peer_client(url)
    window = min(threshold, THRESHOLD)  # a huge threshold: min calls never reached, window stays small
    config = Config(
        failure_rate_threshold=1.0,
        minimum_number_of_calls=threshold,
        window_size=window,
        permitted_calls_in_half_open=1,
        max_concurrent_probes=1,
        wait_duration_in_open=open_seconds,
    )
    breaker = CircuitBreaker(
        name=name, config=config, storage=RedisStorage(client, key_prefix="peers:interlock:")
    )
    return Built(
        call=breaker.call_sync,
        rejected=(CircuitOpenError,),
        local=lambda: int(breaker.snapshot().failed_calls),
        closers=[breaker.close, client.close],
    )


def build_nopanic(url: str, name: str, threshold: int, open_seconds: float) -> Built:
    from nopanic import CircuitOpen
    from nopanic_redis import redis_circuit_breaker

    client = peer_client(url)
    breaker = redis_circuit_breaker(
        client,
        name=name,
        failure_threshold=1.0,
        min_calls=threshold,
        window=10.0,
        window_buckets=10,
        reset_timeout=open_seconds,
        half_open_max_calls=1,
        prefix="peers-nopanic",
    )
    window_key = f"peers-nopanic:breaker:{{{name}}}:window"

    def held() -> int:
        fields = client.hgetall(window_key)
        return sum(int(v) for k, v in fields.items() if k.decode().endswith(":f"))

    return Built(call=breaker.call, rejected=(CircuitOpen,), held=held, local=held, closers=[client.close])


def build_purgatory(url: str, name: str, threshold: int, open_seconds: float) -> Built:
    import purgatory
    from purgatory.domain.model import OpenedState

    client = peer_client(url)
    factory = purgatory.SyncCircuitBreakerFactory(
        default_threshold=threshold, default_ttl=open_seconds, uow=purgatory.SyncRedisUnitOfWork(url)
    )
    factory.uow.contexts.redis = client  # type: ignore[attr-defined]  # as shipped: a redis.asyncio client
    counter_key = f"cbr::{name}::failure_count"

    def call(fn: Callable[[], Any]) -> Any:
        with factory.get_breaker(name):
            return fn()

    def held() -> int:
        return int(client.get(counter_key) or 0)

    return Built(call=call, rejected=(OpenedState,), held=held, local=held, closers=[client.close])


BUILDERS: dict[str, Callable[[str, str, int, float], Built]] = {
    OURS: build_ours,
    "circuitbreaker": build_circuitbreaker,
    "pybreaker": build_pybreaker,
    "interlock": build_interlock,
    "nopanic-redis": build_nopanic,
    "purgatory": build_purgatory,
}


def why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".replace("|", "/").replace("\n", " ")[:140]


def trip(built: Built, failures: int = THRESHOLD) -> int:
    """Failing calls until rejected or `failures` made; how many reached the function."""
    reached = 0

    def counted() -> None:
        nonlocal reached
        reached += 1
        raise Boom

    for _ in range(failures):
        try:
            built.call(counted)
        except built.rejected:
            break
        except Exception:  # Boom, or a peer's own error on the tripping call (pybreaker)
            pass
    built.settle()
    return reached


def is_open(built: Built) -> bool:
    ran = []
    try:
        built.call(lambda: ran.append(1))
    except built.rejected:
        return True
    except Exception:
        return False
    return False


# -- phase 1: µs per call ------------------------------------------------------------


def usec_per_call(call: Callable[[], Any], iterations: int = ITERATIONS) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        call()
    return (time.perf_counter() - start) / iterations * 1e6


def rejecting(built: Built) -> Callable[[], None]:
    def call() -> None:
        with contextlib.suppress(*built.rejected):
            built.call(noop)

    return call


def interleaved(calls: dict[str, Callable[[], Any]], na: dict[str, str], label: str) -> dict[str, float]:
    """Median µs per call of each: REPEATS runs, interleaved so drift hits all alike."""
    samples: dict[str, list[float]] = {peer: [] for peer in calls}
    failed: set[str] = set()
    for _ in range(REPEATS):
        for peer, call in calls.items():
            if peer in failed:
                continue
            try:
                samples[peer].append(usec_per_call(call))
            except Exception as exc:
                failed.add(peer)
                na.setdefault(peer, f"{label}: {why(exc)}")
    return {peer: statistics.median(v) for peer, v in samples.items() if v and peer not in failed}


def phase_timing(url: str, peers: list[str], na: dict[str, str]) -> tuple[dict[str, float], dict[str, float]]:
    """(healthy µs, rejected µs) per library."""
    healthy: dict[str, Callable[[], Any]] = {}
    built: dict[str, Built] = {}
    for peer in peers:
        try:
            b = built[peer] = build(peer, url, f"time-closed-{peer}")
            b.ready()
            call = b.call
            for _ in range(WARMUP):
                call(noop)
            healthy[peer] = lambda call=call: call(noop)  # type: ignore[misc]
        except Exception as exc:
            na[peer] = f"healthy timing: {why(exc)}"
    healthy_usec = interleaved(healthy, na, "healthy timing")
    for b in built.values():
        b.close()

    rejected: dict[str, Callable[[], Any]] = {}
    built = {}
    open_na: dict[str, str] = {}
    for peer in healthy_usec:
        try:
            b = built[peer] = build(peer, url, f"time-open-{peer}")
            b.ready()
            trip(b)
        except Exception as exc:
            open_na[peer] = why(exc)
    time.sleep(0.1)  # a trip written in the background (interlock) lands
    for peer, b in built.items():
        if peer not in open_na and is_open(b):
            rejected[peer] = rejecting(b)
            for _ in range(WARMUP):
                rejected[peer]()
    open_usec = interleaved(rejected, open_na, "open timing")
    for peer, b in built.items():
        if peer in open_usec and not is_open(b):  # open 10 s: the timing must end before
            del open_usec[peer]
        b.close()
    return healthy_usec, open_usec


# -- phase 2: commands per call --------------------------------------------------------


@dataclass
class Counted:
    commands: int
    calls: int
    by_name: Counter[str]

    def cell(self) -> str:
        per = self.commands / self.calls if self.calls else float("nan")
        shown = f"{per:.2f}" if per >= 0.01 or per == 0 else f"{per:.5f}"
        top = ", ".join(f"{name} {n:,}" for name, n in self.by_name.most_common(4)) or "none"
        top = top.replace("EVALSHA other", "EVALSHA (its script)")
        return f"{shown} ({self.commands:,} in {self.calls:,} calls: {top})"


def count_loop(
    url: str, control: redis.Redis, call: Callable[[], Any], settle: Callable[[], None]
) -> Counted:
    from overhead import Monitor

    calls = 0
    with Monitor(url, control) as monitor:
        deadline = time.monotonic() + COUNT_SECONDS
        while time.monotonic() < deadline:
            for _ in range(100):
                call()
            calls += 100
        settle()
    count = monitor.count
    return Counted(count.commands, calls, count.by_name)


def phase_commands(
    url: str, control: redis.Redis, peers: list[str]
) -> tuple[dict[str, Counted | str], dict[str, Counted | str]]:
    healthy: dict[str, Counted | str] = {}
    rejected: dict[str, Counted | str] = {}
    for peer in peers:
        try:
            b = build(peer, url, f"count-closed-{peer}")
            try:
                b.ready()
                for _ in range(50):
                    b.call(noop)
                b.settle()
                healthy[peer] = count_loop(url, control, lambda b=b: b.call(noop), b.settle)  # type: ignore[misc]
            finally:
                b.close()
        except Exception as exc:
            healthy[peer] = f"n/a ({why(exc)})"
        try:
            b = build(peer, url, f"count-open-{peer}")
            try:
                b.ready()
                trip(b)
                time.sleep(0.1)
                if not is_open(b):
                    rejected[peer] = "n/a (did not open after 5 failures)"
                    continue
                rejected[peer] = count_loop(url, control, rejecting(b), b.settle)
            finally:
                b.close()
        except Exception as exc:
            rejected[peer] = f"n/a ({why(exc)})"
    return healthy, rejected


# -- phases 3 and 4: 8 spawned processes -------------------------------------------------

_BARRIER: Any = None  # a multiprocessing Barrier of PROCESSES + 1: the parent takes part


def _init_worker(barrier: Any) -> None:
    global _BARRIER
    _BARRIER = barrier


def _wait() -> None:
    _BARRIER.wait(BARRIER_SECONDS)


def worker_task(job: tuple[str, str, str, str]) -> dict[str, Any]:
    """One process's part of a phase; it takes part in every barrier of the
    phase even when its breaker cannot be built, so no phase hangs."""
    kind, peer, url, name = job
    result: dict[str, Any] = {}
    built: Built | None = None
    try:
        threshold = HUGE if kind == "counts" else THRESHOLD
        open_seconds = RACE_OPEN_SECONDS if kind == "race" else OPEN_SECONDS
        built = build(peer, url, name, threshold, open_seconds)
        built.ready()
        if kind == "upstream":
            for _ in range(3):
                built.call(noop)
            built.settle()
        if kind == "race":
            trip(built)
    except Exception as exc:
        result["error"] = why(exc)
        if built is not None:
            built.close()
        built = None
    try:
        if kind == "counts":
            _wait()
            if built is not None:
                for _ in range(FAILURES_PER_PROCESS):
                    with contextlib.suppress(Exception):
                        built.call(fail)
                built.settle()
                result["local"] = built.local() if built.local else None
        elif kind == "race":
            _wait()
            time.sleep(RACE_OPEN_SECONDS + 0.3)
            _wait()
            if built is not None:
                ran = []

                def probe() -> None:
                    ran.append(1)
                    time.sleep(PROBE_SECONDS)

                try:
                    built.call(probe)
                except Exception as exc:
                    result["exception"] = type(exc).__name__
                result["admitted"] = len(ran)
                built.settle()
        elif kind == "upstream":
            _wait()  # the parent trips the breaker now
            _wait()
            if built is not None:
                reached = []

                def failing() -> None:
                    reached.append(1)
                    raise Boom

                for _ in range(UPSTREAM_CALLS):
                    with contextlib.suppress(Exception):
                        built.call(failing)
                    time.sleep(UPSTREAM_GAP)
                built.settle()
                result["reached"] = len(reached)
    except Exception as exc:
        result.setdefault("error", why(exc))
    finally:
        if built is not None:
            built.close()
    return result


@dataclass
class Pool:
    pool: Any
    barrier: Any

    def run(
        self, kind: str, peer: str, url: str, name: str, between: Callable[[], None] = lambda: None
    ) -> Any:
        """The phase on PROCESSES workers: the list of their results, or 'n/a (reason)'."""
        self.barrier.reset()
        pending = self.pool.map_async(worker_task, [(kind, peer, url, name)] * PROCESSES, chunksize=1)
        try:
            waits = {"counts": 1, "race": 2, "upstream": 2}[kind]
            for i in range(waits):
                self.barrier.wait(BARRIER_SECONDS)
                if kind == "upstream" and i == 0:
                    between()
            results = pending.get(POOL_SECONDS)
        except Exception as exc:
            self.barrier.abort()
            return f"n/a ({why(exc)})"
        errors = {r["error"] for r in results if "error" in r}
        if errors:
            return f"n/a ({sorted(errors)[0]})"
        return results


def phase_counts(pool: Pool, url: str, peer: str) -> str:
    name = f"counts-{peer}"
    results = pool.run("counts", peer, url, name)
    if isinstance(results, str):
        return results
    total = PROCESSES * FAILURES_PER_PROCESS
    locals_ = [r.get("local") for r in results]
    if peer == "interlock":
        return (
            f"per process (not shared): each window held {sorted(set(locals_))} of its "
            f"{FAILURES_PER_PROCESS} failures (a 5-call window); the shared hash holds no counts"
        )
    if peer in IN_PROCESS:
        return f"per process (not shared): each held {sorted(set(locals_))} of its {FAILURES_PER_PROCESS}"
    b = build(peer, url, name, HUGE)
    try:
        held = b.held() if b.held else None
    finally:
        b.close()
    if held is None:
        return "n/a (nothing to read)"
    return f"{held:,} of {total:,} ({total - held:,} lost)"


def phase_race(pool: Pool, url: str, peer: str) -> str:
    results = pool.run("race", peer, url, f"race-{peer}")
    if isinstance(results, str):
        return results
    admitted = sum(r.get("admitted", 0) for r in results)
    seen = Counter(r["exception"] for r in results if "exception" in r)
    others = ", ".join(f"{n} {name}" for name, n in seen.most_common()) or "none"
    return f"{admitted} of {PROCESSES} (the others: {others})"


def phase_upstream(pool: Pool, url: str, peer: str) -> str:
    name = f"upstream-{peer}"
    parent = build(peer, url, name)
    tripped: list[int] = []
    opened: list[bool] = []

    def between() -> None:
        tripped.append(trip(parent))
        time.sleep(0.1)  # a trip written in the background (interlock) lands
        opened.append(is_open(parent))

    try:
        parent.ready()
        results = pool.run("upstream", peer, url, name, between)
    finally:
        parent.close()
    if isinstance(results, str):
        return results
    reached = sum(r.get("reached", 0) for r in results)
    per = sorted(r.get("reached", 0) for r in results)
    state = "open" if opened and opened[0] else "NOT open"
    return (
        f"{reached} of {PROCESSES * UPSTREAM_CALLS} (per process {per}; the parent's {tripped[0]} "
        f"failures left it {state} in the parent)"
    )


# -- phase 5: Redis down ----------------------------------------------------------------


def attempt(built: Built, fn: Callable[[], Any]) -> tuple[str, float]:
    """One call through the breaker: (what the caller saw, ms)."""
    ran: list[int] = []

    def counted() -> Any:
        ran.append(1)
        return fn()

    start = time.perf_counter()
    try:
        built.call(counted)
        seen = "ran (fails open)" if ran else "returned without running it"
    except built.rejected as exc:
        seen = f"rejected: {type(exc).__name__} (fails closed)"
    except Boom:
        seen = "ran (fails open)"
    except Exception as exc:
        seen = f"{'ran, then ' if ran else ''}raised {type(exc).__module__}.{type(exc).__name__}"
    return seen, (time.perf_counter() - start) * 1000


def down_calls(built: Built) -> str:
    """Successful calls DOWN_GAP apart for DOWN_SECONDS, then THRESHOLD failing
    calls and one more: what the caller saw, ms per call, and whether the
    breaker still trips."""
    outcomes: Counter[str] = Counter()
    ms: list[float] = []
    after: list[str] = []
    done = threading.Event()

    def run() -> None:
        deadline = time.monotonic() + DOWN_SECONDS
        while time.monotonic() < deadline:
            seen, took = attempt(built, noop)
            outcomes[seen] += 1
            ms.append(took)
            time.sleep(DOWN_GAP)
        deadline = time.monotonic() + DOWN_SECONDS
        for _ in range(THRESHOLD):
            if time.monotonic() > deadline:
                after.append(f"n/a (the {THRESHOLD} failing calls took over {DOWN_SECONDS:g} s)")
                break
            attempt(built, fail)
        else:
            after.append(attempt(built, noop)[0])
        done.set()

    threading.Thread(target=run, daemon=True).start()
    limit = 2 * DOWN_SECONDS + 4
    if not done.wait(limit):
        return f"blocked: a call had not returned after {limit:g} s ({len(ms)} calls returned)"
    if not ms:
        return "no call made"
    shown = "; ".join(f"{name} x{n}" for name, n in outcomes.most_common())
    return (
        f"{shown}; ms/call first {ms[0]:.1f}, median {statistics.median(ms):.1f}, max {max(ms):.1f}; "
        f"after {THRESHOLD} failures: {after[0]}"
    )


class LogCount(logging.Handler):
    """Counts the WARNING+ records each library logs (and keeps them off stderr)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.by_logger: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.by_logger[record.name.split(".")[0]] += 1


def phase_down(
    url: str, process: subprocess.Popen[bytes], peers: list[str]
) -> tuple[dict[str, str], dict[str, str]]:
    """SIGSTOP then SIGKILL of the server; breakers built and used while it was up."""
    stopped: dict[str, str] = {}
    killed: dict[str, str] = {}
    for outcome, how in ((stopped, "stop"), (killed, "kill")):
        built: dict[str, Built] = {}
        for peer in peers:
            try:
                b = build(peer, url, f"down-{how}-{peer}")
                b.ready()
                for _ in range(20):
                    b.call(noop)
                b.settle()
                built[peer] = b
            except Exception as exc:
                outcome[peer] = f"n/a ({why(exc)})"
        if how == "stop":
            os.kill(process.pid, signal.SIGSTOP)
        else:
            process.kill()
            process.wait()
        try:
            for peer, b in built.items():
                logs = LogCount()
                logging.getLogger().addHandler(logs)
                try:
                    outcome[peer] = down_calls(b)
                finally:
                    logging.getLogger().removeHandler(logs)
                if logs.by_logger:
                    records = ", ".join(f"{name} {n}" for name, n in logs.by_logger.most_common())
                    outcome[peer] += f"; WARNING+ log records: {records}"
        finally:
            if how == "stop":
                os.kill(process.pid, signal.SIGCONT)
            for b in built.values():
                b.close()
    return stopped, killed


# -- the report ---------------------------------------------------------------------------


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "n/a"
    share = value / base
    return f"{share:.2f}x" if share >= 0.1 else f"{share:.3f}x"


def usec(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def cell(value: Counted | str | None) -> str:
    if value is None:
        return "n/a"
    return value if isinstance(value, str) else value.cell()


@dataclass
class Report:
    peers: list[str]
    na: dict[str, str]
    healthy: dict[str, float] = field(default_factory=dict)
    open_usec: dict[str, float] = field(default_factory=dict)
    cmd_healthy: dict[str, Counted | str] = field(default_factory=dict)
    cmd_open: dict[str, Counted | str] = field(default_factory=dict)
    counts: dict[str, str] = field(default_factory=dict)
    race: dict[str, str] = field(default_factory=dict)
    upstream: dict[str, str] = field(default_factory=dict)
    stopped: dict[str, str] = field(default_factory=dict)
    killed: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def get(self, mapping: dict[str, Any], peer: str) -> str:
        if peer in mapping:
            return cell(mapping[peer])
        return f"n/a ({self.na.get(peer, 'not measured')})"

    def print(self, header: str) -> None:
        print(header + "\n")
        everyone = [OURS] + [k for k, _, _ in PEERS]
        floor, pyb = self.healthy.get(FLOOR), self.healthy.get(REDIS_PEER)
        print("## 1. µs per protected call (median of 5 x 2000 calls)\n")
        rows = []
        for peer in everyone:
            h = self.healthy.get(peer)
            rows.append(
                [
                    f"{peer} {peer_version(peer)}",
                    usec(h) if h is not None else f"n/a ({self.na.get(peer, 'not measured')})",
                    ratio(h, floor),
                    ratio(h, pyb),
                    usec(self.open_usec.get(peer)),
                    CONFIGS[peer],
                    CAVEATS[peer],
                ]
            )
        print(
            table(
                [
                    "library",
                    "healthy µs/call",
                    "÷ circuitbreaker",
                    "÷ pybreaker+Redis",
                    "rejected (open) µs/call",
                    "configuration",
                    "caveats",
                ],
                rows,
            )
        )
        print(
            f"\n## 2. Redis commands per call (MONITOR, {COUNT_SECONDS} s loops, script-internal "
            "commands excluded)\n"
        )
        print(
            table(
                ["library", "healthy", "open (rejected calls)"],
                [
                    [peer, self.get(self.cmd_healthy, peer), self.get(self.cmd_open, peer)]
                    for peer in everyone
                ],
            )
        )
        print(
            f"\n## 3. Counts lost: {PROCESSES} spawned processes x {FAILURES_PER_PROCESS} failures, "
            "threshold never reached\n"
        )
        print(
            table(
                ["library", "failures the shared state holds"],
                [[peer, self.get(self.counts, peer)] for peer in everyone],
            )
        )
        print(f"\n## 4. {PROCESSES} processes: half-open race and upstream calls after a trip\n")
        print(
            f"Race: each process trips the breaker (open shortened to {RACE_OPEN_SECONDS:g} s for all), "
            f"waits it out, then all call at once behind a barrier with a {PROBE_SECONDS} s probe. "
            f"Upstream: each process warms the breaker (3 successes), the parent trips it with 5 failures, "
            f"then each process makes {UPSTREAM_CALLS} failing calls {UPSTREAM_GAP * 1000:g} ms apart; "
            "the count is how many reached the function after the trip (0 is ideal for a shared "
            f"breaker; {PROCESSES} x 5 = {PROCESSES * 5} for one that is per process).\n"
        )
        print(
            table(
                ["library", "probes admitted", "upstream calls after the trip"],
                [[peer, self.get(self.race, peer), self.get(self.upstream, peer)] for peer in everyone],
            )
        )
        print(
            f"\n## 5. Redis down: successful calls {DOWN_GAP * 1000:g} ms apart for {DOWN_SECONDS:g} s, "
            f"then {THRESHOLD} failing calls and one more (peers' clients: socket timeouts "
            f"{PEER_SOCKET_TIMEOUT} s, redis-py's default retry)\n"
        )
        print(
            table(
                ["library", "server SIGSTOPped", "server killed"],
                [[peer, self.get(self.stopped, peer), self.get(self.killed, peer)] for peer in everyone],
            )
        )
        if self.skipped:
            print("\nSkipped: " + "; ".join(self.skipped))
        print("\nNotes:\n")
        for note in NOTES:
            print(f"- {note}")


def run_phase(report: Report, label: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:
        report.skipped.append(f"{label}: {why(exc)}")
        return None


def per_peer(report: Report, target: dict[str, str], label: str, fn: Callable[[str], str]) -> None:
    for peer in report.peers:
        try:
            target[peer] = fn(peer)
        except Exception as exc:
            target[peer] = f"n/a ({label}: {why(exc)})"


def main() -> int:
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    na = ensure_installed()
    peers = [OURS] + [k for k, _, _ in PEERS if k not in na]
    report = Report(peers, na)
    from overhead import redis_server_process  # imports pybreaker: after the installs

    with redis_server_process() as (url, process):
        control = redis.Redis.from_url(url)
        server = control.info("server")
        timing = run_phase(report, "timing", lambda: phase_timing(url, peers, na))
        if timing is not None:
            report.healthy, report.open_usec = timing
        commands = run_phase(report, "commands", lambda: phase_commands(url, control, peers))
        if commands is not None:
            report.cmd_healthy, report.cmd_open = commands

        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(PROCESSES + 1)
        with context.Pool(PROCESSES, initializer=_init_worker, initargs=(barrier,)) as mp_pool:
            pool = Pool(mp_pool, barrier)
            per_peer(report, report.counts, "counts", lambda peer: phase_counts(pool, url, peer))
            per_peer(report, report.race, "race", lambda peer: phase_race(pool, url, peer))
            per_peer(report, report.upstream, "upstream", lambda peer: phase_upstream(pool, url, peer))
        control.close()
        down = run_phase(report, "redis down", lambda: phase_down(url, process, peers))
        if down is not None:
            report.stopped, report.killed = down
    versions = ", ".join(f"{k} {peer_version(k)}" for k, _, _ in PEERS)
    header = (
        f"# breaker_redis and its peers — {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"nproc {len(os.sched_getaffinity(0))}, redis-server {server['redis_version']} on 127.0.0.1, "
        f"Python {sys.version.split()[0]}; breaker_redis {peer_version(OURS)}, {versions}; "
        f"1-min load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    report.print(header)
    print(f"\nfinished in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
