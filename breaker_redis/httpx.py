"""httpx transports that put every outbound call behind a shared breaker:
``httpx.Client(transport=BreakerTransport(breakers))`` and
``httpx.AsyncClient(transport=AsyncBreakerTransport(breakers))``.

One breaker per upstream host by default, shared through Redis by every
worker, sync or async, of every host. The rules are breaker_redis/web/clients.py's.
Needs ``httpx`` (``pip install 'breaker-redis[httpx]'``); nothing else imports it.

httpx reads a body after the transport has returned, so the transport hands
the response a stream of its own (``_Body``, ``_AsyncBody``) that reports the
end of the body, a read that fails and a close to the request's exchange.
Over httpx's own ``HTTPTransport`` (the default), the breaker is asked once
the connection pool hands the request a connection: from the first event of
httpcore's ``trace`` extension, which httpcore sends only from a connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx

from breaker_redis.base.errors import BreakerOpen
from breaker_redis.web.clients import (
    SETTLER,
    AsyncExchange,
    Exchange,
    OutboundClient,
    send,
    send_async,
    settle_on_loop,
)

__all__ = ["AsyncBreakerTransport", "BreakerRefused", "BreakerTransport"]

# The service was asked and did not answer: timeouts, network and protocol errors,
# while sending or while reading the body. An unsupported scheme never reached it and
# is ignored, as is any other exception, and a PoolTimeout (no connection of the
# client's own pool came free in time: the service was not asked).
FAILURES: tuple[type[BaseException], ...] = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.ProtocolError,
    httpx.ProxyError,
)


def _failed(exc: BaseException) -> bool:
    return isinstance(exc, FAILURES) and not isinstance(exc, httpx.PoolTimeout)


class BreakerRefused(BreakerOpen, httpx.TransportError):
    """The breaker refused the request; nothing was sent. A ``BreakerOpen``
    (``.breaker``, ``.reason``, ``.retry_after`` in seconds or None) and an
    ``httpx.TransportError`` (``.request``), so code that handles
    ``except httpx.TransportError`` (or ``httpx.RequestError``) handles it too."""

    def __init__(self, refused: BreakerOpen, request: httpx.Request | None = None) -> None:
        BreakerOpen.__init__(self, refused.retry_after, refused.breaker, refused.reason)
        if request is not None:
            self.request = request


class _Options(OutboundClient):
    """What the two transports take: the breaker options (clients.OutboundClient),
    then a transport or the options to build one."""

    def _attach(self, transport: Any = None, **transport_options: Any) -> None:
        where = type(self).__name__
        if transport is not None and transport_options:
            raise TypeError(
                f"{where}: give a transport or its options, not both "
                f"(got {', '.join(sorted(transport_options))})"
            )
        if transport is None:
            transport = (httpx.AsyncHTTPTransport if self._asynchronous else httpx.HTTPTransport)(
                **transport_options
            )
        self.transport = transport


class BreakerTransport(_Options, httpx.BaseTransport):
    """A transport for ``httpx.Client`` whose requests go through their host's breaker.

    ``breakers``: a ``breaker_redis.Breakers``. ``transport``: the transport
    that sends (default: ``httpx.HTTPTransport(**transport_options)``, so
    ``retries=``, ``limits=``, ``verify=`` ... are passed through). The other
    options are ``breaker_redis.requests.BreakerAdapter``'s: ``name``,
    ``config``, ``configs``, ``failure_statuses`` (default 500-599 and 429),
    ``ignore_statuses``, ``classify(response)``, ``honor_retry_after``,
    ``groups`` (``BreakerGroup``; ``AsyncBreakerGroup`` for the async transport).
    """

    transport: httpx.BaseTransport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        exchange = Exchange(self.outbound, request, str(request.url), BreakerRefused, _failed)
        in_pool = type(self.transport) is httpx.HTTPTransport  # (a subclass may answer without its pool)
        with _traced(request, functools.partial(_tracer, exchange) if in_pool else None):
            return send(
                exchange,
                lambda: self.transport.handle_request(request),
                lambda response: _watch(response, exchange),
                ask_first=not in_pool,
            )

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> BreakerTransport:
        self.transport.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.transport.__exit__(*exc_info)


class AsyncBreakerTransport(_Options, httpx.AsyncBaseTransport):
    """``BreakerTransport`` for ``httpx.AsyncClient``, over asyncio breakers
    (``breaker_redis.asyncio.Breakers``): no call blocks the event loop.
    ``transport`` defaults to ``httpx.AsyncHTTPTransport(**transport_options)``."""

    _asynchronous = True
    transport: httpx.AsyncBaseTransport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        exchange = AsyncExchange(self.outbound, request, str(request.url), BreakerRefused, _failed)
        in_pool = type(self.transport) is httpx.AsyncHTTPTransport
        with _traced(request, functools.partial(_async_tracer, exchange) if in_pool else None):
            return await send_async(
                exchange,
                lambda: self.transport.handle_async_request(request),
                lambda response: _watch_async(response, exchange),
                ask_first=not in_pool,
            )

    async def aclose(self) -> None:
        await self.transport.aclose()

    async def __aenter__(self) -> AsyncBreakerTransport:
        await self.transport.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.transport.__aexit__(*exc_info)


# -- asking once a connection is handed over ----------------------------------------------------------


@contextlib.contextmanager
def _traced(request: httpx.Request, tracer: Callable[[Any], Any] | None) -> Iterator[None]:
    """While the request is sent, its ``trace`` extension is ``tracer(the caller's trace)``
    (None: none added); after, the caller's request is as it was."""
    extensions = request.extensions
    if tracer is not None:
        request.extensions = {**extensions, "trace": tracer(extensions.get("trace"))}
    try:
        yield
    finally:
        request.extensions = extensions


def _tracer(
    exchange: Exchange, theirs: Callable[[str, dict[str, Any]], Any] | None
) -> Callable[[str, dict[str, Any]], None]:
    """A ``trace`` extension that asks the breaker at httpcore's first event of the
    request: every event comes from the connection the pool handed the request
    (connect_tcp for a new one, send_request_headers for a kept-alive one), so a
    request waiting for a connection holds no permit, and its wait is not its
    time. A refusal raised there leaves httpcore as it is (httpx maps only
    httpcore's exceptions); the connection, never used, is closed. The
    caller's own ``trace`` still sees every event."""

    def trace(event: str, info: dict[str, Any]) -> None:
        if not exchange.asked:
            exchange.ask()
        if theirs is not None:
            theirs(event, info)

    return trace


def _async_tracer(
    exchange: AsyncExchange, theirs: Callable[[str, dict[str, Any]], Awaitable[Any]] | None
) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    """``_tracer`` for httpcore's async pool, which awaits its trace callback."""

    async def trace(event: str, info: dict[str, Any]) -> None:
        if not exchange.asked:
            await exchange.ask()
        if theirs is not None:
            await theirs(event, info)

    return trace


# -- the body -------------------------------------------------------------------------------------


def _unread(response: httpx.Response) -> bool:
    """Whether a body is left to read: not when the transport read it already
    (a mock transport's ``httpx.Response(content=...)`` arrives read and closed)."""
    return not (response.is_closed or response.is_stream_consumed)


def _watch(response: httpx.Response, exchange: Exchange) -> bool:
    if not _unread(response) or not isinstance(response.stream, httpx.SyncByteStream):
        return False
    SETTLER.ready()
    response.stream = _Body(response.stream, exchange)
    return True


def _watch_async(response: httpx.Response, exchange: AsyncExchange) -> bool:
    if not _unread(response) or not isinstance(response.stream, httpx.AsyncByteStream):
        return False
    response.stream = _AsyncBody(response.stream, exchange, asyncio.get_running_loop())
    return True


class _Body(httpx.SyncByteStream):
    """A response's stream that reports to its request's Exchange: read to its
    end (the status's outcome), a read that fails (a failure for FAILURES'
    errors, else the status's outcome), closed before its end (the status's
    outcome: the caller chose to stop). Collected unclosed, it hands the permit
    to the Settler (a weakref finalizer: httpx's Client makes each response and
    its stream a reference cycle, so that happens at a garbage collection)."""

    def __init__(self, stream: httpx.SyncByteStream, exchange: Exchange) -> None:
        self._stream = stream
        self._exchange = exchange
        self._dropped = weakref.finalize(self, SETTLER.put, exchange.body_closed)
        self._dropped.atexit = False

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._stream
        except Exception as exc:
            self._settled()
            self._exchange.body_failed(exc)
            raise
        self._settled()
        self._exchange.body_ended()

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            self._settled()
            self._exchange.body_closed()

    def _settled(self) -> None:
        self._dropped.detach()


class _AsyncBody(httpx.AsyncByteStream):
    """``_Body`` for httpx.AsyncClient: the permit is recorded on the event loop
    that sent the request, a dropped one too (``settle_on_loop``)."""

    def __init__(
        self, stream: httpx.AsyncByteStream, exchange: AsyncExchange, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._stream = stream
        self._exchange = exchange
        self._dropped = weakref.finalize(self, settle_on_loop, loop, exchange.body_closed)
        self._dropped.atexit = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._stream:
                yield chunk
        except Exception as exc:
            self._dropped.detach()
            await self._exchange.body_failed(exc)
            raise
        self._dropped.detach()
        await self._exchange.body_ended()

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            self._dropped.detach()
            await self._exchange.body_closed()
