"""The stores a test runs on (the ``store`` fixture of tests/conftest.py, and modules that
widen it with their own over ``STORES + ["cluster"]``)."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest

from breaker_redis.urls import client_from_url
from tests.support.topologies import ClusterGroup

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
