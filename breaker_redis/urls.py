"""Storage URLs -> redis-py clients with timeouts suited to a breaker.

A breaker that waits 5 s on a dead Redis (redis-py's default) or retries ten
times has stopped protecting anything, so clients made here answer or fail in
well under a second and never retry: the store-health gate decides what
happens next.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

SOCKET_TIMEOUT = 0.25
CONNECT_TIMEOUT = 0.25
SCHEMES = ("redis", "rediss", "unix")


def client_from_url(url: str, **overrides: Any) -> redis.Redis:
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in SCHEMES:
        raise ValueError(f"unsupported Redis URL {url!r}: use one of {', '.join(s + '://' for s in SCHEMES)}")
    options: dict[str, Any] = {
        "socket_timeout": SOCKET_TIMEOUT,
        "socket_connect_timeout": CONNECT_TIMEOUT,
        "retry": Retry(NoBackoff(), 0),
        "retry_on_timeout": False,
    }
    options.update(overrides)
    return redis.Redis.from_url(url, **options)
