"""What the WSGI and the ASGI middleware hold and decide alike, written once.

Both guard an app by path prefix (breaker_redis/web/routes.py). For each
request a route covers, its breaker is asked for a permit; a refusal becomes
the route's fallback or the 503 every integration answers; an admitted
request becomes an *exchange*, which records the outcome once the response's
status is known, before the server sends it, so the next request on any
worker already sees a trip this one made.

A permit is settled exactly once (``Permit`` ignores a second record) and
never leaks: the status records it when the response starts; an exception
before that is recorded as the breaker's config classifies it; a
cancellation, an exit, or a response that never started is recorded as
ignored (nothing is known of the service, and a half-open probe slot is
handed back at once). An exception *after* the start changes nothing: the
response was counted by its status, which the client already has
(recording at the end of the body would hold a half-open probe for a whole
download and time slow calls by the client's reading speed).

One permit per breaker and request: an admitted request carries its permit
(``RequestGuards``, in the environ or a copy of the scope), so a guard of
the same breaker inside it (the Flask extension, a FastAPI dependency,
another middleware) neither asks nor records, and a guard of another breaker
that refuses inside makes this one count the request as ignored. A
``BreakerOpen`` escaping the app (an outbound breaker refused and nothing
caught it) becomes the same 503, named after that breaker, on any path.

The admit and settle steps are breaker_redis/web/pipeline.py's; the exchange
an admitted request becomes, web/exchange.py's (the Flask extension's too);
how each protocol reads a request and writes a whole answer,
web/protocols.py's. What stays in breaker_redis/wsgi.py and
breaker_redis/asgi.py is their protocol's timing: when a response counts as
started (WSGI: the body's first bytes; ASGI: the start message), how its
status and headers are read, and whether a step is a call or an await. No
web framework is imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Generic, TypeVar

from breaker_redis.base.errors import BreakerOpen
from breaker_redis.engine.core import BreakerCore
from breaker_redis.fallbacks import FallbackContext
from breaker_redis.web.http_policy import (
    Warnings,
    fallback_context,
)
from breaker_redis.web.protocols import Reader
from breaker_redis.web.refusal import Refusal, refusal_for
from breaker_redis.web.routes import Route, RouteSpec, RouteTable, parse_routes, route_table

B = TypeVar("B", bound="BreakerCore[Any]")
R = TypeVar("R", bound=Mapping[str, Any])  # a request: a WSGI environ, an ASGI scope


class Middleware(Generic[B, R]):
    """The routes a middleware guards, built at start-up: each route's Breaker
    (sync for WSGI, asyncio for ASGI), the table a path is looked up in, the
    refusal a route answers, a fallback's view of a request and the warnings.
    Each protocol's BreakerMiddleware says how it reads a request (``read``).

    ``routes``: path prefix -> a breaker name, a dict (``breaker`` plus the
    Flask route options ``fallback``, ``failure_statuses``,
    ``ignore_statuses``, ``classify``, ``message``, ``fallback_on_failure``
    and any BreakerConfig fields over the Breakers' defaults) or a
    RouteSpec. Bad routes or configs fail here, at start-up.
    """

    def __init__(self, breakers: Any, routes: Mapping[str, Any] | None) -> None:
        self.breakers = breakers
        self.routes, configs = parse_routes(routes, defaults=breakers.defaults)
        self._resolved: dict[str, B]
        self._table: RouteTable[Route]
        self._resolved, self._table = route_table(breakers, self.routes, configs)
        self._warnings = Warnings()
        # Bound once, not per response: the exchanges hand it to judge() on every one.
        self.warn: Callable[[str, str], None] = self._warnings.warn

    def breaker(self, name: str) -> B:
        """The Breaker a route uses (for ``snapshot()``, ``force_open()``...)."""
        return self._resolved[name]

    def route_for(self, path: str) -> RouteSpec | None:
        """The spec of the longest prefix covering path, or None."""
        route = self._table.match(path)
        return None if route is None else route.spec

    # How the protocol reads a request (web/protocols.py): each protocol's middleware sets it.
    read: ClassVar[Reader]

    def is_head(self, request: R) -> bool:
        return self.read.method(request).upper() == "HEAD"

    # -- what the middleware answers itself -----------------------------------------------------

    def refusal(self, refused: BreakerOpen, request: R, spec: RouteSpec | None) -> Refusal:
        """The 503 every integration answers (web.refusal.refusal_for), with
        the route's message when its own breaker refused."""
        message = spec.message if spec is not None else None
        return refusal_for(refused, self.breakers, as_json=self.read.wants_json(request), message=message)

    def fallback_context(
        self, name: str, request: R, cause: BaseException | None, store: Any = None
    ) -> FallbackContext:
        """The request as a fallback sees it (http_policy.fallback_context), so a
        response one worker's framework cached serves another's; ``request`` is
        the environ or the scope (what ``cached(key=...)`` is given)."""
        return fallback_context(
            self.breakers,
            name,
            cause,
            method=self.read.method(request),
            path=self.read.path(request),
            query=self.read.query(request),
            request=request,
            store=store,
        )
