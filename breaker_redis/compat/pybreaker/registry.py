"""Which CircuitBreakers use which breaker, and the transitions breaker_redis reports
to them: told by the call that made them in its own thread, to the others at once."""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections.abc import Sequence
from typing import Protocol

from breaker_redis.compat.pybreaker.binding import _Binding
from breaker_redis.compat.pybreaker.fail_counter import _keep_fail_counter
from breaker_redis.engine.breaker import Breaker
from breaker_redis.engine.breakers import Breakers
from breaker_redis.engine.transitions import Transition

log = logging.getLogger("breaker_redis.compat.pybreaker")  # the package's one logger


class _Bound(Protocol):
    """What the registry uses of a CircuitBreaker (tracking.py, which imports this
    module): its breaker, and telling its listeners of transitions."""

    _binding: _Binding | None

    def _apply(self, transitions: Sequence[Transition]) -> None: ...


_REGISTRY_LOCK = threading.Lock()
_bound: dict[tuple[int, str], weakref.WeakSet[_Bound]] = {}
_hooked: weakref.WeakSet[Breakers] = weakref.WeakSet()
_made: weakref.WeakSet[Breaker] = weakref.WeakSet()  # breakers this module created (and may reconfigure)
_local = threading.local()


class _Capture:
    """Collects, in the calling thread, the transitions its own script call made,
    so that the listeners hear of them in pybreaker's order (failure before
    state_change), and so that the call knows it tripped the breaker."""

    __slots__ = ("key", "outer", "transitions")

    def __init__(self, key: tuple[int, str]) -> None:
        self.key = key
        self.transitions: list[Transition] = []
        self.outer: _Capture | None = None

    def __enter__(self) -> list[Transition]:
        self.outer = getattr(_local, "capture", None)
        _local.capture = self
        return self.transitions

    def __exit__(self, *exc: object) -> None:
        _local.capture = self.outer


def _register(cb: _Bound, key: tuple[int, str]) -> None:
    with _REGISTRY_LOCK:
        _bound.setdefault(key, weakref.WeakSet()).add(cb)


def _bound_to(key: tuple[int, str]) -> list[_Bound]:
    with _REGISTRY_LOCK:
        objects = _bound.get(key)
        return list(objects) if objects else []


def _hook(breakers: Breakers) -> None:
    """Hear of every transition made in this process (Breakers.on_transition and
    on_operator_action: once per transition cluster-wide, in the process whose call
    made it)."""
    with _REGISTRY_LOCK:
        if breakers in _hooked:
            return
        _hooked.add(breakers)
    # pybreaker tells its listeners of close() on a closed breaker too: every
    # transition, each once (the rules' from one hook, the operators' from the other)
    breakers.on_transition(functools.partial(_on_rules_transition, breakers))
    breakers.on_operator_action(functools.partial(_on_transition, breakers))


def _on_rules_transition(breakers: Breakers, transition: Transition) -> None:
    if not transition.operator:
        _on_transition(breakers, transition)


def _on_transition(breakers: Breakers, transition: Transition) -> None:
    key = (id(breakers), transition.name)
    objects = _bound_to(key)
    if not objects:
        return  # a breaker of this Breakers that no CircuitBreaker uses
    binding = objects[0]._binding
    if binding is not None:
        _keep_fail_counter(binding, transition)
    capture: _Capture | None = getattr(_local, "capture", None)
    if capture is not None and capture.key == key:
        capture.transitions.append(transition)  # the call that made it tells its listeners
        return
    for cb in objects:
        try:
            cb._apply([transition])
        except Exception:
            log.exception("a state_change listener of %r failed", cb)


# pybreaker's fail_counter counts failures since the last success or close, across
# open and half-open; breaker_redis's consecutive count restarts at each trip. While
