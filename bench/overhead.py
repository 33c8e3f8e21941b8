"""Cost of breaker_redis against pybreaker's Redis storage, in one run on one server.

Run ``python bench/overhead.py``. It starts a fresh redis-server on a free
loopback port, measures, prints one markdown table and stops the server:

1. Redis commands per protected call (closed) and per rejected call (open),
   counted with MONITOR between two ECHO markers; commands run inside Lua
   scripts (``[0 lua]``) and the markers themselves are not counted.
2. Microseconds per successful call while closed (median of repeats, no MONITOR).
3. Microseconds per rejected call while open (likewise).
4. Closed with failures: every 100th (1 %) or every 10th (10 %) call fails,
   never two in a row, so neither library trips (pybreaker fail_max=5;
   breaker_redis trip="rate" at failure_rate 0.5, and trip="consecutive" at
   failure_threshold 5). Commands and µs per call as above. A trip="rate"
   breaker is armed only within reach of its threshold (never here), a
   trip="consecutive" one from a failure to the next success; the share of calls that ran armed
   is read from the record-script runs MONITOR shows (a success sent on its
   own, not in a batch, was admitted while armed).
5. Observe mode while open: calls admitted after a trip, their outcomes
   counted in memory; commands and µs per call, beside the enforce-mode rows.
6. Server time of the record script: ``usec_per_call`` of FCALL (EVALSHA where
   the scripts run that way) in ``INFO commandstats`` over the
   closed timing runs (CONFIG RESETSTAT first; while closed the record script
   is the only script a worker runs).
7. Redis memory of one breaker (MEMORY USAGE ... SAMPLES 0 over its seven keys), after one
   trip and with a full history
   after traffic that includes a trip.

``python bench/overhead.py --against REV`` measures something else: the healthy
call of this checkout against the same call in the code of commit REV (a
refactoring's "no slower"), in alternating child processes on one
redis-server (bench/healthy_call.py), ROUNDS rounds each, and prints the
medians and their ratio.

Targets are those of docs/design.md, section 11. A missed target is reported, not an
error: the script exits 0 unless the benchmark itself cannot run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # measure this checkout, installed or not

import pybreaker  # noqa: E402
import redis  # noqa: E402

from breaker_redis import Breaker, BreakerConfig, BreakerOpen, Breakers  # noqa: E402
from breaker_redis.storage.keys import KEY_SUFFIXES, breaker_keys  # noqa: E402
from breaker_redis.storage.lua_source import OPERATIONS, script_source  # noqa: E402
from breaker_redis.storage.lua_source import library as functions_library  # noqa: E402
from demo_app.stack import redis_server_argv  # noqa: E402

ITERATIONS = 5000  # calls per timing repeat
REPEATS = 5  # timing repeats per library; the median is reported
WARMUP = 500  # calls before anything is counted or timed
COUNT_CALLS = 2000  # calls per closed counting phase
OPEN_COUNT_SECONDS = 2.5  # an open counting phase spans at least two batched flushes
TRIP_FAILURES = 5
FAILURE_EVERY = (100, 10)  # closed with failures: every 100th (1 %) / 10th (10 %) call fails
FAILING_ITERATIONS = 2000  # calls per timing repeat with failures (a multiple of each FAILURE_EVERY)
# ARGV of lua/record.lua: 1-6 common (name, channel, now_ms, ttl, config JSON,
# epoch floor), 7 epoch, 8 outcome, 9 duration, 10 lease, 11-15 pending counts,
# 16 batch epoch, 17 batch count
RECORD_ARGC = 18
RECORD_OUTCOME_ARG = 8

TARGET_CLOSED_COMMANDS = 1.0
TARGET_ARMED_COMMANDS = 1.2
TARGET_OPEN_COMMANDS = 0.01
TARGET_TIME_RATIO = 0.6
TARGET_RECORD_USEC = 15.0
TARGET_MEMORY_BYTES = 2048

REJECTED = (BreakerOpen, pybreaker.CircuitBreakerError)


class Boom(Exception):
    """The failure the protected function raises to trip a breaker."""


def noop() -> None:
    return None


def fail() -> None:
    raise Boom


# -- the server ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def redis_server(binary: str | None = None, extra: Sequence[str] = ()) -> Iterator[str]:
    """A fresh redis-server without persistence (PATH's, or ``binary``, given ``extra``
    arguments); yields its URL, stops it after."""
    with redis_server_process(binary, extra) as (url, _process):
        yield url


@contextmanager
def redis_server_process(
    binary: str | None = None, extra: Sequence[str] = ()
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """redis_server() with its process, for a bench that stops or kills it (bench/peers.py)."""
    binary = binary or shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    folder = tempfile.mkdtemp(prefix="breaker-redis-bench-")
    argv = [*redis_server_argv(binary, port, folder), *extra]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        wait_for_server(url, process)
        yield url, process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)  # a stopped server cannot take SIGTERM
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(folder, ignore_errors=True)


def wait_for_server(url: str, process: subprocess.Popen[bytes]) -> None:
    client = redis.Redis.from_url(url, socket_timeout=0.5)
    deadline = time.monotonic() + 15
    try:
        while True:
            try:
                client.ping()
                return
            except redis.exceptions.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"redis-server did not start on {url}") from None
                time.sleep(0.02)
    finally:
        client.close()


# -- counting commands with MONITOR --------------------------------------------


@dataclass
class CommandCount:
    commands: int = 0
    by_name: Counter[str] = field(default_factory=Counter)  # FCALL/EVALSHA split by script
    record_outcomes: Counter[str] = field(default_factory=Counter)  # ARGV 8 of record.lua; '' a batch alone
    in_lua: Counter[str] = field(default_factory=Counter)  # run inside scripts: not in `commands`


_MONITOR_LINE = re.compile(r"^\S+ \[\d+ (?P<client>[^\]]*)\] \"(?P<name>[^\"]*)\"")
_MONITOR_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')  # MONITOR quotes every argument, escaping " and \
# EVALSHA names a script by the SHA1 of its source, as redis-py's register_script computes it;
# FCALL by the function's name in the library
SCRIPT_NAMES = {hashlib.sha1(script_source(op).encode("utf-8")).hexdigest(): op for op in OPERATIONS}
SCRIPT_NAMES.update({function: op for op, function in functions_library()[1].items()})


class Monitor:
    """Counts the client-sent commands between a start and an end marker.

    A thread holds a MONITOR connection; the control client sends
    ``ECHO <start>`` once MONITOR is on and ``ECHO <end>`` after the workload.
    Only what lies between the two markers is counted, so neither MONITOR's
    own setup nor the markers are in the figure; lines from inside Lua
    scripts (``[0 lua]``) are skipped.
    """

    def __init__(self, url: str, control: redis.Redis) -> None:
        self._client = redis.Redis.from_url(url)
        self._control = control
        token = uuid.uuid4().hex
        self._start, self._end = f"bench-start-{token}", f"bench-end-{token}"
        self._on = threading.Event()
        self._error: BaseException | None = None
        self.count = CommandCount()
        self._thread = threading.Thread(target=self._run, name="bench-monitor", daemon=True)

    def __enter__(self) -> Monitor:
        self._thread.start()
        if not self._on.wait(10) or self._error is not None:
            raise RuntimeError(f"MONITOR did not start: {self._error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        self._control.echo(self._end)
        self._thread.join(10)
        self._client.close()
        if self._thread.is_alive():
            raise RuntimeError("MONITOR thread did not see the end marker")
        if self._error is not None:
            raise RuntimeError(f"MONITOR failed: {self._error!r}")

    def _run(self) -> None:
        try:
            connection = self._client.connection_pool.get_connection()
            connection.send_command("MONITOR")
            connection.read_response()  # +OK
            self._control.echo(self._start)
            started = False
            while True:
                line = connection.read_response()
                if isinstance(line, bytes):
                    line = line.decode("utf-8", "replace")
                if self._start in line:
                    started = True
                    self._on.set()
                elif self._end in line:
                    connection.disconnect()
                    return
                elif started:
                    self._note(line)
        except BaseException as exc:  # reported by __enter__/__exit__
            self._error = exc
            self._on.set()

    def _note(self, line: str) -> None:
        match = _MONITOR_LINE.match(line)
        if match is None:
            return
        name = match["name"].upper()
        if match["client"] == "lua":
            self.count.in_lua[name] += 1
            return
        self.count.commands += 1
        if name in ("EVALSHA", "FCALL"):
            args = _MONITOR_ARG.findall(line[match.start("name") - 1 :])
            script = SCRIPT_NAMES.get(args[1], "other") if len(args) > 2 else "other"
            name = f"{name} {script}"
            if script == "record":
                # name, sha/function, numkeys, keys, ARGV
                outcome_at = 3 + int(args[2]) + RECORD_OUTCOME_ARG - 1
                if len(args) > outcome_at:
                    self.count.record_outcomes[args[outcome_at]] += 1
        self.count.by_name[name] += 1


def count_commands(url: str, control: redis.Redis, workload: Callable[[], int]) -> tuple[CommandCount, int]:
    """(commands seen, calls made) while workload runs; workload returns its call count."""
    with Monitor(url, control) as monitor:
        calls = workload()
    return monitor.count, calls


def closed_workload(call: Callable[[], Any], calls: int, settle: Callable[[], None]) -> Callable[[], int]:
    """`calls` calls, then `settle()`: whatever a library still holds is sent
    inside the counted window (breaker_redis batches successes)."""

    def run() -> int:
        for _ in range(calls):
            call()
        settle()
        return calls

    return run


def open_workload(call_while_open: Callable[[], None], seconds: float) -> Callable[[], int]:
    """Calls to an open breaker (rejected, or admitted in observe mode) in a
    tight loop for at least `seconds` (the flushes are timed)."""

    def run() -> int:
        calls = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for _ in range(200):
                call_while_open()
            calls += 200
        return calls

    return run


# -- the two libraries --------------------------------------------------------


@dataclass
class Subject:
    """One library: a breaker that stays closed and one that is tripped open."""

    name: str
    closed_call: Callable[[], None]
    open_call: Callable[[], None]
    healthy: Callable[[], bool] = lambda: True
    settle: Callable[[], None] = lambda: None
    admitted_while_open: int = 0

    def rejected_call(self) -> None:
        try:
            self.open_call()
        except REJECTED:
            return
        self.admitted_while_open += 1


@dataclass
class Failing:
    """One library's breaker on a call that fails every `every`-th time, never
    twice in a row: stays closed, with failures in its window."""

    library: str  # as in the report: "breaker_redis trip=rate", ..., "pybreaker"
    every: int
    protect: Callable[[Callable[[], None]], None]  # runs a function behind the breaker
    calls: int = 0
    failures: int = 0
    refused: int = 0
    breaker: Breaker | None = None  # breaker_redis only: read back after the run

    def call(self) -> None:
        self.calls += 1
        try:
            self.protect(fail if self.calls % self.every == 0 else noop)
        except Boom:
            self.failures += 1
        except REJECTED:
            self.refused += 1

    @property
    def phase(self) -> str:
        return f"closed, {percent(self.every)} failures"


def percent(every: int) -> str:
    return f"{100 / every:g} %"


def failing_subjects(breakers: Breakers, pb_client: redis.Redis) -> list[Failing]:
    """Per failure share: breaker_redis with trip=rate and trip=consecutive, and pybreaker."""
    subjects = []
    for every in FAILURE_EVERY:
        rate = breakers.get(
            f"bench-rate-{every}",
            BreakerConfig(trip="rate", failure_rate=0.5, minimum_calls=20, window_seconds=10),
        )
        consecutive = breakers.get(
            f"bench-consecutive-{every}", BreakerConfig(trip="consecutive", failure_threshold=TRIP_FAILURES)
        )
        theirs = make_pybreaker(pb_client, f"bench-failing-{every}", TRIP_FAILURES)
        subjects += [
            Failing("breaker_redis trip=rate", every, rate.call, breaker=rate),
            Failing("breaker_redis trip=consecutive", every, consecutive.call, breaker=consecutive),
            Failing("pybreaker", every, theirs.call),
        ]
    return subjects


@dataclass
class Observed:
    """A breaker in observe mode, tripped open: every call is admitted, its
    outcome counted in memory (would_reject, successes)."""

    breaker: Breaker
    refused: int = 0

    def call(self) -> None:
        try:
            self.breaker.call(noop)
        except BreakerOpen:
            self.refused += 1


def observe_subject(breakers: Breakers) -> Observed:
    observing = breakers.get(
        "bench-observe",
        BreakerConfig(
            trip="count",
            failure_threshold=TRIP_FAILURES,
            open_seconds=300,
            max_open_seconds=300,
            mode="observe",
        ),
    )
    for _ in range(100):
        observing.call(noop)
    trip(lambda: observing.call(fail))
    return Observed(observing)


def breaker_redis_subject(breakers: Breakers) -> tuple[Subject, Breaker]:
    closed = breakers.get(
        "bench-closed", BreakerConfig(trip="count", failure_threshold=1_000_000, window_seconds=10)
    )
    tripped = breakers.get(
        "bench-open",
        BreakerConfig(trip="count", failure_threshold=TRIP_FAILURES, open_seconds=300, max_open_seconds=300),
    )
    wait_until_subscribed(breakers, closed)
    for _ in range(100):
        tripped.call(noop)
    trip(lambda: tripped.call(fail))
    subject = Subject(
        "breaker_redis",
        closed_call=lambda: closed.call(noop),
        open_call=lambda: tripped.call(noop),
        healthy=lambda: breakers.gate.healthy,
        settle=closed.flush_batch,  # this breaker's batch only: no other breaker's counts in the figure
    )
    return subject, tripped


def callgrind_subject(run: Callable[[int], object], warmup: int, counted: int) -> None:
    """The subject's side of callgrind_stretch: ``run(warmup)``, then ``run(counted)``
    inside the stretch the parent counts."""
    run(warmup)
    print("ready", flush=True)
    sys.stdin.readline()
    run(counted)
    print("done", flush=True)
    sys.stdin.readline()


def callgrind_stretch(command: list[str], name: str, folder: str, failed: str) -> int:
    """Instructions of the main thread of ``command`` run under callgrind, counted only over
    the stretch it marks: the subject prints 'ready', reads a line, runs what is measured,
    prints 'done', reads a line and exits 0 (``failed``: what another exit means). Used by
    bench/integrations.py and bench/telemetry.py (--instructions)."""
    valgrind, control = shutil.which("valgrind"), shutil.which("callgrind_control")
    if valgrind is None or control is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    out = os.path.join(folder, f"{name}.out")
    argv = [valgrind, "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes"]
    argv += [f"--callgrind-out-file={out}", *command]
    with open(os.path.join(folder, f"{name}.log"), "w") as log:
        child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        assert child.stdin is not None and child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            log.flush()
            with open(log.name) as err:
                sys.stderr.write(err.read()[-3000:])
            raise SystemExit(f"{name}: the subject did not start under callgrind (exit {child.wait()})")
        subprocess.run([control, "-i", "on", str(child.pid)], check=True, capture_output=True)
        child.stdin.write("go\n")
        child.stdin.flush()
        if child.stdout.readline().strip() != "done":
            raise SystemExit(f"{name}: the subject stopped under callgrind (exit {child.wait()})")
        subprocess.run([control, "-i", "off", str(child.pid)], check=True, capture_output=True)
        child.stdin.write("end\n")
        child.stdin.close()
        if child.wait() != 0:
            raise SystemExit(f"{name}: {failed} under callgrind")
    with open(f"{out}-01") as dump:  # the main thread's file
        return max(int(line.split()[1]) for line in dump if line.startswith(("summary:", "totals:")))


def wait_until_subscribed(breakers: Breakers, breaker: Breaker) -> None:
    """The first call starts the invalidation listener; until it is subscribed a
    worker trusts what it knows for 1 s only, which is not the steady state."""
    breaker.call(noop)
    deadline = time.monotonic() + 10
    while breakers.invalidator is not None and not breakers.invalidator.healthy:
        if time.monotonic() > deadline:
            raise RuntimeError("breaker_redis: the invalidation listener did not subscribe")
        time.sleep(0.01)


def make_pybreaker(client: redis.Redis, namespace: str, fail_max: int) -> pybreaker.CircuitBreaker:
    storage = pybreaker.CircuitRedisStorage(pybreaker.STATE_CLOSED, client, namespace=namespace)
    return pybreaker.CircuitBreaker(fail_max=fail_max, reset_timeout=300, state_storage=storage)


def pybreaker_subject(client: redis.Redis) -> Subject:
    closed = make_pybreaker(client, "bench-closed", 1_000_000)
    tripped = make_pybreaker(client, "bench-open", TRIP_FAILURES)
    trip(lambda: tripped.call(fail))
    return Subject("pybreaker", closed_call=lambda: closed.call(noop), open_call=lambda: tripped.call(noop))


def trip(failing_call: Callable[[], None]) -> None:
    for _ in range(TRIP_FAILURES):
        try:
            failing_call()
        except (Boom, *REJECTED):
            pass


def warm_up(subjects: list[Subject], observed: Observed, failing: list[Failing]) -> None:
    for subject in subjects:
        for _ in range(WARMUP):
            subject.closed_call()
            subject.rejected_call()
    for _ in range(WARMUP):
        observed.call()
    for each in failing:  # WARMUP is a multiple of `every`: the window holds failures
        for _ in range(WARMUP):
            each.call()


# -- timing -------------------------------------------------------------------


def usec_per_call(call: Callable[[], None], iterations: int = ITERATIONS) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        call()
    return (time.perf_counter() - start) / iterations * 1e6


def median_usec(calls: dict[Any, Callable[[], None]], iterations: int = ITERATIONS) -> dict[Any, float]:
    """Median µs per call of each, the repeats interleaved so drift hits all alike."""
    samples: dict[Any, list[float]] = {name: [] for name in calls}
    for _ in range(REPEATS):
        for name, call in calls.items():
            samples[name].append(usec_per_call(call, iterations))
    return {name: statistics.median(values) for name, values in samples.items()}


def evalsha_stats(control: redis.Redis) -> tuple[int, float]:
    """(calls, usec_per_call) of the scripts (FCALL and EVALSHA together) since the last CONFIG RESETSTAT."""
    commands = control.info("commandstats")
    stats = [commands.get(f"cmdstat_{name}", {}) for name in ("fcall", "evalsha")]
    calls = sum(int(s.get("calls", 0)) for s in stats)
    usec = sum(float(s.get("usec", 0)) for s in stats)
    return calls, usec / calls if calls else 0.0


def load_trivial_function(control: redis.Redis) -> str:
    """Loads ``return 1`` as a Redis Function; its name."""
    control.function_load(
        "#!lua name=bench_floor\nredis.register_function('bench_floor_one', function() return 1 end)",
        replace=True,
    )
    return "bench_floor_one"


def trivial_script_usec(control: redis.Redis, keys: list[str], argc: int, functions: bool) -> float:
    """Server time of ``return 1`` given as many keys and arguments as the record
    script, run the way the scripts run (FCALL or EVALSHA): the floor any script
    pays on this server, for reading the figure above."""
    args = ["0"] * argc
    if functions:
        function = load_trivial_function(control)

        def script(keys: list[str], args: list[str]) -> Any:
            return control.fcall(function, len(keys), *keys, *args)
    else:
        script = control.register_script("return 1")
    script(keys=keys, args=args)  # loads it
    control.config_resetstat()
    for _ in range(ITERATIONS):
        script(keys=keys, args=args)
    return evalsha_stats(control)[1]


# -- memory -------------------------------------------------------------------


def key_memory(control: redis.Redis, keys: list[str]) -> dict[str, int]:
    return {key: int(control.memory_usage(key, samples=0) or 0) for key in keys}


def full_history_memory(url: str, control: redis.Redis) -> dict[str, int]:
    """Key sizes of a breaker whose history is full: 12 trips and recoveries (the
    events list keeps the last 10), with a failure in every window bucket."""
    now = [1_700_000_000_000]
    history = Breakers.from_url(url, prefix="bench-history", clock=lambda: now[0], listen=False)
    try:
        config = BreakerConfig(trip="count", failure_threshold=10, open_seconds=1, half_open_successes=1)
        breaker = history.get("history", config)
        for _ in range(12):
            for _ in range(10):  # one failure per bucket of the 10 s window: trips at the 10th
                breaker.acquire().failure()
                now[0] += 1000
            now[0] += 1000
            breaker.acquire().success()  # the probe closes it
        for _ in range(9):
            breaker.acquire().failure()
            now[0] += 1000
        return key_memory(control, breaker_keys("bench-history", "history"))
    finally:
        history.close()
        history.client.close()


def pybreaker_keys(control: redis.Redis, namespace: str) -> list[str]:
    return sorted(k.decode() for k in control.scan_iter(match=f"{namespace}:pybreaker:*"))


# -- the report ---------------------------------------------------------------


@dataclass
class Row:
    figure: str
    ours: str
    theirs: str
    target: str
    met: bool | None  # None: no target

    def cells(self) -> list[str]:
        verdict = "—" if self.met is None else "PASS" if self.met else "MISS"
        return [self.figure, self.ours, self.theirs, self.target, verdict]


def markdown(rows: list[Row]) -> str:
    header = ["figure", "breaker_redis", "pybreaker + CircuitRedisStorage", "target", "result"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines)


def per_call(count: CommandCount, calls: int) -> float:
    return count.commands / calls if calls else float("nan")


def describe_count(count: CommandCount, calls: int) -> str:
    value = per_call(count, calls)
    shown = f"{value:.2f}" if value >= 0.01 or value == 0 else f"{value:.6f}"
    return f"{shown} ({count.commands:,} in {calls:,} calls)"


def breakdown(count: CommandCount) -> str:
    parts = []
    for name, n in count.by_name.most_common():
        part = f"{name} {n:,}"
        if name.endswith(" record") and count.record_outcomes:
            outcomes = ", ".join(
                f"{outcome or 'batch alone'} {k:,}" for outcome, k in count.record_outcomes.most_common()
            )
            part += f" ({outcomes})"
        parts.append(part)
    shown = ", ".join(parts) or "none"
    if count.in_lua.get("PUBLISH"):
        shown += f"; messages published by the scripts: {count.in_lua['PUBLISH']:,}"
    return shown


def kb(n: int) -> str:
    return f"{n:,} B"


# -- the run ------------------------------------------------------------------


@dataclass
class Results:
    counts: dict[tuple[str, str], tuple[CommandCount, int]] = field(default_factory=dict)
    closed_usec: dict[str, float] = field(default_factory=dict)
    open_usec: dict[str, float] = field(default_factory=dict)
    failing_usec: dict[tuple[str, str], float] = field(default_factory=dict)
    # failing calls in each counted phase with failures
    failures_counted: dict[tuple[str, str], int] = field(default_factory=dict)
    evalsha_calls: int = 0
    evalsha_usec: float = 0.0
    failing_evalsha_calls: int = 0
    failing_evalsha_usec: float = 0.0
    failing_timed_calls: int = 0
    trivial_script_usec: float = 0.0
    script_command: str = "EVALSHA"
    closed_timed_calls: int = 0
    memory: dict[str, int] = field(default_factory=dict)
    history_memory: dict[str, int] = field(default_factory=dict)
    pybreaker_memory: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    sync_calls: int = 0
    sync_server_usec: float = 0.0
    sync_client_usec: float = 0.0
    acquire_calls: int = 0
    acquire_server_usec: float = 0.0


def acquire_server_time(url: str, control: redis.Redis) -> tuple[int, float]:
    """Server time of the acquire script on a closed breaker: a worker with no
    subscription (as on a cluster) runs it at every call. The permits are
    dropped unrecorded (closed: they hold nothing), so only acquire runs."""
    asking = Breakers.from_url(url, prefix="bench-acquire", listen=False)
    try:
        config = BreakerConfig(trip="count", failure_threshold=10**6, window_seconds=60)
        breaker = asking.get("acquire", config)
        for _ in range(500):
            breaker.acquire()
        control.config_resetstat()
        median_usec({"acquire": breaker.acquire})
        return evalsha_stats(control)
    finally:
        asking.close()
        asking.client.close()


def unbatched_record(url: str, control: redis.Redis) -> tuple[int, float, float]:
    """Every success sent synchronously (batching off): (EVALSHA calls, server
    usec per record script run, client usec per protected call)."""
    sync = Breakers.from_url(url, prefix="bench-sync", batch_successes=False)
    try:
        breaker = sync.get("sync", BreakerConfig(trip="count", failure_threshold=10**6, window_seconds=60))
        for _ in range(500):
            breaker.call(noop)
        control.config_resetstat()
        client_usec = median_usec({"sync": lambda: breaker.call(noop)})["sync"]
        calls, server_usec = evalsha_stats(control)
        return calls, server_usec, client_usec
    finally:
        sync.close()
        sync.client.close()


def measure(url: str, control: redis.Redis, breakers: Breakers, pb_client: redis.Redis) -> Results:
    results = Results()
    ours, tripped = breaker_redis_subject(breakers)
    observed = observe_subject(breakers)
    theirs = pybreaker_subject(pb_client)
    failing = failing_subjects(breakers, pb_client)
    subjects = [ours, theirs]
    warm_up(subjects, observed, failing)

    for subject in subjects:
        closed = closed_workload(subject.closed_call, COUNT_CALLS, subject.settle)
        results.counts[subject.name, "closed"] = count_commands(url, control, closed)
        rejected = open_workload(subject.rejected_call, OPEN_COUNT_SECONDS)
        results.counts[subject.name, "open"] = count_commands(url, control, rejected)
    for each in failing:
        failures_before = each.failures
        settle = each.breaker.flush_batch if each.breaker is not None else lambda: None
        workload = closed_workload(each.call, COUNT_CALLS, settle)  # COUNT_CALLS: a multiple of `every`
        results.counts[each.library, each.phase] = count_commands(url, control, workload)
        results.failures_counted[each.library, each.phase] = each.failures - failures_before
    observed_workload = open_workload(observed.call, OPEN_COUNT_SECONDS)
    results.counts["breaker_redis", "open, observe mode"] = count_commands(url, control, observed_workload)

    control.config_resetstat()  # from here: only the closed timing runs use EVALSHA
    results.closed_usec = median_usec({s.name: s.closed_call for s in subjects})
    results.evalsha_calls, results.evalsha_usec = evalsha_stats(control)
    results.closed_timed_calls = REPEATS * ITERATIONS
    open_calls = {s.name: s.rejected_call for s in subjects}
    results.open_usec = median_usec({**open_calls, "breaker_redis observe": observed.call})
    control.config_resetstat()
    failing_calls = {(each.library, each.phase): each.call for each in failing}
    results.failing_usec = median_usec(failing_calls, FAILING_ITERATIONS)
    results.failing_evalsha_calls, results.failing_evalsha_usec = evalsha_stats(control)
    results.failing_timed_calls = REPEATS * FAILING_ITERATIONS * sum(1 for f in failing if f.breaker)
    results.sync_calls, results.sync_server_usec, results.sync_client_usec = unbatched_record(url, control)
    results.acquire_calls, results.acquire_server_usec = acquire_server_time(url, control)
    keys = breaker_keys(breakers.prefix, tripped.name)
    functions = breakers.gate.remote.use_functions
    results.script_command = "FCALL" if functions else "EVALSHA"
    results.trivial_script_usec = trivial_script_usec(control, keys, RECORD_ARGC, functions)

    results.memory = key_memory(control, keys)
    results.history_memory = full_history_memory(url, control)
    results.pybreaker_memory = key_memory(control, pybreaker_keys(control, "bench-open"))
    results.notes += sanity_notes(subjects, tripped, observed, failing)
    return results


def sanity_notes(
    subjects: list[Subject], tripped: Breaker, observed: Observed, failing: list[Failing]
) -> list[str]:
    notes = []
    for subject in subjects:
        if subject.admitted_while_open:
            notes.append(f"WARNING: {subject.name} admitted {subject.admitted_while_open} calls while open")
        if not subject.healthy():
            notes.append(f"WARNING: {subject.name} switched to its fallback store during the run")
    snapshot = tripped.snapshot()
    if snapshot["state"] != "open":
        notes.append(f"WARNING: breaker_redis 'bench-open' is {snapshot['state']}, expected open")
    notes.append(
        f"breaker_redis 'bench-open' after the run: trips={snapshot['trips']}, "
        f"rejected={snapshot['rejected']:,}, calls={snapshot['calls']:,}"
    )
    snapshot = observed.breaker.snapshot()
    if snapshot["state"] != "open" or observed.refused:
        notes.append(
            f"WARNING: breaker_redis 'bench-observe' is {snapshot['state']} (expected open) "
            f"and refused {observed.refused:,} calls (expected 0)"
        )
    notes.append(
        f"breaker_redis 'bench-observe' (mode=observe) after the run: state={snapshot['state']}, "
        f"trips={snapshot['trips']}, would_reject={snapshot['would_reject']:,}, "
        f"successes={snapshot['successes']:,}, rejected={snapshot['rejected']:,}"
    )
    for each in failing:
        if each.refused:
            notes.append(f"WARNING: {each.library} tripped with {each.phase}: {each.refused:,} calls refused")
        if each.breaker is None:
            continue
        snapshot = each.breaker.snapshot()
        if snapshot["state"] != "closed" or snapshot["trips"]:
            notes.append(
                f"WARNING: breaker_redis {each.breaker.name!r} is {snapshot['state']} after "
                f"{snapshot['trips']} trips, expected closed and never tripped"
            )
        notes.append(
            f"breaker_redis {each.breaker.name!r} after the run: state={snapshot['state']}, "
            f"trips={snapshot['trips']}, calls={snapshot['calls']:,}, failures={snapshot['failures']:,}, "
            f"window {snapshot['window_failures']:,} failures in {snapshot['window_calls']:,} calls"
        )
    return notes


TRIPS = (
    ("breaker_redis trip=rate", "trip=rate, armed only within reach of 50 %"),
    ("breaker_redis trip=consecutive", "trip=consecutive, armed from a failure to the next success"),
)


def armed_share(results: Results, library: str, phase: str) -> float:
    """Of the successes in a counted phase, the share sent at once (admitted
    while armed); a calm worker batches them."""
    count, calls = results.counts[library, phase]
    successes = calls - results.failures_counted[library, phase]
    return count.record_outcomes["success"] / successes if successes else float("nan")


def failing_rows(results: Results) -> tuple[list[Row], list[Row]]:
    """(commands rows, µs rows) for the closed breakers with failures."""
    commands, usec = [], []
    for every in FAILURE_EVERY:
        phase = f"closed, {percent(every)} failures"
        theirs_count = results.counts["pybreaker", phase]
        theirs_usec = results.failing_usec["pybreaker", phase]
        for library, trip_text in TRIPS:
            count = results.counts[library, phase]
            value = per_call(*count)
            share = armed_share(results, library, phase)
            commands.append(
                Row(
                    f"Redis commands per call, {phase} ({trip_text})",
                    f"{describe_count(*count)}; armed for {share * 100:.0f} % of successes",
                    describe_count(*theirs_count),
                    f"breaker_redis <= {TARGET_ARMED_COMMANDS}",
                    value <= TARGET_ARMED_COMMANDS,
                )
            )
            ours_usec = results.failing_usec[library, phase]
            ratio = ours_usec / theirs_usec
            usec.append(
                Row(
                    f"µs per call, {phase} ({library.split()[1]})",
                    f"{ours_usec:.1f}",
                    f"{theirs_usec:.1f}",
                    f"ratio <= {TARGET_TIME_RATIO} (got {ratio:.2f})",
                    ratio <= TARGET_TIME_RATIO,
                )
            )
    return commands, usec


def rows_for(results: Results) -> list[Row]:
    counts = results.counts
    ours_closed, theirs_closed = counts["breaker_redis", "closed"], counts["pybreaker", "closed"]
    ours_open, theirs_open = counts["breaker_redis", "open"], counts["pybreaker", "open"]
    observed = counts["breaker_redis", "open, observe mode"]
    closed_ratio = results.closed_usec["breaker_redis"] / results.closed_usec["pybreaker"]
    open_ratio = results.open_usec["breaker_redis"] / results.open_usec["pybreaker"]
    sync_ratio = results.sync_client_usec / results.closed_usec["pybreaker"]
    total = sum(results.memory.values())
    full = sum(results.history_memory.values())
    failing_commands, failing_usec = failing_rows(results)
    return [
        Row(
            "Redis commands per call, closed",
            describe_count(*ours_closed),
            describe_count(*theirs_closed),
            f"breaker_redis <= {TARGET_CLOSED_COMMANDS}",
            per_call(*ours_closed) <= TARGET_CLOSED_COMMANDS,
        ),
        *failing_commands,
        Row(
            "Redis commands per rejected call, open",
            describe_count(*ours_open),
            describe_count(*theirs_open),
            f"breaker_redis <= {TARGET_OPEN_COMMANDS}",
            per_call(*ours_open) <= TARGET_OPEN_COMMANDS,
        ),
        Row(
            "Redis commands per admitted call, open, mode=observe (outcomes counted in memory)",
            describe_count(*observed),
            "n/a (no observe mode)",
            f"breaker_redis <= {TARGET_OPEN_COMMANDS} (enforce mode: {per_call(*ours_open):.6f})",
            per_call(*observed) <= TARGET_OPEN_COMMANDS,
        ),
        Row(
            "µs per successful call, closed",
            f"{results.closed_usec['breaker_redis']:.1f}",
            f"{results.closed_usec['pybreaker']:.1f}",
            f"ratio <= {TARGET_TIME_RATIO} (got {closed_ratio:.2f})",
            closed_ratio <= TARGET_TIME_RATIO,
        ),
        *failing_usec,
        Row(
            "µs per rejected call, open",
            f"{results.open_usec['breaker_redis']:.2f}",
            f"{results.open_usec['pybreaker']:.1f}",
            f"ratio <= {TARGET_TIME_RATIO} (got {open_ratio:.3f})",
            open_ratio <= TARGET_TIME_RATIO,
        ),
        Row(
            "µs per admitted call, open, mode=observe",
            f"{results.open_usec['breaker_redis observe']:.2f}",
            "n/a (no observe mode)",
            f"none (enforce mode: {results.open_usec['breaker_redis']:.2f} per rejected call)",
            None,
        ),
        Row(
            f"record script server time, µs (cmdstat_{results.script_command.lower()} usec_per_call, "
            "one outcome per run)",
            f"{results.sync_server_usec:.2f} ({results.sync_calls:,} runs)",
            "n/a (no scripts)",
            f"<= {TARGET_RECORD_USEC:g}",
            results.sync_server_usec <= TARGET_RECORD_USEC,
        ),
        Row(
            f"acquire script server time, µs (cmdstat_{results.script_command.lower()} usec_per_call, "
            "closed, a worker with no subscription)",
            f"{results.acquire_server_usec:.2f} ({results.acquire_calls:,} runs)",
            "n/a (no scripts)",
            "none (measured for the record; docs/design.md section 11)",
            None,
        ),
        Row(
            "µs per successful call, closed, batching off (every success sent at once)",
            f"{results.sync_client_usec:.1f}",
            f"{results.closed_usec['pybreaker']:.1f}",
            f"ratio <= {TARGET_TIME_RATIO} (got {sync_ratio:.2f})",
            sync_ratio <= TARGET_TIME_RATIO,
        ),
        Row(
            f"Redis memory per breaker, {len(KEY_SUFFIXES)} keys, after a trip",
            kb(total),
            f"{kb(sum(results.pybreaker_memory.values()))} ({len(results.pybreaker_memory)} keys)",
            f"<= {kb(TARGET_MEMORY_BYTES)}",
            total <= TARGET_MEMORY_BYTES,
        ),
        Row(
            "Redis memory per breaker, full history (10 transitions kept) and a failure in every bucket",
            kb(full),
            "",
            f"<= {kb(TARGET_MEMORY_BYTES)}",
            full <= TARGET_MEMORY_BYTES,
        ),
    ]


def details(results: Results) -> list[str]:
    lines = []
    for (library, phase), (count, _calls) in results.counts.items():
        lines.append(f"- commands sent by {library} while {phase}: {breakdown(count)}")
    lines.append(
        f"- failures: every {' / '.join(f'{e}th' for e in FAILURE_EVERY)} call fails, never two in a row; "
        "breaker_redis trip=rate: failure_rate 0.5, minimum_calls 20, window 10 s; "
        f"trip=consecutive: failure_threshold {TRIP_FAILURES}; pybreaker: fail_max {TRIP_FAILURES}"
    )
    lines.append(
        f"- armed share: successes sent at once (`{results.script_command} record` with outcome success) "
        "out of all "
        "successes in the counted phase; a calm worker batches them (`batch alone`), failures are always "
        "sent at once"
    )
    per_key = ", ".join(f"{key.rsplit(':', 1)[1]} {n:,} B" for key, n in results.memory.items())
    lines.append(f"- breaker_redis memory per key: {per_key}")
    per_key = ", ".join(f"{key.rsplit(':', 1)[1]} {n:,} B" for key, n in results.history_memory.items())
    lines.append(f"- breaker_redis memory per key, full history: {per_key}")
    lines.append(
        f"- batched successes during the closed timing runs: {results.evalsha_calls:,} record script runs "
        f"for {results.closed_timed_calls:,} calls, {results.evalsha_usec:.1f} µs of server time per run"
    )
    lines.append(
        f"- scripts during the timing runs with failures: {results.failing_evalsha_calls:,} runs for "
        f"{results.failing_timed_calls:,} breaker_redis calls, {results.failing_evalsha_usec:.1f} µs "
        "of server time per run"
    )
    lines.append(
        f"- reference: server time of a `return 1` script with the record script's keys and "
        f"argument count: {results.trivial_script_usec:.2f} µs per call"
    )
    return lines + [f"- {note}" for note in results.notes]


AGAINST_ROUNDS = 9  # alternating rounds per code in --against


def code_of(rev: str, into: Path) -> Path:
    """The breaker_redis package and lua/ of commit ``rev``, unpacked into ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "breaker_redis", "lua"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def against(rev: str) -> int:
    """This checkout's healthy call against commit ``rev``'s, rounds alternating."""
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True, capture_output=True, text=True
    ).stdout.strip()
    child = str(Path(__file__).with_name("healthy_call.py"))
    results: dict[str, list[dict[str, float]]] = {"this checkout": [], f"commit {sha}": []}
    with tempfile.TemporaryDirectory() as folder, redis_server() as url:
        roots = {"this checkout": str(ROOT), f"commit {sha}": str(code_of(rev, Path(folder)))}
        for round_ in range(AGAINST_ROUNDS):
            order = list(roots) if round_ % 2 == 0 else list(reversed(roots))
            for code in order:
                name = f"healthy-{round_}-{list(roots).index(code)}"
                argv = [sys.executable, child, "--root", roots[code], "--url", url, "--name", name]
                out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
                results[code].append(json.loads(out.strip().splitlines()[-1]))
        server = redis.Redis.from_url(url).info("server")["redis_version"]
    load = os.getloadavg()[0]
    print(
        f"# the healthy call, this checkout against commit {sha} (redis-server {server}, "
        f"Python {sys.version.split()[0]}, {AGAINST_ROUNDS} alternating rounds of 5 x 5,000 calls each, "
        f"load average {load:.1f})\n"
    )
    print("| code | Breaker.call, µs | acquire + success, µs |")
    print("|---|---|---|")
    medians = {
        code: {path: statistics.median(r[path] for r in rounds) for path in ("call", "permit")}
        for code, rounds in results.items()
    }
    for code, values in medians.items():
        print(f"| {code} | {values['call']:.2f} | {values['permit']:.2f} |")
    new, old = medians["this checkout"], medians[f"commit {sha}"]
    print(f"| ratio | {new['call'] / old['call']:.3f} | {new['permit'] / old['permit']:.3f} |")
    return 0


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--against":
        return against(sys.argv[2])
    if len(sys.argv) > 1:
        print("usage: python bench/overhead.py [--against REV]", file=sys.stderr)
        return 2
    started = time.monotonic()
    with redis_server() as url:
        control = redis.Redis.from_url(url)
        pb_client = redis.Redis.from_url(url)  # bytes replies: CircuitRedisStorage decodes them
        breakers = Breakers.from_url(url)
        try:
            results = measure(url, control, breakers, pb_client)
            server = control.info("server")
        finally:
            breakers.close()
            breakers.client.close()
            pb_client.close()
            control.close()
    print(
        f"# breaker_redis overhead (redis-server {server['redis_version']} on 127.0.0.1, "
        f"Python {sys.version.split()[0]}, pybreaker {version('pybreaker')})\n"
    )
    print(markdown(rows_for(results)))
    print()
    print("\n".join(details(results)))
    print(f"\nfinished in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
