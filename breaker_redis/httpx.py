"""httpx transports that put every outbound call behind a shared breaker:
``httpx.Client(transport=BreakerTransport(breakers))`` and
``httpx.AsyncClient(transport=AsyncBreakerTransport(breakers))``.

One breaker per upstream host by default, shared through Redis by every
worker, sync or async, of every host. The rules are breaker_redis/web/clients.py's.
Needs ``httpx`` (``pip install 'breaker-redis[httpx]'``); nothing else imports it.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import httpx

from breaker_redis.engine.errors import BreakerOpen
from breaker_redis.web.clients import OutboundClient, send, send_async

__all__ = ["AsyncBreakerTransport", "BreakerRefused", "BreakerTransport"]

# The service was asked and did not answer: timeouts, network and protocol errors.
# An unsupported scheme never reached it and is ignored, as is any other exception.
FAILURES: tuple[type[BaseException], ...] = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.ProtocolError,
    httpx.ProxyError,
)


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
            raise TypeError(f"{where}: give a transport or its options, not both "
                            f"(got {', '.join(sorted(transport_options))})")
        if transport is None:
            transport = (httpx.AsyncHTTPTransport if self._asynchronous else httpx.HTTPTransport)(
                **transport_options)
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
        return send(self.outbound, request, str(request.url), lambda: self.transport.handle_request(request),
                    BreakerRefused, FAILURES)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> BreakerTransport:
        self.transport.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        self.transport.__exit__(exc_type, exc_value, traceback)


class AsyncBreakerTransport(_Options, httpx.AsyncBaseTransport):
    """``BreakerTransport`` for ``httpx.AsyncClient``, over asyncio breakers
    (``breaker_redis.asyncio.Breakers``): no call blocks the event loop.
    ``transport`` defaults to ``httpx.AsyncHTTPTransport(**transport_options)``."""

    _asynchronous = True
    transport: httpx.AsyncBaseTransport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await send_async(self.outbound, request, str(request.url),
                                lambda: self.transport.handle_async_request(request),
                                BreakerRefused, FAILURES)

    async def aclose(self) -> None:
        await self.transport.aclose()

    async def __aenter__(self) -> AsyncBreakerTransport:
        await self.transport.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self.transport.__aexit__(exc_type, exc_value, traceback)
