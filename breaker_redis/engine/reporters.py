"""Who reports an outcome, and what Redis says of the reporters.

With ``BreakerConfig(min_reporters=N)`` above 1, a shared trip needs failures
from N reporters, and a reporter failing alone is isolated instead (docs/one-sick-host.md;
the rules are lua/_lib.lua's). A reporter is a host, as a
rule: every worker process of one host names the same one, by default the
host name, so that the workers of a sick host are isolated together.
"""

from __future__ import annotations

import re
import socket
from typing import Any

from breaker_redis.storage.scripts import text

MAX_REPORTER_LENGTH = 64  # a reporter is a hash field in Redis and a Prometheus label value
_ALLOWED = "A-Za-z0-9_.:@/+-"
_REPORTER = re.compile(f"[{_ALLOWED}]{{1,{MAX_REPORTER_LENGTH}}}")
_RULE = f"1-{MAX_REPORTER_LENGTH} characters: letters, digits and . _ - : @ / +"


def validate_reporter(value: object) -> str:
    """The reporter, if it can name one: it lives in a hash field, in the events a reply
    lists (comma-separated) and in a metric's label, so no spaces, commas or braces."""
    if not isinstance(value, str) or not _REPORTER.fullmatch(value):
        raise ValueError(f"invalid reporter {value!r}: a reporter must be {_RULE}")
    return value


def default_reporter() -> str:
    """This host's name, with any character a reporter may not hold made '_'."""
    host = re.sub(f"[^{_ALLOWED}]", "_", socket.gethostname())[:MAX_REPORTER_LENGTH]
    return host or "host"


def reporter_or_default(value: str | None) -> str:
    return default_reporter() if value is None else validate_reporter(value)


def reporters_of(raw: Any) -> dict[str, dict[str, Any]]:
    """lua/includes/quorum.lua reporters_view ({name, failures, isolated until or 0, ...}; as JSON from
    read.lua, an empty one may be {}): the reporters failing in the window and the isolated
    ones, {name: {"failures": n, "isolated_until_ms": ms or None}}, by name."""
    if not raw or isinstance(raw, dict):
        return {}
    found = {}
    for i in range(0, len(raw) - 2, 3):
        until = int(raw[i + 2])
        found[text(raw[i])] = {"failures": int(raw[i + 1]), "isolated_until_ms": until or None}
    return dict(sorted(found.items()))
