"""Call observers: what a tool that counts calls in process is told, and when.

``Breakers.observe_calls(observer)`` adds one (breaker_redis.opentelemetry is
the product's). Each call's outcome is told where this worker settles it,
never from Redis: ``called(name, outcome)`` once per recorded permit and per
healthy call of ``guard()``/``call()`` (success, failure or ignored), and
``refused(refusal)`` once per BreakerOpen raised by an acquire. So a count
costs no round trip, and the counts are this worker's own: the cluster-wide
totals stay Redis's (``snapshot()``, the Prometheus exposition).

The breakers read their Breakers' ``call_observers`` (a tuple, empty until an
observer is added) with one attribute test per call, so a product that adds
none pays only that. An observer runs inside the call: it must be quick and
must not raise (one that raises is logged, and the call goes on).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from breaker_redis.base.errors import BreakerOpen

log = logging.getLogger("breaker_redis")


class CallObserver(Protocol):
    def called(self, name: str, outcome: str) -> None:
        """A call of breaker ``name`` settled: success, failure or ignored."""

    def refused(self, refusal: BreakerOpen) -> None:
        """A call was refused (its breaker's name and reason are the refusal's)."""


def tell_called(observers: Iterable[CallObserver], name: str, outcome: str) -> None:
    for observer in observers:
        try:
            observer.called(name, outcome)
        except Exception:
            log.exception("call observer %r failed for %s of breaker %r", observer, outcome, name)


def tell_refused(observers: Iterable[CallObserver], refusal: BreakerOpen) -> None:
    for observer in observers:
        try:
            observer.refused(refusal)
        except Exception:
            log.exception("call observer %r failed for a refusal of breaker %r", observer, refusal.breaker)
