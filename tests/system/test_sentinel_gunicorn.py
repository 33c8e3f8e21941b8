"""End to end: a ``SENTINEL FAILOVER`` while demo_app serves traffic under
gunicorn (4 sync workers), its Redis given as ``redis+sentinel://`` to the
suite's own master + replica + 3 sentinels (tests/support/topologies.py), the flaky
upstream in a process of its own.

Before the failover ``pay`` is tripped open (the upstream fails every
``/pay``) and the replica has the trip. Client threads then keep calling
``/pay``, ``/products`` and ``/recommend`` (a closed breaker whose successes
are written all along) while the sentinels switch masters. What is held:

- no answer is a 5xx other than the demo's own 502 (upstream failed) and 503
  (breaker open), no request fails, and the gunicorn log has no Traceback;
- every worker runs the breaker's scripts on the new master before the old
  one is demoted (it follows the sentinels' switch, logged once per worker),
  and once the old master is demoted it runs no script any more;
- the trip survives: the new master has the same open state (epoch, trips,
  failures) and every worker refuses ``/pay`` with 503 afterwards;
- no worker flaps: at most one line of each kind ("unavailable", "answers
  again", "failed again", "event subscription lost") per worker, and no
  worker is replaced.

How the figures are measured (printed with ``pytest -s`` and written to
test-artifacts/sentinel-failover.json): a MONITOR connection on each data
server sees every script call with the caller's address, which /proc maps to
the worker's pid; a watcher samples each server's role, ``cmdstat_fcall``, ``cmdstat_evalsha``
and the breakers' stats hashes every 25 ms. The outcomes lost are the stats
the old master gained after the replica was promoted (the cut) and before it
was demoted; the answers from the local fallback are those a worker gave
between its "unavailable" and "answers again" lines (the log is set to show
the pid and a timestamp with ``--log-config-json``). Every wait is a
condition with a deadline.

What it measures (2 cores, loopback, a core burnt or not): the replica is
promoted 0.15-0.25 s after SENTINEL FAILOVER and the sentinels name it after
1.1-1.3 s; the old master stays a writable master until Sentinel demotes it
about 11 s after the command (10 s after the switch). Each worker follows the
sentinels' +switch-master message (breaker_redis/storage/failover.py): all 4 run
their scripts on the new master within 60 ms of the switch, with no answer
from the local store. What the old master counted between the promotion and
the switch (about 0.9 s) is lost when it resyncs: about 150 script calls
(e.g. 87 rejections of pay and 69 successes of recommend in one run). Before
the follower, workers moved only when a new connection happened to ask the
sentinels or when the demotion cut their connections, 3-11 s after the
command, and 275 to 805 script calls were lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
import requests

from breaker_redis.urls import no_retry
from demo_app import stack
from tests.support.redis_server import wait_until
from tests.support.topologies import HOST, SentinelGroup, started
from tests.support.traffic import burst

pytestmark = [pytest.mark.real, pytest.mark.multiprocess]

T = TypeVar("T")

WORKERS = 4
CLIENT_THREADS = 4
PATHS = ("/pay", "/products", "/recommend")
BREAKERS = ("pay", "recommend")
BREAKER_PATHS = ("/pay", "/recommend")
ALLOWED = {"/pay": {502, 503}, "/products": {200}, "/recommend": {200}}
SAMPLE_EVERY = 0.025
# A failover demotes the old master about 10 s after the switch (tests/storage/test_failover.py):
# every deadline below that waits on the demotion leaves ample room on a busy machine.
SWITCH_DEADLINE = 45.0
ARTIFACTS = Path(
    os.environ.get("BREAKER_TEST_ARTIFACTS") or Path(__file__).resolve().parents[2] / "test-artifacts"
)
# The demo logs through the root logger; this adds the pid and a timestamp to each line.
LOG_CONFIG: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"stamped": {"format": "%(created).3f [%(process)d] %(levelname)s %(name)s: %(message)s"}},
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "formatter": "stamped", "stream": "ext://sys.stderr"}
    },
    "root": {"level": "WARNING", "handlers": ["stderr"]},
    "loggers": {
        "gunicorn.error": {"level": "INFO", "handlers": [], "propagate": True},
        "breaker_redis": {"level": "INFO", "handlers": [], "propagate": True},
    },
}
LOG_LINE = re.compile(r"^(\d+\.\d+) \[(\d+)\] \w+ breaker_redis: (.*)$", re.MULTILINE)
SWITCH_KINDS = {
    "Redis unavailable": "unavailable",
    "Redis answers again": "back",
    "Redis failed again": "failed_again",
    "event subscription lost": "subscription_lost",
    "Sentinel moved master": "moved",
}


# -- processes and sockets, from /proc ------------------------------------------------


def children(parent: int) -> set[int]:
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rpartition(")")[2].split()[1]) == parent:
                found.add(int(entry))
    return found


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(int(link[8:-1]))
    return inodes


def _tcp_ends() -> dict[int, tuple[int, int]]:
    """{socket inode: (local port, remote port)} for every TCP socket of this network namespace."""
    ends: dict[int, tuple[int, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, remote = (int(f.rpartition(":")[2], 16) for f in fields[1:3])
                ends[int(fields[9])] = (local, remote)
    return ends


class PortOwners:
    """Which worker owns the TCP connection from a local port to a server's port (cached).

    Both ends are needed: the kernel hands out one local port to several
    connections whose destinations differ (to the old and to the new master).
    """

    def __init__(self, pids: set[int]) -> None:
        self.pids = pids
        self._owner: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()

    def __call__(self, local: int, server: int) -> int:
        """The worker's pid, or 0 when no worker has (or still has) that connection."""
        with self._lock:
            if (local, server) not in self._owner:
                ends = _tcp_ends()
                for pid in self.pids:
                    for inode in _socket_inodes(pid):
                        if inode in ends:
                            self._owner[ends[inode]] = pid
            return self._owner.get((local, server), 0)


# -- what the servers saw ----------------------------------------------------------------


@dataclass(frozen=True)
class ScriptCall:
    at: float  # the server's clock (time.time() of the same host)
    pid: int  # the worker that sent it (0: not resolved)
    command: str  # FCALL or EVALSHA (a breaker script) or EVAL (the store gate's health probe)


BREAKER_SCRIPTS = ("FCALL", "EVALSHA")


class Monitor(threading.Thread):
    """MONITOR on one server: every EVAL/EVALSHA/FCALL sent by a client (not by a script).

    Reconnects when the server drops it (a demotion kills every normal client).
    """

    def __init__(self, port: int, owners: PortOwners, stop: threading.Event) -> None:
        super().__init__(name=f"monitor-{port}", daemon=True)
        self.port = port
        self.owners = owners
        self.halt = stop
        self.calls: list[ScriptCall] = []
        self.drops: list[float] = []
        self.connected = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            with contextlib.suppress(OSError), socket.create_connection((HOST, self.port), timeout=2) as sock:
                sock.sendall(b"MONITOR\r\n")
                self._read(sock)
            self.drops.append(time.time())
            self.halt.wait(0.02)

    def _read(self, sock: socket.socket) -> None:
        buffer = b""
        while not self.halt.is_set():
            if not select.select([sock], [], [], 0.2)[0]:
                continue
            data = sock.recv(1 << 16)
            if not data:
                return
            *lines, buffer = (buffer + data).split(b"\r\n")
            for line in lines:
                self._line(line)

    def _line(self, line: bytes) -> None:
        if line == b"+OK":
            self.connected.set()
            return
        # +1700000000.123456 [0 127.0.0.1:54321] "EVALSHA" "sha" "7" ...
        stamp, _, rest = line[1:].partition(b" [")
        client, _, command = rest.partition(b"] ")
        name = command.partition(b" ")[0].strip(b'"').upper()
        if name not in (b"FCALL", b"EVALSHA", b"EVAL"):
            return
        address = client.partition(b" ")[2]
        if address == b"lua" or b":" not in address:
            return
        pid = self.owners(int(address.rpartition(b":")[2]), self.port)
        self.calls.append(ScriptCall(float(stamp), pid, name.decode()))

    def scripts(
        self, pid: int | None = None, after: float = 0.0, before: float = float("inf")
    ) -> list[float]:
        """Times of breaker scripts (FCALL, EVALSHA) from one worker (or any) in (after, before)."""
        return [
            c.at
            for c in list(self.calls)
            if c.command in BREAKER_SCRIPTS and (pid is None or c.pid == pid) and after < c.at < before
        ]


@dataclass(frozen=True)
class Sample:
    at: float
    role: str  # master, slave, or unreachable
    scripts: int  # cmdstat_evalsha and cmdstat_fcall: calls + rejected_calls + failed_calls
    stats: dict[str, dict[str, int]]  # breaker -> its stats hash


class Watcher(threading.Thread):
    """Samples each data server's role, script count and the breakers' stats."""

    def __init__(self, ports: list[int], prefix: str, stop: threading.Event) -> None:
        super().__init__(name="watcher", daemon=True)
        self.prefix = prefix
        self.halt = stop
        self.clients = {
            port: redis.Redis(
                host=HOST, port=port, socket_timeout=0.5, socket_connect_timeout=0.5, retry=no_retry()
            )
            for port in ports
        }
        self.samples: dict[int, list[Sample]] = {port: [] for port in ports}

    def run(self) -> None:
        while not self.halt.wait(SAMPLE_EVERY):
            for port in self.clients:
                self.samples[port].append(self.sample(port))

    def sample(self, port: int) -> Sample:
        pipe = self.clients[port].pipeline(transaction=False)
        pipe.info("replication")
        pipe.info("commandstats")
        for name in BREAKERS:
            pipe.hgetall(f"{self.prefix}:{{{name}}}:stats")
        try:
            replication, commands, *stats = pipe.execute()
        except (redis.exceptions.RedisError, OSError):
            return Sample(time.time(), "unreachable", -1, {})
        scripts = sum(
            int(commands.get(f"cmdstat_{name}", {}).get(key, 0))
            for name in ("evalsha", "fcall")
            for key in ("calls", "rejected_calls", "failed_calls")
        )
        hashes = {
            name: {k.decode(): int(v) for k, v in raw.items()}
            for name, raw in zip(BREAKERS, stats, strict=True)
        }
        return Sample(time.time(), str(replication.get("role")), scripts, hashes)

    def first(self, port: int, role: str, after: float) -> Sample | None:
        return next((s for s in list(self.samples[port]) if s.at > after and s.role == role), None)

    def last(self, port: int, role: str, before: float) -> Sample | None:
        return next((s for s in reversed(list(self.samples[port])) if s.at < before and s.role == role), None)

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


# -- the app, seen from outside ------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    began: float
    ended: float
    path: str
    status: int  # 0: the request itself failed
    pid: int
    detail: str = ""  # the error, or the start of the body


@dataclass
class Shop:
    url: str
    upstream_url: str
    answers: list[Answer] = field(default_factory=list)
    stop_traffic: threading.Event = field(default_factory=threading.Event)
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(max_workers=8))

    def send(self, path: str, session: requests.Session | None = None) -> Answer:
        method = "POST" if path == "/pay" else "GET"
        began = time.time()
        try:
            response = (session or requests).request(method, self.url + path, timeout=10)
        except requests.RequestException as exc:
            answer = Answer(began, time.time(), path, 0, 0, f"{type(exc).__name__}: {exc}")
        else:
            pid = int(response.headers.get("X-Worker-Pid", 0))
            answer = Answer(began, time.time(), path, response.status_code, pid, response.text[:200])
        self.answers.append(answer)
        return answer

    def burst(self, path: str, n: int = 8) -> list[Answer]:
        return burst(self.pool, n, lambda: self.send(path))

    def every_worker(self, path: str, status: int, what: str, timeout: float = 30) -> None:
        """Bursts until each worker has answered path with status; any other answer fails."""
        seen: set[int] = set()

        def all_seen() -> bool:
            for answer in self.burst(path):
                assert answer.status == status, (what, answer)
                seen.add(answer.pid)
            return len(seen) >= WORKERS

        wait_until(all_seen, timeout=timeout, what=what)

    def traffic(self) -> None:
        session = requests.Session()
        try:
            while not self.stop_traffic.is_set():
                for path in PATHS:
                    self.send(path, session)
                self.stop_traffic.wait(0.005)
        finally:
            session.close()

    def control(self, **body: Any) -> None:
        requests.post(self.upstream_url + "/_control", json=body, timeout=5).raise_for_status()

    def reset_upstream(self) -> None:
        requests.post(self.upstream_url + "/_reset", timeout=5).raise_for_status()

    def hits(self) -> int:
        stats = requests.get(self.upstream_url + "/_stats", timeout=5).json()
        return int(stats["hits"].get("/pay", 0))


def switch_lines(log: str) -> list[tuple[float, int, str]]:
    """(time, pid, kind) of every breaker_redis line about the store's health."""
    found = []
    for stamp, pid, message in LOG_LINE.findall(log):
        kind = next((k for prefix, k in SWITCH_KINDS.items() if message.startswith(prefix)), "other")
        found.append((float(stamp), int(pid), kind))
    return found


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    """A topology of its own: the failover leaves it changed."""
    with started(SentinelGroup()) as sentinels:
        yield sentinels


# -- the test --------------------------------------------------------------------------------


def test_sentinel_failover_under_gunicorn_traffic(
    group: SentinelGroup, upstream_url: str, tmp_path: Path
) -> None:
    prefix = f"sgf-{uuid.uuid4().hex[:10]}"
    log_config = tmp_path / "logging.json"
    log_config.write_text(json.dumps(LOG_CONFIG))
    app_url, gunicorn = stack.start_gunicorn(
        group.url(),
        upstream_url,
        extra_args=["--log-config-json", str(log_config)],
        env={"DEMO_PAY_OPEN_SECONDS": "600", "BREAKER_KEY_PREFIX": prefix},
    )
    shop = Shop(app_url, upstream_url)
    halt = threading.Event()
    threads: list[threading.Thread] = []
    watcher: Watcher | None = None
    figures: dict[str, Any] = {"prefix": prefix}
    try:
        run_failover(group, gunicorn, shop, prefix, halt, threads, figures)
    except BaseException:
        figures["gunicorn_log_kept_at"] = str(gunicorn.log_path)
        raise
    finally:
        shop.stop_traffic.set()
        halt.set()
        for thread in threads:
            thread.join(10)
            if isinstance(thread, Watcher):
                watcher = thread
        if watcher is not None:
            watcher.close()
        shop.pool.shutdown()
        gunicorn.stop()
        report(figures)
    log = gunicorn.output()
    gunicorn.remove_log()
    assert "Traceback" not in log, log[-5000:]
    lines = switch_lines(log)
    per_worker = Counter((pid, kind) for _, pid, kind in lines if kind != "other")
    too_many = {key: n for key, n in per_worker.items() if n > 1}  # one line per change, not per call
    assert not too_many, (too_many, [line for line in log.splitlines() if "breaker_redis:" in line])
    moved = Counter(pid for _, pid, kind in lines if kind == "moved")
    assert len(moved) == WORKERS and set(moved.values()) == {1}, moved  # each worker heard the switch once


def run_failover(
    group: SentinelGroup,
    gunicorn: stack.Child,
    shop: Shop,
    prefix: str,
    halt: threading.Event,
    threads: list[threading.Thread],
    figures: dict[str, Any],
) -> None:
    old, new = group.master_port(), group.replica_port()
    old_master, new_master = group.data(old, timeout=5), group.data(new, timeout=5)
    state_key, stats_key = f"{prefix}:{{pay}}:state", f"{prefix}:{{pay}}:stats"
    pids = until(
        lambda: found if len(found := children(gunicorn.pid)) == WORKERS else None,
        30,
        f"gunicorn's {WORKERS} workers",
    )

    # -- every worker uses both breakers and listens to the events -------------------------------------
    shop.reset_upstream()
    shop.control(latency_ms=30)  # overlapping requests spread over the workers
    shop.every_worker("/pay", 200, "every worker to serve /pay")
    shop.every_worker("/recommend", 200, "every worker to serve /recommend")
    channel = f"{prefix}:notices:0"  # the workers' channel
    wait_until(
        lambda: int(dict(old_master.pubsub_numsub(channel)).get(channel.encode(), 0)) >= WORKERS,
        timeout=15,
        what="every worker to subscribe to the workers' channel",
    )

    # -- trip pay: exactly 5 failures; the replica has the trip ------------------------------------------
    shop.reset_upstream()
    shop.control(path="/pay", fail_rate=1.0)
    for n in range(5):
        assert old_master.hget(state_key, "state") != b"open", f"opened after {n} failures"
        answer = shop.send("/pay")
        assert answer.status == 502, answer
    assert old_master.hget(state_key, "state") == b"open"
    assert shop.hits() == 5
    tripped = numbers(old_master, state_key, "epoch", "open_until")
    wait_until(
        lambda: (
            numbers(new_master, state_key, "epoch", "open_until") == tripped
            and new_master.hget(state_key, "state") == b"open"
        ),
        timeout=10,
        what="the replica to have the trip",
    )
    shop.every_worker("/pay", 503, "every worker to refuse /pay before the failover")

    # -- the observers, then the traffic ------------------------------------------------------------------
    owners = PortOwners(pids)
    monitors = {port: Monitor(port, owners, halt) for port in (old, new)}
    watcher = Watcher([old, new], prefix, halt)
    threads += [*monitors.values(), watcher]
    for thread in (*monitors.values(), watcher):
        thread.start()
    for monitor in monitors.values():
        assert monitor.connected.wait(10), f"MONITOR on {monitor.port} did not start"
    for _ in range(CLIENT_THREADS):
        threads.append(client := threading.Thread(target=shop.traffic, name="client", daemon=True))
        client.start()
    wait_until(
        lambda: all(monitors[old].scripts(pid) for pid in pids),
        timeout=30,
        what="every worker to run scripts on the old master under the traffic",
    )
    hits_before = shop.hits()

    # -- the failover ---------------------------------------------------------------------------------------
    asked = time.time()
    old_port, new_port, took = group.failover(timeout=20)
    accepted = time.time() - took  # when the sentinel accepted SENTINEL FAILOVER
    assert (old_port, new_port) == (old, new)

    def since(at: float) -> float:
        return round(at - accepted, 3)

    figures |= {
        "old_master": old,
        "new_master": new,
        "asked_to_accepted_s": round(accepted - asked, 3),
        "sentinels_name_the_new_master_s": round(took, 3),
    }
    channel = f"{prefix}:notices:0"  # the workers' channel

    def subscribed_on_new() -> float | None:
        ((_, count),) = new_master.pubsub_numsub(channel)
        return time.time() if int(count) >= WORKERS else None

    # the workers' event subscriptions follow too (Invalidator.resubscribe)
    resubscribed = until(subscribed_on_new, SWITCH_DEADLINE, "every worker to subscribe on the new master")
    figures["every_worker_subscribed_on_new_master_s"] = since(resubscribed)
    promotion = until(lambda: watcher.first(new, "master", asked), 10, "a sample of the promoted replica")
    figures["replica_promoted_s"] = since(promotion.at)
    demotion = until(lambda: watcher.first(old, "slave", accepted), SWITCH_DEADLINE, "the demotion")
    still_master = watcher.last(old, "master", demotion.at)
    assert still_master is not None
    figures["old_master_demoted_between_s"] = [since(still_master.at), since(demotion.at)]

    def first_on_new() -> dict[int, float]:
        found = {pid: monitors[new].scripts(pid, after=asked) for pid in pids}
        return {pid: min(times) for pid, times in found.items() if times}

    switched = until(
        lambda: found if len(found := first_on_new()) == WORKERS else None,
        SWITCH_DEADLINE,
        "every worker to run the breaker's scripts on the new master",
    )
    figures |= {
        "every_worker_on_new_master_s": since(max(switched.values())),
        "first_script_on_new_master_s": {str(pid): since(at) for pid, at in sorted(switched.items())},
        "workers_on_new_master_before_demotion": sum(at < still_master.at for at in switched.values()),
    }

    def downs() -> dict[int, float]:
        """Each worker's last switch to the local store, from the log."""
        found: dict[int, float] = {}
        for at, pid, kind in switch_lines(gunicorn.output()):
            if kind in ("unavailable", "failed_again"):
                found[pid] = at
        return found

    wait_until(
        lambda: all(monitors[new].scripts(pid, after=at) for pid, at in downs().items()),
        timeout=SWITCH_DEADLINE,
        what="every worker that left Redis to run a script on it again",
    )

    # -- the demoted master runs no script; the new one runs every worker's ---------------------------------
    quiet_from = time.time()
    scripts_on_old = evalsha_calls(old_master)
    wait_until(
        lambda: all(len(monitors[new].scripts(pid, after=quiet_from)) >= 2 for pid in pids),
        timeout=30,
        what="every worker to run scripts on the new master again",
    )
    shop.stop_traffic.set()
    for thread in threads:
        if thread.name == "client":
            thread.join(15)
    hits_after_failover = shop.hits() - hits_before
    measure(figures, shop, gunicorn, monitors, old, new, asked, promotion, still_master, demotion, since)
    figures |= {
        "pay_calls_reaching_the_upstream_after_failover": hits_after_failover,
        "last_script_on_old_master_s": {
            str(pid): since(max(monitors[old].scripts(pid), default=0.0)) for pid in sorted(pids)
        },
        "scripts_on_old_master_after_the_worker_moved": {
            str(pid): len(monitors[old].scripts(pid, after=at)) for pid, at in sorted(switched.items())
        },
    }

    # every worker followed the sentinels' switch (breaker_redis/storage/failover.py), none waited
    # for the old master's demotion 10 s later to drop its connections
    assert figures["workers_on_new_master_before_demotion"] == WORKERS, figures
    assert resubscribed < still_master.at, figures
    assert evalsha_calls(old_master) == scripts_on_old, "the demoted master ran scripts"
    after_demotion = {s.scripts for s in list(watcher.samples[old]) if s.at >= demotion.at and s.scripts >= 0}
    assert len(after_demotion) == 1, f"the demoted master ran scripts: {sorted(after_demotion)}"
    assert monitors[old].scripts(after=demotion.at) == []

    assert children(gunicorn.pid) == pids, "a worker was replaced"

    # -- the trip survived: the same state on the new master, and every worker refuses-----------------
    assert new_master.hget(state_key, "state") == b"open"
    assert numbers(new_master, state_key, "epoch", "open_until") == tripped
    assert numbers(new_master, stats_key, "trips", "failures") == [1, 5]
    shop.every_worker("/pay", 503, "every worker to refuse /pay after the failover")
    assert shop.hits() - hits_before == hits_after_failover, "a refused /pay reached the upstream"

    # -- every answer, during and after the failover: the demo's own 502 and 503, never a 500 --------------
    wrong = [
        a
        for a in shop.answers
        if a.status not in ALLOWED[a.path] and not (a.path == "/pay" and a.status == 200 and a.ended < asked)
    ]  # /pay answers 200 in the warm-up, before the upstream fails
    assert wrong == [], wrong[:10]

    # -- what the old master had of its own is gone once it resyncs from the new one ------------------------
    group.wait(lambda: group.link_up(old), 15, "the old master to sync from the new one")
    wait_until(
        lambda: numbers(old_master, stats_key, "rejected") == numbers(new_master, stats_key, "rejected"),
        timeout=15,
        what="the old master to hold the new master's counts",
    )


def until(condition: Callable[[], T | None], timeout: float, what: str) -> T:
    """wait_until for a condition whose value is wanted."""
    value = wait_until(condition, timeout=timeout, what=what)
    assert value is not None
    return value


def numbers(client: redis.Redis, key: str, *fields: str) -> list[int]:
    return [int(v or 0) for v in client.hmget(key, list(fields))]


def evalsha_calls(client: redis.Redis) -> int:
    """Breaker scripts run (FCALL and EVALSHA, refused ones included)."""
    commands = client.info("commandstats")
    return sum(
        int(commands.get(f"cmdstat_{name}", {}).get(key, 0))
        for name in ("evalsha", "fcall")
        for key in ("calls", "rejected_calls", "failed_calls")
    )


def measure(
    figures: dict[str, Any],
    shop: Shop,
    gunicorn: stack.Child,
    monitors: dict[int, Monitor],
    old: int,
    new: int,
    asked: float,
    promotion: Sample,
    still_master: Sample,
    demotion: Sample,
    since: Callable[[float], float],
) -> None:
    """The failover's figures: what was lost, what was answered from the local store.

    The cut is the first sample (every 25 ms) of the replica promoted: what the old
    master counts after it never reaches the new one. The old master's last sample
    as a master is at most 25 ms before its demotion.
    """
    cut = promotion.at
    lost: dict[str, dict[str, int]] = {}
    for name in BREAKERS:
        then, now = promotion.stats.get(name, {}), still_master.stats.get(name, {})
        lost[name] = {key: now.get(key, 0) - then.get(key, 0) for key in sorted(set(then) | set(now))}
    lines = switch_lines(gunicorn.output())
    windows: dict[int, list[tuple[float, float]]] = {}
    for at, pid, kind in lines:
        if kind in ("unavailable", "failed_again"):
            ends = [t for t, who, k in lines if who == pid and k == "back" and t > at]
            ends += monitors[new].scripts(pid, after=at)
            windows.setdefault(pid, []).append((at, min(ends, default=time.time())))
    local = Counter(
        a.path
        for a in shop.answers
        if a.path in BREAKER_PATHS and any(s <= a.ended and a.began <= e for s, e in windows.get(a.pid, []))
    )
    during = Counter(f"{a.path} {a.status}" for a in shop.answers if a.began >= asked)
    unresolved = sum(c.pid == 0 for m in monitors.values() for c in m.calls if c.command in BREAKER_SCRIPTS)
    figures |= {
        "scripts_on_old_master_after_cut": len(monitors[old].scripts(after=cut)),
        "scripts_on_old_master_after_demotion": len(monitors[old].scripts(after=demotion.at)),
        "scripts_on_new_master_before_demotion": len(monitors[new].scripts(before=still_master.at)),
        "outcomes_lost_on_old_master": lost,
        "answers_from_local_fallback": dict(local),
        "local_fallback_windows_s": {
            str(pid): [[since(s), since(e)] for s, e in spans] for pid, spans in windows.items()
        },
        "log_lines_s": [f"{since(at)} {pid} {kind}" for at, pid, kind in lines],
        "answers_from_failover_on": dict(sorted(during.items())),
        "monitor_drops_s": {str(port): [since(at) for at in m.drops] for port, m in monitors.items()},
        "script_calls_not_traced_to_a_worker": unresolved,
    }


def report(figures: dict[str, Any]) -> None:
    text = json.dumps(figures, indent=2, sort_keys=True)
    print(f"\nSentinel failover under gunicorn traffic:\n{text}")
    with contextlib.suppress(OSError):
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "sentinel-failover.json").write_text(text + "\n")
