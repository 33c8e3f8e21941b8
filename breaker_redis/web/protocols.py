"""What the WSGI and ASGI protocols say of a request and how a whole answer is
written in each, for breaker_redis/wsgi.py and breaker_redis/asgi.py: a
request's path, method, query and preferred format (``environ_*``,
``scope_*``), a response of the middleware's own (the 503 of
web/refusal.py, a fallback's) as WSGI's status line, headers and body or
as ASGI's two messages, and a fallback that is an app of the protocol, run.
When a request is admitted, judged and settled is the middlewares' (and
web/pipeline.py's); none of that is here. No web framework is imported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, NamedTuple

from breaker_redis.fallbacks import FallbackResponse, Served
from breaker_redis.web.http_policy import as_response, fallback_marks, served_headers, status_line
from breaker_redis.web.refusal import Refusal, environ_wants_json, header_value, wants_json

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Reader(NamedTuple):
    """How a protocol's middleware reads its requests (web/middleware.py)."""

    method: Callable[[Any], str]
    path: Callable[[Any], str]
    query: Callable[[Any], str]
    wants_json: Callable[[Any], bool]


# -- WSGI ----------------------------------------------------------------------------------------


def environ_path(environ: Mapping[str, Any]) -> str:
    """The request's path as Flask's ``request.path`` has it: PATH_INFO (the
    path under the app's mount point), decoded from WSGI's latin-1 as UTF-8,
    with one leading slash."""
    raw = environ.get("PATH_INFO")
    if type(raw) is not str or not raw.isascii():  # ASCII reads the same in latin-1 and UTF-8
        raw = str(raw or "")
        with contextlib.suppress(UnicodeEncodeError):  # else a server that already decoded it
            raw = raw.encode("latin-1").decode("utf-8", "replace")
    return raw if raw[:1] == "/" and raw[1:2] != "/" else "/" + raw.lstrip("/")


def environ_method(environ: Mapping[str, Any]) -> str:
    return str(environ.get("REQUEST_METHOD", "GET"))


def environ_query(environ: Mapping[str, Any]) -> str:
    return str(environ.get("QUERY_STRING") or "")


class WsgiAnswer(NamedTuple):
    """A complete response the middleware sends instead of the app's (no body for HEAD)."""

    status: str
    headers: list[tuple[str, str]]
    body: bytes


def wsgi_answer(code: int, headers: list[tuple[str, str]], body: bytes, head: bool) -> WsgiAnswer:
    return WsgiAnswer(status_line(code), headers, b"" if head else body)


def served_answer(
    served: Served, name: str, cause: BaseException | None, environ: WSGIEnvironment, head: bool
) -> WsgiAnswer:
    """What a fallback of breaker ``name`` served, as a marked answer (a WSGI app it
    gave run on the request's environ)."""
    response = as_response(served.value)
    if not isinstance(response, FallbackResponse):
        response = run_wsgi_app(response, environ)
    headers = served_headers(response, fallback_marks(name, served.kind, cause))
    return wsgi_answer(response.status, headers, response.body, head)


def status_code(status: str | None) -> int | None:
    try:
        return int(status.split(" ", 1)[0])  # type: ignore[union-attr]
    except (ValueError, AttributeError):
        return None


def run_wsgi_app(app: Callable[..., Any], environ: WSGIEnvironment) -> FallbackResponse:
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
        close_iterable(result)
    if not started:
        raise RuntimeError("the fallback's WSGI app never called start_response()")
    status, headers = started[0]
    code = status_code(status)
    if code is None:
        raise ValueError(f"the fallback's WSGI app answered the status {status!r}")
    return FallbackResponse(b"".join(chunks), code, tuple(headers))


def close_iterable(result: Iterable[bytes]) -> None:
    close = getattr(result, "close", None)
    if close is not None:
        close()


# -- ASGI ----------------------------------------------------------------------------------------


def scope_path(scope: Scope) -> str:
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


def scope_method(scope: Scope) -> str:
    return str(scope.get("method", "GET"))


def scope_query(scope: Scope) -> str:
    return bytes(scope.get("query_string") or b"").decode("latin-1")


def scope_wants_json(scope: Scope) -> bool:
    return wants_json(*(_header(scope, name) for name in (b"accept", b"content-type", b"x-requested-with")))


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if bytes(key).lower() == name:
            return bytes(value).decode("latin-1")
    return None


def encode_header(name: str, value: str) -> tuple[bytes, bytes]:
    """ASGI wants lower-case names and latin-1 values."""
    return name.lower().encode("latin-1"), header_value(value).encode("latin-1")


def refusal_messages(refusal: Refusal, *, head: bool = False) -> tuple[Message, Message]:
    """The 503 as the two ASGI messages a server expects."""
    headers = [encode_header(k, v) for k, v in refusal.headers]
    start: Message = {"type": "http.response.start", "status": refusal.status, "headers": headers}
    body: Message = {"type": "http.response.body", "body": b"" if head else refusal.body}
    return start, body


async def nothing() -> None:
    return None


async def run_marked(
    app: ASGIApp, marks: list[tuple[str, str]], scope: Scope, receive: Receive, send: Send
) -> None:
    """A fallback that is an ASGI app (a Starlette StreamingResponse), its start
    message marked with the fallback headers."""
    names = {name.lower().encode("latin-1") for name, _ in marks}

    async def marked(message: Message) -> None:
        if message.get("type") == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers") or () if bytes(k).lower() not in names]
            message = {**message, "headers": [*headers, *(encode_header(k, v) for k, v in marks)]}
        await send(message)

    await app(scope, receive, marked)


ENVIRON = Reader(environ_method, environ_path, environ_query, environ_wants_json)
SCOPE = Reader(scope_method, scope_path, scope_query, scope_wants_json)
