"""pybreaker's arguments as a BreakerConfig, and the operations on a breaker_redis
breaker the layer uses (its public API only)."""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar, overload

from breaker_redis.base.config import BreakerConfig, config_field_names
from breaker_redis.compat.pybreaker.binding import _Binding
from breaker_redis.compat.pybreaker.registry import _made
from breaker_redis.compat.pybreaker.stores import _LOCK
from breaker_redis.engine.breaker import Breaker
from breaker_redis.engine.breakers import Breakers
from breaker_redis.engine.knowledge import Knowledge

V = TypeVar("V")


class _Reconfigurable(Protocol):
    """What a setting uses of a CircuitBreaker (tracking.py, which imports this module)."""

    def _reconfigure(self) -> None: ...


# BreakerConfig fields set from pybreaker's own arguments; the other fields may
# be given as keyword arguments (CircuitBreaker(..., probe_timeout_seconds=5)).
_MAPPED = frozenset(
    {
        "failure_threshold",
        "open_seconds",
        "half_open_successes",
        "record_exceptions",
        "ignore_exceptions",
        "predicate",
    }
)
_OPTIONS = frozenset(config_field_names()) - _MAPPED
# pybreaker's semantics where BreakerConfig's defaults differ; options override them.
_COMPAT_DEFAULTS: dict[str, Any] = {"trip": "consecutive", "open_backoff": 1.0, "half_open_max_calls": 1}


def _config(
    fail_max: Any, reset_timeout: Any, success_threshold: Any, options: dict[str, Any]
) -> BreakerConfig:
    """The BreakerConfig of pybreaker's arguments (validated: a bad value fails at start-up).

    pybreaker takes any number; breaker_redis's bounds apply, except that a
    ``fail_max`` below 1 means 1 and a ``reset_timeout`` of 0 means 1 ms.
    """
    values = {**_COMPAT_DEFAULTS, **options}
    values["failure_threshold"] = max(1, int(fail_max))
    values["open_seconds"] = max(0.001, float(reset_timeout))
    values["half_open_successes"] = max(1, int(success_threshold))
    return BreakerConfig(**values)


class _Setting(Generic[V]):
    """One of pybreaker's arguments that may be changed on a built CircuitBreaker
    (``cb.fail_max = 3``): kept as given, and this process's breaker of that name
    is given the new config, which its next script call applies."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc
        self._attribute = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._attribute = f"_{name}"

    @overload
    def __get__(self, cb: None, owner: type | None = None) -> _Setting[V]: ...

    @overload
    def __get__(self, cb: _Reconfigurable, owner: type | None = None) -> V: ...

    def __get__(self, cb: _Reconfigurable | None, owner: type | None = None) -> V | _Setting[V]:
        if cb is None:
            return self
        value: V = getattr(cb, self._attribute)
        return value

    def __set__(self, cb: _Reconfigurable, value: V) -> None:
        setattr(cb, self._attribute, value)
        cb._reconfigure()


def _breaker_for(breakers: Breakers, name: str, config: BreakerConfig) -> Breaker:
    """The breaker of that name in breakers, with config. One this module made is
    given the newest config (CircuitBreakers of one name in one process share it);
    one the app made with another config is an error, as Breakers.get makes it."""
    with _LOCK:
        new = _is_new(breakers, name)
        try:
            breaker = breakers.get(name, config)
        except ValueError:
            breaker = breakers.get(name)
            if breaker not in _made:
                raise ValueError(
                    f"breaker {name!r} already exists in this Breakers with another config, not made by "
                    f"breaker_redis.compat.pybreaker: {breaker.config}"
                ) from None
            _reconfigure(breaker, config)
        if new:
            _made.add(breaker)
        return breaker


# -- breaker_redis operations the layer uses --------------------------------------------


def _known(breaker: Breaker) -> Knowledge | None:
    """What this worker knows of the breaker: no command."""
    return breaker.known


def _is_new(breakers: Breakers, name: str) -> bool:
    return name not in breakers


def _reconfigure(breaker: Breaker, config: BreakerConfig) -> None:
    """Give a breaker another config in this process: the next script call applies it."""
    breaker.reconfigure(config)


def _run_op(binding: _Binding, op: str) -> None:
    """pybreaker's open() (open for reset_timeout, then half-open: Breaker.trip) or
    half_open() (the next call is the trial): admin operations, on Redis only."""
    if op == "open":
        binding.breaker.trip()
    else:
        binding.breaker.half_open()
