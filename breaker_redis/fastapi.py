"""FastAPI: a route dependency that puts a shared breaker in front of a path operation.

::

    from typing import Annotated
    from fastapi import FastAPI
    from breaker_redis.asyncio import Breakers, BreakerConfig, Permit
    from breaker_redis.fastapi import BreakerGuard, add_refusal_handler, protect

    breakers = Breakers.from_url("redis://127.0.0.1:6379/0")
    app = FastAPI(lifespan=...)            # await breakers.aclose() at shutdown
    add_refusal_handler(app)               # the same 503 body as every other integration

    @app.post("/pay", dependencies=[protect(breakers, "pay", BreakerConfig(failure_threshold=5))])
    async def pay(): ...

    pay_guard = BreakerGuard(breakers, "pay")
    @app.post("/pay2")
    async def pay2(permit: Annotated[Permit, pay_guard.depends()]): ...   # the permit, if wanted

The dependency asks the breaker for a permit before the path operation runs;
a refusal raises ``BreakerRefused``, an ``HTTPException`` (503,
``Retry-After``, ``X-Breaker``, ``X-Breaker-Reason``). With
``add_refusal_handler(app)`` its body is the one ``breaker_redis.web.refusal``
gives every integration (text, or JSON when the client asks for it);
without it FastAPI's own handler answers ``{"detail": message}`` with the
same status and headers. The handler also turns a ``BreakerOpen`` escaping
a path operation (an outbound ``await breaker.call(...)`` refused) into
that 503.

The dependency records the outcome when the path operation is done (a yield
dependency): success on a normal return, the exception's verdict when it
raised (an ``HTTPException`` by its status: 5xx failure by default,
configurable as in the middleware; ``RequestValidationError`` and an
outbound ``BreakerOpen``: ignored, the service was not asked; anything else
by the breaker's config: ``record_exceptions`` / ``ignore_exceptions`` /
``predicate``), and the status a path operation set on the ``Response``
FastAPI injects (``response.status_code = 502``). Limits: a path operation
that *returns* a response object (``JSONResponse(..., status_code=502)``)
hides its status from every dependency: raise ``HTTPException(502)``, set
the injected response's status, settle the permit yourself (``await
permit.failure()``: the dependency's own record is then a no-op), or use
``breaker_redis.asgi.BreakerMiddleware``, which sees every status.

``depends()`` and ``protect()`` give ``Depends(guard, scope="function")``
where FastAPI has dependency scopes (0.121 and later): the outcome is then
recorded before the response is sent, so a client holding the answer of the
call that tripped the breaker finds every worker refusing (as with the
middleware). Older FastAPI, or a plain ``Depends(guard)``, exits after the
response was sent: the trip is recorded a moment after the client has the
answer.

Under ``breaker_redis.asgi.BreakerMiddleware`` guarding the same path with
the same breaker (or below another guard of it), the dependency neither asks
nor records: the outer guard holds the request's one permit
(``breaker_redis.web.routes.RequestGuards``, in the scope) and the dependency
yields that one. Nothing is counted twice.

Fallbacks are the middleware's job (a dependency cannot answer in place of
the path operation); inside one, ``await breaker.call(fn, fallback=...)``.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.exceptions import HTTPException, RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from breaker_redis.asgi import BreakerMiddleware, judge_status
from breaker_redis.asyncio import Breaker, BreakerConfig, Breakers, Permit
from breaker_redis.base.errors import BreakerOpen
from breaker_redis.web.http_policy import Warnings, judge_exception
from breaker_redis.web.pipeline import admit_async, settle_async
from breaker_redis.web.refusal import Refusal, default_message, header_value, refusal_for, wants_json
from breaker_redis.web.routes import GuardOptions, guard_id, held, make_spec, note_refusal, request_guards

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11; never imported at run time

__all__ = [
    "BreakerGuard",
    "BreakerMiddleware",
    "BreakerRefused",
    "add_refusal_handler",
    "protect",
    "refusal_handler",
    "refusal_response",
]

_HAS_SCOPES = "scope" in inspect.signature(Depends).parameters


def _request_wants_json(request: Request) -> bool:
    headers = request.headers
    return wants_json(headers.get("accept"), headers.get("content-type"), headers.get("x-requested-with"))


class BreakerRefused(HTTPException):
    """The 503 a guarded path operation answers when its breaker refuses.

    ``.refusal`` is the ``breaker_redis.web.refusal.Refusal`` (built for the
    request's Accept header; a guard gives the one ``refusal_for`` makes),
    ``.refused`` the ``BreakerOpen``; ``.breaker``, ``.reason`` and
    ``.retry_after`` (whole seconds) are there for your own exception handler."""

    def __init__(
        self,
        refused: BreakerOpen,
        *,
        as_json: bool = False,
        message: str | None = None,
        config: BreakerConfig | None = None,
        refusal: Refusal | None = None,
    ) -> None:
        self.refused = refused
        if refusal is None:
            refusal = refusal_for(refused, as_json=as_json, message=message, config=config)
        self.refusal = refusal
        self.breaker = refused.breaker
        self.reason = refused.reason
        self.retry_after = self.refusal.retry_after
        skip = ("content-type", "content-length")
        headers = {k: header_value(v) for k, v in self.refusal.headers if k.lower() not in skip}
        detail = message or default_message(refused.breaker)
        super().__init__(self.refusal.status, detail=detail, headers=headers)


def refusal_response(refusal: Refusal, *, head: bool = False) -> Response:
    """The refusal as a Starlette response: the bytes every integration sends."""
    headers = {k: header_value(v) for k, v in refusal.headers if k.lower() != "content-length"}
    response = Response(b"" if head else refusal.body, refusal.status, headers)
    if head:
        response.headers["content-length"] = str(len(refusal.body))
    return response


def refusal_handler(breakers: Breakers | None = None) -> Any:
    """An exception handler for ``BreakerRefused`` (a guard refused) and
    ``BreakerOpen`` (an outbound breaker refused inside a path operation):
    the common 503. ``breakers`` lets a forced-open outbound breaker's
    refusal advertise its open period as Retry-After (else 1 s)."""

    async def handle(request: Request, exc: Exception) -> Response:
        if isinstance(exc, (BreakerRefused, BreakerOpen)):
            note_refusal(request.scope, exc.breaker)  # an outer guard counts the request ignored
        if isinstance(exc, BreakerRefused):
            refusal = exc.refusal
        elif isinstance(exc, BreakerOpen):
            refusal = refusal_for(exc, breakers, as_json=_request_wants_json(request))
        else:  # pragma: no cover - registered for those two only
            raise exc
        return refusal_response(refusal, head=request.method == "HEAD")

    return handle


def add_refusal_handler(app: FastAPI, breakers: Breakers | None = None) -> None:
    """Answer ``BreakerRefused`` and an escaping ``BreakerOpen`` with the common 503."""
    handler = refusal_handler(breakers)
    app.add_exception_handler(BreakerRefused, handler)
    app.add_exception_handler(BreakerOpen, handler)


class BreakerGuard:
    """A FastAPI dependency (``Depends(guard)``, better ``guard.depends()``)
    that admits a request through the breaker ``name`` and records its outcome.

    It yields the ``Permit`` (declare ``permit: Annotated[Permit,
    guard.depends()]`` to settle it yourself; None in the one case where the
    breaker could not be asked at all, a bug rather than an outage, when the
    request goes through unprotected, as with the middleware). ``config`` is the breaker's
    BreakerConfig (``breakers.get(name, config)``: no I/O; a different config
    for a breaker that exists is a ValueError). ``failure_statuses``
    (default 500-599), ``ignore_statuses`` and ``classify`` (given a
    ``breaker_redis.asgi.ResponseInfo``, returning "success" / "failure" /
    "ignored", True / False or None) judge an ``HTTPException`` and the
    status set on the injected response, as in the middleware; ``message``
    is the refusal's text.
    """

    def __init__(
        self,
        breakers: Breakers,
        name: str,
        config: BreakerConfig | None = None,
        **route: Unpack[GuardOptions],
    ) -> None:
        if not isinstance(breakers, Breakers):
            raise TypeError("breakers must be a breaker_redis.asyncio.Breakers")
        unknown = route.keys() - GuardOptions.__optional_keys__
        if unknown:
            raise TypeError(f"BreakerGuard() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
        self.spec = make_spec(name, route, f"BreakerGuard({name!r})")  # the middlewares' route format
        self.breakers = breakers
        self.breaker: Breaker = breakers.get(name, config)
        self._guard = guard_id(breakers.prefix, name)
        self._warnings = Warnings()

    def depends(self) -> Any:
        """``Depends(guard.__call__, scope="function")`` where FastAPI has scopes, else
        without the scope. The bound method, not the guard: FastAPI looks at a
        dependency's kind on every request, and a method takes it less work than
        an object with ``__call__`` (about 4 % of a guarded request)."""
        if _HAS_SCOPES:
            return Depends(self.__call__, scope="function")
        return Depends(self.__call__)  # pragma: no cover - FastAPI < 0.121

    async def __call__(self, request: Request, response: Response) -> AsyncIterator[Permit | None]:
        scope = request.scope
        outer: Permit | None = held(scope, self._guard)
        if outer is not None:
            # The middleware (or another guard) of this breaker holds the request's
            # permit: it asked, and it records the one outcome. Nothing is counted twice.
            yield outer
            return
        try:
            permit, guards = await admit_async(self.breaker, self._warn, scope, self._guard)
        except BreakerOpen as refused:
            refusal = refusal_for(
                refused, self.breakers, as_json=_request_wants_json(request), message=self.spec.message
            )
            raise BreakerRefused(refused, message=self.spec.message, refusal=refusal) from None
        if permit is None or guards is None:
            yield None
            return
        try:
            yield permit
        except BaseException as exc:
            await settle_async(permit, self._judge_exception(exc, request), self._warn, self.breaker.name)
            raise
        status = response.status_code  # None unless the path operation set it
        if status is not None:
            outcome = judge_status(self.spec, int(status), response.headers.items(), scope, self._warn)
        else:  # a guard of another breaker inside refused it: the service was not asked
            outcome = "ignored" if guards.refused is not None else "success"
        await settle_async(permit, outcome, self._warn, self.breaker.name)

    def _judge_exception(self, exc: BaseException, request: Request) -> str:
        """An exception thrown in at the yield (see the module docstring): an
        HTTPException by its status, an invalid request ignored, anything else
        as every integration judges it (http_policy.judge_exception)."""
        if isinstance(exc, StarletteHTTPException):
            headers = (exc.headers or {}).items()
            return judge_status(self.spec, exc.status_code, headers, request.scope, self._warn)
        if isinstance(exc, RequestValidationError):
            return "ignored"  # the request was invalid: the service was not asked
        return judge_exception(self.breaker, exc, request_guards(request.scope))

    def _warn(self, name: str, message: str) -> None:
        self._warnings.warn(name, message)

    def __repr__(self) -> str:
        return f"<BreakerGuard {self.breaker.name!r}>"


def protect(
    breakers: Breakers,
    name: str,
    config: BreakerConfig | None = None,
    **options: Any,
) -> Any:
    """``BreakerGuard(breakers, name, config, **options).depends()``: for
    ``dependencies=[protect(breakers, "pay")]`` or ``Annotated[Permit, protect(...)]``."""
    return BreakerGuard(breakers, name, config, **options).depends()
