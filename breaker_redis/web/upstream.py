"""An upstream service as the HTTP client integrations meet it: the breaker
its requests go through by default (one per host, ``host:port``), and what
its response headers say (``Retry-After``). breaker_redis.groups names its
members by the same rules. No HTTP client is imported here.

A header a service sent is read by ``parsed_header`` alone, which never
raises: a malformed one is ignored, never the reason a caller loses the
response.
"""

from __future__ import annotations

import datetime
import email.utils
import hashlib
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from breaker_redis.storage.scripts import MAX_NAME_LENGTH, validate_name

DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
# The most a Retry-After is believed (a day: the longest open period a breaker has).
MAX_RETRY_AFTER_SECONDS = 86400.0
# A derived name (derived_name): the host's readable start, "~", this many hex digits of its digest
DIGEST_CHARS = 16
_DELAY_SECONDS = re.compile(r"[0-9]+")  # Retry-After: delay-seconds, ASCII digits only (RFC 9110)


def host_name(url: str) -> str:
    """The default breaker name of a request: the host and port it goes to,
    ``api.example.com:443`` (the scheme's port when the URL names none).

    Always a valid breaker name: a host that cannot be one (longer than a
    name may be, or holding braces or whitespace, which a client may still
    accept) gets ``derived_name``'s, so that its requests stay protected and
    the same host always gets the same breaker. ValueError only for a URL
    that names no host or cannot be split (a configuration's mistake)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not host:
        raise ValueError(f"no host in the URL {url!r}")
    port = parts.port or DEFAULT_PORTS.get(parts.scheme.lower())
    if ":" in host:
        host = f"[{host}]"  # IPv6
    name = f"{host}:{port}" if port else host
    try:
        return validate_name(name)
    except ValueError:
        return derived_name(host, "" if port is None else str(port))


def derived_name(host: str, port: str = "") -> str:
    """A valid breaker name for a host that cannot be one as it is: its start
    with every character a name may not hold replaced by ``_``, then ``~`` and
    the first DIGEST_CHARS hex digits of the SHA-256 of the host and port, then
    the port: ``aaaa...aaaa~3f09a1c2b4d5e6f7:443``. The digest keeps two hosts
    apart that look alike once cut or replaced (a DNS name cannot hold ``~``,
    so no real host is named so either)."""
    key = f"{host}:{port}".encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(key).hexdigest()[:DIGEST_CHARS]
    suffix = f"~{digest}" + (f":{port}" if port else "")
    readable = "".join(char if _may_name(char) else "_" for char in host[: MAX_NAME_LENGTH - len(suffix)])
    return validate_name(readable + suffix)


def _may_name(char: str) -> bool:
    try:
        validate_name(char)
    except ValueError:
        return False
    return True


def request_name(url: str) -> str:
    """``host_name`` of a request the client has accepted: never raises, since a
    URL the client sends must not fail because of the breaker's naming rules
    (a port or an IPv6 literal urlsplit refuses gets a derived name too)."""
    try:
        return host_name(url)
    except ValueError:
        return derived_name(url.partition("//")[2].lower() or url.lower())


def member_name(value: str) -> str:
    """A breaker name as given in an option: a URL stands for its host's breaker."""
    return host_name(value) if "://" in value else validate_name(value)


H = TypeVar("H")


def parsed_header(headers: Any, name: str, parse: Callable[[str], H | None]) -> H | None:
    """A response header as ``parse`` reads it, or None when it is missing,
    undecodable or malformed. The one way the HTTP client integrations read a
    header a service sent, and it never raises: whatever bytes a service
    sends, its caller gets its response and the breaker its outcome (a header
    that cannot be read is ignored, as if it had not been sent)."""
    try:
        value = headers.get(name)
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if not isinstance(value, str):
            return None
        return parse(value)
    except Exception:
        return None


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """The seconds a ``Retry-After`` value asks to wait (delta-seconds in ASCII
    digits, or an HTTP date, one without a zone read as GMT as RFC 9110 says),
    at most MAX_RETRY_AFTER_SECONDS; None when it says nothing usable. Never
    raises: read through ``parsed_header``, but safe alone too."""
    try:
        return _retry_after(value, now)
    except Exception:  # a date past what datetime or a C long holds, or a bug: ignored, never raised
        return None


def _retry_after(value: str | None, now: float | None) -> float | None:
    if not value or not isinstance(value, str):
        return None
    value = value.strip(" \t")
    if _DELAY_SECONDS.fullmatch(value):
        seconds = float(value) if len(value) < 20 else MAX_RETRY_AFTER_SECONDS
    else:
        parsed = email.utils.parsedate_tz(value)
        if parsed is None:
            return None
        # datetime refuses what no date holds (hour 99, 31 February); no zone: GMT, as every HTTP date is
        when = datetime.datetime(*parsed[:6], tzinfo=datetime.timezone.utc).timestamp() - (parsed[9] or 0)
        seconds = when - (time.time() if now is None else now)
    if not seconds > 0:  # (not >: a NaN too)
        return None
    return min(seconds, MAX_RETRY_AFTER_SECONDS)
