"""BreakerMiddleware: breakers in front of any WSGI app (Django, Falcon, a bare callable).

::

    application = BreakerMiddleware(get_wsgi_application(), breakers, routes={"/pay": "pay"})

The Flask extension's protection for an app that has only the WSGI
interface: the same routes, 503, fallbacks and outcomes. What the WSGI and
ASGI middlewares decide alike is breaker_redis/web/middleware.py, the
exchange an admitted request becomes (the Flask extension's too)
web/exchange.py, how WSGI reads a request and writes a whole answer
web/protocols.py; this module is WSGI's timing. It imports no web framework.

When the outcome is recorded. A WSGI app names its status in
``start_response``, but a server sends nothing until the body's first
non-empty chunk: until then the app may still fail (a Django
``StreamingHttpResponse`` whose generator calls the upstream), and the
server then answers 500 instead. So the middleware holds the app's
``start_response`` back and records when the response is *committed*: its
first non-empty chunk, the end of an empty body, a ``write()`` call, or a
``wsgi.file_wrapper`` returned; for an ordinary response, right after the
app returns. A permit measures the time to the first byte. ``close()``
(which servers call also when the client went away) settles a permit not
settled yet, by the status if the app gave one, else as ignored; an iterable
dropped without ``close()`` (against PEP 3333) is settled by the next
request through this middleware in the process.
"""

from __future__ import annotations

import collections
import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from breaker_redis.base.errors import BreakerOpen
from breaker_redis.engine.breaker import Breaker
from breaker_redis.engine.breakers import Breakers
from breaker_redis.fallbacks import FALLBACK_HEADER
from breaker_redis.web import http_policy, pipeline, protocols
from breaker_redis.web import middleware as shared
from breaker_redis.web import routes as web_routes
from breaker_redis.web.exchange import FALLBACK, FALLBACK_ANSWERED, FALLBACK_FAILED, REFUSED, Exchange
from breaker_redis.web.protocols import WsgiAnswer, close_iterable, served_answer, status_code, wsgi_answer
from breaker_redis.web.protocols import environ_path as request_path
from breaker_redis.web.refusal import Refusal
from breaker_redis.web.routes import DEFAULT_FAILURE_STATUSES, ROUTE_OPTIONS, RouteSpec, parse_routes
from breaker_redis.web.routes import prefix_matches as prefix_matches

if TYPE_CHECKING:
    from _typeshed import OptExcInfo
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = ["DEFAULT_FAILURE_STATUSES", "FALLBACK_HEADER", "ROUTE_OPTIONS", "BreakerMiddleware"]
__all__ += ["ResponseInfo", "RouteSpec", "parse_routes", "prefix_matches"]


PATHS_KEPT = 1024  # paths whose route a middleware keeps (the paths a worker meets are unbounded)
_UNSEEN: Any = object()


@dataclass(frozen=True)
class ResponseInfo(http_policy.ResponseInfo):
    """What a route's ``classify`` sees of the app's response: its status and
    headers (breaker_redis.web.http_policy.ResponseInfo) and the request's ``environ``."""

    environ: dict[str, Any]


class BreakerMiddleware(shared.Middleware[Breaker, dict[str, Any]]):
    """Circuit breakers in front of any WSGI app, by path prefix.

    ``app``: the WSGI app (Django's ``get_wsgi_application()``, a Falcon ``App``,
    any callable). ``breakers``: the ``Breakers`` the routes' breakers live in (no
    I/O until the first request). ``routes``: see breaker_redis.web.middleware."""

    breakers: Breakers

    def __init__(
        self, app: WSGIApplication, breakers: Breakers, routes: Mapping[str, Any] | None = None
    ) -> None:
        if not callable(app):
            raise TypeError(f"BreakerMiddleware needs a WSGI app (got {app!r})")
        if not isinstance(breakers, Breakers):
            raise TypeError(f"breakers must be a breaker_redis.Breakers (got {type(breakers).__name__})")
        super().__init__(breakers, routes)
        self.app = app
        self._entry = self._table.entry  # see __call__
        # The route each PATH_INFO met lately matched (or None): a path matched once; emptied when full.
        self._matched: dict[str, Any] = {}
        # Exchanges whose iterable was dropped without close(): settled by the next request.
        self._orphans: collections.deque[_Exchange] = collections.deque()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if self._orphans:
            self._settle_orphans()
        raw = environ.get("PATH_INFO")
        # A path under no route's stem is unprotected on sight; any other is matched the long way.
        if type(raw) is not str or raw[:1] != "/" or raw.startswith(self._entry):
            guarded = self._guard(environ, start_response, raw)
            if guarded is not None:
                return guarded
        # Unprotected: the app's own answer, except that an outbound refusal escaping it becomes the 503.
        called = False

        def start(status: str, headers: list[tuple[str, str]], exc_info: OptExcInfo | None = None, /) -> Any:
            nonlocal called
            called = True
            return start_response(status, headers, exc_info)

        try:
            return self.app(environ, start)
        except BreakerOpen as refused:
            answer = self.refusal_answer(self.refusal(refused, environ, None), environ)
            # after the app's own start_response, only exc_info allows another
            start_response(answer.status, answer.headers, sys.exc_info() if called else None)
            return [answer.body]

    def _guard(
        self, environ: WSGIEnvironment, start_response: StartResponse, raw: Any
    ) -> Iterable[bytes] | None:
        """A request a route covers, admitted or refused; None: it goes through unprotected
        (no route after all, OPTIONS, an outer guard of the same breaker, a bug). ``raw``: its PATH_INFO."""
        known = type(raw) is str
        route = self._matched.get(raw, _UNSEEN) if known else _UNSEEN
        if route is _UNSEEN:
            route = self._table.match(request_path(environ))
            if known:
                if len(self._matched) >= PATHS_KEPT:
                    self._matched.clear()
                self._matched[raw] = route
        route = web_routes.route_to_ask(route, environ.get("REQUEST_METHOD", "GET"), environ)
        if route is None:
            return None
        try:
            permit, guards = pipeline.admit(route.breaker, self.warn, environ, route.guard)  # seen inside
        except BreakerOpen as refused:
            spec = route.spec
            answer = self.fallback_answer(spec, environ, refused)
            if answer is None:
                answer = self.refusal_answer(self.refusal(refused, environ, spec), environ)
            start_response(answer.status, answer.headers)
            return [answer.body]
        if permit is None or guards is None:
            return None
        exchange = _Pending().begin(route.spec, route.breaker, permit, guards, environ, self.warn)
        return exchange.run(self, start_response)

    def _settle_orphans(self) -> None:
        with contextlib.suppress(IndexError):  # IndexError: none left (another thread took it)
            while True:
                self._orphans.popleft().closed()

    # -- the request, read; what the middleware answers itself ------------------------------

    read = protocols.ENVIRON

    def refusal_answer(self, refusal: Refusal, environ: WSGIEnvironment) -> WsgiAnswer:
        return wsgi_answer(refusal.status, list(refusal.headers), refusal.body, self.is_head(environ))

    def fallback_answer(
        self, spec: RouteSpec, environ: WSGIEnvironment, cause: BaseException | None
    ) -> WsgiAnswer | None:
        """The route's fallback as a marked response (a WSGI app it gave run on the
        request's environ), or None: no fallback, nothing to give, or a fallback
        that failed (a broken fallback must not become a 500)."""
        if spec.fallback is None:
            return None
        try:
            served = spec.fallback.serve(self.fallback_context(spec.name, environ, cause))
            if served is None:
                return None
            return served_answer(served, spec.name, cause, environ, self.is_head(environ))
        except Exception:
            self.warn(spec.name, FALLBACK_FAILED)
            return None


class _Exchange(Exchange):
    """The WSGI part of an admitted request's exchange (web/exchange.py): the app's
    ``start_response`` held back until the response commits, and the iterable the
    server gets (the app's body, chunk by chunk, its iterable closed exactly once)."""

    __slots__ = ("ended", "is_closed", "iterator", "middleware", "result", "server", "server_write")

    info = ResponseInfo

    def run(self, middleware: BreakerMiddleware, server: StartResponse) -> Iterable[bytes]:
        self.middleware = middleware
        self.server = server  # the server's start_response
        self.ended = self.is_closed = False  # ended: the body's end went out (or ours replaced it)
        self.iterator: Iterator[bytes] | None = None
        self.server_write: Callable[[bytes], object] | None = None
        try:
            result = middleware.app(self.request, self.start_response)
        except BaseException as exc:
            body = self.failed(exc)
            if body is None:
                raise
            return [body]
        self.result = result
        if self.committed:  # the app wrote its body through write(): nothing left to decide
            return self
        if self.status is None or type(result) is list:  # (a list is no file_wrapper: one look-up less)
            return self
        file_wrapper = self.request.get("wsgi.file_wrapper")
        if isinstance(file_wrapper, type) and isinstance(result, file_wrapper):
            # Returned whole, so the server can still send the file its own way (sendfile).
            body = self.commit()
            if body is None:
                return result
            close_iterable(result)
            return [body]
        return self

    # -- the app's side of WSGI ------------------------------------------------------------

    def start_response(
        self, status: str, headers: list[tuple[str, str]], exc_info: OptExcInfo | None = None, /
    ) -> Callable[[bytes], object]:
        """Noted, not passed on: the server gets a status when the response commits."""
        if self.committed:
            if self.replaced or self.server_write is None:
                if exc_info is not None and exc_info[1] is not None:
                    raise exc_info[1].with_traceback(exc_info[2])
                raise AssertionError("start_response() called again after the response started")
            return self.server(status, headers, exc_info)
        if exc_info is None and self.status is not None:
            raise AssertionError("start_response() called a second time without exc_info")
        # With exc_info before the commit: nothing has gone out, the new status replaces the old.
        self.status, self.headers = status, list(headers)
        return self.write

    def write(self, data: bytes) -> None:
        """The legacy write() callable: the first call commits the response."""
        if not self.committed:
            if self.status is None:
                raise AssertionError("write() called before start_response()")
            body = self.commit()
            if body is not None:
                assert self.server_write is not None
                self.server_write(body)
        if self.replaced:
            return  # a fallback answered: the app's bytes go nowhere
        self.keep(data)
        assert self.server_write is not None
        self.server_write(data)

    # -- deciding and recording ------------------------------------------------------------

    def code(self) -> int:
        return status_code(self.status) or 0

    def status_text(self) -> str:
        return self.status or ""

    def header_pairs(self) -> list[tuple[str, str]]:
        return list(self.headers)

    def classify(self) -> str:
        try:
            code = int(self.status.split(" ", 1)[0])  # protocols.status_code, inline
        except (ValueError, AttributeError):
            return "failure"  # not a status a server can send: it will answer 500
        return self.judged(code, self)

    def commit(self) -> bytes | None:
        """The response starts now: decided, recorded, and a status to the server.
        Returns the body of the route's fallback answering in the app's place, or None."""
        self.committed = True
        self.__class__ = _Exchange  # recorded next: no __del__ needed any more (_Pending)
        outcome = self.classify()
        try:  # self.settle(), inline
            self.permit.record(outcome)
        except Exception:
            self.warn(self.spec.name, pipeline.UNRECORDED)
        if self.spec.fallback is not None and self.answers(outcome, self.middleware.is_head(self.request)):
            answer = self.middleware.fallback_answer(self.spec, self.request, None)
            if answer is not None:
                return self.answer(answer)
        self.server_write = self.server(self.status, self.headers)
        return None

    def failed(self, exc: BaseException) -> bytes | None:
        """An exception before the commit, recorded (Exchange.after_exception). Returns
        the body of an answer of ours in the app's place, or None: the caller re-raises."""
        if self.committed:
            return None
        outcome, then = self.after_exception(exc)
        self.settle(outcome)
        middleware = self.middleware
        if then is REFUSED:
            assert isinstance(exc, BreakerOpen)
            refusal = middleware.refusal(exc, self.request, None)
            return self.answer(middleware.refusal_answer(refusal, self.request))
        if then is FALLBACK:
            answer = middleware.fallback_answer(self.spec, self.request, exc)
            if answer is not None:
                self.warn(self.spec.name, FALLBACK_ANSWERED)
                return self.answer(answer)
        return None

    def answer(self, answer: WsgiAnswer) -> bytes:
        """Our answer goes to the server in place of the app's; returns its body."""
        self.committed = self.replaced = True
        self.server_write = self.server(answer.status, answer.headers)
        return answer.body

    def body_done(self) -> None:
        """The whole body went out: a successful one is handed to the fallback to
        remember (cached). A body cut short never is."""
        middleware, name, request = self.middleware, self.spec.name, self.request
        self.remember(lambda: middleware.fallback_context(name, request, None), self.kept_response)

    def closed(self) -> None:
        """The server is done with the response, or gave up on it: a permit not settled
        yet is settled by the status the app gave (nobody read the body), else as ignored."""
        self.kept = None
        if self.permit.recorded:
            return
        self.settle(self.classify() if self.status is not None else "ignored")

    # -- the server's side: the body ----------------------------------------------------------

    def __iter__(self) -> Iterator[bytes]:
        """The body, by a generator: its end raises no StopIteration in Python code (PEP 3333)."""
        return self.body()

    def body(self) -> Iterator[bytes]:
        if not self.committed:
            try:
                iterator = self.iterator
                if iterator is None:
                    iterator = self.iterator = iter(self.result)
                chunk = next(iterator, None)  # None: the end
                while chunk is not None and not chunk:
                    chunk = next(iterator, None)  # an empty chunk would make some servers start
                if self.status is None:
                    raise RuntimeError("the WSGI app returned its body without calling start_response()")
            except BaseException as exc:
                answer = self.failed(exc)
                if answer is None:
                    raise
            else:
                answer = self.commit()
            if answer is not None:
                self.ended = True
                yield answer
                return
            if chunk is not None:
                if self.kept is not None:
                    self.keep(chunk)
                yield chunk
        elif self.ended or self.replaced:  # replaced: a fallback answered through write()
            return
        # After the commit: the app's chunks as they are, an exception as it is (the
        # response was counted by its status, which the client already has).
        iterator = self.iterator
        if iterator is None:  # committed by write(): what the app returned follows
            iterator = self.iterator = iter(self.result)
        if self.kept is None:
            yield from iterator
        else:
            for chunk in iterator:
                self.keep(chunk)
                yield chunk
        self.ended = True
        if self.kept is not None:
            self.body_done()

    def close(self) -> None:
        if self.is_closed:
            return
        self.is_closed = True
        try:
            close = getattr(self.result, "close", None)  # protocols.close_iterable, inline
            if close is not None:
                close()
        finally:
            self.kept = None
            if not self.committed:  # (committed: settled at the commit)
                self.closed()


class _Pending(_Exchange):
    """An exchange until its response commits: dropped without close() (against PEP 3333),
    it waits for the next request through the middleware (recording in ``__del__`` could
    run inside any lock: the garbage collector picks the moment). Only it has a ``__del__``,
    which costs a call of the interpreter's own at every free: commit() makes it an
    _Exchange, whose permit is recorded there."""

    __slots__ = ()

    def __del__(self) -> None:
        if not self.is_closed and not self.permit.recorded:
            self.middleware._orphans.append(self)
