"""`breaker-redis doctor` and `flask breakers doctor`, each problem on a real
server started here: an evicting policy, a user without a permission, a
stopped server, a read-only replica, a proxy that delays what a subscriber
receives, and the Cluster and Sentinel topologies."""

from __future__ import annotations

import asyncio
import itertools
import re
import threading
import uuid
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner, Result
from flask import Flask

from breaker_redis import Breakers
from breaker_redis.flask import FlaskBreakers
from breaker_redis.ops import cli
from breaker_redis.ops.doctor import CHECKS, eviction_problem
from breaker_redis.ops.doctor.checkup import Checkup
from breaker_redis.ops.doctor.permissions import PROBE_MEMBER, tries
from breaker_redis.ops.doctor.timing import LATENCY_WARN_MS, ORDERING_ENOUGH_LATE, ORDERING_ROUNDS
from breaker_redis.storage import acl
from tests.support.acl import rules_of
from tests.support.redis_server import RedisServer
from tests.support.redis_waits import Waits, install
from tests.support.topologies import ClusterGroup, SentinelGroup, started

NAMES = [name for name, _ in CHECKS]
LINE = re.compile(r"^(OK|NOTE|WARN|SKIP|PROBLEM) +(\S+) +(.*)$")
_users = itertools.count()


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """A redis-server of this module's own: its config is the default, whatever other tests do."""
    made = RedisServer().start()
    yield made
    made.stop()


@pytest.fixture
def prefix() -> str:
    return "doc" + uuid.uuid4().hex[:8]


def doctor(url: str, prefix: str, *options: str) -> Result:
    return CliRunner().invoke(cli.main, ["--url", url, "--prefix", prefix, *options, "doctor"])


# Through the proxy below, which forwards from a thread of this test's process, a busy
# machine can hold a reply past the 0.5 s the doctor waits by default (a reach problem and
# no further checks); these tests are about the answers' order and delay, not timeouts.
HANG_ONLY = ("--timeout", "10")


def report(result: Result) -> dict[str, list[tuple[str, str]]]:
    """The check lines by check: [(status, text)]."""
    found: dict[str, list[tuple[str, str]]] = {}
    for line in result.stdout.splitlines():
        match = LINE.match(line)
        if match:
            found.setdefault(match[2], []).append((match[1], match[3]))
    return found


def statuses(result: Result) -> dict[str, list[str]]:
    return {check: [status for status, _ in lines] for check, lines in report(result).items()}


def only(result: Result, check: str) -> str:
    """The text of the one line of ``check``."""
    lines = report(result)[check]
    assert len(lines) == 1, lines
    return lines[0][1]


def problems(result: Result) -> list[str]:
    return [
        f"{check}: {text}"
        for check, lines in report(result).items()
        for status, text in lines
        if status == "PROBLEM"
    ]


def keys_under(client: redis.Redis, prefix: str) -> list[bytes]:
    return sorted(client.keys(f"{prefix}*"))


def with_breakers(url: str, prefix: str, *names: str) -> None:
    breakers = Breakers.from_url(url, prefix, listen=False, batch_successes=False)
    for name in names:
        breakers.get(name).call(lambda: "ok")
    breakers.close()


# -- pure parts --------------------------------------------------------------------


@pytest.mark.parametrize(
    "policy", ["noeviction", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"]
)
def test_policies_that_never_evict_a_key_without_a_ttl_are_fine(policy: str) -> None:
    assert eviction_problem(policy, 2 << 20) is None
    assert eviction_problem(policy, 0) is None


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
def test_an_allkeys_policy_with_a_limit_is_the_problem_and_says_what_to_do(policy: str) -> None:
    assert eviction_problem(policy, 0) is None  # maxmemory 0: no limit, nothing is ever evicted
    problem = eviction_problem(policy, 2 << 20)
    assert problem == (
        f"maxmemory-policy {policy} (maxmemory 2.0 MB) can evict a breaker's state, whose keys carry no "
        "TTL: an open breaker then reads closed again for every worker that did not know it open (those "
        "that did restore it); give the breakers a Redis whose maxmemory-policy is noeviction or "
        "volatile-* (a separate database is not enough: the policy is per server)"
    )


def test_the_permission_check_sends_every_command_breaker_redis_sends_itself() -> None:
    """The scripts' commands come from one run of lua/health.lua (test_acl keeps it complete)."""
    sent = [name for name, _ in tries(Checkup(redis.Redis(), "breaker", "nowhere"), [])]
    assert sorted(sent) == sorted(acl.CLIENT_COMMANDS)
    assert len(sent) == len(set(sent))


# -- one server ----------------------------------------------------------------------


@pytest.mark.processes
def test_a_healthy_server_passes_every_check_and_leaves_nothing_behind(
    server: RedisServer, prefix: str
) -> None:
    with_breakers(server.url, prefix, "pay", "search")
    client = server.client()
    before = keys_under(client, prefix)
    result = doctor(server.url, prefix)
    assert result.exit_code == 0, result.output
    assert statuses(result) == {name: ["OK"] for name in NAMES}, result.output
    version = client.info("server")["redis_version"]
    assert only(result, "server") == (
        f"Redis {version}: Redis Functions (FCALL) and sharded pub/sub (SPUBLISH) available"
    )
    assert only(result, "topology") == "standalone master, 0 replicas connected"
    assert (
        only(result, "memory")
        == "maxmemory-policy noeviction, maxmemory 0: no limit, nothing is ever evicted"
    )
    assert only(result, "permissions") == (
        f"user 'default': the {len(acl.required_commands())} commands breaker_redis sends are allowed, "
        f"on the keys {prefix}:* and the channels {prefix}:notices:0 and {prefix}:events"
    )
    assert only(result, "ordering") == (
        f"{ORDERING_ROUNDS} of {ORDERING_ROUNDS} messages were in the subscriber's socket when the "
        "publisher's next reply was answered; not relied on: every change waits for the workers' "
        "acknowledgements"
    )
    assert re.fullmatch(r"100 PINGs: median \d+\.\d\d ms, p99 \d+\.\d\d ms", only(result, "latency"))
    assert re.fullmatch(
        rf"2 breakers listed in {prefix}:names, 2 with a state; about [\d.]+ (bytes|KB) per breaker "
        r"\(MEMORY USAGE of the keys of 2\)",
        only(result, "keys"),
    )
    lines = result.stdout.splitlines()
    assert lines[0] == f"breaker-redis doctor: 127.0.0.1:{server.port}/0, prefix {prefix!r}, user 'default'"
    assert lines[-2] == f"least-privilege user for prefix {prefix!r}: {acl.setuser_line(prefix, 'breaker')}"
    assert lines[-1] == f"no problem found (7 checks: {', '.join(NAMES)})"
    assert len(lines) == 10
    assert keys_under(client, prefix) == before  # the health key gone, the names set as it was
    assert PROBE_MEMBER.encode() not in client.smembers(f"{prefix}:names")
    client.close()


@pytest.mark.processes
def test_allkeys_lru_is_the_one_problem_and_volatile_lru_none() -> None:
    evicting = RedisServer(extra=("--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru")).start()
    # 4 MB: a fresh Redis 7 uses about 0.9 MB, and the doctor's own commands make it
    # allocate about 1 MB more (a latency histogram per command, the EVAL script cache)
    volatile = RedisServer(extra=("--maxmemory", "4mb", "--maxmemory-policy", "volatile-lru")).start()
    try:
        result = doctor(evicting.url, "breaker")
        assert result.exit_code == 1, result.output
        assert problems(result) == [f"memory: {eviction_problem('allkeys-lru', 2 << 20)}"]
        assert result.stdout.splitlines()[-1] == f"1 problem found (7 checks: {', '.join(NAMES)})"

        result = doctor(volatile.url, "breaker")
        assert result.exit_code == 0, result.output
        assert re.fullmatch(
            r"maxmemory-policy volatile-lru, maxmemory 4\.0 MB, \d+% used: it evicts only keys with a TTL, "
            r"and the breakers' keys carry none",
            only(result, "memory"),
        )
        assert statuses(result) == {name: ["OK"] for name in NAMES}, result.output
    finally:
        evicting.stop()
        volatile.stop()


def test_a_database_the_server_lacks_is_named_in_one_line(redis_server) -> None:
    """A URL's /99 on a server with the default 16 databases: every command
    would fail with "DB index is out of range", which is the one thing to say."""
    url = str(redis_server.url).rsplit("/", 1)[0] + "/99"
    result = doctor(url, "breaker")
    assert result.exit_code == 1
    where = url.removeprefix("redis://")
    assert result.stdout == (
        f"PROBLEM  reach        database 99 does not exist on Redis at {where}: the server has fewer "
        "databases (its `databases` setting, 16 by default); fix the number at the end of the URL\n"
    )


@pytest.mark.processes
def test_a_stopped_server_is_one_line_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """At once: one connection attempt, refused, then nothing more is tried (counted, not
    timed: a busy machine stalls a thread for longer than a refused connect takes)."""
    stopped = RedisServer().start()
    stopped.stop()
    install(waits := Waits(), monkeypatch.setattr)
    result = doctor(stopped.url, "breaker")
    assert len(waits.connects) == 1 and waits.replies == 0
    assert result.exit_code == 1
    assert result.stdout.startswith(
        f"PROBLEM  reach        cannot reach Redis at 127.0.0.1:{stopped.port}/0 (Error 111 connecting to "
    )
    assert result.stdout.endswith("): is it running, and is the URL right?\n")
    assert len(result.stdout.splitlines()) == 1
    assert "Traceback" not in result.output


@pytest.mark.processes
def test_a_read_only_replica_is_a_problem_and_no_write_is_tried(prefix: str) -> None:
    master = RedisServer().start()
    replica = RedisServer(extra=("--replicaof", "127.0.0.1", str(master.port))).start()
    try:
        result = doctor(replica.url, prefix)
        assert result.exit_code == 1, result.output
        assert problems(result) == [
            f"topology: 127.0.0.1:{replica.port}/0 is a replica of 127.0.0.1:{master.port}: the breakers' "
            "scripts write, so a read-only replica refuses every one (each worker then decides alone, by "
            "on_store_error) and a writable one loses them at its next resync; point the URL at the "
            "master, or use redis+sentinel://"
        ]
        assert report(result)["permissions"][1] == ("NOTE", "the write commands were not tried on a replica")
    finally:
        replica.stop()
        master.stop()


# -- ACL users -------------------------------------------------------------------------


@pytest.fixture
def make_user(server: RedisServer) -> Iterator:
    """ACL users on this module's server, removed at teardown; returns (URL, user name)."""
    admin = server.client()
    made: list[str] = []

    def make(rules: str) -> tuple[str, str]:
        user = f"doctor-{next(_users)}"
        made.append(user)
        admin.execute_command("ACL", "SETUSER", user, "reset", *rules.split())
        return f"redis://{user}:secret@127.0.0.1:{server.port}/0", user

    yield make
    for user in made:
        admin.execute_command("ACL", "DELUSER", user)
    admin.close()


@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "evalsha"])
@pytest.mark.processes
def test_the_least_privilege_user_passes(
    make_user, server: RedisServer, prefix: str, functions: bool
) -> None:
    with_breakers(server.url, prefix, "pay")
    client = server.client()
    before = keys_under(client, prefix)
    url, user = make_user(rules_of(acl.setuser_line(prefix, functions=functions)))
    result = doctor(url, prefix)
    assert result.exit_code == 0, result.output
    expected = {name: ["OK"] for name in NAMES}
    if not functions:
        expected["permissions"] = ["OK", "NOTE"]
        assert report(result)["permissions"][1] == (
            "NOTE",
            (
                f"user {user!r} may not run the health script (FCALL), FUNCTION LOAD: the scripts run with "
                "EVALSHA, which runs the shared prelude (lua/_lib.lua) again on every call: about 4 us more "
                "Redis time per call (measured: record 14.7 -> 19.2 us, acquire 7.9 -> 12.0 us); ACL SETUSER "
                f"{user} +fcall +function|load allows it"
            ),
        )
    assert statuses(result) == expected, result.output
    assert report(result)["permissions"][0] == (
        "OK",
        (
            f"user {user!r}: the {len(acl.required_commands(functions))} commands breaker_redis sends are "
            f"allowed, on the keys {prefix}:* and the channels {prefix}:notices:0 and {prefix}:events"
        ),
    )
    assert only(result, "keys") == (
        f"1 breaker listed in {prefix}:names, 1 with a state; memory per breaker not measured: user "
        f"{user!r} may not run MEMORY USAGE"
    )
    assert result.stdout.splitlines()[-2] == (
        f"least-privilege user for prefix {prefix!r}: {acl.setuser_line(prefix, user)}"
    )
    assert keys_under(client, prefix) == before
    client.close()


@pytest.mark.parametrize(
    ("without", "add", "what", "refused", "skipped"),
    [
        ("+time", "", "the command time", "the health script (EVAL), TIME", None),
        (
            "~{p}:*",
            "~other:*",
            "the keys {p}:*",
            "the health script (EVALSHA, EVAL, FCALL), GET, EXISTS, DEL, LRANGE, HSET, PEXPIRE, PERSIST, "
            "HMGET, HGETALL, SMEMBERS, SRANDMEMBER, SADD, SREM",
            "keys",
        ),
        ("&{p}:*", "&other:*", "the channel {p}:*", "the health script (EVAL), SUBSCRIBE", "ordering"),
    ],
    ids=["time", "keys", "channel"],
)
@pytest.mark.processes
def test_a_missing_permission_is_one_problem_naming_the_rule(
    make_user,
    server: RedisServer,
    prefix: str,
    without: str,
    add: str,
    what: str,
    refused: str,
    skipped: str | None,
) -> None:
    admin = server.client()
    admin.function_flush()  # so FCALL answers "not found" and EVALSHA "no script" (the ACL let them in),
    admin.script_flush()  # and what a script may not do shows in EVAL alone
    admin.close()
    rule = without.format(p=prefix)
    url, user = make_user(rules_of(acl.setuser_line(prefix), without=rule, add=add))
    result = doctor(url, prefix)
    assert result.exit_code == 1, result.output
    assert problems(result) == [
        f"permissions: user {user!r} may not use {what.format(p=prefix)} (refused: {refused}): add it with "
        f"ACL SETUSER {user} {rule}"
    ]
    expected = {name: ["OK"] for name in NAMES}
    expected["permissions"] = ["PROBLEM"]
    if skipped:
        expected[skipped] = ["SKIP"]
    assert statuses(result) == expected, result.output


@pytest.mark.processes
def test_a_wrong_password_is_one_line(make_user, server: RedisServer) -> None:
    url, _ = make_user(rules_of(acl.setuser_line()))
    result = doctor(url.replace(":secret@", ":wrong@"), "breaker")
    assert result.exit_code == 1
    assert result.stdout == (
        f"PROBLEM  reach        Redis at 127.0.0.1:{server.port}/0 refused the login (invalid "
        "username-password pair or user is disabled.): check the user name and password in the URL\n"
    )


# -- ordering through a proxy ----------------------------------------------------------


class DelayingProxy:
    """A TCP proxy on loopback in front of one Redis: a connection that has sent
    SUBSCRIBE gets the server's bytes ``delay`` seconds late from then on; every
    other byte passes at once. What a worker's subscription meets behind a
    proxy or on a server whose I/O threads write a subscriber's message late."""

    def __init__(self, target_port: int, delay: float, everyone: bool = False) -> None:
        self.target_port, self.delay, self.everyone = target_port, delay, everyone  # everyone: every
        # connection's bytes late, as a Redis far from the workers
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._thread = threading.Thread(target=self.loop.run_forever, name="doctor-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    def __enter__(self) -> DelayingProxy:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self.loop
        )
        self._server = started.result(timeout=10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for writer in self._writers:
                writer.close()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [writer, up_writer]
        subscriber = False
        due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def to_server() -> None:
            nonlocal subscriber
            while data := await reader.read(65536):
                subscriber = subscriber or b"SUBSCRIBE" in data.upper()
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def from_server() -> None:
            while data := await up_reader.read(65536):
                late = subscriber or self.everyone
                due.put_nowait((self.loop.time() + (self.delay if late else 0.0), data))
            due.put_nowait((0.0, b""))

        async def to_client() -> None:
            while True:
                at, data = await due.get()
                if not data:
                    break
                await asyncio.sleep(max(0.0, at - self.loop.time()))
                writer.write(data)
                await writer.drain()
            writer.close()

        await asyncio.gather(to_server(), from_server(), to_client(), return_exceptions=True)


@pytest.mark.processes
def test_a_subscriber_served_late_is_measured_and_not_relied_on(server: RedisServer, prefix: str) -> None:
    """Messages that reach a subscriber after the publisher's next reply (a proxy here)
    were a problem while the boundary rested on that order; with acknowledged changes
    they are counted and the check passes."""
    direct = doctor(server.url, prefix)
    assert direct.exit_code == 0, direct.output
    assert only(direct, "ordering").startswith(f"{ORDERING_ROUNDS} of {ORDERING_ROUNDS} messages were in")
    with DelayingProxy(server.port, delay=0.02) as proxy:
        result = doctor(f"redis://127.0.0.1:{proxy.port}/0", prefix, *HANG_ONLY)
    line = only(result, "ordering")
    late, rounds = map(int, re.match(r"(\d+) of (\d+) messages", line).groups())
    # measured: the doctor stops at ORDERING_ENOUGH_LATE late ones, or earlier at its own
    # ORDERING_SECONDS deadline when a busy machine makes each 20 ms-late round slow
    assert 1 <= late <= ORDERING_ENOUGH_LATE and late <= rounds
    assert line.endswith(
        " messages reached the subscriber after the publisher's next reply was answered; not relied on: "
        "every change waits for the workers' acknowledgements"
    )
    assert statuses(result)["ordering"] == ["OK"]
    assert problems(result) == []


@pytest.mark.processes
def test_a_far_redis_is_a_latency_warning(server: RedisServer, prefix: str) -> None:
    """Every answer 5 ms late (the proxy): the median PING is above LATENCY_WARN_MS."""
    with DelayingProxy(server.port, delay=0.005, everyone=True) as proxy:
        result = doctor(f"redis://127.0.0.1:{proxy.port}/0", prefix, *HANG_ONLY)
    assert statuses(result)["latency"] == ["WARN"], result.output
    median = float(re.match(r"100 PINGs: median (\d+\.\d\d) ms", only(result, "latency"))[1])
    assert median >= 5.0
    assert only(result, "latency").endswith(
        f": above {LATENCY_WARN_MS:g} ms, and every armed outcome waits one round trip, every change a "
        "few; run Redis closer to the workers"
    )
    assert "warning" in result.stdout.splitlines()[-1]


# -- topologies -------------------------------------------------------------------------


def test_a_cluster_reports_its_masters_and_slots_and_every_master_s_policy(cluster: ClusterGroup) -> None:
    cluster.flushall()
    with_breakers(cluster.url, "breaker", "pay", "search", "ship")
    result = doctor(cluster.url, "breaker")
    assert result.exit_code == 0, result.output
    assert statuses(result) == {name: ["OK"] * (3 if name in ("memory", "ordering") else 1) for name in NAMES}
    assert only(result, "topology") == (
        "Redis Cluster: 3 masters, 0 replicas, all 16384 slots served (cluster_state ok); each worker "
        "subscribes once per master, on the breakers' sharded channels"
    )
    assert [text for _, text in report(result)["memory"]] == [
        f"127.0.0.1:{port}: maxmemory-policy noeviction, maxmemory 0: no limit, nothing is ever evicted"
        for port in sorted(cluster.ports)
    ]
    assert [text for _, text in report(result)["ordering"]] == [
        f"127.0.0.1:{port}: {ORDERING_ROUNDS} of {ORDERING_ROUNDS} messages were in the subscriber's socket "
        "when the publisher's next reply was answered; not relied on: every change waits for the "
        "workers' acknowledgements, except a change made while its cluster slot migrates"
        for port in sorted(cluster.ports)
    ]
    assert only(result, "server").endswith(
        "on 3 masters: Redis Functions and sharded pub/sub (SPUBLISH) available; on a cluster the scripts "
        "run with EVALSHA (redis-py would find FCALL's keys with an extra round trip)"
    )
    assert only(result, "keys").startswith("3 breakers listed in breaker:names, 3 with a state; about ")
    assert result.stdout.splitlines()[-2].endswith(acl.setuser_line("breaker", "breaker", functions=False))
    cluster.flushall()


@pytest.fixture(scope="module")
def sentinels() -> Iterator[SentinelGroup]:
    with started(SentinelGroup()) as group:
        yield group


@pytest.mark.processes
def test_sentinel_reports_the_master_it_found_and_the_sentinels(
    sentinels: SentinelGroup, prefix: str
) -> None:
    result = doctor(sentinels.url(), prefix)
    assert result.exit_code == 0, result.output
    assert statuses(result) == {name: ["OK"] for name in NAMES}, result.output
    assert only(result, "topology") == (
        f"Sentinel service 'breaker-test': master 127.0.0.1:{sentinels.master_port()}; 3 of 3 sentinels in "
        "the URL answer (they know 3, quorum 2, 1 replica)"
    )


# -- flask -------------------------------------------------------------------------------


@pytest.mark.processes
def test_flask_breakers_doctor_checks_the_apps_redis_and_prefix(server: RedisServer, prefix: str) -> None:
    app = Flask(__name__)
    app.config.update(BREAKER_REDIS_URL=server.url, BREAKER_KEY_PREFIX=prefix)
    FlaskBreakers(app)
    result = app.test_cli_runner().invoke(args=["breakers", "doctor"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == (
        f"breaker-redis doctor: 127.0.0.1:{server.port}/0, prefix {prefix!r}, user 'default'"
    )
