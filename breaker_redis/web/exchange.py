"""One admitted request, from its permit to its recorded outcome: the one
exchange of the Flask extension and of the WSGI and ASGI middlewares.

Each integration admits a request with web/pipeline.py's ``admit`` and makes
an ``Exchange`` of what that gave it: the route's spec and breaker, the
permit, the request's guards (web/routes.py) and the request as the
protocol has it. What the exchange decides is the same everywhere:

- the outcome of a response, by its status (``judged``: the route's
  classify(), then its status lists, http_policy.judge) or of an exception
  that ended the request before its response (``judged_exception``);
- that the permit is settled exactly once (``settle``, web/pipeline.py's
  step; ``Permit`` ignores a second record), and never leaks;
- whether the route's fallback answers in the app's place (``answers``) and
  which successful body it is handed to remember (``keep``,
  ``kept_response``, ``remember``).

What differs per protocol is only its timing and its I/O: when a response
counts as started and how its status is read, how an answer goes to the
server, and whether a step is a call or an await. Each integration adds
only that, as a subclass with no state of its own beyond its protocol's
(breaker_redis/flask/hooks.py: the after-request function, the view's
return and the settle when ``wsgi_app`` returns; breaker_redis/wsgi.py:
``start_response`` held back and the body's iterable; breaker_redis/asgi.py:
the ``send`` the app awaits). No web framework is imported here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Self
from wsgiref.headers import Headers

from breaker_redis.base.errors import BreakerOpen
from breaker_redis.fallbacks import FallbackContext, FallbackResponse
from breaker_redis.web.http_policy import ResponseInfo, judge, judge_exception, remember_limit
from breaker_redis.web.pipeline import Warn, settle
from breaker_redis.web.routes import RequestGuards, RouteSpec

# What follows an exception that ended an admitted request before its response started.
RAISE, FALLBACK, REFUSED = "raise", "fallback", "refused"
FALLBACK_FAILED = "the fallback of breaker %r failed"
# Not re-raised (the client has a whole answer), but not hidden either: logged with its
# traceback, at most once a minute per breaker.
FALLBACK_ANSWERED = "a request of breaker %r raised; its fallback answered"
UNREMEMBERED = "could not remember a response of breaker %r"


class Exchange:
    """One admitted request: its route, permit and guards, and what is known of
    its response so far.

    ``status`` and ``headers``: the response's, as the protocol gives them
    (None until it does); ``outcome``: a verdict reached before the permit is
    settled (Flask judges in an after-request function and settles when its
    ``wsgi_app`` returns); ``exception``: the first exception the request
    raised, noted where it is seen; ``committed``: the response's status (the
    app's or ours) went to the server; ``replaced``: an answer of ours went
    instead of the app's; ``kept``: a successful body, or the response
    itself (Flask), for the route's fallback to remember.
    """

    __slots__ = (
        "breaker",
        "committed",
        "exception",
        "guards",
        "headers",
        "kept",
        "kept_limit",
        "kept_size",
        "outcome",
        "permit",
        "replaced",
        "request",
        "spec",
        "status",
        "warn",
    )

    # How classify() is given the response: None, the response itself (Flask's, which
    # reads as a ResponseInfo); else the protocol's ResponseInfo, built from the
    # exchange (``judged(code, self)``) with the request as its users know it.
    info: ClassVar[Callable[..., ResponseInfo] | None] = None
    kept: Any
    kept_limit: int
    kept_size: int

    # Made as ``Exchange().begin(...)``, not by an __init__: a class whose __init__ is
    # Python code costs a frame of the interpreter's own to make, on every request.
    def begin(
        self, spec: RouteSpec, breaker: Any, permit: Any, guards: RequestGuards, request: Any, warn: Warn
    ) -> Self:
        self.spec = spec
        self.breaker = breaker
        self.permit = permit
        self.guards = guards  # where a guard inside notes a refusal
        self.request = request
        self.warn = warn
        self.status: Any = None
        self.headers: Any = ()
        self.outcome: str | None = None
        self.exception: BaseException | None = None
        self.committed = False
        self.replaced = False
        self.kept = None
        return self

    # -- deciding ---------------------------------------------------------------------------

    def judged(self, code: int, subject: Any) -> str:
        """The outcome of a response of status ``code``: ``subject`` is what the
        route's classify() is given (through the protocol's ``info``, if any)."""
        spec = self.spec
        if spec.classify is None and self.guards.refused is None:
            # http_policy.judge's last step, inline: what nearly every response takes
            if code in spec.ignore_statuses:
                return "ignored"
            return "failure" if code in spec.failure_statuses else "success"
        info = None if self.info is None else response_info
        return judge(spec, code, subject, info, self.warn, self.guards)

    def judged_exception(self, exc: BaseException) -> str:
        """The outcome of an exception that ended the request before its response
        (http_policy.judge_exception: a refusal, a cancellation or an exit is ignored)."""
        return judge_exception(self.breaker, exc, self.guards)

    def after_exception(self, exc: BaseException) -> tuple[str, str]:
        """(the outcome to record, what follows) for an exception that ended the
        request before its response started: an outbound refusal is ignored and
        answered with its 503 (REFUSED); anything else is judged and answered by
        the route's fallback when it answers that (FALLBACK), else re-raised (RAISE)."""
        if isinstance(exc, BreakerOpen):
            return "ignored", REFUSED
        outcome = self.judged_exception(exc)
        if self.spec.fallback is not None and self.answers(outcome, False):
            return outcome, FALLBACK
        return outcome, RAISE

    def answers(self, outcome: str, head: bool) -> bool:
        """Whether the route's fallback answers in the app's place after ``outcome``
        (asked only when the route has a fallback, so a route without costs
        nothing): a failure, unless ``fallback_on_failure`` is off. A success
        has its body kept when the fallback remembers (not for HEAD)."""
        spec = self.spec
        if outcome == "failure":
            return spec.fallback_on_failure
        if outcome == "success" and spec.fallback is not None and not head:
            limit = remember_limit(spec.fallback)
            if limit > 0:
                self.kept, self.kept_size, self.kept_limit = [], 0, limit
        return False

    def settle(self, outcome: str) -> None:
        """Record ``outcome`` (sync breakers; an asyncio exchange awaits pipeline.settle_async)."""
        settle(self.permit, outcome, self.warn, self.spec.name)

    # -- what the route's fallback remembers ------------------------------------------------

    def keep(self, chunk: bytes) -> None:
        """A chunk of a kept body, until it is more than the fallback would keep."""
        if self.kept is not None:
            self.kept_size += len(chunk)
            if self.kept_size > self.kept_limit:
                self.kept = None  # too big to cache: stop holding it
            else:
                self.kept.append(chunk)

    def kept_response(self) -> FallbackResponse | None:
        """The whole successful response, taken for the route's fallback to remember
        (a body cut short never is), or None: nothing was kept."""
        kept, self.kept = self.kept, None
        if kept is None:
            return None
        return FallbackResponse(b"".join(kept), self.code(), tuple(self.header_pairs()))

    def remember(
        self, context: Callable[[], FallbackContext], response: Callable[[], FallbackResponse | None]
    ) -> None:
        """Hand the successful ``response()`` (None: nothing to remember) to the
        route's fallback, sync (``cached`` writes Redis here); a failure to make
        or remember it is logged, never raised."""
        fallback = self.spec.fallback
        if fallback is None:
            return
        try:
            made = response()
            if made is not None:
                fallback.remember(context(), made)
        except Exception:
            self.warn(self.spec.name, UNREMEMBERED)

    # -- the response's status and headers, as each protocol reads them ---------------------

    def code(self) -> int:
        raise NotImplementedError

    def status_text(self) -> str:
        raise NotImplementedError

    def header_pairs(self) -> list[tuple[str, str]]:
        raise NotImplementedError


def response_info(exchange: Exchange) -> ResponseInfo:
    """What a middleware's classify() is given: status, headers and the request."""
    info = exchange.info
    assert info is not None
    return info(exchange.code(), exchange.status_text(), Headers(exchange.header_pairs()), exchange.request)
