"""Fixtures only the system tests use: the demo's upstream, and the proxies that reorder
what a server writes (tests/system/test_boundary_reordered.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from demo_app import stack
from tests.support.jitter_proxy import Proxies
from tests.support.mp_workers import Team, emptied_server_url


@pytest.fixture(scope="module")
def upstream_url() -> Iterator[str]:
    """The demo's flaky upstream (demo_app.upstream) in its own process."""
    url, child = stack.start_upstream()
    yield url
    child.stop()
    child.remove_log()


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


@pytest.fixture(params=["real", "embedded"])
def url(request: pytest.FixtureRequest) -> str:
    """The session's redis-server ('real') or embedded server ('embedded'), emptied: the
    process tests' server, unless a module has a ``url`` of its own."""
    return emptied_server_url(request)


@pytest.fixture
def team(url: str) -> Iterator[Team]:
    """Worker processes on ``url`` (tests/support/mp_workers.py), stopped at the test's end."""
    made = Team(url)
    yield made
    made.stop_all()
