"""Functions run in separate worker processes by test_multiprocess.py.

They live in an importable module so the 'spawn' start method can find them:
every process builds its own Breakers, as a gunicorn worker would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from breaker_redis import BreakerConfig, BreakerOpen, Breakers
from tests.support.redis_server import emptied
from tests.support.workers import snapshot


def record_outcomes(url: str, name: str, config: BreakerConfig, n: int, barrier: Any) -> int:
    """n failures and n successes, interleaved; successes go through the batching path."""
    breakers = Breakers.from_url(url)
    breaker = breakers.get(name, config)
    barrier.wait()
    for _ in range(n):
        breaker.acquire().failure()
        breaker.acquire().success()
    breakers.close()
    return n


def race_for_probe(url: str, name: str, config: BreakerConfig, now_ms: int, barrier: Any) -> bool:
    """True if this process got a probe permit (it keeps it: the probe is in flight)."""
    breakers = Breakers.from_url(url, clock=lambda: now_ms, listen=False)
    breaker = breakers.get(name, config)
    barrier.wait()
    try:
        permit = breaker.acquire()
    except BreakerOpen:
        return False
    finally:
        breakers.close()
    return permit.probe


def race_to_trip(
    url: str, name: str, config: BreakerConfig, n: int, barrier: Any, reports: Any = None
) -> int:
    """Record up to n failures; returns how many were admitted. With reports (a
    shared list), an on_transition callback appends every transition it is given."""
    breakers = Breakers.from_url(url)
    if reports is not None:
        breakers.on_transition(lambda t: reports.append((t.name, t.old, t.new, t.cause, t.epoch)))
    breaker = breakers.get(name, config)
    barrier.wait()
    admitted = 0
    for _ in range(n):
        try:
            breaker.acquire().failure()
            admitted += 1
        except BreakerOpen:
            pass
    breakers.close()
    return admitted


def serve(
    url: str,
    name: str,
    config: BreakerConfig,
    conn: Any,
    batch_successes: bool = True,
    reporter: str | None = None,
    now_ms: int | None = None,
) -> None:
    """A worker process driven step by step by the test: each command is run and
    answered before the next is sent, so the test fixes the real-time order. With
    ``now_ms``, a test clock that the command "clock <ms>" sets. Besides the calls:
    "listening" (its subscription is confirmed), "store" (its breaker's store:
    "redis" or the fallback's), "calm N" (N healthy calls in a row, then its batch
    sent: what a busy worker does between two of the test's steps), "share N" (N calls,
    answered with how many were admitted and why the others were refused), "run S" (calls
    for S seconds of real time: _run_for), "failure-opens" (a
    failure, answered "opened" when this call's own reply opened the breaker, else
    "recorded"), "hold" then "release-<outcome>" (a call left running, then recorded),
    "trusted" (what it knows would decide its next call), "count-scripts" then "scripts"
    (the script calls it sent since: _count_scripts)."""
    clock = [now_ms]
    breakers = Breakers.from_url(
        url,
        batch_successes=batch_successes,
        reporter=reporter,
        clock=None if now_ms is None else (lambda: int(clock[0] or 0)),
    )
    made: list[str] = []  # the states this process's calls moved the breaker to (on_transition)
    breakers.on_transition(lambda t: made.append(t.new))
    breaker = breakers.get(name, config)
    breakers.ensure_process()
    while not (breakers.invalidator is not None and breakers.invalidator.healthy):
        breakers.invalidator.drain() if breakers.invalidator is not None else None
        conn.poll(0.01)  # waits for the subscription, with the pipe as the clock
    conn.send("ready")
    held: list[Any] = []
    scripts = [0]
    while True:
        command = conn.recv()
        if command == "stop":
            break
        if command in ("count-scripts", "scripts"):
            conn.send(_count_scripts(breakers, scripts) if command == "count-scripts" else scripts[0])
            continue
        if command.startswith("clock "):
            clock[0] = int(command.split()[1])
            conn.send(True)
            continue
        try:
            if command == "admits":
                breaker.acquire().ignore()
                conn.send(True)
                continue
            if command == "trusted":  # memory would decide its next call: its lease runs
                known = breaker.known
                conn.send(known is not None and breaker._trusted(known))
                continue
            if command == "listening":
                breaker.acquire().ignore()  # delivers what its master sent, as any call does
                conn.send(breakers.invalidator is not None and breakers.invalidator.healthy)
                continue
            if command == "store":
                conn.send(breaker.snapshot()["store"])
                continue
            if command.startswith("share "):  # N calls: (admitted, the refusals' reasons), batch sent
                admitted, reasons = 0, set()
                for _ in range(int(command.split()[1])):
                    try:
                        breaker.acquire().success()
                        admitted += 1
                    except BreakerOpen as refusal:
                        reasons.add(refusal.reason)
                breakers.flush()
                conn.send((admitted, sorted(reasons)))
                continue
            if command.startswith("run "):
                conn.send(_run_for(breaker, float(command.split()[1])))
                breakers.flush()
                continue
            if command.startswith("calm "):
                for _ in range(int(command.split()[1])):
                    breaker.acquire().success()
                breakers.flush()
            elif command == "hold":
                held.append(breaker.acquire())
            elif command.startswith("release-"):
                held.pop().record(command.removeprefix("release-"))
            elif command == "failure-opens":
                made.clear()
                breaker.acquire().failure()
                conn.send("opened" if "open" in made else "recorded")
                continue
            else:  # "success" | "failure"
                breaker.acquire().record(command)
            conn.send(True)
        except BreakerOpen:
            conn.send(False)
    breakers.close()
    conn.send("stopped")


def _count_scripts(breakers: Breakers, scripts: list[int]) -> bool:
    """From now on count the script calls this worker's calls send (acquire, record; not
    the sweep of idle names, which picks among however many names the server holds), and
    send its batches and counts only at the test's steps ("share" ends with a flush),
    never on the recorder's or the counts' own timer, so the count depends on the steps."""
    from breaker_redis.engine import core

    core.FLUSH_SECONDS = 3600.0
    breakers.recorder.schedule = lambda breaker: None  # type: ignore[method-assign]
    runner, run = breakers.gate.remote, breakers.gate.remote.run

    def counted(operation: str, *args: Any) -> Any:
        scripts[0] += operation in ("acquire", "record")
        return run(operation, *args)

    runner.run = counted  # type: ignore[method-assign]
    return True


def _run_for(breaker: Any, seconds: float) -> dict[int, list[int]]:
    """Calls as fast as it can for ``seconds`` of real time: per ms of the worker's Redis
    time (when each call was decided), [calls, admitted], the calls refused for any other
    reason than the ramp left out (serve's "run S")."""
    import time

    seen: dict[int, list[int]] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        at = breaker.now_ms()
        try:
            breaker.acquire().success()
            admitted = 1
        except BreakerOpen as refusal:
            if refusal.reason != "ramp":
                continue
            admitted = 0
        row = seen.setdefault(at, [0, 0])
        row[0] += 1
        row[1] += admitted
    return seen


def steady(
    url: str, name: str, config: BreakerConfig, failure_rate: float, seconds: float, barrier: Any
) -> tuple[int, int, int]:
    """Calls for ``seconds``, the i-th failing when floor((i + 1) * rate) > floor(i * rate):
    every prefix of this worker's calls fails at most ``failure_rate`` of the time.
    Returns (calls, failures, refused); close() sends what is batched.

    Its client waits up to 10 s for a connection or a reply, longer than a URL may ask
    (under 1 s): the test counts what Redis saw against what the workers did, so a
    worker must not go to its local store because 8 free-running processes on a busy
    2-core machine kept the server from answering within a second (the embedded
    server, a thread of the test's process, once took longer to accept a connection)."""
    import math
    import time

    import redis

    breakers = Breakers(redis.Redis.from_url(url.split("?")[0], socket_timeout=10, socket_connect_timeout=10))
    breaker = breakers.get(name, config)
    barrier.wait()
    calls = failures = refused = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        fails = math.floor((calls + 1) * failure_rate) > math.floor(calls * failure_rate)
        try:
            breaker.acquire().record("failure" if fails else "success")
        except BreakerOpen:
            refused += 1
            continue
        calls += 1
        failures += fails
    breakers.close()
    return calls, failures, refused


def emptied_server_url(request: Any, through: Callable[[int], Any] | None = None) -> str:
    """The URL of the session's redis-server (``request.param`` 'real') or embedded
    server ('embedded'), emptied: a ``url`` fixture of the process tests. With
    ``through`` (tests/support/jitter_proxy.py's ``Proxies``), the URL of a proxy it starts
    in front of that server."""
    server = request.getfixturevalue("redis_server" if request.param == "real" else "embedded")
    emptied(Breakers.from_url(server.url, listen=False).client)
    # the longest client timeout the product allows: a reply stalled past the default
    # 0.25 s on a busy machine sends a worker to its local store, whose counts Redis
    # never sees (8 free-running processes on 2 cores keep a server busy)
    url = str(server.url if through is None else through(server.port).url)
    return url + ("&" if "?" in url else "?") + "socket_timeout=0.9&socket_connect_timeout=0.9"


def at_once(workers: list[Worker], command: str) -> list[Any]:
    """Send command to every worker before any answers; their answers, in the workers' order."""
    for worker in workers:
        worker.conn.send(command)
    return [worker.answer(command) for worker in workers]


class Worker:
    """A process running serve(), driven by the test one command at a time."""

    def __init__(
        self,
        ctx: Any,
        url: str,
        name: str,
        config: BreakerConfig,
        batch_successes: bool = True,
        reporter: str | None = None,
        now_ms: int | None = None,
        target: Callable[..., None] = serve,
    ) -> None:
        self.conn, theirs = ctx.Pipe()
        self.process = ctx.Process(
            target=target, args=(url, name, config, theirs, batch_successes, reporter, now_ms), daemon=True
        )
        self.process.start()

    def ready(self) -> None:
        assert self.conn.poll(60), "the worker process did not subscribe within 60 s"
        assert self.conn.recv() == "ready"

    def __call__(self, command: str) -> bool:
        return bool(self.ask(command))

    def ask(self, command: str) -> Any:
        self.conn.send(command)
        return self.answer(command)

    def answer(self, command: str) -> Any:
        """The answer to command, sent already."""
        assert self.conn.poll(30), f"the worker process did not answer {command!r}"
        return self.conn.recv()

    def stop(self) -> None:
        self.conn.send("stop")
        assert self.conn.poll(30) and self.conn.recv() == "stopped"
        self.conn.close()
        self.process.join(30)


class Team:
    """Worker processes a test starts (each waits until it is subscribed) and
    stops at its end, whatever state it left them in."""

    def __init__(self, url: str) -> None:
        import multiprocessing

        self._ctx = multiprocessing.get_context("spawn")
        self._url = url
        self._made: list[Worker] = []

    def start(
        self,
        name: str,
        config: BreakerConfig,
        count: int,
        batch_successes: bool = True,
        reporter: str | None = None,
        now_ms: int | None = None,
        target: Callable[..., None] = serve,
    ) -> list[Worker]:
        """``count`` workers running target (serve, or mp_asyncio.py's serve_asyncio), of ``reporter``
        (the host name by default), on the test clock when ``now_ms`` is given (the
        command "clock <ms>" moves it)."""
        args = (self._ctx, self._url, name, config, batch_successes, reporter, now_ms, target)
        workers = [Worker(*args) for _ in range(count)]
        self._made.extend(workers)
        for worker in workers:
            worker.ready()
        return workers

    def stop_all(self) -> None:
        for worker in self._made:
            if worker.process.is_alive() and not worker.conn.closed:
                worker.stop()


def deal(
    url: str, workers: list[Worker], name: str, outcomes: list[str], config: BreakerConfig
) -> tuple[int, int, int]:
    """Deal the calls round-robin, each answered before the next, until one is refused:
    (index of the last admitted call, window calls, window failures), read right after
    the refusal."""
    for index, outcome in enumerate(outcomes):
        if not workers[index % len(workers)](outcome):
            snap = snapshot(url, name, config)
            assert snap["state"] == "open"
            return index - 1, snap["window_calls"], snap["window_failures"]
    raise AssertionError("the breaker never tripped")
