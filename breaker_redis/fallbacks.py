"""What a protected route answers instead of failing: static, cached, function, chain.

The three usual ways to degrade instead of failing (a default value, the
last cached data, a simplified implementation) plus a chain that tries them
in order.
They are framework-neutral on purpose: a fallback produces either a
``FallbackResponse`` (status, headers, bytes) or, for ``function``, whatever
the framework's view could return; the integration (``breaker_redis.flask``)
turns that into its own response object and adds the header naming the
fallback that served it.

``cached`` keeps the last good response in Redis, next to the breaker's own
keys (``<prefix>:{NAME}:fallback:<sha1 of the request key>``, a HASH with
``status``, ``headers`` (JSON), ``body`` (raw bytes) and ``stored_at``), so a
response remembered by one worker can be served by every other worker. It is
stored as bytes and JSON, never pickled: a cache another process can write
must never be able to run code in this one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("breaker_redis")

# The header naming the fallback that served a response, in every integration.
FALLBACK_HEADER = "X-Breaker-Fallback"

# Headers never replayed from the cache: hop-by-hop, recomputed, or personal.
_NOT_STORED = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "date",
        "set-cookie",
        "age",
        "x-breaker-fallback",
    }
)


@dataclass(frozen=True)
class FallbackResponse:
    """A complete, framework-neutral response: what static and cached serve."""

    body: bytes
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()


@dataclass
class FallbackContext:
    """Everything a fallback may need to answer one request.

    ``cause`` is the BreakerOpen that refused the request, or the exception a
    failed call raised, or None when the call failed by its response (a 5xx).
    ``key`` identifies the request for the cache (method and path with query);
    ``store`` is the Redis client shared by every worker, ``store_healthy``
    says whether the store-health gate currently trusts it.
    """

    breaker: str
    cause: BaseException | None
    key: str
    method: str
    store: Any
    prefix: str
    store_healthy: bool = True
    request: Any = None


@dataclass(frozen=True)
class Served:
    """A fallback's answer: the response (or view return value) and who served it."""

    value: Any
    kind: str


class Fallback:
    """Base class. ``serve`` returns None when this fallback has nothing to give,
    so that a chain can go on to the next one; ``remember`` sees every
    successful response of the breaker (only ``cached`` keeps it)."""

    kind = "fallback"

    def serve(self, context: FallbackContext) -> Served | None:
        raise NotImplementedError

    def remember(self, context: FallbackContext, response: FallbackResponse) -> None:
        return None

    @property
    def remembers(self) -> bool:
        """Whether successful responses must be handed to remember() at all."""
        return False


def _encode_body(body: Any, content_type: str | None) -> tuple[bytes, str]:
    if isinstance(body, bytes):
        return body, content_type or "application/octet-stream"
    if isinstance(body, str):
        return body.encode("utf-8"), content_type or "text/plain; charset=utf-8"
    return json.dumps(body, ensure_ascii=False).encode("utf-8"), content_type or "application/json"


class Static(Fallback):
    """A fixed response, a default value: ``static({"items": []})``."""

    kind = "static"

    def __init__(
        self,
        body: Any = b"",
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> None:
        data, ctype = _encode_body(body, content_type)
        merged = {"Content-Type": ctype, **(headers or {})}
        self.response = FallbackResponse(data, int(status), tuple(merged.items()))

    def serve(self, context: FallbackContext) -> Served | None:
        return Served(self.response, self.kind)


class Function(Fallback):
    """A simplified implementation, called as ``fn(context)``.

    Its return value is anything a view may return. If it raises, it is
    logged and treated as "nothing to give", so a chain goes on: a degraded
    path must never make a bad moment worse.
    """

    kind = "function"

    def __init__(self, fn: Callable[[FallbackContext], Any]) -> None:
        if not callable(fn):
            raise TypeError("function() needs a callable")
        self.fn = fn

    def serve(self, context: FallbackContext) -> Served | None:
        try:
            value = self.fn(context)
        except Exception:
            log.exception("fallback function of breaker %r failed", context.breaker)
            return None
        if value is None:
            return None
        return Served(value, self.kind)


@dataclass
class _Throttle:
    """Per process: when each cache key was last written, so a busy route
    costs at most one extra Redis command per key per refresh period."""

    last: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def due(self, key: str, every: float) -> bool:
        now = time.monotonic()
        with self.lock:
            if now - self.last.get(key, -1e18) < every:
                return False
            if len(self.last) > 10_000:  # bounded: keys may contain query strings
                self.last.clear()
            self.last[key] = now
            return True


class Cached(Fallback):
    """The last good response of the same request, kept in Redis for ``ttl`` seconds.

    Only responses to ``methods`` (GET by default; HEAD reads GET's entry) with
    a status in ``statuses`` and a body of at most ``max_bytes`` are kept;
    ``Cache-Control: no-store`` or ``private`` responses never are. The entry
    is shared by every user: give ``key`` (request -> str) when a response
    depends on who asks. A served entry carries ``Age``.
    """

    kind = "cached"

    def __init__(
        self,
        ttl: float = 300.0,
        *,
        key: Callable[[Any], str] | None = None,
        methods: Iterable[str] = ("GET",),
        statuses: Iterable[int] = (200,),
        max_bytes: int = 1 << 20,
        refresh_seconds: float = 1.0,
    ) -> None:
        if not ttl > 0:
            raise ValueError(f"cached(ttl=...) must be > 0 (got {ttl!r})")
        self.ttl_ms = max(1, int(ttl * 1000))
        self.key = key
        self.methods = frozenset(m.upper() for m in methods)
        self.statuses = frozenset(int(s) for s in statuses)
        self.max_bytes = int(max_bytes)
        self.refresh_seconds = float(refresh_seconds)
        self._throttle = _Throttle()

    @property
    def remembers(self) -> bool:
        return True

    def redis_key(self, context: FallbackContext) -> str | None:
        method = "GET" if context.method == "HEAD" else context.method
        if method not in self.methods:
            return None
        request_key = context.key
        if self.key is not None and context.request is not None:
            request_key = f"{method} {self.key(context.request)}"
        digest = hashlib.sha1(request_key.encode("utf-8")).hexdigest()
        return f"{context.prefix}:{{{context.breaker}}}:fallback:{digest}"

    def remember(self, context: FallbackContext, response: FallbackResponse) -> None:
        key = self.redis_key(context)
        if key is None or context.store is None or not context.store_healthy:
            return
        if response.status not in self.statuses or len(response.body) > self.max_bytes:
            return
        headers = [(k, v) for k, v in response.headers if k.lower() not in _NOT_STORED]
        for name, value in headers:
            if name.lower() == "cache-control" and ("no-store" in value or "private" in value):
                return
        if not self._throttle.due(key, self.refresh_seconds):
            return
        try:
            pipe = context.store.pipeline(transaction=True)
            pipe.delete(key)
            pipe.hset(
                key,
                mapping={
                    "status": str(response.status),
                    "headers": json.dumps(headers),
                    "body": response.body,
                    "stored_at": str(int(time.time() * 1000)),
                },
            )
            pipe.pexpire(key, self.ttl_ms)
            pipe.execute()
        except Exception as exc:  # the cache is best effort; the response already succeeded
            log.warning("could not cache a response of breaker %r: %s", context.breaker, exc)

    def serve(self, context: FallbackContext) -> Served | None:
        key = self.redis_key(context)
        if key is None or context.store is None or not context.store_healthy:
            return None
        try:
            raw = context.store.hgetall(key)
        except Exception as exc:
            log.warning("could not read the cached fallback of %r: %s", context.breaker, exc)
            return None
        entry = {_text(k): v for k, v in (raw or {}).items()}
        try:
            status = int(_text(entry["status"]))
            headers = [(str(k), str(v)) for k, v in json.loads(_text(entry["headers"]))]
            body = entry["body"] if isinstance(entry["body"], bytes) else str(entry["body"]).encode()
            stored_at = int(_text(entry.get("stored_at", b"0")))
        except (KeyError, ValueError, TypeError):
            return None  # missing or not written by us: a miss, never an error
        if stored_at:
            age = max(0, int(time.time() - stored_at / 1000))
            headers.append(("Age", str(age)))
        return Served(FallbackResponse(body, status, tuple(headers)), self.kind)


class Chain(Fallback):
    """Try each fallback in turn; the first that has something wins."""

    kind = "chain"

    def __init__(self, *fallbacks: Fallback) -> None:
        if not fallbacks:
            raise ValueError("chain() needs at least one fallback")
        for item in fallbacks:
            if not isinstance(item, Fallback):
                raise TypeError(f"chain() takes fallbacks (got {type(item).__name__})")
        self.fallbacks = fallbacks

    @property
    def remembers(self) -> bool:
        return any(item.remembers for item in self.fallbacks)

    def serve(self, context: FallbackContext) -> Served | None:
        for item in self.fallbacks:
            served = item.serve(context)
            if served is not None:
                return served
        return None

    def remember(self, context: FallbackContext, response: FallbackResponse) -> None:
        for item in self.fallbacks:
            if item.remembers:
                item.remember(context, response)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def static(
    body: Any = b"",
    status: int = 200,
    headers: Mapping[str, str] | None = None,
    content_type: str | None = None,
) -> Static:
    """A fixed response: bytes as they are, str as text, anything else as JSON."""
    return Static(body, status, headers, content_type)


def cached(ttl: float = 300.0, **options: Any) -> Cached:
    """The last good response, shared by every worker through Redis (see Cached)."""
    return Cached(ttl, **options)


def function(fn: Callable[[FallbackContext], Any]) -> Function:
    """A simplified implementation: ``fn(context)`` returns what a view would."""
    return Function(fn)


def chain(*fallbacks: Fallback) -> Chain:
    """The first fallback that has an answer, e.g. ``chain(cached(), static(...))``."""
    return Chain(*fallbacks)


def as_fallback(value: Any) -> Fallback | None:
    """What ``protect(fallback=...)`` accepts: a Fallback, a callable (a function
    fallback), or None. Anything else is a static body."""
    if value is None or isinstance(value, Fallback):
        return value
    if callable(value):
        return Function(value)
    return Static(value)


__all__ = [
    "Cached",
    "Chain",
    "Fallback",
    "FallbackContext",
    "FallbackResponse",
    "Function",
    "Served",
    "Static",
    "as_fallback",
    "cached",
    "chain",
    "function",
    "static",
]
