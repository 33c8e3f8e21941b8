"""OpenTelemetry metrics and span events of a Breakers, with opentelemetry-api only.

``instrument(breakers)`` (docs/opentelemetry.md: every instrument, attribute
and event, an example, the cost) works for the sync Breakers and the asyncio
one alike, through three hooks of the engine:

- the calls by outcome: a call observer (engine/observers.py), told in
  process where a call settles or is refused. It adds one to a count of its
  own, under a lock; an observable counter hands the SDK the totals when it
  collects. An SDK counter's ``add()`` per call would cost several times
  more (it builds the attributes' key and takes its own locks on every
  call); a count per (breaker, outcome) is all a sum needs;
- the state: an observable gauge of what the worker knows of each breaker
  it built (``Breaker.known``), read at collection, never from Redis, and
  so is the share of calls it admits after a close (``ramp_seconds``);
- the transitions: ``Breakers.on_transition``, called once per transition
  cluster-wide, in the process whose call made it (engine/transitions.py),
  so the counter's sum over every process is the number of transitions.

A refusal and a trip are also events on the span current where they happen
(the caller's request, say), when it is recording. Outside any recording span
(a background job, a script) they are lost unless ``instrument`` is given a
tracer provider: then each becomes a span of its own, named as the event, so
a refusal in a job nobody traced still shows in the traces.

The metrics are this worker's counts, as an OpenTelemetry SDK per process
expects; the cluster-wide totals are Redis's (``snapshot()``,
breaker_redis.metrics). Nothing here runs unless ``instrument`` is called,
and ``import breaker_redis`` never imports this module.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterable
from typing import Any, Protocol

from breaker_redis.ops import extras

try:
    from opentelemetry import metrics, trace
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
    from opentelemetry.trace import Tracer, TracerProvider
except ImportError as error:  # an optional dependency (ops/extras.py)
    raise extras.missing(__name__, "opentelemetry-api", "opentelemetry", error) from error

from breaker_redis import BreakerOpen, Transition, __version__

SCOPE = "breaker_redis"  # the instrumentation scope (the meter's name)

CALLS = "breaker.calls"
STATE = "breaker.state"
RAMP_SHARE = "breaker.ramp_share"
TRANSITIONS = "breaker.transitions"

NAME = "breaker.name"
OUTCOME = "breaker.outcome"
REASON = "breaker.refusal.reason"
RETRY_AFTER = "breaker.refusal.retry_after"
STATE_ATTRIBUTE = "breaker.state"
FROM = "breaker.transition.from"
TO = "breaker.transition.to"
CAUSE = "breaker.transition.cause"

REFUSAL_EVENT = "breaker.refusal"
TRIP_EVENT = "breaker.trip"

STATES = ("closed", "open", "half_open")
REFUSED = "refused"


class _Known(Protocol):
    state: str

    def ramp_share(self, now_ms: int) -> float: ...


class _Built(Protocol):
    name: str

    def now_ms(self) -> int: ...

    @property
    def known(self) -> _Known | None: ...


class Instrumentable(Protocol):
    """What is used of a Breakers (sync or asyncio)."""

    def observe_calls(self, observer: Any) -> Any: ...
    def on_transition(self, callback: Any) -> Any: ...
    def built(self) -> Iterable[_Built]: ...


def _event(tracer: Tracer | None, name: str, attributes: dict[str, str | float]) -> None:
    """An event on the current span when it records; else, with a tracer, a span of its own."""
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(name, attributes)
    elif tracer is not None:
        tracer.start_span(name, attributes=attributes).end()


class _Tally:
    """The call observer of one Breakers on one meter provider: the counts, and the
    refusals' and trips' span events (through ``tracer`` outside any span, if given)."""

    def __init__(self, breakers: Instrumentable, tracer: Tracer | None) -> None:
        self.breakers = weakref.ref(breakers)  # a Breakers dropped is not kept alive by its metrics
        self.tracer = tracer
        self.after_fork()
        _tallies.add(self)

    def after_fork(self) -> None:
        """Start afresh: a forked worker's counts are its own (the parent's, counted again by
        every child, would be counted once per child), and a lock held at the fork stays held."""
        self._lock = threading.Lock()
        # (breaker name, outcome, refusal reason or "") -> calls
        self._counts: dict[tuple[str, str, str], int] = {}

    def called(self, name: str, outcome: str) -> None:
        key = (name, outcome, "")
        counts = self._counts
        with self._lock:
            counts[key] = counts.get(key, 0) + 1

    def refused(self, refusal: BreakerOpen) -> None:
        key = (refusal.breaker, REFUSED, refusal.reason)
        counts = self._counts
        with self._lock:
            counts[key] = counts.get(key, 0) + 1
        attributes: dict[str, str | float] = {NAME: refusal.breaker, REASON: refusal.reason}
        if refusal.retry_after is not None:
            attributes[RETRY_AFTER] = refusal.retry_after
        _event(self.tracer, REFUSAL_EVENT, attributes)

    def tripped(self, transition: Transition) -> None:
        if transition.new == "open":
            attributes: dict[str, str | float] = {
                NAME: transition.name,
                FROM: transition.old,
                CAUSE: transition.cause,
            }
            _event(self.tracer, TRIP_EVENT, attributes)

    def counts(self) -> list[tuple[tuple[str, str, str], int]]:
        with self._lock:
            return sorted(self._counts.items())


_tallies: weakref.WeakSet[_Tally] = weakref.WeakSet()


def _after_fork() -> None:
    for tally in list(_tallies):
        tally.after_fork()


os.register_at_fork(after_in_child=_after_fork)


class _Instruments:
    """The instruments of one meter provider, read over every Breakers instrumented on it
    (an SDK keeps the first of two instruments of one name, and its callbacks only)."""

    def __init__(self, provider: MeterProvider | None) -> None:
        meter = metrics.get_meter(SCOPE, __version__, meter_provider=provider)
        self.tallies: list[_Tally] = []
        meter.create_observable_counter(
            CALLS,
            callbacks=[self._calls],
            unit="{call}",
            description="Calls of a breaker by outcome (success, failure, ignored, refused) in this process.",
        )
        meter.create_observable_gauge(
            STATE,
            callbacks=[self._states],
            unit="1",
            description="1 for the state this process knows a breaker is in, 0 for the other states.",
        )
        meter.create_observable_gauge(
            RAMP_SHARE,
            callbacks=[self._ramp_shares],
            unit="1",
            description="The share of calls this process admits after a close (1: all; docs/recovery.md).",
        )
        self.transitions = meter.create_counter(
            TRANSITIONS,
            unit="{transition}",
            description="Transitions of a breaker, counted by the process whose call made each one.",
        )

    def _calls(self, options: CallbackOptions) -> Iterable[Observation]:
        for tally in list(self.tallies):
            for (name, outcome, reason), count in tally.counts():
                attributes = {NAME: name, OUTCOME: outcome}
                if reason:
                    attributes[REASON] = reason
                yield Observation(count, attributes)

    def _states(self, options: CallbackOptions) -> Iterable[Observation]:
        for tally in list(self.tallies):
            breakers = tally.breakers()
            for breaker in breakers.built() if breakers is not None else ():
                known = breaker.known  # None: forgotten (a notice, a store switch) until its next call
                if known is not None:
                    for state in STATES:
                        yield Observation(
                            int(known.state == state), {NAME: breaker.name, STATE_ATTRIBUTE: state}
                        )

    def _ramp_shares(self, options: CallbackOptions) -> Iterable[Observation]:
        for tally in list(self.tallies):
            breakers = tally.breakers()
            for breaker in breakers.built() if breakers is not None else ():
                known = breaker.known
                if known is not None and known.state == "closed":
                    yield Observation(known.ramp_share(breaker.now_ms()), {NAME: breaker.name})

    def transitioned(self, transition: Transition) -> None:
        attributes = {
            NAME: transition.name,
            FROM: transition.old,
            TO: transition.new,
            CAUSE: transition.cause,
        }
        self.transitions.add(1, attributes)


_lock = threading.Lock()
_instruments: weakref.WeakKeyDictionary[Any, _Instruments] = weakref.WeakKeyDictionary()


def instrument(
    breakers: Instrumentable,
    meter_provider: MeterProvider | None = None,
    tracer_provider: TracerProvider | None = None,
) -> None:
    """Emit the metrics and span events of ``breakers`` (a Breakers, sync or asyncio)
    through ``meter_provider`` (None: the global one, as set now or later). The events go
    to the current span; ``tracer_provider`` makes a span of its own for each event that
    happens outside any recording span (None: such an event is dropped, and counted in
    the metrics all the same). Once per Breakers and meter provider: a second call for
    the same pair does nothing."""
    provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    tracer = None
    if tracer_provider is not None:
        tracer = trace.get_tracer(SCOPE, __version__, tracer_provider=tracer_provider)
    with _lock:
        instruments = _instruments.get(provider)
        if instruments is None:
            instruments = _instruments[provider] = _Instruments(meter_provider)
        if any(tally.breakers() is breakers for tally in instruments.tallies):
            return
        tally = _Tally(breakers, tracer)
        instruments.tallies.append(tally)
    breakers.on_transition(instruments.transitioned)
    breakers.on_transition(tally.tripped)
    breakers.observe_calls(tally)
