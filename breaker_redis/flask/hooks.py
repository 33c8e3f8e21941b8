"""The walk a protected request takes through Flask's hooks.

One path for decorated views and for ``BREAKER_ROUTES`` prefixes alike:

- ``before_request`` asks the breaker for a permit; a refusal becomes the
  route's fallback or a 503 ``BreakerOpenError`` (Retry-After, a friendly
  message, JSON when the client asks for JSON) and the view never runs;
- ``after_request`` classifies the response (5xx or an exception: failure,
  anything else: success, configurable) and may swap a failed response for
  the fallback;
- ``teardown_request`` records the outcome. It runs for every request, also
  when the view or a later hook raised, so a permit is always settled
  exactly once (the Permit itself ignores a second record), and it runs
  before the WSGI server sends the body, so the next request already sees a
  trip this one caused.

All per-request data lives in ``flask.g``, so threaded workers share nothing.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from flask import Flask, Response, current_app, g, got_request_exception, has_request_context, request
from werkzeug.exceptions import HTTPException

from ..breaker import Breaker
from ..errors import BreakerOpen
from ..permit import Permit
from ..routes import held_permit, hold_permit, note_refusal
from .refusal import BreakerOpenError, retry_after_seconds
from .routes import RouteSpec, prefix_matches
from .serving import fallback_context, freeze, serve
from .state import EXTENSION_KEY, AppState

F = TypeVar("F", bound=Callable[..., Any])

SPEC_ATTRIBUTE = "_breaker_redis_spec"
PENDING_KEY = "_breaker_redis"


@dataclass
class Pending:
    """One admitted request, kept in ``flask.g`` from before_request to teardown."""

    spec: RouteSpec
    breaker: Breaker
    permit: Permit
    exception: BaseException | None = None
    refused_inside: bool = False
    outcome: str | None = None
    response: Response | None = None


def install_hooks(app: Flask, state: AppState) -> None:
    """The three hooks, plus the two ways an exception reaches us: Flask's
    signal (seen even when an error handler answers) and a handler for an
    outbound BreakerOpen that escaped a view."""
    app.before_request(lambda: before_request(state))
    app.after_request(lambda response: after_request(state, response))
    app.teardown_request(lambda exc: teardown_request(state, exc))
    got_request_exception.connect(on_exception, app, weak=False)
    app.register_error_handler(BreakerOpen, inner_refusal)


def protected_view(view: F, spec: RouteSpec) -> F:
    """The view marked with its spec (which the hooks look up by endpoint),
    noting any exception it raises. Seen here, an exception is classified by
    the breaker's config even when an error handler turns it into a page."""

    def note(exc: BaseException) -> None:
        if not has_request_context():
            return  # called directly, outside a request: nothing to note
        pending = g.get(PENDING_KEY)
        if isinstance(pending, Pending) and pending.exception is None:
            pending.exception = exc

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
                return view(*args, **kwargs)
            except BaseException as exc:
                note(exc)
                raise

    setattr(wrapper, SPEC_ATTRIBUTE, spec)
    return cast(F, wrapper)


def spec_for_request(state: AppState) -> RouteSpec | None:
    endpoint = request.endpoint
    if endpoint is not None:
        if endpoint.startswith("breaker_redis."):
            return None  # the admin endpoints are never behind a breaker
        view = current_app.view_functions.get(endpoint)
        spec = getattr(view, SPEC_ATTRIBUTE, None)
        if isinstance(spec, RouteSpec):
            return spec
    path = request.path
    for prefix, spec in state.routes:
        if prefix_matches(prefix, path):
            return spec
    return None


def before_request(state: AppState) -> Any:
    if request.method == "OPTIONS":
        return None  # CORS preflights and automatic OPTIONS never reach a service
    spec = spec_for_request(state)
    if spec is None:
        return None
    environ, prefix = request.environ, state.breakers.prefix
    if held_permit(environ, prefix, spec.name) is not None:
        # A WSGI middleware around the app guards this route with the same breaker:
        # it holds the request's permit, asks and records. Nothing is counted twice.
        return None
    breaker = state.breaker(spec.name)
    try:
        permit = breaker.acquire()
    except BreakerOpen as refused:
        note_refusal(environ, spec.name)
        served = serve(state, spec, refused)
        if served is not None:
            return served
        raise BreakerOpenError(refused, spec.message, retry_after_seconds(refused, breaker.config)) from None
    except Exception:
        # Not an outage (the store gate handles those) but a bug: let the
        # request through rather than turn the breaker into the outage.
        state.warn(spec.name, "could not ask breaker %r; the request goes through unprotected")
        return None
    setattr(g, PENDING_KEY, Pending(spec, breaker, permit))
    hold_permit(environ, prefix, spec.name, permit)
    return None


def on_exception(sender: Any, exception: BaseException, **extra: Any) -> None:
    pending = g.get(PENDING_KEY)
    if isinstance(pending, Pending) and pending.exception is None:
        pending.exception = exception


def inner_refusal(refused: BreakerOpen) -> Any:
    """An outbound breaker refused inside a view and nobody caught it: 503.
    The route's own breaker ignores this request (its service was not asked)."""
    pending = g.get(PENDING_KEY)
    if isinstance(pending, Pending):
        pending.refused_inside = True
    note_refusal(request.environ, refused.breaker)  # and a WSGI middleware around the app ignores it
    config = None
    state = current_app.extensions.get(EXTENSION_KEY)
    if isinstance(state, AppState) and refused.breaker in state.resolved:
        config = state.resolved[refused.breaker].config
    error = BreakerOpenError(refused, None, retry_after_seconds(refused, config))
    return error.get_response(request.environ)


def classify(pending: Pending, response: Response) -> str:
    """success, failure or ignored: an exception by the breaker's config,
    else the route's classify(), else its status lists."""
    if pending.refused_inside or isinstance(pending.exception, BreakerOpen):
        return "ignored"
    exc = pending.exception
    if exc is not None and not isinstance(exc, HTTPException):
        return pending.breaker.classify(exc)
    spec = pending.spec
    if spec.classify is not None:
        verdict = spec.classify(response)
        if verdict is True:
            return "failure"
        if verdict is False:
            return "success"
        if verdict in ("success", "failure", "ignored"):
            return verdict
        if verdict is not None:
            raise ValueError(f"classify() of breaker {spec.name!r} returned {verdict!r}")
    if response.status_code in spec.ignore_statuses:
        return "ignored"
    if response.status_code in spec.failure_statuses:
        return "failure"
    return "success"


def after_request(state: AppState, response: Response) -> Response:
    pending = g.get(PENDING_KEY)
    if not isinstance(pending, Pending) or pending.permit.recorded:
        return response
    try:
        outcome = classify(pending, response)
    except Exception:
        state.warn(pending.spec.name, "classify() of breaker %r raised; counted as a failure")
        outcome = "failure"
    pending.outcome = outcome
    if outcome == "success":
        pending.response = response
    elif outcome == "failure" and pending.spec.fallback_on_failure and pending.spec.fallback:
        served = serve(state, pending.spec, pending.exception)
        if served is not None:
            return served
    return response


def teardown_request(state: AppState, exc: BaseException | None) -> None:
    pending = g.pop(PENDING_KEY, None)
    if not isinstance(pending, Pending) or pending.permit.recorded:
        return
    if exc is not None and not pending.refused_inside:
        outcome = pending.breaker.classify(exc)  # escaped the view or a later hook
    else:
        outcome = pending.outcome or "ignored"
    try:
        pending.permit.record(outcome)
    except Exception:  # a teardown that raises would turn a served response into a 500
        state.warn(pending.spec.name, "could not record an outcome of breaker %r")
    fallback = pending.spec.fallback
    if outcome == "success" and pending.response is not None and fallback and fallback.remembers:
        try:
            frozen = freeze(pending.response)
            if frozen is not None:
                fallback.remember(fallback_context(state, pending.spec.name, None), frozen)
        except Exception:
            state.warn(pending.spec.name, "could not remember a response of breaker %r")
