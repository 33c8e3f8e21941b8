"""The breaker of a host: the name an HTTP client integration gives the breaker
of the host a request goes to, and a breaker group's member named by its URL.

Its own module because both web/clients.py and breaker_redis/groups.py name
hosts so, and the clients check a group's type: the groups import this, never
the clients (docs/design.md, section 1). web/clients.py re-exports
``host_name``, where docs/http-clients.md names it.
"""

from __future__ import annotations

import hashlib
from urllib.parse import urlsplit

from breaker_redis.base.names import MAX_NAME_LENGTH, validate_name

DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
# A derived name (derived_name): the host's readable start, "~", this many hex digits of its digest
DIGEST_CHARS = 16


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
