"""Redis topologies the test suite starts for itself, on free loopback ports:

- ``TLSServer``: one redis-server speaking only TLS (``--port 0 --tls-port P``,
  clients must show a certificate), with a CA, a server and a client
  certificate made here with the ``openssl`` command, and a second CA that
  signed nothing (a client trusting only it must fail);
- ``SentinelGroup``: a master, one replica and three sentinels (quorum 2,
  short timeouts);
- ``ClusterGroup``: three cluster masters joined with ``redis-cli --cluster create``,
  with a replica each when asked, behind a proxy each when asked (tests/support/jitter_proxy.py).

Each keeps its files (configs, certificates, logs) in a temp dir of its own and
removes it in ``stop()``; ``start()`` either returns a topology that answers
or stops what it started and raises ``RuntimeError`` with the log of whatever
did not come up. Every wait is a condition with a deadline. Each class is a
context manager (``with TLSServer() as tls: ...``).
"""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import redis

from breaker_redis.urls import no_retry
from tests.support.jitter_proxy import JitterProxy
from tests.support.redis_server import free_port, redis_server_binary, wait_until

T = TypeVar("T")
TopologyT = TypeVar("TopologyT", bound="Topology")
START_TIMEOUT = 15.0
HOST = "127.0.0.1"


def _binary(name: str) -> str:
    if name == "redis-server":
        return redis_server_binary()  # $BREAKER_REDIS_SERVER or PATH's
    path = shutil.which(name)
    if path is None:
        hint = (
            "it comes with the distribution's openssl package"
            if name == "openssl"
            else (
                "run the README's test command (.ci/run), which installs redis-server from the "
                "distribution's packages"
            )
        )
        raise RuntimeError(f"{name} is not installed; {hint}")
    return path


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_cluster_port() -> int:
    """A free port P whose cluster bus port P + 10000 is free too (so P <= 55535).

    Picked below the kernel's ephemeral range (32768 and up), where ports bound
    with port 0 come from, so P itself does not race with them.
    """
    for _ in range(200):
        port = random.randint(20000, 30000)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("found no free port P with P + 10000 free between 20000 and 30000")


class Process:
    """One child (redis-server, its sentinel mode), its output in a log file."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, cwd: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            self.argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self, last: int = 3000) -> str:
        with contextlib.suppress(OSError, ValueError):
            if not self._log.closed:
                self._log.flush()
            return self.log_path.read_text("utf-8", "replace")[-last:]
        return ""

    def check_alive(self) -> bool:
        if not self.alive():
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}; its log:\n{self.log()}")
        return True

    def kill(self) -> None:
        """SIGKILL: a crash (no shutdown, no last reply)."""
        if self.alive():
            self.process.kill()
            self.process.wait(5)
        self._log.close()

    def stop(self) -> None:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()


def _answers(client: redis.Redis, pid: int) -> bool:
    """Whether the server behind client answers and is our process (not another one on that port)."""
    try:
        return int(client.info("server")["process_id"]) == pid
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
        return False


def _start(
    name: str,
    folder: Path,
    pick_port: Callable[[], int],
    argv: Callable[[int], Sequence[str]],
    ready: Callable[[int, Process], bool],
    attempts: int = 4,
) -> tuple[int, Process]:
    """Start a child on a free port, again on another port if that one was taken meanwhile."""
    last_log = ""
    for _ in range(attempts):
        port = pick_port()
        child = Process(f"{name} on port {port}", argv(port), folder / f"{name}-{port}.log", folder)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if not child.alive():
                break
            if ready(port, child):
                return port, child
            time.sleep(0.01)
        exited = child.process.poll()
        last_log = child.log()
        child.stop()
        if "already in use" not in last_log and "Could not create server TCP" not in last_log:
            what = (
                f"exited with {exited}"
                if exited is not None
                else f"did not answer within {START_TIMEOUT:.0f}s"
            )
            raise RuntimeError(f"{name} on port {port} {what}; its log:\n{last_log}")
    raise RuntimeError(f"{name}: no free port after {attempts} attempts; last log:\n{last_log}")


def _server_argv(binary: str, folder: Path, *extra: str) -> list[str]:
    """A loopback-only redis-server that keeps nothing on disk."""
    quiet = f"--bind {HOST} --appendonly no --protected-mode no".split()
    return [binary, *quiet, "--save", "", "--dir", str(folder), *extra]


class Topology:
    """Shared life cycle: a temp dir, children, stop() on error and at the end."""

    kind = "topology"

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"breaker-redis-{self.kind}-"))
        self.children: list[Process] = []
        self.started_in: float | None = None
        self._clients: dict[tuple[int, float], redis.Redis] = {}

    def plain(self, port: int, timeout: float = 0.5) -> redis.Redis:
        """A plain client of one server on this host (kept, closed in stop())."""
        client = self._clients.get((port, timeout))
        if client is None:
            client = self._clients[port, timeout] = redis.Redis(
                host=HOST, port=port, socket_timeout=timeout, socket_connect_timeout=timeout, retry=no_retry()
            )
        return client

    def start(self: TopologyT) -> TopologyT:
        began = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began
        return self

    def _start(self) -> None:
        raise NotImplementedError

    def logs(self) -> str:
        return "\n".join(f"--- {child.name}\n{child.log(1500)}" for child in self.children)

    def wait(self, condition: Callable[[], T], timeout: float, what: str) -> T:
        """wait_until, with every child checked alive and the logs in the error."""

        def check() -> T:
            for child in self.children:
                child.check_alive()
            return condition()

        try:
            return wait_until(check, timeout=timeout, what=what)
        except TimeoutError as exc:
            raise RuntimeError(f"{self.kind}: {exc}; logs:\n{self.logs()}") from None

    def crash(self, child: Process) -> None:
        """SIGKILL one child; the topology no longer counts on it."""
        self.children.remove(child)
        child.kill()

    def stop(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        for child in reversed(self.children):
            child.stop()
        self.children.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self: TopologyT) -> TopologyT:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- TLS ---------------------------------------------------------------------------


class Certificates:
    """A CA, a server certificate (for 127.0.0.1 and localhost), a client
    certificate, and another CA that signed neither, made with openssl (EC P-256 keys)."""

    def __init__(self, folder: Path) -> None:
        self.dir = folder
        self.openssl = _binary("openssl")
        self.ca, self.ca_key = folder / "ca.crt", folder / "ca.key"
        self.server, self.server_key = folder / "server.crt", folder / "server.key"
        self.client, self.client_key = folder / "client.crt", folder / "client.key"
        self.other_ca, self.other_ca_key = folder / "other-ca.crt", folder / "other-ca.key"

    def make(self) -> Certificates:
        self._ca(self.ca, self.ca_key, "breaker-redis test CA")
        self._ca(self.other_ca, self.other_ca_key, "breaker-redis unrelated CA")
        self._signed(
            self.server,
            self.server_key,
            "localhost",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        )
        self._signed(
            self.client, self.client_key, "breaker-redis test client", "extendedKeyUsage=clientAuth\n"
        )
        return self

    def _run(self, *args: str) -> None:
        done = subprocess.run(
            [self.openssl, *args], cwd=self.dir, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"openssl {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-2000:]}")

    def _key(self, key: Path) -> None:
        self._run("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key))

    def _ca(self, cert: Path, key: Path, name: str) -> None:
        self._key(key)  # file names, relative to the folder openssl runs in
        self._run(
            *f"req -x509 -new -key {key.name} -sha256 -days 2 -out {cert.name}".split(),
            "-subj",
            f"/CN={name}",
        )

    def _signed(self, cert: Path, key: Path, name: str, extensions: str) -> None:
        self._key(key)
        csr, ext = cert.with_suffix(".csr"), cert.with_suffix(".ext")
        ext.write_text(extensions)
        self._run(*f"req -new -key {key.name} -out {csr.name}".split(), "-subj", f"/CN={name}")
        ca, ca_key = self.ca.name, self.ca_key.name
        self._run(
            *f"x509 -req -in {csr.name} -CA {ca} -CAkey {ca_key} -CAcreateserial -sha256 -days 2".split(),
            *f"-extfile {ext.name} -out {cert.name}".split(),
        )


class TLSServer(Topology):
    """redis-server with --port 0 --tls-port P, requiring a client certificate."""

    kind = "tls"

    def __init__(self) -> None:
        super().__init__()
        self.certs = Certificates(self.dir)
        self.port = 0

    def _start(self) -> None:
        binary = _binary("redis-server")
        self.certs.make()
        certs = self.certs

        def argv(port: int) -> list[str]:  # file names: redis-server runs in self.dir
            tls = f"--tls-cert-file {certs.server.name} --tls-key-file {certs.server_key.name} "
            tls += f"--tls-ca-cert-file {certs.ca.name} --tls-auth-clients yes"
            return _server_argv(binary, self.dir, "--port", "0", "--tls-port", str(port), *tls.split())

        def ready(port: int, child: Process) -> bool:
            self.port = port
            client = self.client(socket_timeout=0.5)
            try:
                return _answers(client, child.pid)
            finally:
                client.close()

        self.port, child = _start("redis-server-tls", self.dir, free_port, argv, ready)
        self.children.append(child)

    def tls_options(self, ca: Path | None = None, client_cert: bool = True) -> dict[str, Any]:
        options: dict[str, Any] = {"ssl_ca_certs": str(ca or self.certs.ca)}
        if client_cert:
            options |= {"ssl_certfile": str(self.certs.client), "ssl_keyfile": str(self.certs.client_key)}
        return options

    def url(self, ca: Path | None = None, client_cert: bool = True, db: int = 0) -> str:
        query = "&".join(f"{key}={value}" for key, value in self.tls_options(ca, client_cert).items())
        return f"rediss://{HOST}:{self.port}/{db}?{query}"

    def client(self, **kwargs: Any) -> redis.Redis:
        options: dict[str, Any] = {"ssl": True, "retry": no_retry(), **self.tls_options(), **kwargs}
        return redis.Redis(host=HOST, port=self.port, **options)


# -- Sentinel ----------------------------------------------------------------------


# The test's own reads of a sentinel wait this long: a sentinel writes its configuration to
# disk at each change of the failover, and on a busy machine a reply has taken over the 0.5 s
# the other plain clients wait (no test stops a sentinel, so only a hang would reach it).
SENTINEL_READ = 10.0


class SentinelGroup(Topology):
    """A master, a replica and three sentinels watching them as ``service``.

    Quorum 2, ``down-after-milliseconds`` 1000, ``failover-timeout`` 4000;
    diskless replication without delay so a (re)sync takes milliseconds.
    """

    kind = "sentinel"
    service = "breaker-test"
    quorum = 2

    def __init__(self, sentinels: int = 3) -> None:
        super().__init__()
        self.sentinel_count = sentinels
        self.data_ports: list[int] = []  # the first master, then the replica
        self.sentinel_ports: list[int] = []

    def _start(self) -> None:
        binary = _binary("redis-server")
        repl = ["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]
        master_port, master = _start(
            "master",
            self.dir,
            free_port,
            lambda port: _server_argv(binary, self.dir, "--port", str(port), *repl),
            lambda port, child: _answers(self.plain(port), child.pid),
        )
        self.children.append(master)
        self.data_ports.append(master_port)
        replica_port, replica = _start(
            "replica",
            self.dir,
            free_port,
            lambda port: _server_argv(
                binary, self.dir, "--port", str(port), *repl, "--replicaof", HOST, str(master_port)
            ),
            lambda port, child: _answers(self.plain(port), child.pid),
        )
        self.children.append(replica)
        self.data_ports.append(replica_port)
        self.wait(lambda: self.link_up(replica_port), 10, "the replica's link to the master")
        for index in range(self.sentinel_count):
            port, child = _start(
                f"sentinel{index}",
                self.dir,
                free_port,
                lambda port, index=index: [
                    binary,
                    str(self._sentinel_conf(index, port, master_port)),
                    "--sentinel",
                ],
                lambda port, child: _answers(self.plain(port), child.pid),
            )
            self.children.append(child)
            self.sentinel_ports.append(port)
        self.wait(self._sentinels_agree, 15, "every sentinel to see the master, the replica and the others")

    def _sentinel_conf(self, index: int, port: int, master_port: int) -> Path:
        path = self.dir / f"sentinel{index}-{port}.conf"
        path.write_text(
            f"port {port}\nbind {HOST}\nprotected-mode no\ndir {self.dir}\n"
            f"sentinel monitor {self.service} {HOST} {master_port} {self.quorum}\n"
            f"sentinel down-after-milliseconds {self.service} 1000\n"
            f"sentinel failover-timeout {self.service} 4000\n"
            f"sentinel parallel-syncs {self.service} 1\n"
        )
        return path

    def link_up(self, replica_port: int) -> bool:
        try:
            info = self.plain(replica_port).info("replication")
        except redis.exceptions.RedisError:
            return False
        return info.get("role") == "slave" and info.get("master_link_status") == "up"

    def _sentinels_agree(self) -> bool:
        for port in self.sentinel_ports:
            try:
                state = self.plain(port, SENTINEL_READ).sentinel_master(self.service)
            except redis.exceptions.RedisError:
                return False
            if (
                state.get("num-other-sentinels", 0) < self.sentinel_count - 1
                or state.get("num-slaves", 0) < 1
            ):
                return False
        return True

    def sentinel(self, index: int = 0) -> redis.Redis:
        return self.plain(self.sentinel_ports[index], SENTINEL_READ)

    def master_addresses(self) -> set[tuple[str, int]]:
        """The master's address as each sentinel reports it (one entry when they agree)."""
        found: set[tuple[str, int]] = set()
        for port in self.sentinel_ports:
            host, master_port = self.plain(port, SENTINEL_READ).sentinel_get_master_addr_by_name(self.service)
            found.add((host.decode() if isinstance(host, bytes) else str(host), int(master_port)))
        return found

    def master_port(self) -> int:
        """The master's port, as every sentinel reports it (they must agree)."""
        found = self.master_addresses()
        if len(found) != 1:
            raise RuntimeError(f"sentinels disagree on the master of {self.service}: {sorted(found)}")
        return next(iter(found))[1]

    def role(self, port: int) -> str:
        try:
            return str(self.plain(port).info("replication").get("role"))
        except redis.exceptions.RedisError:
            return "unreachable"

    def data(self, port: int, timeout: float = 0.5) -> redis.Redis:
        """A plain client of one data server (master or replica), not through the sentinels."""
        return self.plain(port, timeout)

    def replica_port(self) -> int:
        master = self.master_port()
        return next(port for port in self.data_ports if port != master)

    def _known_replica(self, port: int) -> bool:
        """Whether the first sentinel lists the server on port as a replica it can reach."""
        try:
            replicas = self.sentinel(0).sentinel_slaves(self.service)
        except redis.exceptions.RedisError:
            return False
        return any(int(r.get("port", 0)) == port and r.get("flags") == "slave" for r in replicas)

    def _ask_failover(self) -> bool:
        """SENTINEL FAILOVER; False while the sentinel finds no replica fit to promote yet."""
        try:
            answer = self.sentinel(0).execute_command("SENTINEL FAILOVER", self.service)
        except redis.exceptions.ResponseError as exc:
            if "NOGOODSLAVE" in str(exc) or "INPROG" in str(exc):
                return False
            raise
        if answer not in (True, b"OK", "OK"):
            raise RuntimeError(f"SENTINEL FAILOVER {self.service} answered {answer!r}")
        return True

    def failover(self, timeout: float = 15.0) -> tuple[int, int, float]:
        """SENTINEL FAILOVER, then wait until every sentinel names the promoted
        replica and it says it is a master: (old port, new port, seconds taken
        from the accepted SENTINEL FAILOVER)."""
        old, new = self.master_port(), self.replica_port()
        began = 0.0
        aborts = 0

        def ask() -> None:
            nonlocal began, aborts
            what = f"replica {new} in sync and known to the sentinels"
            self.wait(lambda: self.link_up(new) and self._known_replica(new), timeout, what)
            aborts = self._aborted_failovers()
            self.wait(self._ask_failover, timeout, f"SENTINEL FAILOVER {self.service} to be accepted")
            began = time.monotonic()

        def switched() -> bool:
            if self.master_addresses() == {(HOST, new)} and self.role(new) == "master":
                return True
            if self._aborted_failovers() > aborts:
                # The sentinel gave the failover up: on a busy machine another sentinel can
                # turn the promoted replica back into a replica before the leader's word
                # reaches it, and the promotion times out. Asked again once it is in sync.
                ask()
            return False

        ask()
        self.wait(switched, 3 * timeout, f"every sentinel to name {HOST}:{new} the master of {self.service}")
        return old, new, time.monotonic() - began

    def _aborted_failovers(self) -> int:
        """How many failovers the first sentinel (the one asked, so their leader) gave up."""
        first = next(child for child in self.children if child.name.startswith("sentinel0 "))
        return first.log(10**9).count("-failover-abort")

    def url(self, db: int = 0, scheme: str = "redis+sentinel") -> str:
        hosts = ",".join(f"{HOST}:{port}" for port in self.sentinel_ports)
        return f"{scheme}://{hosts}/{self.service}/{db}"


# -- Cluster ------------------------------------------------------------------------


class ClusterGroup(Topology):
    """Cluster masters (three by default) holding all 16384 slots, each with
    ``replicas`` replicas of its own (none by default: the quickest start).

    With replicas, ``start()`` returns once every replica is in sync with its
    master and every node's slot map names each master with its replicas, so
    that a ``CLUSTER FAILOVER`` or a dead master's automatic failover can
    happen at once. ``ports`` lists every node started (masters first, as
    ``redis-cli --cluster create`` takes them); a node killed with ``kill``
    stays listed there and in ``dead``.

    ``proxied``: a JitterProxy in front of every node (``proxies``, as ``ports``), each
    node announcing its proxy's port (``--cluster-announce-port``; its bus stays on the
    node's port + 10000), so that CLUSTER SLOTS, MOVED and ``url`` name the proxies and
    clients reach every node through its proxy. The group's own checks use the nodes'
    ports; CLUSTER NODES and CLUSTER SLOTS then name the proxies' (no replicas then)."""

    kind = "cluster"

    def __init__(
        self, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 3000, proxied: bool = False
    ) -> None:
        super().__init__()
        if replicas not in (0, 1):
            raise ValueError(f"replicas must be 0 or 1 (got {replicas!r})")
        if replicas and proxied:
            raise ValueError("a proxied cluster has no replicas (views() reads the nodes' ports)")
        self.proxied = proxied
        self.proxies: list[JitterProxy] = []  # the nodes', in the order of ports
        self.size = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.ports: list[int] = []
        self.dead: set[int] = set()
        self._child_of: dict[int, Process] = {}

    @property
    def node_count(self) -> int:
        return self.size * (1 + self.replicas)

    def _start(self) -> None:
        binary = _binary("redis-server")
        cli = _binary("redis-cli")
        repl = ["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]
        for index in range(self.node_count):
            node_dir = self.dir / f"node{index}"
            node_dir.mkdir()
            proxy = JitterProxy().start() if self.proxied else None
            if proxy is not None:
                self.proxies.append(proxy)

            def argv(port: int, node_dir: Path = node_dir, proxy: JitterProxy | None = proxy) -> list[str]:
                announce: list[str] = []
                if proxy is not None:  # the proxy connects to its target when a client connects
                    proxy.target_port = port
                    announce = [
                        *("--cluster-announce-ip", HOST, "--cluster-announce-port", str(proxy.port)),
                        *("--cluster-announce-bus-port", str(port + 10000)),
                    ]
                return _server_argv(
                    binary,
                    node_dir,
                    "--port",
                    str(port),
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    f"nodes-{port}.conf",
                    "--cluster-node-timeout",
                    str(self.node_timeout_ms),
                    *repl,
                    *announce,
                )

            port, child = _start(
                f"cluster-node{index}",
                node_dir,
                free_cluster_port,
                argv,
                lambda port, child: _answers(self.node(port), child.pid),
            )
            self.children.append(child)
            self.ports.append(port)
            self._child_of[port] = child
        create = subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"{HOST}:{port}" for port in self.ports),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if create.returncode != 0 or "[OK] All 16384 slots covered" not in create.stdout:
            raise RuntimeError(
                f"redis-cli --cluster create failed ({create.returncode}):\n{create.stdout[-2000:]}"
                f"\n{create.stderr[-2000:]}\n{self.logs()}"
            )
        self.wait(self._state_ok, 15, "cluster_state:ok on every node")
        if self.replicas:
            self.wait(self.replicas_ready, 30, "every replica in sync and known to every node")

    def node(self, port: int, timeout: float = 0.5) -> redis.Redis:
        return self.plain(port, timeout)

    def live_ports(self) -> list[int]:
        return [port for port in self.ports if port not in self.dead]

    def _state_ok(self) -> bool:
        for port in self.live_ports():
            try:
                info = self.node(port).cluster("info")
            except redis.exceptions.RedisError:
                return False
            known = int(info.get("cluster_known_nodes", 0))
            if info.get("cluster_state") != "ok" or known != self.node_count:
                return False
        return True

    def role(self, port: int) -> str:
        try:
            return str(self.node(port).info("replication").get("role"))
        except redis.exceptions.RedisError:
            return "unreachable"

    def masters(self) -> list[int]:
        """The live nodes that say they are masters."""
        return [port for port in self.live_ports() if self.role(port) == "master"]

    def slot_map(self, port: int) -> list[tuple[int, int, list[int]]]:
        """CLUSTER SLOTS as one node has it: (first slot, last slot, [master, *replicas] ports)."""
        return sorted(
            (int(start), int(end), [int(node[1]) for node in nodes])
            for start, end, *nodes in self.node(port).execute_command("CLUSTER SLOTS")
        )

    def _in_sync(self, replica: int) -> bool:
        try:
            info = self.node(replica).info("replication")
        except redis.exceptions.RedisError:
            return False
        return (
            info.get("role") == "slave"
            and info.get("master_link_status") == "up"
            and int(info.get("master_sync_in_progress", 1)) == 0
        )

    def views(self) -> list[dict[int, tuple[str, int | None]]]:
        """CLUSTER NODES as each live node has it: {port: (role, its master's port)}."""
        found = []
        for port in self.live_ports():
            nodes = self.node(port).cluster("nodes")
            port_of = {node["node_id"]: int(address.rsplit(":", 1)[1]) for address, node in nodes.items()}
            view: dict[int, tuple[str, int | None]] = {}
            for address, node in nodes.items():
                flags = set(node["flags"].split(","))
                role = "fail" if flags & {"fail", "fail?"} else "master" if "master" in flags else "replica"
                view[int(address.rsplit(":", 1)[1])] = (role, port_of.get(node["master_id"]))
            found.append(view)
        return found

    def replicas_ready(self) -> bool:
        """Every live node agrees on who replicates whom (no node flagged failing), each
        master has its replicas, and every replica is in sync."""
        try:
            views = self.views()
        except redis.exceptions.RedisError:
            return False
        if any(view != views[0] for view in views):
            return False
        masters = [port for port, (role, _) in views[0].items() if role == "master"]
        replicas = [(port, master) for port, (role, master) in views[0].items() if role == "replica"]
        return (
            len(masters) == self.size
            and all(sum(master == m for _, master in replicas) == self.replicas for m in masters)
            and all(self._in_sync(port) for port, _ in replicas)
        )

    def replica_of(self, master: int) -> int:
        """A replica of master, as the first live node knows them."""
        for port, (role, of) in self.views()[0].items():
            if role == "replica" and of == master:
                return port
        raise RuntimeError(f"the master on port {master} has no replica")

    def owners(self, slot: int) -> set[int]:
        """The master serving slot as each live node names it (one entry when they agree)."""
        found = set()
        for port in self.live_ports():
            try:
                ranges = self.slot_map(port)
            except redis.exceptions.RedisError:
                found.add(-1)
                continue
            found.update(nodes[0] for start, end, nodes in ranges if start <= slot <= end)
        return found

    def owner(self, slot: int) -> int:
        """The port of the master serving slot, from CLUSTER SLOTS."""
        for start, end, nodes in self.slot_map(self.live_ports()[0]):
            if start <= slot <= end:
                return nodes[0]
        raise RuntimeError(f"slot {slot} is not served")

    def failover(self, replica: int) -> None:
        """CLUSTER FAILOVER sent to replica: it takes over its master's slots once it has
        every write the master acknowledged (Redis coordinates that; no data is lost)."""
        self.wait(lambda: self._in_sync(replica), 15, f"the replica on port {replica} in sync")
        answer = self.node(replica).execute_command("CLUSTER", "FAILOVER")
        if answer not in (True, b"OK", "OK"):
            raise RuntimeError(f"CLUSTER FAILOVER on port {replica} answered {answer!r}")

    def promoted(self, port: int, slot: int) -> bool:
        """Whether port says it is a master and every live node names it the owner of slot."""
        return self.role(port) == "master" and self.owners(slot) == {port}

    def kill(self, port: int) -> None:
        """SIGKILL the node on port (a crash); it stays in ``ports``, and in ``dead``."""
        self.crash(self._child_of[port])
        self.dead.add(port)

    def flushall(self) -> None:
        for port in self.masters():
            self.node(port).flushall()

    def stop(self) -> None:
        super().stop()
        for proxy in self.proxies:
            proxy.stop()
        self.proxies.clear()

    @property
    def url(self) -> str:
        """The nodes', or with ``proxied`` their proxies' addresses."""
        ports = [proxy.port for proxy in self.proxies] if self.proxied else self.ports
        return "redis+cluster://" + ",".join(f"{HOST}:{port}" for port in ports)


@contextlib.contextmanager
def started(topology: TopologyT) -> Iterator[TopologyT]:
    """For fixtures: ``with started(SentinelGroup()) as group: yield group``."""
    topology.start()
    try:
        yield topology
    finally:
        topology.stop()
