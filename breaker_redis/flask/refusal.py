"""The 503 a refused request gets, and the numbers and words in it.

Kept apart from the hooks because it is also what an outbound refusal that
escapes a view turns into, and what an app's own error handler receives.
"""

from __future__ import annotations

from typing import Any

from werkzeug.exceptions import ServiceUnavailable
from werkzeug.wrappers import Response as WerkzeugResponse

from breaker_redis.base.errors import BreakerOpen
from breaker_redis.web.refusal import (
    BREAKER_HEADER,
    REASON_HEADER,
    Refusal,
    default_message,
    environ_wants_json,
    refusal_for,
    retry_after_seconds,
)

__all__ = [
    "BREAKER_HEADER",
    "REASON_HEADER",
    "BreakerOpenError",
    "default_message",
    "refusal_response",
    "retry_after_seconds",
    "wants_json",
]

wants_json = environ_wants_json  # from a WSGI environ (or None)


def refusal_response(refusal: Refusal) -> WerkzeugResponse:
    """The refusal as a Werkzeug response: the bytes every integration sends."""
    headers = [(k, v) for k, v in refusal.headers if k.lower() != "content-length"]
    return WerkzeugResponse(refusal.body, refusal.status, headers)


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
        refusal = refusal_for(
            self.refused, as_json=wants_json(env), message=self.description, retry_after=self._retry_seconds
        )
        return refusal_response(refusal)
