"""What the HTTP client integrations share: breaker_redis.requests (an adapter
for a requests Session) and breaker_redis.httpx (transports for httpx.Client
and httpx.AsyncClient). No HTTP client is imported here.

One breaker per upstream host by default (``host:port``,
breaker_redis/web/hosts.py), so a payment API that fails is refused for
every worker while the inventory API next to it keeps being called; the
options and rules of an adapter or transport are breaker_redis/web/outbound.py.
A request goes through one permit (an ``Exchange``): asked before the request
is sent (a refusal never sends it), judged when the response's status and
headers arrive, and settled once its body is read to the end or closed, so
that a body the service fails to deliver (a reset, a stall past the read
timeout, a body cut short) counts as the failure it is. A failing status
settles at once: nothing in the body can change it.

What counts as a failure: a connection error or a timeout, a body that
fails mid-read, and a response whose status is in ``failure_statuses`` (5xx
and 429 by default).

Each step of an exchange is written once, as an ``async def`` whose breaker
calls go through ``_finish`` (engine/steps.py's way, docs/design.md): the
asyncio side awaits what its breaker returns, the sync side's ``_finish``
returns it as it is and never suspends, so ``run_sync`` runs the step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from breaker_redis.base.blocking import run_sync
from breaker_redis.base.errors import BreakerOpen
from breaker_redis.web.hosts import host_name, member_name, request_name
from breaker_redis.web.outbound import (
    DEFAULT_FAILURE_STATUSES,
    Outbound,
    OutboundClient,
    parsed_header,
    retry_after_seconds,
)
from breaker_redis.web.pipeline import admit, admit_async

__all__ = [
    "DEFAULT_FAILURE_STATUSES",
    "SETTLER",
    "AsyncExchange",
    "Exchange",
    "Outbound",
    "OutboundClient",
    "Settler",
    "host_name",
    "member_name",
    "parsed_header",
    "request_name",
    "retry_after_seconds",
    "send",
    "send_async",
    "settle_on_loop",
]

log = logging.getLogger("breaker_redis")


class Response(Protocol):
    """What a client library's response is read for here: its status."""

    status_code: int


R = TypeVar("R", bound=Response)


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
            threading.Thread(
                target=self._run, args=(self._jobs,), name="breaker_redis-settler", daemon=True
            ).start()
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
    judging the response at its headers (``_send``), and settling the
    permit once the body is read to the end (``body_ended``), fails mid-read
    (``body_failed``: a failure when ``body_failures`` says the service broke
    it), or is closed before its end (``body_closed``: as its status says).

    A failing status settles at once; any other waits for the body, so that
    every outcome of the call, reading its body included, reaches the breaker
    exactly once. The state is kept under a lock: a body may be closed from
    another thread (the Settler's). Exchange runs the steps on the sync
    side, AsyncExchange awaits them."""

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

    # -- the steps, each written once (the module docstring) -----------------------------

    _admit: Callable[..., Any]  # web/pipeline.py's admit step of this side

    async def _finish(self, result: Any) -> Any:
        """What a breaker call (or the transport) returned, finished: each side's I/O."""
        raise NotImplementedError

    async def _ask(self) -> None:
        """Ask the breaker for a permit, once; a refusal raises the client's exception."""
        if not self._asked():
            return
        try:
            self.permit, _ = await self._finish(self._admit(self.breaker, self.outbound.warn))
        except BreakerOpen as refused:
            raise self._refusal(refused) from None

    async def _send(self, transport: Callable[[], Any], watch: Callable[[R], bool], ask_first: bool) -> R:
        """One request behind its breaker (``send``)."""
        if ask_first:
            await self._ask()
        try:
            response: R = await self._finish(transport())
        except BaseException as exc:
            # The send raised before a response: a failure if the service did not answer.
            outcome = self._raised_outcome(exc)
            if outcome is not None:
                await self._record(outcome, None)
            raise
        if self.permit is not None:
            # The status and headers arrived: judged; a body left to read settles the rest.
            self._headers_at()
            status = self.outbound.judge(self.spec, response.status_code, response)
            final = self._due(status, None if watch(response) else "end")
            if final is not None:
                await self._record(final, response)
        elif not self.asked:  # the pool never asked: a connection class of its own
            self.outbound.warn(
                self.spec.name, "the request to breaker %r was sent without asking it", traceback=False
            )
        return response

    async def _body(self, body: str) -> None:
        """The body ended ("end"), failed ("failed") or was closed ("closed")."""
        final = self._due(body=body)
        if final is not None:
            await self._record(final, None)

    async def _record(self, outcome: str, response: Any) -> None:
        await self._finish(self.permit.record(outcome, ended_ms=self.answered_ms))
        group = self.outbound.group_due(self.spec.name)
        if group is not None:
            await self._finish(group.settle())  # a trip held back at the group's cap, or a member closed
        if response is not None:
            hold = self.outbound.hold_for(self.breaker, outcome, response)
            if hold is not None:
                await self._finish(self.breaker.hold_open(hold))


class Exchange(ExchangeState):
    """An exchange over sync breakers (requests, httpx.Client): each step run to its end."""

    _admit = staticmethod(admit)

    async def _finish(self, result: Any) -> Any:
        return result  # a blocking call's result: never suspends (run_sync)

    def ask(self) -> None:
        run_sync(self._ask())

    def body_ended(self) -> None:
        run_sync(self._body("end"))

    def body_failed(self, exc: BaseException) -> None:
        run_sync(self._body(self._body_kind(exc)))

    def body_closed(self) -> None:
        run_sync(self._body("closed"))


class AsyncExchange(ExchangeState):
    """An exchange over asyncio breakers (httpx.AsyncClient): each step awaited."""

    _admit = staticmethod(admit_async)

    async def _finish(self, result: Any) -> Any:
        return await result

    def ask(self) -> Awaitable[None]:
        return self._ask()

    def body_ended(self) -> Awaitable[None]:
        return self._body("end")

    def body_failed(self, exc: BaseException) -> Awaitable[None]:
        return self._body(self._body_kind(exc))

    def body_closed(self) -> Awaitable[None]:
        return self._body("closed")


def send(
    exchange: Exchange, transport: Callable[[], R], watch: Callable[[R], bool], *, ask_first: bool = True
) -> R:
    """One request behind its breaker. ``transport()`` sends it and returns a
    response with a ``status_code``; ``watch(response)`` makes its body report
    to the exchange and says whether a body is left to read. ``ask_first``:
    ask the breaker before sending; False when the transport asks once its
    pool hands the request a connection, so that a request waiting for a
    connection holds no permit (no probe slot that could expire while it
    waits, no pool wait in its time)."""
    return run_sync(exchange._send(transport, watch, ask_first))


def send_async(
    exchange: AsyncExchange,
    transport: Callable[[], Awaitable[R]],
    watch: Callable[[R], bool],
    *,
    ask_first: bool = True,
) -> Awaitable[R]:
    """``send`` for asyncio breakers and an awaited transport."""
    return exchange._send(transport, watch, ask_first)
