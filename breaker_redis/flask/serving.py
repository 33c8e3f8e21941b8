"""Serving a route's fallback inside a request, and keeping good responses for it.

The fallbacks themselves (breaker_redis.fallbacks) know nothing of Flask;
this is where a request becomes their FallbackContext and what they serve
becomes a Flask response marked with ``X-Breaker-Fallback``.
"""

from __future__ import annotations

from flask import Request, Response, current_app, request

from breaker_redis.fallbacks import FALLBACK_HEADER as FALLBACK_HEADER
from breaker_redis.fallbacks import FallbackContext, FallbackResponse, Served
from breaker_redis.flask.routes import RouteSpec
from breaker_redis.flask.state import AppState
from breaker_redis.web import http_policy
from breaker_redis.web.http_policy import fallback_marks


def fallback_context(
    state: AppState, name: str, cause: BaseException | None, req: Request | None = None
) -> FallbackContext:
    """A request (the current one by default) as a fallback sees it (http_policy.fallback_context)."""
    if req is None:
        req = request._get_current_object()  # type: ignore[attr-defined]
    return http_policy.fallback_context(
        state.breakers,
        name,
        cause,
        method=req.method,
        path=req.path,
        query=req.query_string.decode("latin-1"),
        request=req,
    )


def serve(state: AppState, spec: RouteSpec, cause: BaseException | None) -> Response | None:
    """The route's fallback as a response, or None (no fallback, nothing to
    serve, or the fallback failed: a broken fallback must not become a 500)."""
    if spec.fallback is None:
        return None
    try:
        served = spec.fallback.serve(fallback_context(state, spec.name, cause))
        return None if served is None else to_response(spec.name, served, cause)
    except Exception:
        state.warn(spec.name, "the fallback of breaker %r failed")
        return None


def to_response(name: str, served: Served, cause: BaseException | None) -> Response:
    value = served.value
    if isinstance(value, FallbackResponse):
        response = current_app.response_class(value.body, value.status, list(value.headers))
    else:
        response = current_app.make_response(value)
    for header, mark in fallback_marks(name, served.kind, cause):
        response.headers[header] = mark
    return response


def freeze(response: Response) -> FallbackResponse | None:
    """The bytes, status and headers of a response, for the cache. A streamed
    body is never read here: that would consume it before the client gets it."""
    if response.is_streamed or response.direct_passthrough:
        return None
    return FallbackResponse(response.get_data(), response.status_code, tuple(response.headers.items()))
