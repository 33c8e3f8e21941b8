from __future__ import annotations

import itertools
import multiprocessing.process
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from breaker_redis import Breakers
from breaker_redis.embedded import EmbeddedServer
from tests.support.clock import Clock
from tests.support.redis_server import RedisServer
from tests.support.stores import STORES, make_store
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


@pytest.fixture(scope="session")
def embedded() -> Iterator[EmbeddedServer]:
    """The embedded server (fakeredis over TCP with Redis's pub/sub ordering)."""
    server = EmbeddedServer("127.0.0.1", 0).start()  # port 0: the kernel picks a free one
    yield server
    server.stop()


@pytest.fixture
def clock() -> Clock:
    return Clock()


_prefixes = itertools.count()


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
