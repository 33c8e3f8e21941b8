"""The conftest.py of pybreaker's own suite when tests/compat/test_pybreaker.py runs
it against breaker_redis.compat.pybreaker (copied next to the suite as conftest.py).

It changes where the suite's Redis clients connect, never what a test does:

``COMPAT_REDIS_PORT`` is the port of the test session's redis-server, and:

- ``fakeredis.FakeStrictRedis()`` is a client of that server, so the suite's
  Redis classes run against a real redis-server (their tearDown's FLUSHALL
  empties it between tests);
- ``redis.Redis()`` without an address, in test_success_threshold_redis_storage
  (which wants a server on 6379 and skips without one), reaches it too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis

PORT = int(os.environ.get("COMPAT_REDIS_PORT") or 0)
_Redis = redis.Redis


class _SessionRedis(_Redis):
    """``redis.Redis()`` pointed at the session's server unless told otherwise."""

    def __init__(self, host: str = "127.0.0.1", port: int = PORT, *args: Any, **kwargs: Any) -> None:
        super().__init__(host, port, *args, **kwargs)


def _real_client(*args: Any, **kwargs: Any) -> redis.Redis:
    return _Redis(host="127.0.0.1", port=PORT)


@pytest.fixture(autouse=True)
def _where_redis_is(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if PORT and request.node.name == "test_success_threshold_redis_storage":
        monkeypatch.setattr(redis, "Redis", _SessionRedis)
    if PORT:
        monkeypatch.setattr(fakeredis, "FakeStrictRedis", _real_client)
    yield
