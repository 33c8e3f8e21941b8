from __future__ import annotations

import itertools
import multiprocessing.process
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest

from breaker_redis import Breakers
from breaker_redis.embedded import EmbeddedServer
from breaker_redis.urls import client_from_url
from demo_app import stack
from tests.support.jitter_proxy import Proxies
from tests.support.mp_workers import emptied_server_url
from tests.support.redis_server import RedisServer
from tests.support.topologies import ClusterGroup, started


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def no_subscriber_left(request: pytest.FixtureRequest) -> None:
    """A test of the session's redis-server starts with no subscription an earlier test
    left behind (tests/support/redis_server.py ``emptied`` says why); its data is its own business."""
    if "redis_server" in request.fixturenames:
        client = request.getfixturevalue("redis_server").client()
        try:
            client.client_kill_filter(_type="pubsub", skipme=True)
        finally:
            client.close()


@pytest.fixture(scope="session")
def cluster() -> Iterator[ClusterGroup]:
    """Three Redis Cluster masters (tests/support/topologies.py), started once per session."""
    with started(ClusterGroup()) as group:
        yield group


@pytest.fixture(scope="module")
def upstream_url() -> Iterator[str]:
    """The demo's flaky upstream (demo_app.upstream) in its own process."""
    url, child = stack.start_upstream()
    yield url
    child.stop()
    child.remove_log()


@pytest.fixture(scope="session")
def embedded() -> Iterator[EmbeddedServer]:
    """The embedded server (fakeredis over TCP with Redis's pub/sub ordering)."""
    server = EmbeddedServer("127.0.0.1", 0).start()  # port 0: the kernel picks a free one
    yield server
    server.stop()


@pytest.fixture
def jitter_proxies() -> Iterator[Proxies]:
    """Starts proxies that deliver each connection's replies late, subscriptions later
    (tests/support/jitter_proxy.py): ``jitter_proxies(port)``. Stopped at the test's end."""
    proxies = Proxies()
    yield proxies
    proxies.stop()


@pytest.fixture(params=["real", "embedded"])
def proxied_url(request: pytest.FixtureRequest, jitter_proxies: Proxies) -> str:
    """The URL of a proxy from ``jitter_proxies`` in front of the session's redis-server
    ('real') or embedded server ('embedded'), emptied (tests/support/mp_workers.py emptied_server_url)."""
    return emptied_server_url(request, through=jitter_proxies)


class Clock:
    """A test clock in milliseconds: scripts get it as now_ms, workers decide by it."""

    def __init__(self, start: int = 1_700_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@pytest.fixture
def clock() -> Clock:
    return Clock()


_prefixes = itertools.count()


STORES = ["fake", "real"]


def make_store(request: pytest.FixtureRequest) -> Any:
    """fakeredis[lua], the session's real redis-server or its Redis Cluster, emptied."""
    if request.param == "fake":
        return fakeredis.FakeRedis(server=fakeredis.FakeServer())
    if request.param == "cluster":
        group: ClusterGroup = request.getfixturevalue("cluster")
        group.flushall()
        return client_from_url(group.url).connected()
    client = request.getfixturevalue("redis_server").client()
    client.flushall()
    return client


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest):
    """A Redis client: fakeredis[lua] or the session's real redis-server, emptied.
    A module can widen it with its own ``store`` fixture over ``STORES + ["cluster"]``."""
    client = make_store(request)
    yield client
    client.close()


@pytest.fixture
def make_breakers(store, clock):
    """Breakers on the store with the test clock; closed at teardown."""
    made: list[Breakers] = []

    def make(**kwargs) -> Breakers:
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("listen", False)
        breakers = Breakers(store, **kwargs)
        made.append(breakers)
        return breakers

    yield make
    for breakers in made:
        breakers.close()


# -- the quick set (./dev test --quick, pytest -m quick) ---------------------------------------

# Fixtures that start a process (a redis-server, a cluster, the demo's upstream): a test that
# uses one, directly or through another fixture, is not quick.
PROCESS_FIXTURES = frozenset({"redis_server", "cluster", "upstream_url"})
# Parameters naming a store served by a process.
PROCESS_PARAMS = frozenset({"real", "cluster", "sentinel"})


# Markers of tests that start processes: `processes` says so; the others say which.
PROCESS_MARKERS = ("processes", "multiprocess", "real")


def starts_processes(item: pytest.Item) -> bool:
    if any(item.get_closest_marker(name) is not None for name in PROCESS_MARKERS):
        return True
    if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and any(
        isinstance(value, str) and value in PROCESS_PARAMS for value in callspec.params.values()
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark quick every test that starts no process of its own (fakeredis in this process,
    the embedded server's thread): the edit-test loop runs them alone."""
    for item in items:
        if not starts_processes(item):
            item.add_marker(pytest.mark.quick)


def pytest_configure(config: pytest.Config) -> None:
    """In the quick set a process started, by a test or by a fixture it uses, is an error
    naming the test, rather than a quick set that slowly grows slow: mark that test
    ``processes``."""
    if config.getoption("markexpr") != "quick":
        return

    def refuse(*args: Any, **kwargs: Any) -> Any:
        test = os.environ.get("PYTEST_CURRENT_TEST", "a test").split(" ")[0]
        raise AssertionError(
            f"{test} starts a process, so it is not in the quick set: "
            "mark it @pytest.mark.processes (tests/conftest.py)"
        )

    subprocess.Popen.__init__ = refuse
    os.fork = refuse
    multiprocessing.process.BaseProcess.start = refuse
