"""What the HTTP client integrations share: breaker_redis.requests (an adapter
for a requests Session) and breaker_redis.httpx (transports for httpx.Client
and httpx.AsyncClient). No HTTP client is imported here.

One breaker per upstream host by default (``host:port``), so a payment API
that fails is refused for every worker while the inventory API next to it
keeps being called. A request goes through one permit (an ``Exchange``):
asked before the request is sent (a refusal never sends it), judged when the
response's status and headers arrive, and settled once its body is read to
the end or closed, so that a body the service fails to deliver (a reset, a
stall past the read timeout, a body cut short) counts as the failure it is.
A failing status settles at once: nothing in the body can change it.

What counts as a failure: a connection error or a timeout, a body that
fails mid-read, and a response whose status is in ``failure_statuses`` (5xx
and 429 by default), judged as the server-side integrations judge a route's
response (``http_policy.judge``). A failing response whose service said when
to come back (``Retry-After``) keeps the breaker open at least that long, for
every worker (``Breaker.hold_open``). A header a service sent is read by
``parsed_header`` alone, which never raises: a malformed one is ignored, never
the reason a caller loses the response.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import email.utils
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from breaker_redis.base.config import BreakerConfig
from breaker_redis.base.errors import BreakerOpen
from breaker_redis.base.names import validate_name
from breaker_redis.web.hosts import host_name as host_name
from breaker_redis.web.hosts import member_name, request_name
from breaker_redis.web.http_policy import Warnings, judge
from breaker_redis.web.routes import DEFAULT_FAILURE_STATUSES as ROUTE_FAILURE_STATUSES
from breaker_redis.web.routes import RouteSpec, route_config, status_codes


class Response(Protocol):
    """What a client library's response is read for here: its status."""

    status_code: int


R = TypeVar("R", bound=Response)

# 5xx: the service failed; 429: the service says it is overloaded. Both ask the caller to back off.
DEFAULT_FAILURE_STATUSES = ROUTE_FAILURE_STATUSES | {429}
HOSTS_KEPT = 1024  # origins whose breaker name an adapter or transport keeps
# The most a Retry-After is believed (a day: the longest open period a breaker has).
MAX_RETRY_AFTER_SECONDS = 86400.0

NameRule = Callable[[Any], str]


log = logging.getLogger("breaker_redis")

_DELAY_SECONDS = re.compile(r"[0-9]+")  # Retry-After: delay-seconds, ASCII digits only (RFC 9110)


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


class Outbound:
    """The options of one adapter or transport, checked when it is built (a bad
    one is an error naming it), and the breaker and rules of each request.

    ``breakers``: a ``Breakers`` (sync) or a ``breaker_redis.asyncio.Breakers``.
    ``name``: a breaker name for every request, or ``name(request) -> str``
    (default: the request's ``host:port``). ``config``: the config of every
    host's breaker (default: the Breakers' defaults); ``configs``: per breaker
    name (or URL), a BreakerConfig or a dict of fields over ``config``.
    ``failure_statuses``, ``ignore_statuses`` and ``classify(response)`` judge a
    response as the route options do (docs/flask.md). ``honor_retry_after``:
    a failing response's Retry-After keeps an open breaker open that long.
    """

    def __init__(
        self,
        breakers: Any,
        *,
        name: str | NameRule | None,
        config: BreakerConfig | None,
        configs: Mapping[str, BreakerConfig | Mapping[str, Any]] | None,
        failure_statuses: Iterable[int] | None,
        ignore_statuses: Iterable[int] | None,
        classify: Callable[[Any], str | bool | None] | None,
        honor_retry_after: bool,
        where: str,
        groups: Iterable[Any] = (),
        asynchronous: bool = False,
    ) -> None:
        from breaker_redis.asyncio import Breakers as AsyncBreakers
        from breaker_redis.engine.breakers import Breakers

        wanted = AsyncBreakers if asynchronous else Breakers
        if not isinstance(breakers, wanted):
            kind = "breaker_redis.asyncio.Breakers" if asynchronous else "breaker_redis.Breakers"
            raise TypeError(f"{where}: breakers must be a {kind} (got {breakers!r})")
        self.breakers = breakers
        self.where = where
        if isinstance(name, str):
            self._fixed: str | None = _checked_name(name, f"{where}: name")
            self._rule: NameRule | None = None
        elif name is None or callable(name):
            self._fixed, self._rule = None, name
        else:
            why = "must be a breaker name or a callable name(request)"
            raise TypeError(f"{where}: name {why} (got {name!r})")
        if config is not None and not isinstance(config, BreakerConfig):
            raise TypeError(f"{where}: config must be a BreakerConfig (got {config!r})")
        self.config = config or breakers.defaults
        self.configs = self._per_name(configs)
        if classify is not None and not callable(classify):
            raise TypeError(f"{where}: classify must be callable or None (got {classify!r})")
        if not isinstance(honor_retry_after, bool):
            raise TypeError(f"{where}: honor_retry_after must be True or False (got {honor_retry_after!r})")
        self.honor_retry_after = honor_retry_after
        self._spec = RouteSpec(
            name=where,
            failure_statuses=status_codes(
                failure_statuses, DEFAULT_FAILURE_STATUSES, where, "failure_statuses"
            ),
            ignore_statuses=status_codes(ignore_statuses, frozenset(), where, "ignore_statuses"),
            classify=classify,
        )
        self.groups = self._members(groups, asynchronous)
        self._hosts: dict[str, str] = {}  # scheme://host:port -> its breaker's name
        self._resolved: dict[str, tuple[Any, RouteSpec]] = {}
        self._warnings = Warnings()

    def _members(self, groups: Iterable[Any], asynchronous: bool) -> dict[str, Any]:
        """Each member's group (breaker_redis.groups); a member has its group's config."""
        from breaker_redis.groups import AsyncBreakerGroup, BreakerGroup

        wanted = AsyncBreakerGroup if asynchronous else BreakerGroup
        if isinstance(groups, (str, bytes, wanted)) or not isinstance(groups, Iterable):
            raise TypeError(f"{self.where}: groups must be a list of {wanted.__name__} (got {groups!r})")
        found: dict[str, Any] = {}
        for group in groups:
            if not isinstance(group, wanted):
                raise TypeError(f"{self.where}: groups must hold {wanted.__name__}s (got {group!r})")
            if group.breakers is not self.breakers:
                raise ValueError(f"{self.where}: group {group.name!r} is built on other Breakers")
            for member in group.members:
                if member in self.configs:
                    raise ValueError(f"{self.where}: {member!r} has a config in configs and in group "
                                     f"{group.name!r}: a member's config is its group's")
                found[member] = group
        return found

    def _per_name(
        self, configs: Mapping[str, BreakerConfig | Mapping[str, Any]] | None
    ) -> dict[str, BreakerConfig]:
        if configs is None:
            return {}
        if not isinstance(configs, Mapping):
            raise TypeError(f"{self.where}: configs must map breaker names (or URLs) to configs")
        found: dict[str, BreakerConfig] = {}
        for key, value in configs.items():
            where = f"{self.where}: configs[{key!r}]"
            if not isinstance(key, str):
                raise TypeError(f"{where}: the key must be a breaker name or a URL")
            name = _checked_name(key, where, url=True)
            if isinstance(value, BreakerConfig):
                found[name] = value
            elif isinstance(value, Mapping):
                found[name] = route_config(self.config, value, where)
            else:
                raise TypeError(f"{where}: give a BreakerConfig or a dict of its fields (got {value!r})")
        return found

    def name_of(self, request: Any, url: str) -> str:
        if self._fixed is not None:
            return self._fixed
        if self._rule is None:
            end = url.find("/", url.find("//") + 2)
            origin = url if end < 0 else url[:end]  # scheme://host:port, the part host_name reads
            name = self._hosts.get(origin)
            if name is None:
                if len(self._hosts) >= HOSTS_KEPT:
                    self._hosts.clear()
                name = self._hosts[origin] = request_name(origin)
            return name
        return _checked_name(self._rule(request), f"{self.where}: name(request)")

    def resolve(self, request: Any, url: str) -> tuple[Any, RouteSpec]:
        """The breaker of this request (built on first use, no I/O) and how its responses are judged."""
        name = self.name_of(request, url)
        found = self._resolved.get(name)
        if found is None:
            group = self.groups.get(name)
            if group is not None:
                breaker = group.breaker(name)
            else:
                breaker = self.breakers.get(name, self.configs.get(name, self.config))
            found = self._resolved[name] = (breaker, dataclasses.replace(self._spec, name=name))
        return found

    def group_due(self, name: str) -> Any:
        """The group of this breaker if it has something to settle (breaker_redis.groups), else None."""
        group = self.groups.get(name)
        return group if group is not None and group.due else None

    def judge(self, spec: RouteSpec, status: int, response: Any) -> str:
        return judge(spec, status, response, None, self._warnings.warn)

    def warn(self, name: str, message: str, *, traceback: bool = True) -> None:
        self._warnings.warn(name, message, traceback=traceback)

    def hold_for(self, breaker: Any, outcome: str, response: Any) -> float | None:
        """How long to keep the breaker open after this outcome (None: nothing to do):
        the Retry-After of a failing response, once the breaker is open."""
        if outcome != "failure" or not self.honor_retry_after:
            return None
        seconds = parsed_header(response.headers, "Retry-After", retry_after_seconds)
        if seconds is None:
            return None
        known = breaker.known
        return seconds if known is not None and known.state == "open" and not known.forced else None


class OutboundClient:
    """What an adapter or a transport (breaker_redis.requests, breaker_redis.httpx)
    takes, checked when it is built (Outbound, named after the class), then the
    client library's own options, which ``_attach`` hands to its base."""

    _asynchronous = False

    def __init__(
        self,
        breakers: Any,
        *args: Any,
        name: str | NameRule | None = None,
        config: BreakerConfig | None = None,
        configs: Mapping[str, BreakerConfig | Mapping[str, Any]] | None = None,
        failure_statuses: Iterable[int] | None = None,
        ignore_statuses: Iterable[int] | None = None,
        classify: Callable[[Any], str | bool | None] | None = None,
        honor_retry_after: bool = True,
        groups: Iterable[Any] = (),
        **options: Any,
    ) -> None:
        self.outbound = Outbound(
            breakers,
            name=name,
            config=config,
            configs=configs,
            failure_statuses=failure_statuses,
            ignore_statuses=ignore_statuses,
            classify=classify,
            honor_retry_after=honor_retry_after,
            where=type(self).__name__,
            groups=groups,
            asynchronous=self._asynchronous,
        )
        self._attach(*args, **options)

    def _attach(self, *args: Any, **options: Any) -> None:
        raise NotImplementedError


def _checked_name(value: Any, where: str, *, url: bool = False) -> str:
    try:
        if url and isinstance(value, str):
            return member_name(value)
        return validate_name(value)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}: {exc}") from None




# -- one request through its breaker ---------------------------------------------------------------


class Settler:
    """Settles the permits of responses dropped without being read to the end
    or closed, in a daemon thread of its own (one per process, started again
    in a forked child). A finalizer must not do I/O: it may run inside any
    code of its thread, a lock of redis-py's held, and recording a permit
    takes that lock; so it only hands the job over (``SimpleQueue.put`` is
    safe there, which is what it is for), and the job runs here."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._jobs: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()

    def ready(self) -> None:
        """Start the thread in this process unless it runs: called in ordinary code,
        where a body is watched, never in a finalizer (a thread's start takes locks)."""
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid == os.getpid():
                return
            self._jobs = queue.SimpleQueue()  # a forked child's: the parent's may have been mid-put
            threading.Thread(target=self._run, args=(self._jobs,), name="breaker_redis-settler",
                             daemon=True).start()
            self._pid = os.getpid()

    def put(self, job: Callable[[], object]) -> None:
        self._jobs.put(job)

    @staticmethod
    def _run(jobs: queue.SimpleQueue[Callable[[], object]]) -> None:
        while True:
            job = jobs.get()
            try:
                job()
            except Exception:  # the thread must outlive one failed job
                log.exception("settling the permit of an HTTP response dropped unclosed failed")


SETTLER = Settler()
_TASKS: set[asyncio.Task[None]] = set()  # settling tasks started by finalizers, kept until done


def settle_on_loop(loop: asyncio.AbstractEventLoop, job: Callable[[], Awaitable[None]]) -> None:
    """From a finalizer: run ``job()`` as a task on ``loop`` (an asyncio permit is
    recorded on its own loop). ``call_soon_threadsafe`` takes no lock, so it is safe
    there; a loop already closed drops the job, and a probe's lease then expires."""

    def start() -> None:
        task = asyncio.ensure_future(job())
        _TASKS.add(task)
        task.add_done_callback(_TASKS.discard)

    with contextlib.suppress(RuntimeError):  # the loop is closed
        loop.call_soon_threadsafe(start)


class ExchangeState:
    """One request through its breaker: asking for the permit (``ask``),
    judging the response at its headers (``answered``), and settling the
    permit once the body is read to the end (``body_ended``), fails mid-read
    (``body_failed``: a failure when ``body_failures`` says the service broke
    it), or is closed before its end (``body_closed``: as its status says).

    A failing status settles at once; any other waits for the body, so that
    every outcome of the call, reading its body included, reaches the breaker
    exactly once. The state is kept under a lock: a body may be closed from
    another thread (the Settler's). This class holds the state and the rules;
    Exchange takes the steps on the sync side, AsyncExchange awaits them."""

    def __init__(
        self,
        outbound: Outbound,
        request: Any,
        url: str,
        refused: Callable[[BreakerOpen, Any], BaseException],
        failures: Callable[[BaseException], bool],
        body_failures: Callable[[BaseException], bool] | None = None,
    ) -> None:
        self.outbound = outbound
        self.breaker, self.spec = outbound.resolve(request, url)
        self.request = request
        self.refused = refused
        self.failures = failures
        self.body_failures = body_failures or failures
        self.permit: Any = None
        self.asked = False
        self.outcome: str | None = None  # the status's verdict, once judged
        self.body: str | None = None  # "end", "failed" or "closed", once known
        self.answered_ms: int | None = None  # when the headers came (the breaker's clock)
        self.done = False
        self.dropping = False  # its response is being collected: settled by the Settler
        self._lock = threading.Lock()

    def _asked(self) -> bool:
        """Whether to go on asking: False once asked (a retry inside one send asks no more)."""
        if self.asked:
            return False
        self.asked = True
        return True

    def _refusal(self, refused: BreakerOpen) -> BaseException:
        return self.refused(refused, self.request)

    def _unprotected(self) -> None:
        self.outbound.warn(self.spec.name, "could not ask breaker %r; the request goes through unprotected")

    def _headers_at(self) -> None:
        permit = self.permit
        if permit is not None and permit.started:
            self.answered_ms = self.breaker.now_ms()

    def _due(self, outcome: str | None = None, body: str | None = None) -> str | None:
        """What to record now, once: None while the outcome is not known yet."""
        with self._lock:
            if outcome is not None:
                self.outcome = outcome
            if body is not None and self.body is None:
                self.body = body
            if self.done or self.permit is None or self.outcome is None:
                return None
            if self.outcome == "failure" or self.body == "failed":
                final = "failure"
            elif self.body is not None:
                final = self.outcome
            else:
                return None
            self.done = True
            return final

    def _raised_outcome(self, exc: BaseException) -> str | None:
        with self._lock:
            if self.done or self.permit is None:
                return None
            self.done = True
        return "failure" if self.failures(exc) else "ignored"

    def _body_kind(self, exc: BaseException) -> str:
        return "failed" if self.body_failures(exc) else "closed"


class Exchange(ExchangeState):
    """ExchangeState's steps over sync breakers (requests, httpx.Client)."""

    def ask(self) -> None:
        """Ask the breaker for a permit, once; a refusal raises the client's exception."""
        if not self._asked():
            return
        try:
            self.permit = self.breaker.acquire()
        except BreakerOpen as refused:
            raise self._refusal(refused) from None
        except Exception:  # a bug, not an outage (the store gate handles those): do not fail the call
            self._unprotected()

    def raised(self, exc: BaseException) -> None:
        """The send raised before a response: a failure if the service did not answer."""
        outcome = self._raised_outcome(exc)
        if outcome is not None:
            self._record(outcome, None)

    def answered(self, status: int, response: Any, body_open: bool) -> None:
        """The status and headers arrived: judge them; ``body_open``: a body is left to read."""
        if self.permit is None:
            return
        self._headers_at()
        final = self._due(self.outbound.judge(self.spec, status, response), None if body_open else "end")
        if final is not None:
            self._record(final, response)

    def body_ended(self) -> None:
        self._settle(self._due(body="end"))

    def body_failed(self, exc: BaseException) -> None:
        self._settle(self._due(body=self._body_kind(exc)))

    def body_closed(self) -> None:
        self._settle(self._due(body="closed"))

    def _settle(self, final: str | None) -> None:
        if final is not None:
            self._record(final, None)

    def _record(self, outcome: str, response: Any) -> None:
        self.permit.record(outcome, ended_ms=self.answered_ms)
        group = self.outbound.group_due(self.spec.name)
        if group is not None:
            group.settle()  # a trip held back at the group's cap, or a member closed
        if response is not None:
            hold = self.outbound.hold_for(self.breaker, outcome, response)
            if hold is not None:
                self.breaker.hold_open(hold)


class AsyncExchange(ExchangeState):
    """ExchangeState's steps over asyncio breakers (httpx.AsyncClient), awaited."""

    async def ask(self) -> None:
        if not self._asked():
            return
        try:
            self.permit = await self.breaker.acquire()
        except BreakerOpen as refused:
            raise self._refusal(refused) from None
        except Exception:
            self._unprotected()

    async def raised(self, exc: BaseException) -> None:
        outcome = self._raised_outcome(exc)
        if outcome is not None:
            await self._record(outcome, None)

    async def answered(self, status: int, response: Any, body_open: bool) -> None:
        if self.permit is None:
            return
        self._headers_at()
        final = self._due(self.outbound.judge(self.spec, status, response), None if body_open else "end")
        if final is not None:
            await self._record(final, response)

    async def body_ended(self) -> None:
        await self._settle(self._due(body="end"))

    async def body_failed(self, exc: BaseException) -> None:
        await self._settle(self._due(body=self._body_kind(exc)))

    async def body_closed(self) -> None:
        await self._settle(self._due(body="closed"))

    async def _settle(self, final: str | None) -> None:
        if final is not None:
            await self._record(final, None)

    async def _record(self, outcome: str, response: Any) -> None:
        await self.permit.record(outcome, ended_ms=self.answered_ms)
        group = self.outbound.group_due(self.spec.name)
        if group is not None:
            await group.settle()
        if response is not None:
            hold = self.outbound.hold_for(self.breaker, outcome, response)
            if hold is not None:
                await self.breaker.hold_open(hold)


def send(
    exchange: Exchange,
    transport: Callable[[], R],
    watch: Callable[[R], bool],
    *,
    ask_first: bool = True,
) -> R:
    """One request behind its breaker. ``transport()`` sends it and returns a
    response with a ``status_code``; ``watch(response)`` makes its body report
    to the exchange and says whether a body is left to read. ``ask_first``:
    ask the breaker before sending; False when the transport asks once its
    pool hands the request a connection, so that a request waiting for a
    connection holds no permit (no probe slot that could expire while it
    waits, no pool wait in its time)."""
    if ask_first:
        exchange.ask()
    try:
        response = transport()
    except BaseException as exc:
        exchange.raised(exc)
        raise
    if exchange.permit is not None:
        exchange.answered(response.status_code, response, watch(response))
    elif not exchange.asked:  # the pool never asked: a connection class of its own
        exchange.outbound.warn(exchange.spec.name, "the request to breaker %r was sent without asking it",
                                     traceback=False)
    return response


async def send_async(
    exchange: AsyncExchange,
    transport: Callable[[], Awaitable[R]],
    watch: Callable[[R], bool],
    *,
    ask_first: bool = True,
) -> R:
    """``send`` for asyncio breakers and an awaited transport."""
    if ask_first:
        await exchange.ask()
    try:
        response = await transport()
    except BaseException as exc:
        await exchange.raised(exc)
        raise
    if exchange.permit is not None:
        await exchange.answered(response.status_code, response, watch(response))
    elif not exchange.asked:
        exchange.outbound.warn(exchange.spec.name, "the request to breaker %r was sent without asking it",
                                     traceback=False)
    return response
