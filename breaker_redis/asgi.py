"""BreakerMiddleware: breakers in front of any ASGI app (Starlette, FastAPI, Quart, a bare callable).

::

    from breaker_redis.asyncio import Breakers
    from breaker_redis.asgi import BreakerMiddleware

    breakers = Breakers.from_url("redis://127.0.0.1:6379/0")
    app.add_middleware(BreakerMiddleware, breakers=breakers, routes={"/pay": "pay"})   # Starlette/FastAPI
    app = BreakerMiddleware(app, breakers, routes={"/pay": "pay"})                     # any ASGI app

The ASGI twin of ``breaker_redis.wsgi``: the same routes and options, the
same 503 and the same fallbacks. What the two decide alike is
breaker_redis/web/middleware.py and web/exchange.py (ASGI's reading and
writing: web/protocols.py); this module is ASGI's timing. It
imports no web framework. Only ``http`` requests are guarded; ``lifespan``
and ``websocket`` scopes go to the app untouched.

When the outcome is recorded. The app's ``http.response.start`` names the
status; the middleware classifies it and records the outcome *before*
passing the message on, so a client that has the status of the call that
tripped the breaker finds every worker refusing already (docs/boundary.md).
A cancellation (a server or an ``anyio`` cancel scope giving up on the
request) and an app that returns without starting a response record it as
ignored. Acquiring and recording run to their end even when the request is
cancelled (breaker_redis.asyncio does it), so a request cancelled while its
script is in flight still settles what the script took.

``cached()`` reads and writes Redis with a *blocking* client (shared with
the Flask and WSGI integrations, so one cache entry serves them all); here
it runs in a thread (``asyncio.to_thread``) on the blocking client given as
``cache_client``, and a route with ``cached()`` and no ``cache_client`` is
an error at start-up. ``static()`` and ``function()`` (sync or async) run
on the loop.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from wsgiref.headers import Headers

from breaker_redis import fallbacks
from breaker_redis.asyncio import Breaker, Breakers
from breaker_redis.base.errors import BreakerOpen
from breaker_redis.web import http_policy, pipeline, protocols
from breaker_redis.web import middleware as shared
from breaker_redis.web import routes as web_routes
from breaker_redis.web.exchange import (
    FALLBACK,
    FALLBACK_ANSWERED,
    FALLBACK_FAILED,
    REFUSED,
    UNREMEMBERED,
    Exchange,
)
from breaker_redis.web.http_policy import as_response, decode_headers, fallback_marks, judge, served_headers
from breaker_redis.web.protocols import (
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    encode_header,
    nothing,
    refusal_messages,
    run_marked,
)
from breaker_redis.web.protocols import scope_path as request_path
from breaker_redis.web.refusal import Refusal, header_value
from breaker_redis.web.routes import (
    DEFAULT_FAILURE_STATUSES,
    ROUTE_OPTIONS,
    RouteSpec,
    parse_routes,
    prefix_matches,
)

FALLBACK_HEADER = fallbacks.FALLBACK_HEADER

__all__ = [
    "DEFAULT_FAILURE_STATUSES",
    "FALLBACK_HEADER",
    "ROUTE_OPTIONS",
    "BreakerMiddleware",
    "ResponseInfo",
    "RouteSpec",
    "header_value",
    "judge_status",
    "parse_routes",
    "prefix_matches",
    "refusal_messages",
]


@dataclass(frozen=True)
class ResponseInfo(http_policy.ResponseInfo):
    """What a route's ``classify`` sees of the app's response: the status and
    headers of ``http.response.start`` (breaker_redis.web.http_policy.ResponseInfo)
    and the ASGI ``scope``."""

    scope: Scope


def judge_status(
    spec: RouteSpec,
    code: int,
    headers: Iterable[tuple[str, str]],
    scope: Scope,
    warn: Callable[[str, str], None],
) -> str:
    """success, failure or ignored, from a status and headers (str pairs), by
    http_policy.judge: ignored when a guard inside refused the request, else
    the route's classify() given an ASGI ResponseInfo, else its status lists."""

    def info(seen: Iterable[tuple[str, str]]) -> ResponseInfo:
        pairs = Headers([(str(k), str(v)) for k, v in seen])
        return ResponseInfo(code, http_policy.status_line(code), pairs, scope)

    return judge(spec, code, headers, info, warn, web_routes.request_guards(scope))


def _needs_blocking_store(fallback: fallbacks.Fallback | None) -> bool:
    if isinstance(fallback, fallbacks.Chain):
        return any(_needs_blocking_store(item) for item in fallback.fallbacks)
    return isinstance(fallback, fallbacks.Cached)


class BreakerMiddleware(shared.Middleware[Breaker, Scope]):
    """Circuit breakers in front of any ASGI app, by path prefix.

    ``app``: the ASGI app. ``breakers``: a ``breaker_redis.asyncio.Breakers``
    (built without I/O, so at import time, before gunicorn forks its uvicorn
    workers). ``routes``: as every middleware takes them
    (breaker_redis.web.middleware.Middleware). ``cache_client``: a *blocking*
    redis client for ``cached()`` fallbacks
    (``breaker_redis.urls.client_from_url(url)``), used from a thread.
    """

    breakers: Breakers

    def __init__(
        self,
        app: ASGIApp,
        breakers: Breakers,
        routes: Mapping[str, Any] | None = None,
        *,
        cache_client: Any = None,
    ) -> None:
        if not callable(app):
            raise TypeError(f"BreakerMiddleware needs an ASGI app (got {app!r})")
        if not isinstance(breakers, Breakers):
            raise TypeError(
                "breakers must be a breaker_redis.asyncio.Breakers (got "
                f"{type(breakers).__module__}.{type(breakers).__name__}); a sync Breakers "
                "would block the event loop"
            )
        super().__init__(breakers, routes)
        self.app = app
        self.cache_client = cache_client
        self._entry = self._table.entry  # see __call__
        for prefix, spec in self.routes:
            if cache_client is None and _needs_blocking_store(spec.fallback):
                raise ValueError(
                    f"routes[{prefix!r}]: cached() reads and writes Redis with a blocking client, "
                    "which must not run on the event loop; give BreakerMiddleware(cache_client="
                    "breaker_redis.urls.client_from_url(url)): it is used from a thread"
                )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)  # lifespan, websocket: untouched
            return
        path = scope.get("path")
        # A path (under no root_path) that starts with no route's stem is
        # unprotected, decided on sight; any other is matched the long way.
        if (
            type(path) is not str or path[:1] != "/" or scope.get("root_path") or path.startswith(self._entry)
        ) and await self._guard(scope, receive, send):
            return
        # Unprotected: the app's own answer, except that an outbound refusal escaping it becomes the 503.
        started = False

        def watch(message: Message) -> Awaitable[None]:
            # not a coroutine of its own: the app awaits the server's send directly
            nonlocal started
            if message.get("type") == "http.response.start":
                started = True
            return send(message)

        try:
            await self.app(scope, receive, watch)
        except BreakerOpen as refused:
            if started:
                raise
            await self.send_refusal(self.refusal(refused, scope, None), scope, send)

    async def _guard(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """A request a route covers, admitted or refused; False: it goes through unprotected
        (no route after all, OPTIONS, an outer guard of the same breaker, a bug)."""
        route = web_routes.route_to_ask(
            self._table.match(request_path(scope)), scope.get("method", "GET"), scope
        )
        if route is None:
            return False
        scope = dict(scope)  # ASGI: a middleware that adds to the scope passes on a copy
        try:
            permit, guards = await pipeline.admit_async(route.breaker, self.warn, scope, route.guard)
        except BreakerOpen as refused:
            if not await self.send_fallback(route.spec, scope, receive, send, refused):
                await self.send_refusal(self.refusal(refused, scope, route.spec), scope, send)
            return True
        if permit is None or guards is None:
            return False
        exchange = _Exchange().begin(route.spec, route.breaker, permit, guards, scope, self.warn)
        await exchange.run(self, receive, send)
        return True

    # -- the request, read; what the middleware answers itself ------------------------------

    read = protocols.SCOPE

    async def send_refusal(self, refusal: Refusal, scope: Scope, send: Send) -> None:
        for message in refusal_messages(refusal, head=self.is_head(scope)):
            await send(message)

    async def serve(
        self, fallback: fallbacks.Fallback, name: str, scope: Scope, cause: BaseException | None
    ) -> fallbacks.Served | None:
        """A fallback's answer, without blocking the loop: static as it is, a
        function on the loop (awaited if it returns an awaitable; ``context.store``
        is the Breakers' asyncio client), cached in a thread on ``cache_client``,
        a chain item by item, any other Fallback subclass in a thread."""
        if isinstance(fallback, fallbacks.Chain):
            for item in fallback.fallbacks:
                served = await self.serve(item, name, scope, cause)
                if served is not None:
                    return served
            return None
        if isinstance(fallback, fallbacks.Static):
            return fallback.serve(self.fallback_context(name, scope, cause, self.breakers.client))
        if isinstance(fallback, fallbacks.Function):
            try:
                value = fallback.fn(self.fallback_context(name, scope, cause, self.breakers.client))
                if inspect.isawaitable(value):
                    value = await value
            except Exception:
                self.warn(name, "the fallback function of breaker %r failed")
                return None
            return None if value is None else fallbacks.Served(value, fallback.kind)
        context = self.fallback_context(name, scope, cause, self.cache_client)
        return await asyncio.to_thread(fallback.serve, context)

    async def send_fallback(
        self, spec: RouteSpec, scope: Scope, receive: Receive, send: Send, cause: BaseException | None
    ) -> bool:
        """Send the route's fallback, marked as the Flask extension marks it (an
        ASGI app it gave run on the request). False when there is none, it has
        nothing to give, or it failed (a broken fallback must not become a 500)."""
        if spec.fallback is None:
            return False
        try:
            served = await self.serve(spec.fallback, spec.name, scope, cause)
            if served is None:
                return False
            response = as_response(served.value)
        except Exception:
            self.warn(spec.name, FALLBACK_FAILED)
            return False
        marks = fallback_marks(spec.name, served.kind, cause)
        if not isinstance(response, fallbacks.FallbackResponse):
            await run_marked(response, marks, scope, receive, send)
            return True
        headers = [encode_header(k, v) for k, v in served_headers(response, marks)]
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if self.is_head(scope) else response.body})
        return True

    async def remember(self, spec: RouteSpec, scope: Scope, response: fallbacks.FallbackResponse) -> None:
        """Hand a successful response to the route's fallback (cached keeps it), in a thread."""
        if spec.fallback is None:
            return
        context = self.fallback_context(spec.name, scope, None, self.cache_client)
        try:
            await asyncio.to_thread(spec.fallback.remember, context, response)
        except Exception:
            self.warn(spec.name, UNREMEMBERED)


class _Exchange(Exchange):
    """The ASGI part of an admitted request's exchange (web/exchange.py), from the
    app's call to the end of its body.

    The app's ``http.response.start`` is classified and recorded before it
    goes to the server (see the module docstring); a failed response may be
    replaced by the route's fallback, and a successful one kept for it.
    """

    __slots__ = ("ended", "middleware", "receive", "server")

    info = ResponseInfo

    async def run(self, middleware: BreakerMiddleware, receive: Receive, server: Send) -> None:
        self.middleware = middleware
        self.receive = receive
        self.server = server  # the server's send
        self.ended = False  # the last body message of a kept body went to the server
        try:
            await middleware.app(self.request, receive, self.send)
        except BaseException as exc:
            if not await self.failed(exc):
                raise
            return
        if not self.permit.recorded:
            # The app returned without starting a response (it saw the client
            # leave, or it is broken and the server answers 500): nothing is
            # known of the service. Hand the permit back.
            await self.settle_async("ignored")
        if self.ended:
            response = self.kept_response()
            if response is not None:
                await middleware.remember(self.spec, self.request, response)

    # -- the app's side of ASGI --------------------------------------------------------------

    def send(self, message: Message) -> Awaitable[None]:
        """What the app awaits: the start message's handling, a message ignored,
        or else the server's own send (no coroutine of ours per body message)."""
        if self.replaced:
            return nothing()  # a fallback answered: the app's messages go nowhere
        kind = message.get("type")
        if kind == "http.response.start" and not self.committed:
            return self.start(message)
        if kind == "http.response.body" and self.kept is not None:
            self.keep(bytes(message.get("body") or b""))
            if not message.get("more_body", False):
                self.ended = True
        return self.server(message)

    async def start(self, message: Message) -> None:
        """The response starts: decide by its status, record, then pass it on
        (or the route's fallback for a failure)."""
        self.status = code = int(message["status"])
        self.headers = message.get("headers") or ()
        spec = self.spec
        outcome = self.judged(code, self)
        await pipeline.settle_async(self.permit, outcome, self.warn, spec.name)  # one frame less
        if spec.fallback is not None and self.answers(outcome, self.middleware.is_head(self.request)):
            self.replaced = True  # the app may send body messages while the fallback is served
            if await self.middleware.send_fallback(spec, self.request, self.receive, self.server, None):
                self.committed = True
                return
            self.replaced = False
        self.committed = True
        await self.server(message)

    # -- deciding and recording -----------------------------------------------------------------

    def code(self) -> int:
        return self.status or 0

    def status_text(self) -> str:
        return http_policy.status_line(self.status or 0)

    def header_pairs(self) -> list[tuple[str, str]]:
        return decode_headers(self.headers)

    def settle_async(self, outcome: str) -> Awaitable[None]:
        return pipeline.settle_async(self.permit, outcome, self.warn, self.spec.name)

    async def failed(self, exc: BaseException) -> bool:
        """The app raised (or was cancelled): recorded (Exchange.after_exception)
        unless the response had started (counted by its status). Returns True
        when an answer of ours went out instead (the 503 of an outbound refusal,
        the fallback of a failure): the exception is then not re-raised."""
        self.kept = None
        if self.permit.recorded:
            return False
        outcome, then = self.after_exception(exc)
        await self.settle_async(outcome)
        if self.committed:
            return False
        middleware = self.middleware
        if then is REFUSED:
            assert isinstance(exc, BreakerOpen)
            await middleware.send_refusal(
                middleware.refusal(exc, self.request, None), self.request, self.server
            )
            return True
        if then is FALLBACK:
            self.replaced = True
            if await middleware.send_fallback(self.spec, self.request, self.receive, self.server, exc):
                self.committed = True
                self.warn(self.spec.name, FALLBACK_ANSWERED)
                return True
            self.replaced = False
        return False
