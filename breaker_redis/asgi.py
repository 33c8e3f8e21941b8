"""BreakerMiddleware: breakers in front of any ASGI app (Starlette, FastAPI, Quart, a bare callable).

::

    from breaker_redis.asyncio import Breakers
    from breaker_redis.asgi import BreakerMiddleware

    breakers = Breakers.from_url("redis://127.0.0.1:6379/0")
    app.add_middleware(BreakerMiddleware, breakers=breakers, routes={"/pay": "pay"})   # Starlette/FastAPI
    app = BreakerMiddleware(app, breakers, routes={"/pay": "pay"})                     # any ASGI app

The ASGI twin of ``breaker_redis.wsgi``, with the same routes and options
(path prefix -> breaker, longest prefix first, ``/pay`` covering ``/pay/x``
but not ``/payment``; ``fallback``, ``failure_statuses``,
``ignore_statuses``, ``classify``, ``message``, ``fallback_on_failure`` and
BreakerConfig fields), the same 503 (``breaker_redis.engine.refusal``) and the same
fallbacks (``breaker_redis.fallbacks``, marked ``X-Breaker-Fallback``). It
imports no web framework. Only ``http`` requests are guarded; ``lifespan``
and ``websocket`` scopes go to the app untouched.

When the outcome is recorded, and why. The app's ``http.response.start``
names the status; the middleware classifies it (5xx: failure by default)
and records the outcome *before* passing the message on, so a client that
has the status of the call that tripped the breaker finds every worker
refusing already (the boundary of docs/boundary.md). An exception before
the response started is classified by the breaker's config and re-raised
(unless the route's fallback answers a failure in its place, or it is an
outbound ``BreakerOpen``, which becomes the 503). An exception, a
cancellation or a client that goes away *after* the start changes nothing:
the response was counted by its status, which the client already has
(recording at the end of the body would hold a half-open probe for the
whole download and time slow calls by the client's reading speed).

A permit never leaks: every way out of the app settles it exactly once.
The start message records it; an exception records it as the breaker's
config classifies it; a cancellation (``CancelledError``: a server or an
``anyio`` cancel scope giving up on the request) and an app that returns
without starting a response (it saw ``http.disconnect``) record it as
*ignored*: nothing is known of the service, and a half-open probe slot is
handed back at once instead of after ``probe_timeout_seconds``. Acquiring
and recording run to their end even when the request is cancelled
(breaker_redis.asyncio does it), so a request cancelled while its script is
in flight still settles what the script took.

One permit per breaker and request: an admitted request's scope (a copy)
carries the permit (``breaker_redis.web.routes.RequestGuards``), and a guard of
the same breaker inside it (a FastAPI dependency, another middleware) neither
asks nor records; a guard of another breaker that refuses inside makes this
one count the request as ignored.

``cached()`` reads and writes Redis with a *blocking* client (it is shared
with the Flask and WSGI integrations, so one cache entry serves them all).
Run on the event loop it would stall every request of the worker, so here
it runs in a thread (``asyncio.to_thread``) on the blocking client given as
``cache_client``; a route with ``cached()`` and no ``cache_client`` is an
error at start-up. ``static()`` and ``function()`` (sync or async) run on
the loop.

What a guarded request's outcome is, and how a fallback's answer is made
and marked, is breaker_redis/web/http_policy.py's, the same for every
integration; this module is ASGI's timing and I/O (see breaker_redis/wsgi.py
for where the two read alike, and why they stay two).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import quote
from wsgiref.headers import Headers

from breaker_redis.asyncio import Breaker, Breakers, Permit
from breaker_redis.engine.errors import BreakerOpen
from breaker_redis.engine.refusal import Refusal, wants_json
from breaker_redis.fallbacks import (
    FALLBACK_HEADER,
    Cached,
    Chain,
    Fallback,
    FallbackContext,
    FallbackResponse,
    Function,
    Served,
    Static,
)
from breaker_redis.web import http_policy
from breaker_redis.web.http_policy import KeptBody, Middleware, judge
from breaker_redis.web.routes import (
    DEFAULT_FAILURE_STATUSES,
    ROUTE_OPTIONS,
    RequestGuards,
    RouteSpec,
    hold,
    note_refusal,
    parse_routes,
    prefix_matches,
    request_guards,
    route_to_ask,
)

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

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class ResponseInfo(http_policy.ResponseInfo):
    """What a route's ``classify`` sees of the app's response: the status and
    headers of ``http.response.start`` (breaker_redis.web.http_policy.ResponseInfo)
    and the ASGI ``scope``."""

    scope: Scope


def request_path(scope: Scope) -> str:
    """The path the app routes on, as Flask's ``request.path`` has it: ``scope["path"]``
    less ``root_path`` when the server included it (ASGI servers differ)."""
    path = scope.get("path")
    if type(path) is str and path[:1] == "/" and path[1:2] != "/" and not scope.get("root_path"):
        return path  # the usual path: already what the rest would make of it
    path = str(path or "/")
    root = str(scope.get("root_path") or "").rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        path = path[len(root) :]
    return "/" + path.lstrip("/")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if bytes(key).lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _wants_json(scope: Scope) -> bool:
    return wants_json(
        _header(scope, b"accept"), _header(scope, b"content-type"), _header(scope, b"x-requested-with")
    )


def _is_head(scope: Scope) -> bool:
    return str(scope.get("method", "GET")).upper() == "HEAD"


def header_value(value: str) -> str:
    """A header value as HTTP can carry it (latin-1): one beyond latin-1 (a
    breaker named in another script) is percent-encoded as UTF-8."""
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return quote(value, safe=" !#$&'()*+,-./:;<=>?@[]^_`{|}~")
    return value


def _encode_header(name: str, value: str) -> tuple[bytes, bytes]:
    """ASGI wants lower-case names and latin-1 values."""
    return name.lower().encode("latin-1"), header_value(value).encode("latin-1")


def _decode_headers(raw: Iterable[Any]) -> list[tuple[str, str]]:
    return [(bytes(k).decode("latin-1"), bytes(v).decode("latin-1")) for k, v in raw]


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

    return judge(spec, code, headers, info, warn, request_guards(scope))


# -- answers -----------------------------------------------------------------------------


def refusal_messages(refusal: Refusal, *, head: bool = False) -> tuple[Message, Message]:
    """The 503 as the two ASGI messages a server expects."""
    headers = [_encode_header(k, v) for k, v in refusal.headers]
    start: Message = {"type": "http.response.start", "status": refusal.status, "headers": headers}
    body: Message = {"type": "http.response.body", "body": b"" if head else refusal.body}
    return start, body


def _read_response(value: Any) -> FallbackResponse | None:
    """A response object with ``status_code`` and a bytes ``body`` (a Starlette
    ``Response``; its ``raw_headers`` or ``headers`` are kept) as a
    FallbackResponse; None for anything else. (http_policy.as_response makes
    the rest a response, or hands back an ASGI app, such as a Starlette
    ``StreamingResponse``, to run on the request.)"""
    status_code = getattr(value, "status_code", None)
    body_bytes = getattr(value, "body", None)
    if isinstance(status_code, int) and isinstance(body_bytes, (bytes, bytearray, memoryview)):
        raw = getattr(value, "raw_headers", None)
        if raw is not None:
            headers_seen = tuple(_decode_headers(raw))
        else:
            items = getattr(getattr(value, "headers", None), "items", None)
            headers_seen = tuple((str(k), str(v)) for k, v in items()) if callable(items) else ()
        return FallbackResponse(bytes(body_bytes), status_code, headers_seen)
    return None


def _needs_blocking_store(fallback: Fallback | None) -> bool:
    if isinstance(fallback, Cached):
        return True
    if isinstance(fallback, Chain):
        return any(_needs_blocking_store(item) for item in fallback.fallbacks)
    return False


# -- the middleware --------------------------------------------------------------------------


class BreakerMiddleware(Middleware[Breaker]):
    """Circuit breakers in front of any ASGI app, by path prefix.

    ``app``: the ASGI app. ``breakers``: a ``breaker_redis.asyncio.Breakers``
    (built without I/O, so at import time, before gunicorn forks its
    uvicorn workers). ``routes``: path prefix -> a breaker name, a dict
    (``breaker`` plus ``fallback``, ``failure_statuses``,
    ``ignore_statuses``, ``classify``, ``message``, ``fallback_on_failure``
    and any BreakerConfig fields over the Breakers' defaults) or a
    RouteSpec. ``cache_client``: a *blocking* redis client for ``cached()``
    fallbacks (``breaker_redis.urls.client_from_url(url)``), used from a
    thread. Bad routes or configs fail here, at start-up.

    A ``BreakerOpen`` escaping the app (an outbound breaker refused inside
    it and nothing caught it) becomes the same 503, named after that
    breaker, on any path; a protected route's own breaker ignores that
    request (its service was not asked).
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
        # A path that starts with none of these is covered by no route (see __call__).
        self._stems = (*self._table.stems, "//")
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
            type(path) is not str
            or path[:1] != "/"
            or scope.get("root_path")
            or path.startswith(self._stems)
        ) and await self._guard(scope, receive, send):
            return
        # Unprotected: the app's own answer, untouched, except that an outbound
        # refusal escaping the app becomes the 503.
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
            await self.send_refusal(refused, scope, send, None)

    async def _guard(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """A request a route covers, admitted or refused; False: it goes through unprotected
        (no route after all, OPTIONS, an outer guard of the same breaker, a bug)."""
        route = route_to_ask(self._table, request_path(scope), scope.get("method", "GET"), scope)
        if route is None:
            return False
        spec, breaker = route.spec, cast(Breaker, route.breaker)
        try:
            permit = await breaker.acquire()
        except BreakerOpen as refused:
            note_refusal(scope, spec.name)
            if not await self.send_fallback(spec, scope, receive, send, refused):
                await self.send_refusal(refused, scope, send, spec)
            return True
        except Exception:
            # Not an outage (the store gate handles those) but a bug: let the
            # request through rather than turn the breaker into the outage.
            self.warn(spec.name, "could not ask breaker %r; the request goes through unprotected")
            return False
        scope = dict(scope)  # ASGI: a middleware that adds to the scope passes on a copy
        guards = hold(scope, route.guard, permit)
        await _Exchange(self, spec, breaker, permit, guards, scope, receive, send).run()
        return True

    # -- what the middleware answers itself -----------------------------------------------

    async def send_refusal(
        self, refused: BreakerOpen, scope: Scope, send: Send, spec: RouteSpec | None
    ) -> None:
        """The route's refusal (Middleware.refusal) as ASGI messages."""
        refusal = self.refusal(refused, _wants_json(scope), spec)
        for message in refusal_messages(refusal, head=_is_head(scope)):
            await send(message)

    def fallback_context(
        self, name: str, scope: Scope, cause: BaseException | None, store: Any
    ) -> FallbackContext:
        """The request as a fallback sees it (http_policy.fallback_context), so a
        response cached by a Flask or WSGI worker serves here too; ``request``
        is the ASGI scope (what ``cached(key=...)`` is given)."""
        return http_policy.fallback_context(
            self.breakers,
            name,
            cause,
            method=str(scope.get("method", "GET")),
            path=request_path(scope),
            query=bytes(scope.get("query_string") or b"").decode("latin-1"),
            request=scope,
            store=store,
        )

    async def serve(
        self, fallback: Fallback, name: str, scope: Scope, cause: BaseException | None
    ) -> Served | None:
        """A fallback's answer, without blocking the loop: static as it is, a
        function on the loop (awaited if it returns an awaitable; ``context.store``
        is the Breakers' asyncio client), cached in a thread on ``cache_client``,
        a chain item by item, any other Fallback subclass in a thread."""
        if isinstance(fallback, Chain):
            for item in fallback.fallbacks:
                served = await self.serve(item, name, scope, cause)
                if served is not None:
                    return served
            return None
        if isinstance(fallback, Static):
            return fallback.serve(self.fallback_context(name, scope, cause, self.breakers.client))
        if isinstance(fallback, Function):
            try:
                value = fallback.fn(self.fallback_context(name, scope, cause, self.breakers.client))
                if inspect.isawaitable(value):
                    value = await value
            except Exception:
                self.warn(name, "the fallback function of breaker %r failed")
                return None
            return None if value is None else Served(value, fallback.kind)
        context = self.fallback_context(name, scope, cause, self.cache_client)
        return await asyncio.to_thread(fallback.serve, context)

    async def send_fallback(
        self, spec: RouteSpec, scope: Scope, receive: Receive, send: Send, cause: BaseException | None
    ) -> bool:
        """Send the route's fallback, marked as the Flask extension marks it.
        False when there is none, it has nothing to give, or it failed (a broken
        fallback must not become a 500): the caller answers otherwise."""
        if spec.fallback is None:
            return False
        try:
            served = await self.serve(spec.fallback, spec.name, scope, cause)
            if served is None:
                return False
            response = http_policy.as_response(served.value, _read_response)
        except Exception:
            self.warn(spec.name, "the fallback of breaker %r failed")
            return False
        marks = http_policy.fallback_marks(spec.name, served.kind, cause)
        if not isinstance(response, FallbackResponse):
            await _run_marked(response, marks, scope, receive, send)
            return True
        await send({
            "type": "http.response.start",
            "status": response.status,
            "headers": [_encode_header(k, v) for k, v in http_policy.served_headers(response, marks)],
        })
        await send({"type": "http.response.body", "body": b"" if _is_head(scope) else response.body})
        return True

    async def remember(self, spec: RouteSpec, scope: Scope, response: FallbackResponse) -> None:
        """Hand a successful response to the route's fallback (cached keeps it), in a thread."""
        if spec.fallback is None:
            return
        context = self.fallback_context(spec.name, scope, None, self.cache_client)
        try:
            await asyncio.to_thread(spec.fallback.remember, context, response)
        except Exception:
            self.warn(spec.name, "could not remember a response of breaker %r")


async def _nothing() -> None:
    return None


async def _run_marked(
    app: ASGIApp, marks: list[tuple[str, str]], scope: Scope, receive: Receive, send: Send
) -> None:
    """A fallback that is an ASGI app (a Starlette StreamingResponse), its start
    message marked with the fallback headers."""
    names = {name.lower().encode("latin-1") for name, _ in marks}

    async def marked(message: Message) -> None:
        if message.get("type") == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers") or () if bytes(k).lower() not in names]
            message = {**message, "headers": [*headers, *(_encode_header(k, v) for k, v in marks)]}
        await send(message)

    await app(scope, receive, marked)


class _Exchange(KeptBody):
    """One admitted request, from the app's call to the end of its body.

    The app's ``http.response.start`` is classified and recorded before it
    goes to the server (see the module docstring); a failed response may be
    replaced by the route's fallback, and a successful one kept for it.
    """

    # middleware, spec, breaker, permit, guards and replaced are the WSGI exchange's too; each
    # class assigns its own in __init__, without a super().__init__() call per request.
    __slots__ = (
        "breaker",
        "complete",
        "guards",
        "middleware",
        "permit",
        "raw_headers",
        "receive",
        "replaced",
        "scope",
        "server_send",
        "spec",
        "started",
        "status",
    )

    def __init__(
        self,
        middleware: BreakerMiddleware,
        spec: RouteSpec,
        breaker: Breaker,
        permit: Permit,
        guards: RequestGuards,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        self.middleware = middleware
        self.spec = spec
        self.breaker = breaker
        self.permit = permit
        self.scope = scope
        self.receive = receive
        self.server_send = send
        self.guards = guards  # where a guard inside notes a refusal
        self.status: int | None = None
        self.raw_headers: Iterable[Any] = ()  # of the start message, decoded when something reads them
        self.started = False  # a start message (the app's or ours) went to the server
        self.replaced = False  # an answer of ours went to the server instead of the app's
        self.kept = None  # a successful body, for fallback.remember (KeptBody)
        self.complete = False

    async def run(self) -> None:
        try:
            await self.middleware.app(self.scope, self.receive, self.send)
        except BaseException as exc:
            if not await self.failed(exc):
                raise
            return
        if not self.permit.recorded:
            # The app returned without starting a response (it saw the client
            # leave, or it is broken and the server answers 500): nothing is
            # known of the service. Hand the permit back.
            await self.settle("ignored")
        if self.complete and self.kept is not None:
            kept, self.kept = self.kept, None
            headers = tuple(_decode_headers(self.raw_headers))
            await self.middleware.remember(
                self.spec, self.scope, FallbackResponse(b"".join(kept), self.status or 0, headers)
            )

    # -- the app's side of ASGI --------------------------------------------------------------

    def send(self, message: Message) -> Awaitable[None]:
        """What the app awaits: the start message's handling, a message ignored,
        or else the server's own send (no coroutine of ours per body message)."""
        kind = message.get("type")
        if self.replaced:
            return _nothing()  # a fallback answered: the app's messages go nowhere
        if kind == "http.response.start" and not self.started:
            return self.start(message)
        if kind == "http.response.body" and self.kept is not None:
            self.keep(bytes(message.get("body") or b""))
            if not message.get("more_body", False):
                self.complete = True
        return self.server_send(message)

    async def start(self, message: Message) -> None:
        """The response starts: decide by its status, record, then pass it on
        (or the route's fallback for a failure)."""
        self.status = code = int(message["status"])
        self.raw_headers = message.get("headers") or ()
        spec, scope = self.spec, self.scope
        outcome = judge(spec, code, self, _Exchange.response_info, self.middleware.warn, self.guards)
        # self.settle(outcome) inline: no coroutine of ours per response
        try:
            await self.permit.record(outcome)
        except Exception:  # recording must never turn a served response into a 500
            self.middleware.warn(spec.name, "could not record an outcome of breaker %r")
        if spec.fallback is not None and self.fallback_takes(spec, outcome, _is_head(scope)):
            self.replaced = True  # the app may send body messages while the fallback is served
            if await self.middleware.send_fallback(spec, scope, self.receive, self.server_send, None):
                self.started = True
                return
            self.replaced = False
        self.started = True
        await self.server_send(message)

    # -- deciding and recording -----------------------------------------------------------------

    def response_info(self) -> ResponseInfo:
        """What the route's classify() is given (see judge in start)."""
        code = self.status or 0
        headers = Headers(_decode_headers(self.raw_headers))
        return ResponseInfo(code, http_policy.status_line(code), headers, self.scope)

    async def settle(self, outcome: str) -> None:
        try:
            await self.permit.record(outcome)
        except Exception:  # recording must never turn a served response into a 500
            self.middleware.warn(self.spec.name, "could not record an outcome of breaker %r")

    async def failed(self, exc: BaseException) -> bool:
        """The app raised (or was cancelled). Before the response started, an
        exception is classified by the breaker's config and recorded, and the
        route's fallback may answer a failure; a cancellation is recorded as
        ignored. Returns True when an answer of ours went out instead (the
        exception is then not re-raised), False: the caller re-raises."""
        self.kept = None
        if self.permit.recorded or not isinstance(exc, Exception):
            # After the start (counted by its status), or a cancellation / exit.
            if not self.permit.recorded:
                await self.settle("ignored")
            return False
        if isinstance(exc, BreakerOpen):
            await self.settle("ignored")  # an outbound breaker refused: this route's service was not asked
            if self.started:
                return False
            await self.middleware.send_refusal(exc, self.scope, self.server_send, None)
            return True
        outcome = http_policy.judge_exception(self.breaker, exc, self.guards)
        await self.settle(outcome)
        spec, scope = self.spec, self.scope
        if self.started or spec.fallback is None:
            return False
        if self.fallback_takes(spec, outcome, _is_head(scope)):
            self.replaced = True
            if await self.middleware.send_fallback(spec, scope, self.receive, self.server_send, exc):
                self.started = True
                # Not re-raised (the client has a whole answer), but not hidden either:
                # logged with its traceback, at most once a minute per breaker.
                self.middleware.warn(spec.name, "a request of breaker %r raised; its fallback answered")
                return True
            self.replaced = False
        return False
