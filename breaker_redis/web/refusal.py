"""The answer an HTTP client gets when a breaker refuses its request.

One refusal for every integration (Flask, any WSGI app, Starlette/FastAPI):
503, ``Retry-After`` in whole seconds, ``X-Breaker`` / ``X-Breaker-Reason``
and a friendly message, as JSON when the client asks for JSON. Users of a
deployment that mixes frameworks see one answer, and a client written
against one works against all. No web framework is imported here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from breaker_redis.base.config import BreakerConfig
from breaker_redis.base.errors import BreakerOpen

BREAKER_HEADER = "X-Breaker"
REASON_HEADER = "X-Breaker-Reason"
STATUS = 503


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


def header_value(value: str) -> str:
    """A header value as HTTP can carry it (latin-1): one beyond latin-1 (a
    breaker named in another script) is percent-encoded as UTF-8."""
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return quote(value, safe=" !#$&'()*+,-./:;<=>?@[]^_`{|}~")
    return value


def default_message(breaker: str) -> str:
    return f"The {breaker} service is temporarily unavailable, please retry later."


def _accepted(header: str) -> list[tuple[str, float]]:
    """(media type, quality) for each entry of an Accept header; entries with
    a quality that does not parse are left out, as Werkzeug does."""
    found = []
    for entry in header.split(","):
        kind, *params = (part.strip() for part in entry.split(";"))
        if not kind:
            continue
        quality = 1.0
        try:
            for param in params:
                key, _, value = param.partition("=")
                if key.strip().lower() == "q":
                    quality = min(1.0, max(0.0, float(value.strip())))
        except ValueError:
            continue
        found.append((kind.lower(), quality))
    return found


def wants_json(
    accept: str | None, content_type: str | None = None, requested_with: str | None = None
) -> bool:
    """JSON when the client names a JSON type at least as willingly as HTML;
    with no preference (no Accept, or only ``*/*``), when it sent JSON or is
    an XMLHttpRequest. curl and browsers get text."""
    json_q = html_q = 0.0
    explicit = False
    for kind, quality in _accepted(accept or ""):
        if kind == "*/*":
            continue
        explicit = True
        if kind in ("application/json", "application/*") or kind.endswith("+json"):
            json_q = max(json_q, quality)
        elif kind in ("text/html", "text/*"):
            html_q = max(html_q, quality)
    if explicit:
        return json_q > 0 and json_q >= html_q
    return "json" in (content_type or "").lower() or requested_with == "XMLHttpRequest"


def environ_wants_json(environ: Mapping[str, Any] | None) -> bool:
    """wants_json, from a WSGI environ's headers."""
    if environ is None:
        return False
    return wants_json(
        environ.get("HTTP_ACCEPT"), environ.get("CONTENT_TYPE"), environ.get("HTTP_X_REQUESTED_WITH")
    )


@dataclass(frozen=True)
class Refusal:
    """A refused request's response: status, headers and body, framework-free."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    breaker: str
    reason: str
    retry_after: int

    @classmethod
    def build(
        cls,
        refused: BreakerOpen,
        breakers: Any = None,
        *,
        as_json: bool,
        message: str | None = None,
        retry_after: int | None = None,
        config: BreakerConfig | None = None,
    ) -> Refusal:
        """The 503 an integration answers ``refused`` with (``refusal_for``): a
        guard's own refusal (``message``: its route's) or an outbound one that
        escaped the app. Every integration makes its refusal here, and only
        adapts it to its own response type, so the bytes are the same whichever
        answers. The refusing breaker's config is ``config``, else from
        ``breakers`` (the integration's Breakers, sync or asyncio; None: none)
        when it built that breaker: a forced-open one then advertises its open
        period as Retry-After (``retry_after``: whole seconds decided already,
        as a Flask BreakerOpenError carries them)."""
        name = refused.breaker
        if config is None and breakers is not None and name in breakers:
            config = breakers.get(name).config
        seconds = retry_after if retry_after is not None else retry_after_seconds(refused, config)
        text = message or default_message(refused.breaker)
        if as_json:
            document = {
                "error": "service_unavailable",
                "message": text,
                "breaker": refused.breaker,
                "reason": refused.reason,
                "retry_after": seconds,
            }
            body = json.dumps(document, ensure_ascii=False).encode()
            content_type = "application/json"
        else:
            body = f"{text}\n".encode()
            content_type = "text/plain; charset=utf-8"
        headers = [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Retry-After", str(seconds)),
            (BREAKER_HEADER, refused.breaker),
            (REASON_HEADER, refused.reason),
        ]
        return cls(STATUS, headers, body, refused.breaker, refused.reason, seconds)


refusal_for = Refusal.build  # the name the integrations call it by
