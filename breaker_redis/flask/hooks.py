"""The walk a protected request takes through Flask.

One path for decorated views and for ``BREAKER_ROUTES`` prefixes alike:

- ``before_request`` asks the breaker for a permit; a refusal becomes the
  route's fallback or a 503 ``BreakerOpenError`` (Retry-After, a friendly
  message, JSON when the client asks for JSON) and the view never runs;
- for an admitted request only, an ``after_this_request`` function
  classifies the response (5xx or an exception: failure, anything else:
  success, configurable) and may swap a failed response for the fallback;
- the outcome is recorded when the app's ``wsgi_app`` returns (or raises):
  for every admitted request, also when the view or a hook raised, so a
  permit is always settled exactly once (the Permit itself ignores a second
  record), and before the WSGI server sends the body, so the next request
  already sees a trip this one caused.

What a request costs where no breaker guards it: the one ``before_request``
hook, which looks its view function up in a dict (the answer for each view,
found at its first request: a spec, none, or "by path" for BREAKER_ROUTES),
and the ``wsgi_app`` wrapper's look for a pending permit in the environ.
Nothing is registered for the rest of such a request.

An admitted request is the exchange every integration makes of one
(breaker_redis/web/exchange.py: its outcome judged, its permit settled once,
what its fallback remembers); what is Flask's is only when those happen.
Per-request data lives in the request's WSGI environ (under a key of the
app's own), so threaded workers share nothing.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from flask import (
    Flask,
    Response,
    current_app,
    got_request_exception,
    has_request_context,
    request,
)
from flask.globals import _cv_request
from werkzeug.exceptions import HTTPException

from breaker_redis.base.errors import BreakerOpen
from breaker_redis.flask.refusal import BreakerOpenError, refusal_response, retry_after_seconds, wants_json
from breaker_redis.flask.routes import RouteSpec
from breaker_redis.flask.serving import fallback_context, freeze, serve
from breaker_redis.flask.settings import log
from breaker_redis.flask.state import BY_PATH, EXTENSION_KEY, AppState, Guarded
from breaker_redis.web.exchange import Exchange
from breaker_redis.web.pipeline import UNRECORDED
from breaker_redis.web.pipeline import admit as admit_step
from breaker_redis.web.refusal import refusal_for
from breaker_redis.web.routes import GUARDS_KEY, held, note_refusal

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

F = TypeVar("F", bound=Callable[..., Any])

SPEC_ATTRIBUTE = "_breaker_redis_spec"
# What a view may return that Flask answers with its response class's default status, made by
# that class itself (a dict or a list goes through the app's JSON provider, which may differ).
PLAIN_BODIES = frozenset({str, bytes})
_UNKNOWN: Any = object()  # a view not met yet
# Each function protect() wrapped -> its wrapper. The function registered as a view while
# its wrapper is registered nowhere means @protect was put above @app.route: the route
# serves the bare function, unprotected (misplaced_protect).
_WRAPPED: weakref.WeakKeyDictionary[Callable[..., Any], Callable[..., Any]] = weakref.WeakKeyDictionary()


class _Exchange(Exchange):
    """The Flask part of an admitted request's exchange (web/exchange.py), kept
    in the environ from before_request to the return of ``wsgi_app``: the
    response is judged by an after-request function, and the permit settled
    when ``wsgi_app`` returns. ``request`` is the Flask request (for the
    fallback's cache key after the context is gone); ``kept``, a successful
    response, for the fallback to remember."""

    __slots__ = ("handled", "state", "view")

    state: AppState
    handled: BaseException | None  # the last exception Flask's handle_exception was given
    view: Any  # the view function Flask dispatches this request to

    def returned(self, ctx: Any, value: Any) -> Any:
        """A view of ours (protected_view) returned ``value``, the view Flask
        dispatched this request to. A str or bytes, which Flask answers with
        its response class's default status, on a route where nothing but the
        status is judged (no classify(), no fallback, no exception noted), is
        judged by that status here, as ``after`` would judge its response,
        and ``after`` is taken off the request's list: Flask checks each such
        function for a coroutine on every call (about a fifth of a breaker
        call). Any other value is left to ``after``."""
        spec = self.spec
        if (
            type(value) in PLAIN_BODIES
            and spec.classify is None
            and spec.fallback is None
            and self.exception is None
        ):
            ctx._after_request_functions.remove(self.after)
            code = ctx.app.response_class.default_status
            if self.guards.refused is not None:  # a guard inside refused: judged() says what follows
                self.outcome = self.judged(code, value)
            elif code in spec.ignore_statuses:  # else judged()'s last step, inline (one call less)
                self.outcome = "ignored"
            else:
                self.outcome = "failure" if code in spec.failure_statuses else "success"
        return value

    def after(self, response: Response) -> Response:
        """after_this_request: the outcome as every integration judges it
        (http_policy): an exception the view raised (an HTTPException by its
        response), else the response, which the route's classify() is given as
        it is; a failure may get the fallback."""
        if self.permit.recorded:
            return response
        spec, exc = self.spec, self.exception
        if exc is not None and not isinstance(exc, HTTPException):
            outcome = self.judged_exception(exc)
        else:
            outcome = self.judged(response.status_code, response)
        self.outcome = outcome
        if outcome == "success":
            self.kept = response
        elif outcome == "failure" and spec.fallback_on_failure and spec.fallback:
            served = serve(self.state, spec, self.exception)
            if served is not None:
                return served
        return response

    def finish(self, escaped: BaseException | None) -> None:
        """Record the outcome, once ``wsgi_app`` is done. An exception Flask's
        handle_exception was given (answered with a 500, or propagated), or
        a BaseException that escaped, is judged as every integration judges
        one (http_policy.judge_exception; Flask passes the same one to
        teardown_request); else the after function's verdict holds
        ("ignored" if it never ran)."""
        if self.permit.recorded:
            return
        state, spec = self.state, self.spec
        error = self.handled
        if error is None and escaped is None:
            outcome = self.outcome or "ignored"  # what nearly every request takes
        else:
            if error is None and escaped is not None and not isinstance(escaped, Exception):
                error = escaped
            if error is not None and state.app is not None and state.app.should_ignore_error(error):
                error = None
            # an error escaped the view or a later hook; else the after function's verdict
            outcome = self.judged_exception(error) if error is not None else self.outcome or "ignored"
        try:  # self.settle(), inline
            self.permit.record(outcome)
        except Exception:
            state.warn(spec.name, UNRECORDED)
        response = self.kept
        if outcome == "success" and response is not None and spec.fallback and spec.fallback.remembers:
            req = self.request
            self.remember(lambda: fallback_context(state, spec.name, None, req), lambda: freeze(response))


def install_hooks(app: Flask, state: AppState) -> None:
    """The before_request hook and the wsgi_app wrapper that settles admitted
    requests, plus the two ways an exception reaches us: Flask's signal (seen
    even when an error handler answers) and a handler for an outbound
    BreakerOpen that escaped a view."""
    state.app = app
    key = state.pending_key
    view_functions = app.view_functions
    by_view = state.by_view

    def before_request() -> Any:
        ctx: Any = _cv_request.get()  # the request context, without the proxy's steps
        req = ctx.request
        rule = req.url_rule
        view = view_functions.get(rule.endpoint) if rule is not None else None
        try:
            found = by_view.get(view, _UNKNOWN)
        except TypeError:  # a view object that cannot be hashed: found again each time
            found = _UNKNOWN
        if found is None:
            return None  # a view no breaker guards: the whole cost of an unprotected request
        guarded = found
        if type(found) is not Guarded:  # a view not met yet, or one BREAKER_ROUTES guards by path
            guarded = guarded_by(state, req, view, found)
            if guarded is None:
                return None
        # Ask the route's breaker for a permit (here, not in a function of its own: one
        # call less per request); a refusal is answered here.
        if req.method == "OPTIONS":
            return None  # CORS preflights and automatic OPTIONS never reach a service
        spec, environ = guarded.spec, req.environ
        if GUARDS_KEY in environ and held(environ, guarded.guard) is not None:
            # A WSGI middleware around the app guards this route with the same breaker:
            # it holds the request's permit, asks and records. Nothing is counted twice.
            return None
        breaker = guarded.breaker
        if breaker is None:
            breaker = guarded.breaker = state.breaker(spec.name)
        try:
            permit, guards = admit_step(breaker, state.warn, environ, guarded.guard)
        except BreakerOpen as refused:
            served = serve(state, spec, refused)
            if served is not None:
                return served
            raise BreakerOpenError(
                refused, spec.message, retry_after_seconds(refused, breaker.config)
            ) from None
        if permit is None or guards is None:
            return None  # the breaker could not be asked (a bug, logged): unprotected
        exchange = _Exchange().begin(spec, breaker, permit, guards, req, state.warn)
        exchange.state, exchange.handled, exchange.view = state, None, view
        environ[key] = exchange
        ctx._after_request_functions.append(exchange.after)  # after_this_request, one call less
        ctx._breaker_redis_exchange = exchange  # where protected_view finds it
        return None

    inner = app.wsgi_app

    def wsgi_app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        try:
            result = inner(environ, start_response)
        except BaseException as exc:
            exchange = environ.pop(key, None)
            if exchange is not None:
                exchange.finish(exc)
            raise
        exchange = environ.pop(key, None)
        if exchange is not None:
            exchange.finish(None)
        return result

    def on_exception(sender: Any, exception: BaseException, **extra: Any) -> None:
        exchange = request.environ.get(key)
        if isinstance(exchange, _Exchange):
            if exchange.exception is None:
                exchange.exception = exception
            exchange.handled = exception

    app.before_request(before_request)
    app.wsgi_app = wsgi_app  # type: ignore[method-assign]
    got_request_exception.connect(on_exception, app, weak=False)
    app.register_error_handler(BreakerOpen, inner_refusal)


def guarded_by(state: AppState, req: Any, view: Any, found: Any) -> Guarded | None:
    """What guards a request whose view's answer (``found``) is not a Guarded yet."""
    if found is _UNKNOWN:
        found = route_of_view(state, req.endpoint, view)
    if found is BY_PATH:
        found = state.table.match(req.path)
    return cast("Guarded | None", found)


def route_of_view(state: AppState, endpoint: str | None, view: Any) -> Any:
    """What guards a view's requests, found at its first request and kept: its
    own spec (``protect``), BY_PATH (BREAKER_ROUTES decides by the request's
    path) or None. A request no view matched (404, 405) goes by path too."""
    spec = getattr(view, SPEC_ATTRIBUTE, None)
    if spec is None and endpoint is not None and state.app is not None:
        misplaced = [found for found in misplaced_protect(state.app.view_functions) if found[0] == endpoint]
        if misplaced:  # registered after init_app (a blueprint): too late to refuse, so said loudly
            log.error("%s", misplaced_message(misplaced))
    if endpoint is not None and endpoint.startswith("breaker_redis."):
        found: Any = None  # the admin endpoints are never behind a breaker
    elif isinstance(spec, RouteSpec):
        found = state.guarded(spec)
    else:
        found = BY_PATH if state.table.routes else None
    with contextlib.suppress(TypeError):  # a view object that cannot be hashed is not kept
        state.by_view[view] = found
    return found


def protected_view(view: F, spec: RouteSpec) -> F:
    """The view marked with its spec (which the hooks look up by view function),
    noting any exception it raises. Seen here, an exception is classified by
    the breaker's config even when an error handler turns it into a page.

    A view already protected is refused: Flask dispatches to the outer wrapper
    only, so a second breaker would be silently unused (a route has one
    breaker; a second service is called through ``breakers.call``)."""
    existing = getattr(view, SPEC_ATTRIBUTE, None)
    if isinstance(existing, RouteSpec):
        raise TypeError(
            f"protect({spec.name!r}): {getattr(view, '__name__', view)!r} is protected by breaker "
            f"{existing.name!r} already; a route has one breaker: call a second service inside the "
            "view with breakers.call() or @breakers.outbound"
        )

    def note(exc: BaseException) -> None:
        if not has_request_context():
            return  # called directly, outside a request: nothing to note
        exchange = current_exchange()
        if exchange is not None and exchange.exception is None:
            exchange.exception = exc

    wrapper: Callable[..., Any]
    if inspect.iscoroutinefunction(view):

        @functools.wraps(view)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return await view(*args, **kwargs)
            except BaseException as exc:
                note(exc)
                raise

    else:

        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                value = view(*args, **kwargs)
            except BaseException as exc:
                note(exc)
                raise
            # The view Flask dispatched an admitted request to (not a view called by
            # another, nor one inside a decorator of the app's): judged on return.
            ctx = _cv_request.get(None)
            exchange = getattr(ctx, "_breaker_redis_exchange", None)
            if exchange is not None and exchange.view is wrapper:
                return exchange.returned(ctx, value)
            return value

    setattr(wrapper, SPEC_ATTRIBUTE, spec)
    with contextlib.suppress(TypeError):  # a view object that cannot be weakly referenced
        _WRAPPED[view] = wrapper
    return cast(F, wrapper)


def misplaced_protect(view_functions: dict[str, Callable[..., Any]]) -> list[tuple[str, str]]:
    """(endpoint, breaker) of each route that serves a function protect() wrapped
    while the wrapper is registered nowhere: ``@breakers.protect`` above
    ``@app.route``, which leaves the route unprotected without a word."""
    registered = {id(view) for view in view_functions.values()}
    found = []
    for endpoint, view in view_functions.items():
        try:
            wrapper = _WRAPPED.get(view)
        except TypeError:  # not weakly referenceable: never wrapped
            continue
        if wrapper is not None and id(wrapper) not in registered:
            found.append((endpoint, getattr(wrapper, SPEC_ATTRIBUTE).name))
    return found


def misplaced_message(found: list[tuple[str, str]]) -> str:
    routes = ", ".join(f"endpoint {endpoint!r} (breaker {name!r})" for endpoint, name in found)
    return (
        f"@breakers.protect is above @app.route for {routes}: the route serves the view "
        "unprotected; put @breakers.protect below @app.route (or @bp.route)"
    )


def current_exchange() -> _Exchange | None:
    """The admitted request being handled by the current app, if any."""
    state = current_app.extensions.get(EXTENSION_KEY)
    if not isinstance(state, AppState):
        return None
    exchange = request.environ.get(state.pending_key)
    return exchange if isinstance(exchange, _Exchange) else None


def inner_refusal(refused: BreakerOpen) -> Any:
    """An outbound breaker refused inside a view and nobody caught it: 503.
    The route's own breaker ignores this request (its service was not asked)."""
    # The route's own hooks and a WSGI middleware around the app see it in the request's guards.
    note_refusal(request.environ, refused.breaker)
    state = current_app.extensions.get(EXTENSION_KEY)
    breakers = state.breakers if isinstance(state, AppState) else None
    return refusal_response(refusal_for(refused, breakers, as_json=wants_json(request.environ)))
