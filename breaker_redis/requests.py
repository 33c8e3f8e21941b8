"""A requests adapter that puts every outbound call behind a shared breaker:
``session.mount("https://", BreakerAdapter(breakers))``.

One breaker per upstream host by default, shared through Redis by every
worker of every host: after the payment API's fifth failure, no worker's
Session opens a connection to it until the breaker lets a probe through.
The rules are breaker_redis/web/clients.py's. Needs ``requests``
(``pip install 'breaker-redis[requests]'``); nothing else imports it.

requests reads a body after the adapter has returned (``Session.send`` reads
it unless ``stream=True``), so the adapter hands the body's outcome to the
breaker through urllib3's response: its class becomes a subclass
(``_WatchedBody``) that reports the end of the body, a read that fails and a
close to the request's ``Exchange``. With ``pool_block=True`` the breaker is
asked only once urllib3's pool hands the request a connection (``_AskInPool``).
"""

from __future__ import annotations

import http.client
from collections.abc import Callable, Generator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.exceptions import ProtocolError, ReadTimeoutError
from urllib3.exceptions import SSLError as Urllib3SSLError

from breaker_redis.base.errors import BreakerOpen
from breaker_redis.web.clients import SETTLER, Exchange, OutboundClient, send

__all__ = ["BreakerAdapter", "BreakerRefused"]

# The service was asked and did not answer: these count as failures. Any other
# exception (an invalid URL, a missing schema) never reached it and is ignored.
FAILURES: tuple[type[BaseException], ...] = (
    requests.ConnectionError,  # refused, reset, DNS, TLS, proxy, connect timeout
    requests.Timeout,  # read timeout
    requests.exceptions.RetryError,  # max_retries used up on retried statuses
)
# A body the service failed to deliver, as urllib3 raises it while requests reads it:
# cut short or reset (ProtocolError), stalled past the read timeout, broken TLS. A
# body that cannot be decoded (DecodeError) is the status's outcome, as with httpx,
# which decodes above its transport.
BODY_FAILURES: tuple[type[BaseException], ...] = (
    ProtocolError,
    ReadTimeoutError,
    Urllib3SSLError,
    http.client.HTTPException,
    OSError,
)

# The request whose permit urllib3's pool asks for once it hands over a connection (pool_block=True)
_ASKING: ContextVar[Exchange | None] = ContextVar("breaker_redis_asking", default=None)


class BreakerRefused(BreakerOpen, requests.RequestException):
    """The breaker refused the request; nothing was sent. A ``BreakerOpen``
    (``.breaker``, ``.reason``, ``.retry_after`` in seconds or None) and a
    ``requests.RequestException`` (``.request``), so code that already handles
    ``except requests.RequestException`` handles a refusal too."""

    def __init__(self, refused: BreakerOpen, request: requests.PreparedRequest | None = None) -> None:
        BreakerOpen.__init__(self, refused.retry_after, refused.breaker, refused.reason)
        self.request = request


class _Refusal(Exception):
    """A refusal raised inside urllib3's pool, carried out of it. The refusal is a
    ``requests.RequestException``, an OSError, which urllib3 would take for a
    broken connection and retry, and requests would wrap in a ConnectionError;
    this plain Exception passes through both to ``BreakerAdapter.send``."""

    def __init__(self, refusal: BaseException) -> None:
        super().__init__(refusal)
        self.refusal = refusal


def _failed(exc: BaseException) -> bool:
    return isinstance(exc, FAILURES)


def _body_failed(exc: BaseException) -> bool:
    return isinstance(exc, BODY_FAILURES)


class BreakerAdapter(OutboundClient, HTTPAdapter):
    """An ``HTTPAdapter`` whose requests go through their host's breaker.

    ``breakers``: a ``breaker_redis.Breakers``. ``name``: one breaker name for
    every request sent through this adapter, or ``name(request) -> str`` (the
    ``PreparedRequest``); default: ``host:port``. ``config``: the config of each
    breaker (default: the Breakers' defaults); ``configs``: per name or URL,
    a ``BreakerConfig`` or a dict of fields over ``config``.
    ``failure_statuses`` (default 500-599 and 429), ``ignore_statuses`` and
    ``classify(response)`` (``"success"``, ``"failure"``, ``"ignored"``, True,
    False or None) judge a response; connection errors, timeouts and a body
    that fails mid-read are failures. ``honor_retry_after``: a failing
    response's Retry-After keeps an open breaker open that long (at most
    ``max_open_seconds``). ``groups``: ``breaker_redis.groups.BreakerGroup``
    pools of replica hosts, whose members get their group's config and cap.
    The other keyword arguments are the ``HTTPAdapter``'s
    (``pool_connections``, ``pool_maxsize``, ``max_retries``, ``pool_block``).
    """

    _ask_in_pool = False

    def _attach(self, *args: Any, **adapter_options: Any) -> None:
        HTTPAdapter.__init__(self, *args, **adapter_options)

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any
    ) -> None:
        """requests' pool manager; with ``block=True`` its pools ask the breaker once
        they hand a request a connection, so a request that waits for one holds no
        permit: a half-open probe stuck behind connections that streams the caller
        never closed cannot see its lease expire and reopen the breaker for all."""
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        self._ask_in_pool = block
        if block:
            _ask_in_pools(self.poolmanager)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if self._ask_in_pool:
            _ask_in_pools(manager)
        return manager

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: bool | str = True,
        cert: Any = None,
        proxies: dict[str, str] | None = None,
    ) -> requests.Response:
        exchange = Exchange(self.outbound, request, request.url or "", BreakerRefused, _failed, _body_failed)
        in_pool = self._ask_in_pool

        def transport() -> requests.Response:
            token = _ASKING.set(exchange if in_pool else None)
            try:
                return super(BreakerAdapter, self).send(
                    request, stream=stream, timeout=timeout, verify=verify, cert=cert, proxies=proxies
                )
            except _Refusal as carried:
                raise carried.refusal from None
            finally:
                _ASKING.reset(token)

        return send(exchange, transport, lambda response: _watch(response, exchange), ask_first=not in_pool)


# -- asking in the pool (pool_block=True) -----------------------------------------------------------


class _AskInPool:
    """Mixed into urllib3's pool classes of a blocking adapter: once ``_get_conn``
    has a connection (after waiting for one), the request's permit is asked
    for. A refusal gives the connection back closed (urllib3 puts an empty slot
    back in the pool when the request ends in an exception)."""

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)  # type: ignore[misc]
        exchange = _ASKING.get()
        if exchange is not None and not exchange.asked:
            try:
                exchange.ask()
            except BreakerOpen as refusal:
                conn.close()
                raise _Refusal(refusal) from None
            except BaseException:
                conn.close()
                raise
        return conn


_ASKING_CLASSES: dict[type, type] = {}


def _ask_in_pools(manager: Any) -> None:
    """Make the pools ``manager`` creates from now on ask in ``_get_conn``
    (PoolManager and ProxyManager pick a pool class per scheme from
    ``pool_classes_by_scheme``; set per manager, so no other adapter changes)."""
    classes = dict(manager.pool_classes_by_scheme)
    for scheme, pool_class in classes.items():
        if not issubclass(pool_class, _AskInPool):
            asking = _ASKING_CLASSES.get(pool_class)
            if asking is None:
                asking = _ASKING_CLASSES.setdefault(
                    pool_class, type(f"Asking{pool_class.__name__}", (_AskInPool, pool_class), {})
                )
            classes[scheme] = asking
    manager.pool_classes_by_scheme = classes


# -- the body -------------------------------------------------------------------------------------

if TYPE_CHECKING:
    _Response = urllib3.response.HTTPResponse
else:
    _Response = object


class _WatchedBody(_Response):
    """What the class of a urllib3 response behind a breaker becomes: the same
    response, whose body reports to its request's Exchange. The end of the body
    settles the permit as its status says; a read that raises one of
    BODY_FAILURES makes it a failure; a close before the end settles it as its
    status says (the caller chose to stop). A close that urllib3 makes inside a
    read (before it raises ProtocolError on a broken chunk) is the read's
    business, so it waits for the read's outcome. Collected without having been
    closed, the response hands its permit to the Settler (``__del__``): io's
    finalizer closes it, and a finalizer must not record it itself."""

    __slots__ = ()
    _breaker_exchange: Exchange
    _breaker_reading: int

    def read(self, amt: int | None = None, *args: Any, **kwargs: Any) -> bytes:
        return self._watched_read(super().read, amt, *args, **kwargs)

    def read1(self, amt: int | None = None, *args: Any, **kwargs: Any) -> bytes:
        return self._watched_read(super().read1, amt, *args, **kwargs)

    def _watched_read(self, read: Any, amt: int | None, *args: Any, **kwargs: Any) -> bytes:
        data: bytes = self._reading(read, amt, *args, **kwargs)
        if amt is None or (not data and amt != 0) or self.closed:
            self._breaker_exchange.body_ended()
        return data

    def read_chunked(self, amt: int | None = None, decode_content: bool | None = None) -> Generator[bytes]:
        return self._watched_chunks(super().read_chunked(amt, decode_content))

    def stream(self, amt: int | None = 2**16, decode_content: bool | None = None) -> Generator[bytes]:
        return self._watched_chunks(super().stream(amt, decode_content))

    def _watched_chunks(self, chunks: Generator[bytes]) -> Generator[bytes]:
        """The chunks of urllib3's generator, reported: each step counts as a read
        (not the time the generator waits at a yield, so that the caller's close
        between two chunks settles), and its end is the body's end."""
        try:
            while (chunk := self._reading(next, chunks, _END)) is not _END:
                yield chunk
        finally:
            chunks.close()  # left early (a caller that stops iterating): urllib3's generator too
        self._breaker_exchange.body_ended()

    def _reading(self, read: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One read of the body: counted while it runs (a close inside it is the
        read's business), a failure reported to the exchange."""
        self._breaker_reading += 1
        try:
            return read(*args, **kwargs)
        except Exception as exc:
            self._breaker_exchange.body_failed(exc)
            raise
        finally:
            self._breaker_reading -= 1

    def close(self) -> None:
        super().close()
        exchange = self._breaker_exchange
        if not self._breaker_reading and not exchange.dropping:
            exchange.body_closed()

    def __del__(self) -> None:
        exchange = self._breaker_exchange
        exchange.dropping = True  # the close io's finalizer makes next must not record
        if not exchange.done:
            SETTLER.put(exchange.body_closed)
        super().__del__()


_WATCHED_CLASSES: dict[type, type] = {}
_END: Any = object()  # the end of urllib3's chunks


def _watch(response: requests.Response, exchange: Exchange) -> bool:
    """Make the body of ``response`` report to ``exchange``; whether a body is left
    to read (False: none, or a raw that is not urllib3's, judged by its status)."""
    raw = response.raw
    if not isinstance(raw, urllib3.response.HTTPResponse) or raw.closed:
        return False
    cls = type(raw)
    watched = _WATCHED_CLASSES.get(cls)
    if watched is None:
        watched = _WATCHED_CLASSES.setdefault(cls, type(f"Watched{cls.__name__}", (_WatchedBody, cls), {}))
    SETTLER.ready()
    raw._breaker_exchange = exchange  # type: ignore[attr-defined]
    raw._breaker_reading = 0  # type: ignore[attr-defined]
    try:
        raw.__class__ = watched
    except TypeError:  # a response class whose layout cannot be extended: judged by its status
        return False
    return True
