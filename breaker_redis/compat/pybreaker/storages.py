"""Where a CircuitBreaker's breaker lives: pybreaker's storage classes, each naming
a store (this process, or a Redis and a key prefix) rather than holding counters."""

from __future__ import annotations

import itertools
import threading
import unicodedata
from typing import Any

import breaker_redis.compat.pybreaker.stores as stores
from breaker_redis.compat.pybreaker.binding import _Binding
from breaker_redis.compat.pybreaker.states import _OPS, STATE_CLOSED, STATE_OPEN, Named, _check_state
from breaker_redis.engine.breakers import Breakers
from breaker_redis.storage.keys import breaker_keys


def _key_name(label: str) -> str:
    """A pybreaker name as a breaker_redis name: pybreaker's names are labels
    (``"payment api"``), breaker_redis's are part of keys. Whitespace, braces,
    control characters and ``%`` are percent-encoded, so that two labels
    never share a breaker by accident (``"payment api"`` -> ``payment%20api``)."""
    if all(ch.isalnum() or ch in "-_.:/" for ch in label):  # the usual case, unchanged
        return label
    out = []
    for ch in label:
        if ch == "%" or ch in "{}" or ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf", "Cs"):
            out.append("".join(f"%{byte:02X}" for byte in ch.encode("utf-8", "surrogatepass")))
        else:
            out.append(ch)
    return "".join(out)


class CircuitBreakerStorage(Named):
    """Where a breaker's state lives. Unlike pybreaker's, a storage here names a
    store (this process, or a Redis and a key prefix); the CircuitBreaker's
    name picks the breaker in it, and breaker_redis's scripts keep its state
    and counters. pybreaker's storage methods (``increment_counter``,
    ``opened_at`` ...) are not offered: nothing but a call changes a count.
    Its ``name`` is ``memory`` (this process only) or ``redis`` (shared)."""

    # No other attribute can be set: pybreaker code writing a storage's opened_at
    # or counters gets an AttributeError, not a value nothing reads.
    __slots__ = ()
    _eager = True  # bound when the CircuitBreaker is built, as pybreaker reads its state then

    def _locate(self, label: str | None) -> tuple[Breakers, str]:
        """(the Breakers, the breaker's name in it) for a CircuitBreaker called label."""
        raise TypeError(
            f"{type(self).__name__} cannot hold a breaker_redis breaker: give state_storage="
            "CircuitMemoryStorage(...) or CircuitRedisStorage(...), breakers=Breakers(...), "
            "or a name= with pybreaker.configure(...) / BREAKER_REDIS_URL"
        )

    def _initial_op(self, binding: _Binding) -> str | None:
        """The state a newly bound breaker is put in ('open', 'half_open'), if any."""
        return None


class CircuitMemoryStorage(CircuitBreakerStorage):
    """A breaker in this process only (pybreaker's default storage).

    It runs breaker_redis's scripts on an in-process store (fakeredis, as
    breaker_redis's own fallback while Redis is down), so the semantics are
    the same as shared breakers'. Each storage object is its own store:
    CircuitBreakers given the same object and the same name share a breaker.
    """

    __slots__ = ("_id", "_initial", "_lock", "_started")
    _serial = itertools.count(1)

    def __init__(self, state: str) -> None:
        super().__init__("memory")
        self._initial = _check_state(state)
        self._id = next(CircuitMemoryStorage._serial)
        self._started: set[str] = set()
        self._lock = threading.Lock()

    def _locate(self, label: str | None) -> tuple[Breakers, str]:
        return stores._memory_breakers(), f"memory-{self._id}/{_key_name(label or 'default')}"

    def _initial_op(self, binding: _Binding) -> str | None:
        with self._lock:
            if binding.breaker.name in self._started:
                return None
            self._started.add(binding.breaker.name)
        return _OPS.get(self._initial)


class CircuitRedisStorage(CircuitBreakerStorage):
    """Breakers shared through ``redis_object``, under the key prefix ``namespace``
    (``pybreaker`` when None): ``<namespace>:{<name>}:state`` and the other keys
    of breaker_redis's layout, where ``<name>`` is the CircuitBreaker's name
    (``default`` when it has none).

    ``fallback_circuit_state`` says what happens while Redis cannot be
    reached: ``open`` refuses every call (``on_store_error="deny"``); any other
    keeps protecting with a per-process breaker (``"local"``, breaker_redis's
    default), where pybreaker lets every call through uncounted.
    ``cluster_mode`` is accepted and not needed: a RedisCluster client is
    recognised. ``state`` is the state of a breaker that does not exist yet in
    Redis (pybreaker's SETNX).
    """

    __slots__ = (
        "_breakers",
        "_cluster_mode",
        "_fallback_circuit_state",
        "_initial",
        "_namespace_name",
        "_redis",
    )

    def __init__(
        self,
        state: str,
        redis_object: Any,
        namespace: str | None = None,
        fallback_circuit_state: str = STATE_CLOSED,
        cluster_mode: bool = False,
    ) -> None:
        super().__init__("redis")
        self._initial = _check_state(str(state))
        self._redis = redis_object
        self._namespace_name = namespace
        self._fallback_circuit_state = _check_state(fallback_circuit_state)
        self._cluster_mode = cluster_mode
        policy = "deny" if fallback_circuit_state == STATE_OPEN else "local"
        self._breakers = stores._breakers_on(redis_object, namespace or "pybreaker", policy)

    def _locate(self, label: str | None) -> tuple[Breakers, str]:
        return self._breakers, _key_name(label or "default")

    def _initial_op(self, binding: _Binding) -> str | None:
        op = _OPS.get(self._initial)
        if op is None:
            return None
        state_key = breaker_keys(binding.breakers.prefix, binding.breaker.name)[0]
        return None if binding.breakers.client.exists(state_key) else op


class _BreakersStorage(CircuitBreakerStorage):
    """``CircuitBreaker(..., breakers=Breakers(...))``: a Breakers built by the app."""

    __slots__ = ("_breakers",)

    def __init__(self, breakers: Breakers) -> None:
        super().__init__("redis")
        self._breakers = breakers

    def _locate(self, label: str | None) -> tuple[Breakers, str]:
        return self._breakers, _key_name(label or "default")


class _DefaultStorage(CircuitBreakerStorage):
    """A named CircuitBreaker without a storage: the Redis of ``configure()`` or
    ``BREAKER_REDIS_URL``, looked up at its first use (a module-level breaker is
    often built before the app configures anything), or this process when neither
    is set."""

    __slots__ = ()
    _eager = False

    def __init__(self) -> None:
        super().__init__("redis")

    def _locate(self, label: str | None) -> tuple[Breakers, str]:
        breakers = stores._default_breakers()
        if breakers is stores._memory:
            self._name = "memory"
        return breakers, _key_name(label or "default")
