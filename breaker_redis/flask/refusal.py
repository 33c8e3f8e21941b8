"""The 503 a refused request gets, and the numbers and words in it.

Kept apart from the hooks because it is also what an outbound refusal that
escapes a view turns into, and what an app's own error handler receives.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from werkzeug.exceptions import ServiceUnavailable
from werkzeug.wrappers import Response as WerkzeugResponse

from breaker_redis.engine.errors import BreakerOpen
from breaker_redis.engine.refusal import (
    BREAKER_HEADER,
    REASON_HEADER,
    Refusal,
    default_message,
    retry_after_seconds,
)
from breaker_redis.engine.refusal import wants_json as _wants_json

__all__ = [
    "BREAKER_HEADER",
    "REASON_HEADER",
    "BreakerOpenError",
    "default_message",
    "retry_after_seconds",
    "wants_json",
]


def wants_json(environ: Mapping[str, Any] | None) -> bool:
    """breaker_redis.engine.refusal.wants_json, from a WSGI environ."""
    if environ is None:
        return False
    return _wants_json(
        environ.get("HTTP_ACCEPT"), environ.get("CONTENT_TYPE"), environ.get("HTTP_X_REQUESTED_WITH")
    )


class BreakerOpenError(ServiceUnavailable):
    """503 for a request the breaker refused. Register your own handler with
    ``@app.errorhandler(BreakerOpenError)``; ``.breaker``, ``.reason``,
    ``.retry_after`` (whole seconds) and ``.refused`` (the BreakerOpen) are there."""

    def __init__(self, refused: BreakerOpen, message: str | None = None, retry_after: int | None = None):
        self.refused = refused
        self.breaker = refused.breaker
        self.reason = refused.reason
        seconds = retry_after if retry_after is not None else retry_after_seconds(refused)
        self._retry_seconds = seconds
        super().__init__(message or default_message(refused.breaker), retry_after=seconds)

    def get_response(self, environ: Any = None, scope: Any = None) -> Any:
        # Werkzeug passes an environ dict or a request object.
        env = environ if isinstance(environ, dict) or environ is None else getattr(environ, "environ", None)
        refusal = Refusal.build(
            self.refused, as_json=wants_json(env), message=self.description, retry_after=self._retry_seconds
        )
        headers = [(k, v) for k, v in refusal.headers if k.lower() != "content-length"]
        return WerkzeugResponse(refusal.body, refusal.status, headers)
