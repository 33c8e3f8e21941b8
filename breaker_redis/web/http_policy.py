"""What every HTTP integration decides alike about a guarded request, whatever
its framework or protocol: the outcome of a response or of an exception, what
a route's ``classify`` is given, the cache key a fallback sees, how a
fallback's value becomes a response and how that response is marked, which
successful bodies are kept for a fallback to remember, and the log that stays
quiet.

The Flask extension (breaker_redis/flask/), the WSGI and ASGI middlewares,
the FastAPI dependency and the HTTP clients each keep only their protocol's
timing and I/O: when a response counts as started, how its status and
headers are read, how an answer is sent. A rule changed here changes for all
of them, so a deployment that mixes frameworks behaves as one. The routes
themselves (their options, the table, the guards one request shares) are
breaker_redis/web/routes.py; an admitted request's exchange, which asks
these rules, breaker_redis/web/exchange.py; what the two middlewares share,
breaker_redis/web/middleware.py. No web framework is imported here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, TypeVar
from wsgiref.headers import Headers

from breaker_redis import fallbacks
from breaker_redis.base.errors import BreakerOpen
from breaker_redis.engine.core import BreakerCore
from breaker_redis.fallbacks import FALLBACK_HEADER, FallbackContext, FallbackResponse, Static
from breaker_redis.web.refusal import BREAKER_HEADER, REASON_HEADER
from breaker_redis.web.routes import RequestGuards, RouteSpec

log = logging.getLogger("breaker_redis")
T = TypeVar("T")

OUTCOMES = ("success", "failure", "ignored")
# Never copied from a fallback's response: recomputed here, or hop-by-hop.
NOT_SERVED = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive"})
MARKERS = frozenset(h.lower() for h in (FALLBACK_HEADER, BREAKER_HEADER, REASON_HEADER))


# -- judging ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResponseInfo:
    """What a route's ``classify`` sees of a response: the status and headers,
    never the body (it may be a stream nobody has read yet).

    ``status_code`` and ``headers.get(name)`` (case-insensitive) read as on a
    Flask response, so one classifier can serve every integration. Each
    middleware adds the request under its protocol's name
    (breaker_redis.wsgi.ResponseInfo ``environ``, breaker_redis.asgi.ResponseInfo
    ``scope``), as its users know it.
    """

    status_code: int
    status: str
    headers: Headers


def judge(
    spec: RouteSpec,
    code: int,
    subject: T,
    info: Callable[[T], Any] | None,
    warn: Callable[[str, str], None],
    guards: RequestGuards | None = None,
) -> str:
    """success, failure or ignored for a response: ignored when a guard of
    another breaker inside refused the request (noted in ``guards``, the
    request's RequestGuards; this route's service was not asked), else the
    route's classify(),
    else its status lists (5xx a failure by default). classify() is given
    ``info(subject)``, built only when there is a classify (a ResponseInfo
    from a middleware's exchange), or without ``info`` the subject itself (a
    Flask or an HTTP client's response): nothing is allocated per response
    for it. A classifier that raises or answers nonsense counts a failure,
    and ``warn(name, message)`` says so."""
    if guards is not None and guards.refused is not None:
        return "ignored"
    if spec.classify is not None:
        try:
            verdict = spec.classify(subject if info is None else info(subject))
            if verdict is True:
                return "failure"
            if verdict is False:
                return "success"
            if isinstance(verdict, str) and verdict in OUTCOMES:
                return verdict
            if verdict is not None:
                raise ValueError(f"classify() of breaker {spec.name!r} returned {verdict!r}")
        except Exception:
            warn(spec.name, "classify() of breaker %r raised; counted as a failure")
            return "failure"
    if code in spec.ignore_statuses:
        return "ignored"
    if code in spec.failure_statuses:
        return "failure"
    return "success"


def judge_exception(breaker: BreakerCore[Any], exc: BaseException, guards: RequestGuards | None) -> str:
    """failure or ignored for an exception that ended a guarded request before
    its response: ignored when a breaker refused (an outbound ``BreakerOpen``,
    or a guard of another breaker inside: the service was not asked), else as
    the breaker's config classifies it (a cancellation or an exit: ignored;
    a predicate that raises: failure, logged by the breaker)."""
    if isinstance(exc, BreakerOpen) or (guards is not None and guards.refused is not None):
        return "ignored"
    return breaker.classify(exc)


def status_line(code: int) -> str:
    try:
        return f"{code} {HTTPStatus(code).phrase}"
    except ValueError:
        return f"{code} Unknown"


# -- fallbacks ----------------------------------------------------------------------------------


def fallback_context(
    breakers: Any,
    name: str,
    cause: BaseException | None,
    *,
    method: str,
    path: str,
    query: str,
    request: Any,
    store: Any = None,
) -> FallbackContext:
    """The request as a fallback sees it. The cache key is ``"METHOD path?query"``
    with HEAD sharing GET's, the same in every integration, so a response one
    worker's framework cached serves another's; ``request`` is the framework's
    own (what ``cached(key=...)`` is given); ``store`` defaults to the
    Breakers' client."""
    method = method.upper()
    key_method = "GET" if method == "HEAD" else method
    return FallbackContext(
        breaker=name,
        cause=cause,
        key=f"{key_method} {path}{'?' + query if query else ''}",
        method=method,
        store=breakers.client if store is None else store,
        prefix=breakers.prefix,
        store_healthy=breakers.store_healthy,
        request=request,
    )


def as_response(value: Any) -> FallbackResponse | Callable[..., Any]:
    """What a function fallback returned, as a complete response, or an app of
    the integration's protocol for it to run (any other callable).

    A FallbackResponse as it is; ``(body, status)`` or ``(body, status,
    headers)``; a framework's response object as read_response reads it; any
    other value is a body as ``static()`` takes it (bytes, str as text,
    anything else as JSON).
    """
    if isinstance(value, FallbackResponse):
        return value
    if isinstance(value, tuple) and len(value) in (2, 3):
        body, status, *rest = value
        headers = rest[0] if rest else None
        if headers is not None and not isinstance(headers, Mapping):
            headers = dict(headers)
        return Static(body, int(status), headers).response
    response = read_response(value)
    if response is not None:
        return response
    if callable(value):
        return value  # type: ignore[no-any-return]
    return Static(value).response


def read_response(value: Any) -> FallbackResponse | None:
    """A framework's complete response object as a FallbackResponse, or None: an
    int ``status_code`` and a bytes body, ``content`` (a Django HttpResponse)
    or ``body`` (a Starlette Response), with its ``raw_headers``, ``items()``
    or ``headers.items()``. A streaming one has neither body: it is an app of
    its protocol, which the integration runs on the request."""
    status = getattr(value, "status_code", None)
    body = getattr(value, "content", None)
    if not isinstance(body, (bytes, bytearray, memoryview)):
        body = getattr(value, "body", None)
    if not isinstance(status, int) or not isinstance(body, (bytes, bytearray, memoryview)):
        return None
    raw = getattr(value, "raw_headers", None)
    items = getattr(value, "items", None) or getattr(getattr(value, "headers", None), "items", None)
    if raw is not None:
        headers = decode_headers(raw)
    else:
        headers = [(str(k), str(v)) for k, v in items()] if callable(items) else []
    return FallbackResponse(bytes(body), status, tuple(headers))


def decode_headers(raw: Iterable[Any]) -> list[tuple[str, str]]:
    """ASGI's header pairs (bytes) as str pairs."""
    return [(bytes(k).decode("latin-1"), bytes(v).decode("latin-1")) for k, v in raw]


def fallback_marks(name: str, kind: str, cause: BaseException | None) -> list[tuple[str, str]]:
    """The headers that say a fallback answered: which kind, for which breaker,
    and why the breaker refused (when it did), as the Flask extension marks it."""
    marks = [(FALLBACK_HEADER, kind), (BREAKER_HEADER, name)]
    if isinstance(cause, BreakerOpen):
        marks.append((REASON_HEADER, cause.reason))
    return marks


def served_headers(response: FallbackResponse, marks: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A fallback's response headers as sent: its own, less what is recomputed,
    hop-by-hop or a mark of ours, then its Content-Length and ``marks``."""
    headers = [
        (str(k), str(v))
        for k, v in response.headers
        if k.lower() not in NOT_SERVED and k.lower() not in MARKERS
    ]
    headers += [("Content-Length", str(len(response.body))), *marks]
    return headers


def remember_limit(fallback: fallbacks.Fallback) -> int:
    """The most body bytes worth keeping for ``fallback.remember`` (0: none)."""
    if isinstance(fallback, fallbacks.Cached):
        return fallback.max_bytes
    if isinstance(fallback, fallbacks.Chain):
        return max((remember_limit(item) for item in fallback.fallbacks), default=0)
    return 1 << 20 if fallback.remembers else 0


# -- the log that stays quiet ------------------------------------------------------------------


class Warnings:
    """Log with traceback at most once a minute per breaker and message: a broken
    fallback or classifier would otherwise log on every request. At most
    ``CAP`` pairs are remembered (then forgotten at once), so breakers named
    after hosts or tenants cannot grow it without end; ``clock`` is for tests."""

    CAP = 10_000
    EVERY = 60.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def warn(self, name: str, message: str, *, traceback: bool = True) -> None:
        """Log ``message % name`` unless it was logged within EVERY seconds; with the
        traceback of the exception being handled, or (``traceback=False``, outside
        an ``except``) as a plain warning."""
        key = f"{name}:{message}"
        now = self._clock()
        with self._lock:
            if now - self._last.get(key, -1e18) < self.EVERY:
                return
            if len(self._last) > self.CAP:
                self._last.clear()
            self._last[key] = now
        if traceback:
            log.exception(message, name)
        else:
            log.warning(message, name)
