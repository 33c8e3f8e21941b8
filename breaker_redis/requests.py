"""A requests adapter that puts every outbound call behind a shared breaker:
``session.mount("https://", BreakerAdapter(breakers))``.

One breaker per upstream host by default, shared through Redis by every
worker of every host: after the payment API's fifth failure, no worker's
Session opens a connection to it until the breaker lets a probe through.
The rules are breaker_redis/web/clients.py's. Needs ``requests``
(``pip install 'breaker-redis[requests]'``); nothing else imports it.
"""

from __future__ import annotations

from typing import Any

import requests
from requests.adapters import HTTPAdapter

from breaker_redis.engine.errors import BreakerOpen
from breaker_redis.web.clients import OutboundClient, send

__all__ = ["BreakerAdapter", "BreakerRefused"]

# The service was asked and did not answer: these count as failures. Any other
# exception (an invalid URL, a missing schema) never reached it and is ignored.
FAILURES: tuple[type[BaseException], ...] = (
    requests.ConnectionError,  # refused, reset, DNS, TLS, proxy, connect timeout
    requests.Timeout,  # read timeout
    requests.exceptions.RetryError,  # max_retries used up on retried statuses
)


class BreakerRefused(BreakerOpen, requests.RequestException):
    """The breaker refused the request; nothing was sent. A ``BreakerOpen``
    (``.breaker``, ``.reason``, ``.retry_after`` in seconds or None) and a
    ``requests.RequestException`` (``.request``), so code that already handles
    ``except requests.RequestException`` handles a refusal too."""

    def __init__(self, refused: BreakerOpen, request: requests.PreparedRequest | None = None) -> None:
        BreakerOpen.__init__(self, refused.retry_after, refused.breaker, refused.reason)
        self.request = request


class BreakerAdapter(OutboundClient, HTTPAdapter):
    """An ``HTTPAdapter`` whose requests go through their host's breaker.

    ``breakers``: a ``breaker_redis.Breakers``. ``name``: one breaker name for
    every request sent through this adapter, or ``name(request) -> str`` (the
    ``PreparedRequest``); default: ``host:port``. ``config``: the config of each
    breaker (default: the Breakers' defaults); ``configs``: per name or URL,
    a ``BreakerConfig`` or a dict of fields over ``config``.
    ``failure_statuses`` (default 500-599 and 429), ``ignore_statuses`` and
    ``classify(response)`` (``"success"``, ``"failure"``, ``"ignored"``, True,
    False or None) judge a response; connection errors and timeouts are
    failures. ``honor_retry_after``: a failing response's Retry-After keeps an
    open breaker open that long (at most ``max_open_seconds``). ``groups``:
    ``breaker_redis.groups.BreakerGroup`` pools of replica hosts, whose members
    get their group's config and cap. The other keyword arguments are the
    ``HTTPAdapter``'s (``pool_connections``, ``pool_maxsize``, ``max_retries``,
    ``pool_block``).
    """

    def _attach(self, *args: Any, **adapter_options: Any) -> None:
        HTTPAdapter.__init__(self, *args, **adapter_options)

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: bool | str = True,
        cert: Any = None,
        proxies: dict[str, str] | None = None,
    ) -> requests.Response:
        def transport() -> requests.Response:
            return super(BreakerAdapter, self).send(
                request, stream=stream, timeout=timeout, verify=verify, cert=cert, proxies=proxies
            )

        return send(self.outbound, request, request.url or "", transport, BreakerRefused, FAILURES)
