"""The 503 a refused request gets, and the numbers and words in it.

Kept apart from the hooks because it is also what an outbound refusal that
escapes a view turns into, and what an app's own error handler receives.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from werkzeug.datastructures import MIMEAccept
from werkzeug.exceptions import ServiceUnavailable
from werkzeug.http import parse_accept_header
from werkzeug.wrappers import Response as WerkzeugResponse

from ..config import BreakerConfig
from ..errors import BreakerOpen

BREAKER_HEADER = "X-Breaker"
REASON_HEADER = "X-Breaker-Reason"


def retry_after_seconds(refused: BreakerOpen, config: BreakerConfig | None = None) -> int:
    """Retry-After in whole seconds, at least 1.

    Unknown (a half-open breaker whose probe slots are taken, a full
    bulkhead) means "soon": 1 s. A forced-open breaker has no end, so it
    advertises the breaker's open period rather than inviting a retry storm.
    """
    if refused.retry_after is not None:
        return max(1, math.ceil(refused.retry_after))
    if refused.reason == "forced_open" and config is not None:
        return max(1, math.ceil(config.open_seconds))
    return 1


def default_message(breaker: str) -> str:
    return f"The {breaker} service is temporarily unavailable, please retry later."


def wants_json(environ: Mapping[str, Any] | None) -> bool:
    """JSON when the client names a JSON type at least as willingly as HTML;
    with no preference (no Accept, or only ``*/*``), when it sent JSON or is
    an XMLHttpRequest. curl and browsers get text."""
    if environ is None:
        return False
    accept = parse_accept_header(environ.get("HTTP_ACCEPT"), MIMEAccept)
    json_q = html_q = 0.0
    explicit = False
    for value, quality in accept:
        kind = value.lower()
        if kind == "*/*":
            continue
        explicit = True
        if kind in ("application/json", "application/*") or kind.endswith("+json"):
            json_q = max(json_q, quality)
        elif kind in ("text/html", "text/*"):
            html_q = max(html_q, quality)
    if explicit:
        return json_q > 0 and json_q >= html_q
    content_type = str(environ.get("CONTENT_TYPE", "")).lower()
    return "json" in content_type or environ.get("HTTP_X_REQUESTED_WITH") == "XMLHttpRequest"


class BreakerOpenError(ServiceUnavailable):
    """503 for a request the breaker refused. Register your own handler with
    ``@app.errorhandler(BreakerOpenError)``; ``.breaker``, ``.reason``,
    ``.retry_after`` (whole seconds) and ``.refused`` (the BreakerOpen) are there."""

    def __init__(self, refused: BreakerOpen, message: str | None = None, retry_after: int | None = None):
        self.refused = refused
        self.breaker = refused.breaker
        self.reason = refused.reason
        seconds = retry_after if retry_after is not None else retry_after_seconds(refused)
        super().__init__(message or default_message(refused.breaker), retry_after=seconds)

    def get_response(self, environ: Any = None, scope: Any = None) -> Any:
        # Werkzeug passes an environ dict or a request object.
        env = environ if isinstance(environ, dict) or environ is None else getattr(environ, "environ", None)
        headers = [*self.get_headers(env), (BREAKER_HEADER, self.breaker), (REASON_HEADER, self.reason)]
        if wants_json(env):
            body = json.dumps(
                {
                    "error": "service_unavailable",
                    "message": self.description,
                    "breaker": self.breaker,
                    "reason": self.reason,
                    "retry_after": self.retry_after,
                },
                ensure_ascii=False,
            )
            headers = [(k, v) for k, v in headers if k.lower() != "content-type"]
            headers.append(("Content-Type", "application/json"))
        else:
            body = f"{self.description}\n"
            headers = [(k, v) for k, v in headers if k.lower() != "content-type"]
            headers.append(("Content-Type", "text/plain; charset=utf-8"))
        return WerkzeugResponse(body, self.code, headers)
