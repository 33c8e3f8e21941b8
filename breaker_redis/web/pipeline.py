"""One request through its breaker, the same steps in every web integration:
the Flask extension, the WSGI and ASGI middlewares, the FastAPI dependency
and the HTTP clients.

- ``admit``: ask the breaker for a permit. A refusal is noted in the
  request's guards (an outer guard then counts the request as ignored,
  breaker_redis/web/routes.py) and raised as the BreakerOpen, which each
  integration answers its own way (the route's fallback or the 503 of
  breaker_redis/web/refusal.py; a client's exception). A breaker that
  cannot be asked at all is a bug, not an outage (the store gate answers
  those): the request goes through unprotected rather than the breaker
  becoming the outage. An admitted request's permit is held in its guards,
  so a guard of the same breaker inside neither asks nor records.
- ``settle``: record the outcome, judged by breaker_redis/web/http_policy.py,
  once (``Permit`` ignores a second record); recording never turns a served
  response into an error.

Why a sync and an asyncio form of each step, and not engine/steps.py's one
``async def`` run by ``run_sync`` on the sync side: these steps run on every
protected request, where that costs a coroutine and its StopIteration per
step (measured: about 11,000 instructions on a Flask request, half the
breaker call it guards), while engine/steps.py's run only where a call goes
to Redis anyway. So each form is a few lines around the breaker call, and
what follows the call is shared (``not_admitted``, ``UNRECORDED``; the sync
``admit`` writes ``admitted`` and its ``routes.hold`` inline, two calls less
per request).
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

from breaker_redis.base.errors import BreakerOpen
from breaker_redis.web.routes import GUARDS_KEY, RequestGuards, hold, note_refusal

Warn = Callable[[str, str], None]
# (the permit, the request's guards it is held in); (None, None): unprotected
Admission = tuple[Any, "RequestGuards | None"]

UNPROTECTED = "could not ask breaker %r; the request goes through unprotected"
UNRECORDED = "could not record an outcome of breaker %r"
_UNPROTECTED: Admission = (None, None)


def admit(
    breaker: Any, warn: Warn, carrier: MutableMapping[str, Any] | None = None, guard: str = ""
) -> Admission:
    """Ask a sync breaker (the module docstring). ``carrier``: the environ or scope
    the request's guards live in (None for an HTTP client's request), ``guard``:
    the breaker's guard_id there. Raises the BreakerOpen of a refusal."""
    try:
        permit = breaker.acquire()
    except Exception as exc:
        return not_admitted(exc, breaker, warn, carrier)
    if carrier is None:
        return permit, None
    # admitted() and routes.hold() (and its holding()), inline: three calls and a look-up less
    guards = carrier.get(GUARDS_KEY)
    if isinstance(guards, RequestGuards):
        guards.permits[guard] = permit
    else:
        guards = carrier[GUARDS_KEY] = RequestGuards()
        guards.permits, guards.refused = {guard: permit}, None
    return permit, guards


async def admit_async(
    breaker: Any, warn: Warn, carrier: MutableMapping[str, Any] | None = None, guard: str = ""
) -> Admission:
    """``admit`` for an asyncio breaker."""
    try:
        return admitted(await breaker.acquire(), carrier, guard)
    except Exception as exc:
        return not_admitted(exc, breaker, warn, carrier)


def admitted(permit: Any, carrier: MutableMapping[str, Any] | None, guard: str) -> Admission:
    return permit, None if carrier is None else hold(carrier, guard, permit)


def not_admitted(
    exc: Exception, breaker: Any, warn: Warn, carrier: MutableMapping[str, Any] | None
) -> Admission:
    """A refusal noted and raised again; any other exception logged: unprotected."""
    if isinstance(exc, BreakerOpen):
        if carrier is not None:
            note_refusal(carrier, breaker.name)
        raise exc
    warn(breaker.name, UNPROTECTED)
    return _UNPROTECTED


def settle(permit: Any, outcome: str, warn: Warn, name: str) -> None:
    """Record ``outcome`` of a sync breaker's permit; a failure to record is logged, never raised."""
    try:
        permit.record(outcome)
    except Exception:
        warn(name, UNRECORDED)


async def settle_async(permit: Any, outcome: str, warn: Warn, name: str) -> None:
    """``settle`` for an asyncio breaker's permit."""
    try:
        await permit.record(outcome)
    except Exception:
        warn(name, UNRECORDED)
