"""BreakerMiddleware: breakers in front of any WSGI app (Django, Falcon, a bare callable).

::

    application = BreakerMiddleware(get_wsgi_application(), breakers, routes={"/pay": "pay"})

The Flask extension protects routes through Flask's hooks; an app written
for another framework has only the WSGI interface, so this is the same
protection at that level: the request's path picks a route (a path prefix,
longest first, like ``BREAKER_ROUTES`` and an OpenResty ``location``), the
route's breaker is asked for a permit, a refusal becomes the 503 every
integration answers with (``breaker_redis.engine.refusal``) or the route's fallback
(``breaker_redis.fallbacks``, marked ``X-Breaker-Fallback`` as in Flask), and
the response is classified and recorded.

When the outcome is recorded, and why. A WSGI app names its status in
``start_response``, but a server sends nothing until the body's first
non-empty chunk: until then the app may still fail (a Django
``StreamingHttpResponse`` whose generator calls the upstream), and the
server then answers 500 instead. So the middleware holds the app's
``start_response`` back and records at the moment the response is
*committed*: its first non-empty chunk, the end of an empty body, a
``write()`` call, or a ``wsgi.file_wrapper`` returned. For an ordinary
response that is right after the app returns, before the server writes a
byte, so the next request on any worker already sees a trip this one made
(as with Flask). The status decides (5xx: failure, configurable); an
exception before the commit is classified by the breaker's config. An
exception *after* it (a stream cut off midway) changes nothing: the
response was already counted by its status, the client already has that
status, and recording at the end of a stream instead would hold a half-open
probe for the whole download and time "slow calls" by the client's reading
speed. The duration a permit measures is the time to the first byte.

A permit is settled exactly once (``Permit`` ignores a second record) and
never leaks: the commit records it; an exception records it; ``close()``
(which servers call also when the client went away, or when they stop
reading early) records one not yet settled, by the status if the app gave
one, else as ignored; an iterable dropped without ``close()`` (against PEP
3333) is settled by the next request through this middleware in the process.

One permit per breaker and request: an admitted request's environ carries
the permit (``breaker_redis.web.routes.RequestGuards``), and a guard of the same
breaker inside (the Flask extension, another middleware) neither asks nor
records; a guard of another breaker that refuses inside makes this one count
the request as ignored.

What a guarded request's outcome is, and how a fallback's answer is made
and marked, is breaker_redis/web/http_policy.py's, the same for every
integration; this module is WSGI's timing and I/O. Where it reads like
breaker_redis/asgi.py (asking the breaker in ``_guard``, an exchange's
``failed``), the difference is the protocol's: a call and a returned body
here, an await and sent messages there. This module is part of the core: it
imports no web framework.
"""

from __future__ import annotations

import collections
import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, cast
from wsgiref.headers import Headers

from breaker_redis.engine.breaker import Breaker
from breaker_redis.engine.breakers import Breakers
from breaker_redis.engine.errors import BreakerOpen
from breaker_redis.engine.permit import Permit
from breaker_redis.engine.refusal import wants_json
from breaker_redis.fallbacks import FALLBACK_HEADER, FallbackContext, FallbackResponse
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
    route_to_ask,
)

if TYPE_CHECKING:
    from _typeshed import OptExcInfo
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = [
    "DEFAULT_FAILURE_STATUSES",
    "FALLBACK_HEADER",
    "ROUTE_OPTIONS",
    "BreakerMiddleware",
    "ResponseInfo",
    "RouteSpec",
    "parse_routes",
    "prefix_matches",
]


@dataclass(frozen=True)
class ResponseInfo(http_policy.ResponseInfo):
    """What a route's ``classify`` sees of the app's response: its status and
    headers (breaker_redis.web.http_policy.ResponseInfo) and the request's ``environ``."""

    environ: dict[str, Any]


def request_path(environ: Mapping[str, Any]) -> str:
    """The request's path as Flask's ``request.path`` has it: PATH_INFO (the
    path under the app's mount point), decoded from WSGI's latin-1 as UTF-8,
    with one leading slash."""
    raw = environ.get("PATH_INFO")
    if type(raw) is not str or not raw.isascii():  # ASCII reads the same in latin-1 and UTF-8
        raw = str(raw or "")
        with contextlib.suppress(UnicodeEncodeError):  # else a server that already decoded it
            raw = raw.encode("latin-1").decode("utf-8", "replace")
    return raw if raw[:1] == "/" and raw[1:2] != "/" else "/" + raw.lstrip("/")


# -- answers -----------------------------------------------------------------------------


class _Answer(NamedTuple):
    """A complete response the middleware sends instead of the app's."""

    status: str
    headers: list[tuple[str, str]]
    body: bytes


def _raw_stems(stems: tuple[str, ...]) -> tuple[str, ...]:
    """What a raw PATH_INFO starts with when a route may cover it: a stem as
    UTF-8 read as latin-1 (WSGI's form), or as it is (a server that decoded the
    path), or ``//`` (request_path would normalise it). A PATH_INFO that starts
    with "/" and with none of these is covered by no route, without decoding it."""
    if any("\ufffd" in stem for stem in stems):
        return ("",)  # a stem a bad byte could decode to: every path goes the long way
    found = {"//"}
    for stem in stems:
        found.update((stem, stem.encode("utf-8").decode("latin-1")))
    return tuple(sorted(found))


def _status_code(status: str) -> int | None:
    try:
        return int(status.split(" ", 1)[0])
    except (ValueError, AttributeError):
        return None


def _wants_json(environ: Mapping[str, Any]) -> bool:
    return wants_json(
        environ.get("HTTP_ACCEPT"), environ.get("CONTENT_TYPE"), environ.get("HTTP_X_REQUESTED_WITH")
    )


def _is_head(environ: Mapping[str, Any]) -> bool:
    return str(environ.get("REQUEST_METHOD", "GET")).upper() == "HEAD"


def _run_app(app: Callable[..., Any], environ: WSGIEnvironment) -> FallbackResponse:
    """A WSGI app a function fallback returned, run to the end: its whole answer."""
    started: list[tuple[str, list[tuple[str, str]]]] = []
    chunks: list[bytes] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started[:] = [(status, list(headers))]
        return chunks.append

    result = app(dict(environ), start_response)
    try:
        for chunk in result:
            chunks.append(bytes(chunk))
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    if not started:
        raise RuntimeError("the fallback's WSGI app never called start_response()")
    status, headers = started[0]
    code = _status_code(status)
    if code is None:
        raise ValueError(f"the fallback's WSGI app answered the status {status!r}")
    return FallbackResponse(b"".join(chunks), code, tuple(headers))


def _read_response(value: Any) -> FallbackResponse | None:
    """A response object with ``status_code``, ``content`` and ``items()`` (a
    Django HttpResponse) as a FallbackResponse; None for anything else."""
    content = getattr(value, "content", None)
    if isinstance(getattr(value, "status_code", None), int) and isinstance(content, bytes):
        items = getattr(value, "items", None)
        headers_seen = tuple((str(k), str(v)) for k, v in items()) if callable(items) else ()
        return FallbackResponse(content, int(value.status_code), headers_seen)
    return None


def _as_response(value: Any, environ: WSGIEnvironment) -> FallbackResponse:
    """What a function fallback returned, as a complete response
    (http_policy.as_response: a Django HttpResponse read, a WSGI app run on the
    request's environ and its body read whole)."""
    response = http_policy.as_response(value, _read_response)
    return response if isinstance(response, FallbackResponse) else _run_app(response, environ)


# -- the middleware --------------------------------------------------------------------------


class BreakerMiddleware(Middleware[Breaker]):
    """Circuit breakers in front of any WSGI app, by path prefix.

    ``app``: the WSGI app (Django's ``get_wsgi_application()``, a Falcon
    ``App``, any callable). ``breakers``: the ``Breakers`` the routes'
    breakers live in (nothing connects until the first request, so build it
    before gunicorn forks if you like). ``routes``: path prefix -> a breaker
    name, a dict (``breaker`` plus the Flask route options ``fallback``,
    ``failure_statuses``, ``ignore_statuses``, ``classify``, ``message``,
    ``fallback_on_failure`` and any BreakerConfig fields over the Breakers'
    defaults) or a RouteSpec. Bad routes or configs fail here, at start-up.

    A ``BreakerOpen`` escaping the app (an outbound breaker refused inside
    it and nothing caught it) becomes the same 503, named after that
    breaker, on any path; a protected route's own breaker ignores that
    request (its service was not asked).
    """

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
        self._raw_stems = _raw_stems(self._table.stems)
        # Exchanges whose iterable was dropped without close(): settled by the next request.
        self._orphans: collections.deque[_Exchange] = collections.deque()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if self._orphans:
            self._settle_orphans()
        raw = environ.get("PATH_INFO")
        # A path that starts with no route's stem is unprotected, decided on sight;
        # any other is matched the long way.
        if type(raw) is not str or raw[:1] != "/" or raw.startswith(self._raw_stems):
            guarded = self._guard(environ, start_response)
            if guarded is not None:
                return guarded
        # Unprotected: the app's own answer, untouched, except that an outbound
        # refusal escaping the app becomes the 503.
        called = False

        def start(status: str, headers: list[tuple[str, str]], exc_info: OptExcInfo | None = None, /) -> Any:
            nonlocal called
            called = True
            return start_response(status, headers, exc_info)

        try:
            return self.app(environ, start)
        except BreakerOpen as refused:
            answer = self.refusal_answer(refused, environ, None)
            # after the app's own start_response, only exc_info allows another
            start_response(answer.status, answer.headers, sys.exc_info() if called else None)
            return [b"" if _is_head(environ) else answer.body]

    def _guard(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes] | None:
        """A request a route covers, admitted or refused; None: it goes through unprotected
        (no route after all, OPTIONS, an outer guard of the same breaker, a bug)."""
        method = environ.get("REQUEST_METHOD", "GET")
        route = route_to_ask(self._table, request_path(environ), method, environ)
        if route is None:
            return None
        spec, breaker = route.spec, cast(Breaker, route.breaker)
        try:
            permit = breaker.acquire()
        except BreakerOpen as refused:
            note_refusal(environ, spec.name)
            answer = self.fallback_answer(spec, environ, refused) or self.refusal_answer(
                refused, environ, spec
            )
            start_response(answer.status, answer.headers)
            return [b"" if _is_head(environ) else answer.body]
        except Exception:
            # Not an outage (the store gate handles those) but a bug: let the
            # request through rather than turn the breaker into the outage.
            self.warn(spec.name, "could not ask breaker %r; the request goes through unprotected")
            return None
        guards = hold(environ, route.guard, permit)  # seen by a Flask app inside
        return _Exchange(self, spec, breaker, permit, guards, environ, start_response).run()

    def _settle_orphans(self) -> None:
        while True:
            try:
                exchange = self._orphans.popleft()
            except IndexError:
                return
            exchange.closed()

    # -- what the middleware answers itself -----------------------------------------------

    def refusal_answer(
        self, refused: BreakerOpen, environ: WSGIEnvironment, spec: RouteSpec | None
    ) -> _Answer:
        """The route's refusal (Middleware.refusal) as a WSGI answer."""
        refusal = self.refusal(refused, _wants_json(environ), spec)
        return _Answer(http_policy.status_line(refusal.status), list(refusal.headers), refusal.body)

    def fallback_context(
        self, name: str, environ: WSGIEnvironment, cause: BaseException | None
    ) -> FallbackContext:
        """The request as a fallback sees it (http_policy.fallback_context);
        ``request`` is the WSGI environ (what ``cached(key=...)`` is given)."""
        return http_policy.fallback_context(
            self.breakers,
            name,
            cause,
            method=str(environ.get("REQUEST_METHOD", "GET")),
            path=request_path(environ),
            query=str(environ.get("QUERY_STRING") or ""),
            request=environ,
        )

    def fallback_answer(
        self, spec: RouteSpec, environ: WSGIEnvironment, cause: BaseException | None
    ) -> _Answer | None:
        """The route's fallback as a response marked as the Flask extension marks
        it, or None: no fallback, nothing to give, or a fallback that failed
        (a broken fallback must not become a 500)."""
        if spec.fallback is None:
            return None
        try:
            served = spec.fallback.serve(self.fallback_context(spec.name, environ, cause))
            if served is None:
                return None
            response = _as_response(served.value, environ)
            marks = http_policy.fallback_marks(spec.name, served.kind, cause)
            headers = http_policy.served_headers(response, marks)
            return _Answer(http_policy.status_line(response.status), headers, response.body)
        except Exception:
            self.warn(spec.name, "the fallback of breaker %r failed")
            return None


class _Exchange(KeptBody):
    """One admitted request, from the app's call to the end of its body.

    The app's ``start_response`` is held back until the response commits
    (see the module docstring); then the outcome is decided and recorded,
    and either the app's status and headers or a fallback's go to the server.

    It is also the iterable the server gets: the app's body, passed on chunk
    by chunk, committing the response at its first non-empty chunk (or its
    end), and closing the app's iterable exactly once.
    """

    # middleware, spec, breaker, permit, guards and replaced are the ASGI exchange's too; each
    # class assigns its own in __init__, without a super().__init__() call per request.
    __slots__ = (
        "breaker",
        "committed",
        "environ",
        "guards",
        "headers",
        "is_closed",
        "iterator",
        "middleware",
        "permit",
        "replaced",
        "result",
        "sent_all",
        "server_start_response",
        "server_write",
        "spec",
        "status",
    )

    def __init__(
        self,
        middleware: BreakerMiddleware,
        spec: RouteSpec,
        breaker: Breaker,
        permit: Permit,
        guards: RequestGuards,
        environ: WSGIEnvironment,
        start_response: StartResponse,
    ) -> None:
        self.middleware = middleware
        self.spec = spec
        self.breaker = breaker
        self.permit = permit
        self.environ = environ
        self.server_start_response = start_response
        self.guards = guards  # where a guard inside notes a refusal
        self.status: str | None = None
        self.headers: list[tuple[str, str]] = []
        self.committed = False
        self.replaced = False  # an answer of ours went to the server instead of the app's
        self.server_write: Callable[[bytes], object] | None = None
        self.kept = None  # a successful body, for fallback.remember (KeptBody)
        self.result: Iterable[bytes] = ()  # the app's body
        self.iterator: Iterator[bytes] | None = None
        self.sent_all = False  # the body's end went to the server (or ours replaced it)
        self.is_closed = False

    def run(self) -> Iterable[bytes]:
        try:
            result = self.middleware.app(self.environ, self.start_response)
        except BaseException as exc:
            body = self.failed(exc)
            if body is None:
                raise
            return [body]
        self.result = result
        if self.committed:  # the app wrote its body through write(): nothing left to decide
            return self
        file_wrapper = self.environ.get("wsgi.file_wrapper")
        if self.status is not None and isinstance(file_wrapper, type) and isinstance(result, file_wrapper):
            # Returned whole, so the server can still send the file its own way (sendfile).
            body = self.commit()
            if body is None:
                return result
            _close(result)
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
            return self.server_start_response(status, headers, exc_info)  # the server decides
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

    def classify(self) -> str:
        """success, failure or ignored, from the status and headers (http_policy.judge)."""
        status = self.status or ""
        code = _status_code(status)
        if code is None:
            return "failure"  # not a status a server can send: it will answer 500
        return judge(self.spec, code, self, _Exchange.response_info, self.middleware.warn, self.guards)

    def response_info(self) -> ResponseInfo:
        """What the route's classify() is given (see classify)."""
        status = self.status or ""
        code = _status_code(status) or 0
        return ResponseInfo(code, status, Headers(list(self.headers)), self.environ)

    def settle(self, outcome: str) -> None:
        try:
            self.permit.record(outcome)
        except Exception:  # recording must never turn a served response into a 500
            self.middleware.warn(self.spec.name, "could not record an outcome of breaker %r")

    def commit(self) -> bytes | None:
        """The response starts now: decide by its status, record, and give the
        server a status. Returns the body to send instead of the app's when
        the route's fallback answers a failed response, else None."""
        self.committed = True
        outcome = self.classify()
        self.settle(outcome)
        spec = self.spec
        if spec.fallback is not None and self.fallback_takes(spec, outcome, _is_head(self.environ)):
            answer = self.middleware.fallback_answer(spec, self.environ, None)
            if answer is not None:
                return self.answer(answer)
        assert self.status is not None
        self.server_write = self.server_start_response(self.status, self.headers)
        return None

    def failed(self, exc: BaseException) -> bytes | None:
        """An exception before the response started: classified by the breaker's
        config and recorded. Returns the body of an answer of ours (the
        fallback of a failure, the 503 of an outbound refusal), or None: the
        caller re-raises. After the response committed (the app called write()),
        the status is out: the outcome was recorded then, and nothing may be
        answered in its place."""
        if self.committed:
            return None
        if isinstance(exc, BreakerOpen):
            self.settle("ignored")  # an outbound breaker refused: this route's service was not asked
            return self.answer(self.middleware.refusal_answer(exc, self.environ, None))
        outcome = http_policy.judge_exception(self.breaker, exc, self.guards)
        self.settle(outcome)
        spec = self.spec
        if spec.fallback is not None and self.fallback_takes(spec, outcome, _is_head(self.environ)):
            answer = self.middleware.fallback_answer(spec, self.environ, exc)
            if answer is not None:
                return self.answer(answer)
        return None

    def answer(self, answer: _Answer) -> bytes:
        """Our answer goes to the server in place of the app's; returns its body."""
        self.committed = self.replaced = True
        self.server_write = self.server_start_response(answer.status, answer.headers)
        return b"" if _is_head(self.environ) else answer.body

    def body_done(self) -> None:
        """The whole body went out: a successful one is handed to the fallback to
        remember (cached). A body cut short never is."""
        kept, self.kept = self.kept, None
        if kept is None or self.spec.fallback is None:
            return
        try:
            code = _status_code(self.status or "") or 0
            response = FallbackResponse(b"".join(kept), code, tuple(self.headers))
            self.spec.fallback.remember(
                self.middleware.fallback_context(self.spec.name, self.environ, None), response
            )
        except Exception:
            self.middleware.warn(self.spec.name, "could not remember a response of breaker %r")

    def closed(self) -> None:
        """The server is done with the response, or gave up on it (the client
        went away, it stopped reading). A permit not settled yet is settled now:
        by the status when the app gave one (the app answered; nobody read the
        body), else as ignored (nothing is known)."""
        self.kept = None
        if self.permit.recorded:
            return
        self.settle(self.classify() if self.status is not None else "ignored")

    # -- the server's side: the body ----------------------------------------------------------

    def __iter__(self) -> _Exchange:
        return self

    def __next__(self) -> bytes:
        if self.sent_all:
            raise StopIteration
        if not self.committed:
            return self._first()
        if self.replaced:  # a fallback answered through write(): the app's chunks go nowhere
            self.sent_all = True
            raise StopIteration
        iterator = self.iterator
        if iterator is None:
            iterator = self.iterator = iter(self.result)
        try:
            chunk = next(iterator)
        except StopIteration:
            self.sent_all = True
            if self.kept is not None:
                self.body_done()
            raise
        # An exception here (after the commit) reaches the server as it is: the
        # response was counted by its status, which the client already has.
        if self.kept is not None:
            self.keep(chunk)
        return chunk

    def _first(self) -> bytes:
        """Up to the first non-empty chunk (empty ones would make some servers
        send the headers), then commit."""
        chunk = b""
        ended = False
        try:
            iterator = self.iterator
            if iterator is None:
                iterator = self.iterator = iter(self.result)
            while not chunk:
                try:
                    chunk = next(iterator)
                except StopIteration:
                    ended = True
                    break
            if self.status is None:
                raise RuntimeError("the WSGI app returned its body without calling start_response()")
        except BaseException as exc:
            body = self.failed(exc)
            if body is None:
                raise
            self.sent_all = True
            return body
        body = self.commit()
        if body is not None:
            self.sent_all = True
            return body
        if ended:
            self.sent_all = True
            if self.kept is not None:
                self.body_done()
            raise StopIteration
        if self.kept is not None:
            self.keep(chunk)
        return chunk

    def close(self) -> None:
        if self.is_closed:
            return
        self.is_closed = True
        try:
            _close(self.result)
        finally:
            self.kept = None
            if not self.permit.recorded:
                self.closed()

    def __del__(self) -> None:
        # Dropped without close(), against PEP 3333. Recording here could run
        # inside any lock (the garbage collector picks the moment), so the
        # exchange waits for the next request through the middleware instead.
        if not self.is_closed and not self.permit.recorded:
            self.middleware._orphans.append(self)


def _close(result: Iterable[bytes]) -> None:
    close = getattr(result, "close", None)
    if close is not None:
        close()
