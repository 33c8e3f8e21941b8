"""pybreaker's states as its code and listeners see them; the state machine itself
runs in Redis (breaker_redis's scripts), these only name its states."""

from __future__ import annotations

from typing import Protocol

STATE_OPEN = "open"
STATE_CLOSED = "closed"
STATE_HALF_OPEN = "half-open"

# breaker_redis's state names -> pybreaker's
_FROM_REDIS = {"closed": STATE_CLOSED, "open": STATE_OPEN, "half_open": STATE_HALF_OPEN}
# pybreaker's states a breaker can be put in by hand -> the compat script's operation
_OPS = {STATE_OPEN: "open", STATE_HALF_OPEN: "half_open"}


class _Notified(Protocol):
    """What a state uses of its CircuitBreaker (tracking.py, which imports this module)."""

    def _notify_state_change(
        self, prev_state: CircuitBreakerState | None, new_state: CircuitBreakerState
    ) -> None: ...


class Named:
    """pybreaker's read-only ``name``, given when built: a state's, a storage's."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name


class CircuitBreakerState(Named):
    """A state as pybreaker's listeners receive it: ``name`` is ``closed``,
    ``open`` or ``half-open``. The state machine itself runs in Redis."""

    def __init__(self, cb: _Notified, name: str) -> None:
        super().__init__(name)
        self._breaker = cb

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._breaker!r}>"


class _NamedState(CircuitBreakerState):
    """pybreaker's concrete states: (cb, prev_state, notify), the name fixed per class."""

    state_name = ""

    def __init__(
        self, cb: _Notified, prev_state: CircuitBreakerState | None = None, notify: bool = False
    ) -> None:
        super().__init__(cb, self.state_name)
        if notify:
            cb._notify_state_change(prev_state, self)


class CircuitClosedState(_NamedState):
    state_name = STATE_CLOSED


class CircuitOpenState(_NamedState):
    state_name = STATE_OPEN


class CircuitHalfOpenState(_NamedState):
    state_name = STATE_HALF_OPEN


def _check_state(state: str) -> str:
    if state not in (STATE_CLOSED, STATE_OPEN, STATE_HALF_OPEN):
        valid = f"{STATE_CLOSED}, {STATE_OPEN}, {STATE_HALF_OPEN}"
        raise ValueError(f"Unknown state {state!r}, valid states: {valid}")
    return state


def _pybreaker_state(state: str, forced: str | None) -> str:
    if forced == "open":
        return STATE_OPEN
    if forced == "closed":
        return STATE_CLOSED
    return _FROM_REDIS.get(state, STATE_CLOSED)
