"""The bearer-token check every admin and dashboard endpoint starts with, and
the JSON 503 they answer while Redis is down (admin.py's docstring says how
both behave). Its own module because both admin.py and dashboard.py use it,
and admin.py installs the dashboard: each imports it from here, neither the
other's (docs/design.md, section 1).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from typing import Any

import redis
from flask import Response, jsonify, request

from breaker_redis.storage.store import StoreUnavailable

REALM = "breaker_redis"
REDIS_DOWN = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, StoreUnavailable, OSError)
_UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, StoreUnavailable, OSError)
RETRY_SECONDS = 1  # the store gate probes Redis again within 2 s


def redis_down(exc: BaseException) -> Response:
    """The 503 an admin endpoint answers when Redis cannot be read or written."""
    cause = exc.__cause__ if isinstance(exc, StoreUnavailable) and exc.__cause__ else exc
    if isinstance(exc, _UNREACHABLE):
        error = f"Redis is unreachable: {cause}"
    else:
        error = f"Redis answered with an error: {cause}"
    response = jsonify(error=error)
    response.status_code = 503
    response.headers["Retry-After"] = str(RETRY_SECONDS)
    response.headers["Cache-Control"] = "no-store"
    return response


class Gate:
    """The bearer-token check every admin and dashboard endpoint starts with."""

    def __init__(self, token: str) -> None:
        # Digests have one length whatever the token's: the comparison tells nothing of it.
        self._digest = hashlib.sha256(token.encode()).digest()

    def given(self) -> str | None:
        """The token of the Authorization header; None when there is no bearer credential."""
        scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not credential.strip():
            return None
        return credential.strip()

    def authorized(self) -> bool:
        given = self.given()
        digest = hashlib.sha256((given or "").encode()).digest()
        return hmac.compare_digest(digest, self._digest) and given is not None

    def denied(self, body: Any = None) -> Response:
        """401 with the challenge RFC 6750 asks for (``invalid_token`` when one was given)."""
        challenge = f'Bearer realm="{REALM}"'
        if self.given() is not None:
            challenge += ', error="invalid_token"'
        response = body if isinstance(body, Response) else jsonify(error="unauthorized")
        response.status_code = 401
        response.headers["WWW-Authenticate"] = challenge
        response.headers["Cache-Control"] = "no-store"
        return response

    def guard(self, view: Callable[..., Any]) -> Callable[..., Any]:
        """The view behind the token; Redis down is the JSON 503, not a 500."""

        def guarded(*args: Any, **kwargs: Any) -> Any:
            if not self.authorized():
                return self.denied()
            try:
                return view(*args, **kwargs)
            except REDIS_DOWN as exc:
                return redis_down(exc)

        guarded.__name__ = view.__name__
        return guarded
