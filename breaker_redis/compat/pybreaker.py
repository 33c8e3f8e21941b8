"""pybreaker's public names, backed by breaker_redis breakers shared through Redis.

Migrating is one line::

    import breaker_redis.compat.pybreaker as pybreaker   # was: import pybreaker

and, to share the breakers between processes, one of ``pybreaker.configure(url)``,
the environment variable ``BREAKER_REDIS_URL``, or pybreaker's own
``CircuitRedisStorage(state, redis_client, namespace)``. docs/pybreaker-migration.md
says what maps to what and what differs.

Why a layer and not an alias: pybreaker keeps its state with GET/SET from
Python, so every process reads, decides and writes on its own (counts race,
every process probes a recovering service). Here every decision is one of
breaker_redis's Lua scripts, and a healthy call costs no Redis command.

The mapping: ``fail_max`` -> ``failure_threshold`` with ``trip="consecutive"``,
``reset_timeout`` -> ``open_seconds`` (no backoff: ``open_backoff=1``, as
pybreaker reopens for ``reset_timeout`` each time), ``success_threshold`` ->
``half_open_successes``, and ``half_open_max_calls=1``: one trial call at a
time, cluster-wide, where pybreaker lets one through per process. What
pybreaker does in Python around the state machine (listeners, excluded
exceptions counted as successes, ``CircuitBreakerError`` for the call that
trips the breaker, generators, tornado coroutines) is done here, around a
breaker_redis permit.

It uses breaker_redis's public API only: ``Breaker.known`` (noticing a
change made elsewhere), ``Breaker.reconfigure`` (the ``fail_max`` setters),
``Breaker.trip`` and ``Breaker.half_open`` (pybreaker's timed ``open()`` and
``half_open()``, admin operations of lua/admin.lua).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import inspect
import itertools
import logging
import os
import threading
import types
import unicodedata
import weakref
from collections.abc import Callable, Coroutine, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import redis

from breaker_redis.engine.breaker import Breaker
from breaker_redis.engine.breakers import Breakers
from breaker_redis.engine.config import BreakerConfig, config_field_names
from breaker_redis.engine.errors import BreakerOpen
from breaker_redis.engine.knowledge import Knowledge
from breaker_redis.engine.permit import Permit
from breaker_redis.engine.transitions import Transition
from breaker_redis.storage.scripts import breaker_keys
from breaker_redis.storage.store import StoreUnavailable

__all__ = (
    "STATE_CLOSED",
    "STATE_HALF_OPEN",
    "STATE_OPEN",
    "CircuitBreaker",
    "CircuitBreakerError",
    "CircuitBreakerListener",
    "CircuitMemoryStorage",
    "CircuitRedisStorage",
)

# its own logger under breaker_redis: its name says where a line comes from
log = logging.getLogger("breaker_redis.compat.pybreaker")

STATE_OPEN = "open"
STATE_CLOSED = "closed"
STATE_HALF_OPEN = "half-open"

# pybreaker's flags. The tornado one is read at each use, as pybreaker reads its own.
HAS_TORNADO_SUPPORT = importlib.util.find_spec("tornado") is not None
HAS_REDIS_SUPPORT = True

T = TypeVar("T")

# breaker_redis's state names -> pybreaker's
_FROM_REDIS = {"closed": STATE_CLOSED, "open": STATE_OPEN, "half_open": STATE_HALF_OPEN}
# pybreaker's states a breaker can be put in by hand -> the compat script's operation
_OPS = {STATE_OPEN: "open", STATE_HALF_OPEN: "half_open"}
_TRIP_CAUSES = frozenset({"consecutive", "count", "rate", "slow"})
_PROBE_FAILURES = frozenset({"probe_failed", "probe_timeout"})
# What a refused call says, by BreakerOpen.reason (pybreaker has only the first).
_REFUSALS = {
    "open": "Timeout not elapsed yet, circuit breaker still open",
    "half_open_full": "Trial call in progress, circuit breaker half-open",
    "forced_open": "Circuit breaker forced open",
    "bulkhead": "Too many calls in flight, circuit breaker refused the call",
}
# BreakerConfig fields set from pybreaker's own arguments; the other fields may
# be given as keyword arguments (CircuitBreaker(..., probe_timeout_seconds=5)).
_MAPPED = frozenset(
    {"failure_threshold", "open_seconds", "half_open_successes", "record_exceptions", "ignore_exceptions",
     "predicate"}
)
_OPTIONS = frozenset(config_field_names()) - _MAPPED
# pybreaker's semantics where BreakerConfig's defaults differ; options override them.
_COMPAT_DEFAULTS: dict[str, Any] = {"trip": "consecutive", "open_backoff": 1.0, "half_open_max_calls": 1}


class CircuitBreakerError(Exception):
    """The call was refused (the breaker is open), or its failure opened the breaker.

    Beyond pybreaker's: ``reason`` is BreakerOpen's reason for a refusal
    (``open``, ``half_open_full``, ``forced_open``, ``bulkhead``) or
    ``tripped`` for the call whose failure opened the breaker, and
    ``retry_after`` the seconds until the open period ends (None when unknown).
    """

    reason: str = ""
    retry_after: float | None = None


def _error(message: str, reason: str, retry_after: float | None = None) -> CircuitBreakerError:
    error = CircuitBreakerError(message)
    error.reason, error.retry_after = reason, retry_after
    return error


class CircuitBreakerListener:
    """Plug code into a CircuitBreaker's events, as in pybreaker.

    ``state_change`` is called for every transition made by a call of this
    process (once, to every CircuitBreaker of that breaker here), and when a
    CircuitBreaker notices, at a call or a state read, a change made elsewhere.
    """

    def before_call(self, cb: CircuitBreaker, func: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Called before the circuit breaker ``cb`` calls ``func`` (not for a refused call)."""

    def failure(self, cb: CircuitBreaker, exc: BaseException) -> None:
        """Called when a function called by the circuit breaker ``cb`` fails."""

    def success(self, cb: CircuitBreaker) -> None:
        """Called when a function called by ``cb`` succeeds (or raises an excluded exception)."""

    def state_change(
        self, cb: CircuitBreaker, old_state: CircuitBreakerState | None, new_state: CircuitBreakerState
    ) -> None:
        """Called when the state of the circuit breaker ``cb`` changes."""


class CircuitBreakerState:
    """A state as pybreaker's listeners receive it: ``name`` is ``closed``,
    ``open`` or ``half-open``. The state machine itself runs in Redis."""

    def __init__(self, cb: CircuitBreaker, name: str) -> None:
        self._breaker = cb
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._breaker!r}>"


class _NamedState(CircuitBreakerState):
    """pybreaker's concrete states: (cb, prev_state, notify), the name fixed per class."""

    state_name = ""

    def __init__(
        self, cb: CircuitBreaker, prev_state: CircuitBreakerState | None = None, notify: bool = False
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


# -- where a breaker lives ------------------------------------------------------


def _check_state(state: str) -> str:
    if state not in (STATE_CLOSED, STATE_OPEN, STATE_HALF_OPEN):
        valid = f"{STATE_CLOSED}, {STATE_OPEN}, {STATE_HALF_OPEN}"
        raise ValueError(f"Unknown state {state!r}, valid states: {valid}")
    return state


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


class CircuitBreakerStorage:
    """Where a breaker's state lives. Unlike pybreaker's, a storage here names a
    store (this process, or a Redis and a key prefix); the CircuitBreaker's
    name picks the breaker in it, and breaker_redis's scripts keep its state
    and counters. pybreaker's storage methods (``increment_counter``,
    ``opened_at`` ...) are not offered: nothing but a call changes a count."""

    # No other attribute can be set: pybreaker code writing a storage's opened_at
    # or counters gets an AttributeError, not a value nothing reads.
    __slots__ = ("_name",)
    _eager = True  # bound when the CircuitBreaker is built, as pybreaker reads its state then

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def name(self) -> str:
        """``memory`` (this process only) or ``redis`` (shared)."""
        return self._name

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
        return _memory_breakers(), f"memory-{self._id}/{_key_name(label or 'default')}"

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

    __slots__ = ("_breakers", "_cluster_mode", "_fallback_circuit_state", "_initial", "_namespace_name",
                 "_redis")

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
        self._breakers = _breakers_on(redis_object, namespace or "pybreaker", policy)

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
        breakers = _default_breakers()
        if breakers is _memory:
            self._name = "memory"
        return breakers, _key_name(label or "default")


# -- the default store ------------------------------------------------------------

_LOCK = threading.RLock()  # the module's stores and bindings (not held around calls)
_configured: Breakers | None = None
_from_env: dict[tuple[str, str], Breakers] = {}
_on_clients: dict[tuple[int, str, str], Breakers] = {}
_memory: Breakers | None = None
_warned: set[str] = set()


def configure(target: Any = None, *, prefix: str = "breaker", **kwargs: Any) -> Breakers | None:
    """Where named CircuitBreakers without a state_storage keep their state.

    ``target`` is a Redis URL (``Breakers.from_url``: sub-second timeouts, no
    retry loop), a redis client, a ``Breakers`` the app already has (its
    Flask extension's, say: a compat breaker and a ``@breakers.protect`` of
    the same name are then one breaker), or None to forget an earlier call.
    ``prefix`` and ``kwargs`` go to Breakers (``on_store_error=...``).
    Breakers already bound keep their store: a CircuitBreaker binds at its
    first call or state read, so configuring at app start-up is in time for
    module-level breakers. Returns the Breakers now in use (None when none).
    """
    global _configured
    breakers: Breakers | None
    if target is None or isinstance(target, Breakers):
        if kwargs or prefix != "breaker":
            raise TypeError("configure(Breakers or None) takes no prefix or Breakers options")
        breakers = target
    elif isinstance(target, str):
        breakers = Breakers.from_url(target, prefix, **kwargs)
    else:
        breakers = Breakers(target, prefix, **kwargs)
    with _LOCK:
        _configured = breakers
    return breakers


def _redis_configured() -> bool:
    return _configured is not None or bool(os.environ.get("BREAKER_REDIS_URL", "").strip())


def _default_breakers() -> Breakers:
    with _LOCK:
        if _configured is not None:
            return _configured
        url = os.environ.get("BREAKER_REDIS_URL", "").strip()
        if url:
            prefix = os.environ.get("BREAKER_KEY_PREFIX", "").strip() or "breaker"
            breakers = _from_env.get((url, prefix))
            if breakers is None:
                breakers = _from_env[(url, prefix)] = Breakers.from_url(url, prefix)
            return breakers
        _warn_once(
            "unconfigured",
            "no Redis configured (pybreaker.configure(url) or "
            "BREAKER_REDIS_URL): named CircuitBreakers keep their state in this process only",
        )
        return _memory_breakers()


def _memory_breakers() -> Breakers:
    """The process's in-process store: breaker_redis's scripts on a private fakeredis server."""
    global _memory
    with _LOCK:
        if _memory is None:
            import fakeredis  # as breaker_redis's local fallback store does (store.py)

            _memory = Breakers(fakeredis.FakeRedis(server=fakeredis.FakeServer()), "pybreaker")
        return _memory


def _breakers_on(client: Any, prefix: str, policy: str) -> Breakers:
    """One Breakers per (client, prefix, policy) in a process: one subscription each."""
    key = (id(client), prefix, policy)
    with _LOCK:
        breakers = _on_clients.get(key)
        if breakers is None or breakers.client is not client:
            breakers = _on_clients[key] = Breakers(client, prefix, on_store_error=policy)
        return breakers


def _warn_once(key: str, message: str) -> None:
    with _LOCK:
        if key in _warned:
            return
        _warned.add(key)
    log.warning(message)


# -- bindings, and transitions reported by breaker_redis ------------------------------


@dataclass(frozen=True)
class _Binding:
    """A CircuitBreaker's breaker: the Breakers it lives in, and the breaker."""

    breakers: Breakers
    breaker: Breaker

    @property
    def key(self) -> tuple[int, str]:
        return (id(self.breakers), self.breaker.name)


_REGISTRY_LOCK = threading.Lock()
_bound: dict[tuple[int, str], weakref.WeakSet[CircuitBreaker]] = {}
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


def _register(cb: CircuitBreaker, key: tuple[int, str]) -> None:
    with _REGISTRY_LOCK:
        _bound.setdefault(key, weakref.WeakSet()).add(cb)


def _bound_to(key: tuple[int, str]) -> list[CircuitBreaker]:
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
# the breaker is not closed, the count is this key's, kept by the process that made
# each transition (it decides nothing: it is what fail_counter reports).


def _fail_counter_key(binding: _Binding) -> str:
    return f"{binding.breakers.prefix}:{{{binding.breaker.name}}}:pybreaker"


def _fail_counter_op(binding: _Binding, op: str, value: int = 0) -> None:
    breakers = binding.breakers
    if not breakers.gate.healthy:
        return  # no command may wait on a Redis that is down
    key, ttl = _fail_counter_key(binding), breakers.gate.remote.ttl_ms
    try:
        if op == "set":
            breakers.client.set(key, value, px=ttl)
        else:
            breakers.client.incr(key)
            breakers.client.pexpire(key, ttl)
    except Exception as exc:  # a lost count must not fail the call
        log.debug("fail_counter of %r not kept (%s)", binding.breaker.name,
                  exc)


def _read_fail_counter(binding: _Binding) -> int:
    if not binding.breakers.gate.healthy:
        return 0
    try:
        return int(binding.breakers.client.get(_fail_counter_key(binding)) or 0)
    except Exception:
        return 0


def _keep_fail_counter(binding: _Binding, transition: Transition) -> None:
    if transition.new != "open":
        return
    if transition.old == "closed" and transition.cause in _TRIP_CAUSES:
        _fail_counter_op(binding, "set", binding.breaker.config.failure_threshold)
    elif transition.old == "half_open" and transition.cause in _PROBE_FAILURES:
        _fail_counter_op(binding, "incr")


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


def _pybreaker_state(state: str, forced: str | None) -> str:
    if forced == "open":
        return STATE_OPEN
    if forced == "closed":
        return STATE_CLOSED
    return _FROM_REDIS.get(state, STATE_CLOSED)


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _calling_block() -> None:
    """The body of ``with cb.calling():``, as listeners' before_call receive it."""


# -- the circuit breaker -------------------------------------------------------------


class CircuitBreaker:
    """pybreaker's CircuitBreaker over a breaker_redis breaker.

    The name picks the breaker: CircuitBreakers of the same name on the same
    store are one breaker, in one process or in many. Without a
    ``state_storage``, a named breaker lives in the Redis of ``configure()`` /
    ``BREAKER_REDIS_URL`` (this process when neither is set) and an unnamed
    one in this process, like pybreaker's default memory storage.

    Beyond pybreaker's arguments: ``breakers=`` (a Breakers to live in) and any
    BreakerConfig field not set from pybreaker's own (``probe_timeout_seconds``,
    ``open_backoff``, ``half_open_max_calls``, ``slow_call_seconds``, ``mode`` ...).
    Calls are not serialised (pybreaker holds a lock around each call); the
    listeners of one CircuitBreaker are called one at a time, as pybreaker's are.
    """

    def __init__(
        self,
        fail_max: int = 5,
        reset_timeout: float = 60,
        success_threshold: int = 1,
        exclude: Iterable[type[BaseException] | Callable[[Any], bool]] | None = None,
        listeners: Sequence[CircuitBreakerListener] | None = None,
        state_storage: CircuitBreakerStorage | None = None,
        name: str | None = None,
        throw_new_error_on_trip: bool = True,
        *,
        breakers: Breakers | None = None,
        **options: Any,
    ) -> None:
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise TypeError(
                f"CircuitBreaker() got unexpected keyword argument(s) {', '.join(unknown)} "
                f"(BreakerConfig fields it accepts: {', '.join(sorted(_OPTIONS))})"
            )
        if breakers is not None and state_storage is not None:
            raise TypeError("CircuitBreaker() takes state_storage= or breakers=, not both")
        self._lock = threading.RLock()
        self._fail_max = fail_max
        self._reset_timeout = reset_timeout
        self._success_threshold = success_threshold
        self._options = dict(options)
        _config(fail_max, reset_timeout, success_threshold, self._options)
        self._excluded_exceptions: list[type[BaseException] | Callable[[Any], bool]] = list(exclude or [])
        self._listeners: list[CircuitBreakerListener] = list(listeners or [])
        self._name = name
        self._label = name or None  # picks the breaker; the name setter does not move it
        self._throw_new_error_on_trip = throw_new_error_on_trip
        if state_storage is None:
            if breakers is not None:
                state_storage = _BreakersStorage(breakers)
            elif self._label is not None:
                state_storage = _DefaultStorage()
            else:
                if _redis_configured():
                    _warn_once(
                        "unnamed",
                        "a CircuitBreaker without a name keeps its "
                        "state in this process; give it name= to share it through Redis",
                    )
                state_storage = CircuitMemoryStorage(STATE_CLOSED)
        if not isinstance(state_storage, CircuitBreakerStorage):
            raise TypeError(
                f"state_storage must be a breaker_redis.compat.pybreaker storage (got {state_storage!r}): "
                "pybreaker's own storage objects keep pybreaker's keys, which breaker_redis does not read"
            )
        self._state_storage = state_storage
        self._binding: _Binding | None = None
        self._state: CircuitBreakerState | None = None
        self._seen_epoch = 0  # the newest epoch this object has told its listeners about
        self._incarnation: tuple[int, int] | None = None  # (store generation, born) of what it saw
        if state_storage._eager:
            self._bind()

    # -- binding --------------------------------------------------------------

    def _bind(self) -> _Binding:
        binding = self._binding
        if binding is None:
            with _LOCK:
                binding = self._binding
                if binding is None:
                    binding = self._do_bind()
        return binding

    def _do_bind(self) -> _Binding:
        breakers, name = self._state_storage._locate(self._label)
        breaker = _breaker_for(breakers, name, self._make_config())
        _hook(breakers)
        binding = _Binding(breakers, breaker)
        try:
            op = self._state_storage._initial_op(binding)
            if op is not None:
                _run_op(binding, op)
        except (redis.exceptions.RedisError, OSError) as exc:  # as pybreaker, start anyway
            log.warning("breaker %r not put in its initial state (%s: %s)",
                        name, type(exc).__name__, exc)
        state, epoch = self._read_state(binding)
        self._seen_epoch = max(epoch, 0)
        self._state = self._create_new_state(state)
        self._binding = binding
        _register(self, binding.key)
        return binding

    def _make_config(self) -> BreakerConfig:
        return _config(self._fail_max, self._reset_timeout, self._success_threshold, self._options)

    def _reconfigure(self) -> None:
        config = self._make_config()
        binding = self._binding
        if binding is not None:
            _reconfigure(binding.breaker, config)

    @property
    def breaker(self) -> Breaker:
        """The breaker_redis Breaker behind this object (snapshot(), force_open() ...)."""
        return self._bind().breaker

    @property
    def breakers(self) -> Breakers:
        """The Breakers it lives in."""
        return self._bind().breakers

    # -- counters and settings ------------------------------------------------

    @property
    def fail_counter(self) -> int:
        """Failures since the last success or close, shared by every process."""
        binding = self._bind()
        try:
            snapshot = binding.breaker.snapshot()
        except StoreUnavailable:
            return 0
        if snapshot["state"] == "closed":
            return int(snapshot["consecutive_failures"])
        return _read_fail_counter(binding)

    @property
    def success_counter(self) -> int:
        """Successful trial calls in the current half-open state."""
        try:
            snapshot = self._bind().breaker.snapshot()
        except StoreUnavailable:
            return 0
        return int(snapshot["half_open_successes"]) if snapshot["state"] == "half_open" else 0

    @property
    def fail_max(self) -> int:
        return self._fail_max

    @fail_max.setter
    def fail_max(self, number: int) -> None:
        """Applies to this process's breaker of that name (each worker applies its own
        threshold to the shared state, as in breaker_redis)."""
        self._fail_max = number
        self._reconfigure()

    @property
    def reset_timeout(self) -> float:
        return self._reset_timeout

    @reset_timeout.setter
    def reset_timeout(self, timeout: float) -> None:
        """Applies from the next time the breaker opens."""
        self._reset_timeout = timeout
        self._reconfigure()

    @property
    def success_threshold(self) -> int:
        return self._success_threshold

    @success_threshold.setter
    def success_threshold(self, threshold: int) -> None:
        self._success_threshold = threshold
        self._reconfigure()

    @property
    def name(self) -> str | None:
        return self._name

    @name.setter
    def name(self, name: str) -> None:
        """A label, as in pybreaker: the breaker chosen by the name given when built stays."""
        self._name = name

    # -- state ----------------------------------------------------------------

    def _create_new_state(
        self, new_state: str, prev_state: CircuitBreakerState | None = None, notify: bool = False
    ) -> CircuitBreakerState:
        """The state object for a state name (looked up at each call, as pybreaker does)."""
        state_map: dict[str, Callable[..., CircuitBreakerState]] = {
            STATE_CLOSED: CircuitClosedState,
            STATE_OPEN: CircuitOpenState,
            STATE_HALF_OPEN: CircuitHalfOpenState,
        }
        try:
            cls = state_map[new_state]
        except KeyError as e:
            raise ValueError(f"Unknown state {new_state!r}, valid states: {', '.join(state_map)}") from e
        return cls(self, prev_state=prev_state, notify=notify)

    @property
    def current_state(self) -> str:
        """The state in Redis now (one script call): 'closed', 'open' or 'half-open'.
        Like pybreaker's, 'open' until a call finds the open period over."""
        return self._read_state(self._bind())[0]

    @property
    def state(self) -> CircuitBreakerState:
        """The state object, brought up to date (its listeners hear of a change made elsewhere)."""
        binding = self._bind()
        name, epoch = self._read_state(binding)
        with self._lock:
            self._seen_epoch = max(self._seen_epoch, epoch)
            if name != self._current().name:
                self._set_state(name)
            return self._current()

    @state.setter
    def state(self, state_str: str) -> None:
        """pybreaker's: the state object this CircuitBreaker shows, and a state_change;
        Redis is not changed (``open()``, ``half_open()`` and ``close()`` do that)."""
        self._bind()
        self._set_state(state_str)

    def _set_state(self, state_str: str) -> None:
        with self._lock:
            self._state = self._create_new_state(state_str, prev_state=self._state, notify=True)

    def _current(self) -> CircuitBreakerState:
        state = self._state
        assert state is not None, "bound before use"
        return state

    def _read_state(self, binding: _Binding) -> tuple[str, int]:
        try:
            snapshot = binding.breaker.snapshot()
        except StoreUnavailable:  # on_store_error="deny": pybreaker's fallback_circuit_state "open"
            return STATE_OPEN, -1
        return _FROM_REDIS.get(snapshot["state"], STATE_CLOSED), int(snapshot["epoch"])

    def _notify_state_change(
        self, prev_state: CircuitBreakerState | None, new_state: CircuitBreakerState
    ) -> None:
        for listener in tuple(self._listeners):
            listener.state_change(self, prev_state, new_state)

    def _apply(self, transitions: Sequence[Transition]) -> None:
        """Tell the listeners of transitions made by a call of this process, once each."""
        with self._lock:
            for transition in transitions:
                if transition.epoch <= self._seen_epoch:
                    continue  # already told (noticed by another thread first)
                self._seen_epoch = transition.epoch
                self._set_state(_FROM_REDIS.get(transition.new, STATE_CLOSED))

    def _notice(self, binding: _Binding, permit: Permit | None = None) -> None:
        """At a call's admission or refusal: a change made elsewhere reaches the
        listeners at this object's next call, as in pybreaker. From what this
        worker knows (no command); from the permit, or one snapshot after a
        refusal, when the worker has just forgotten (a pushed notice, a new
        subscription)."""
        known = _known(binding.breaker)
        if known is not None:
            name = _pybreaker_state(known.state, known.forced)
            self._saw(name, known.epoch, (known.generation, known.born))
        elif permit is not None:
            if permit.epoch >= 0:  # not a permit of on_store_error="allow"
                name = STATE_HALF_OPEN if permit.probe else STATE_OPEN if permit.observing else STATE_CLOSED
                self._saw(name, permit.epoch, None)
        else:
            name, epoch = self._read_state(binding)
            if epoch >= 0:
                self._saw(name, epoch, None)

    def _saw(self, name: str, epoch: int, incarnation: tuple[int, int] | None) -> None:
        with self._lock:
            if incarnation is not None and incarnation != self._incarnation:
                if self._incarnation is not None:
                    self._seen_epoch = 0  # another store, or the keys were recreated: other epochs
                self._incarnation = incarnation
            if epoch <= self._seen_epoch:
                return
            self._seen_epoch = epoch
            if name != self._current().name:
                self._set_state(name)

    def _after(self, binding: _Binding, transitions: Sequence[Transition]) -> None:
        """After a script call: its transitions to every CircuitBreaker of this
        breaker here, this one first."""
        if not transitions:
            return
        self._apply(transitions)
        for other in _bound_to(binding.key):
            if other is not self:
                try:
                    other._apply(transitions)
                except Exception:
                    log.exception("a listener of %r failed", other)

    # -- exclusions and listeners ---------------------------------------------

    @property
    def excluded_exceptions(self) -> tuple[type[BaseException] | Callable[[Any], bool], ...]:
        return tuple(self._excluded_exceptions)

    def add_excluded_exception(self, exception: type[BaseException] | Callable[[Any], bool]) -> None:
        with self._lock:
            self._excluded_exceptions.append(exception)

    def add_excluded_exceptions(self, *exceptions: type[BaseException] | Callable[[Any], bool]) -> None:
        for exception in exceptions:
            self.add_excluded_exception(exception)

    def remove_excluded_exception(self, exception: type[BaseException] | Callable[[Any], bool]) -> None:
        with self._lock:
            self._excluded_exceptions.remove(exception)

    def is_system_error(self, exception: BaseException) -> bool:
        """False for an excluded exception (a class it is an instance of, or a
        callable that returns True for it): pybreaker counts those as successes."""
        for exclusion in self._excluded_exceptions:
            if isinstance(exclusion, type):
                if isinstance(exception, exclusion):
                    return False
            elif callable(exclusion) and exclusion(exception):
                return False
        return True

    @property
    def listeners(self) -> tuple[CircuitBreakerListener, ...]:
        return tuple(self._listeners)

    def add_listener(self, listener: CircuitBreakerListener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def add_listeners(self, *listeners: CircuitBreakerListener) -> None:
        for listener in listeners:
            self.add_listener(listener)

    def remove_listener(self, listener: CircuitBreakerListener) -> None:
        with self._lock:
            self._listeners.remove(listener)

    def _dispatch(self, event: str, *args: Any, **kwargs: Any) -> None:
        """Call one event of every listener, one CircuitBreaker's listeners at a time."""
        if not self._listeners:
            return
        with self._lock:
            for listener in tuple(self._listeners):
                getattr(listener, event)(self, *args, **kwargs)

    # -- calls ----------------------------------------------------------------

    def call(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call func behind the breaker. A generator's outcome is recorded when it
        finishes, a coroutine's when it is awaited to the end."""
        permit = self._admit(func, args, kwargs)
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            error = self._settle(permit, exc)
            if error is not None:
                raise error.with_traceback(exc.__traceback__) from exc
            raise
        if isinstance(result, types.GeneratorType):
            return cast(T, self._generator(permit, result))
        if inspect.iscoroutine(result):
            return cast(T, self._coroutine(permit, result))
        self._settle(permit)
        return result

    def _admit(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Permit:
        """A permit for one call, or CircuitBreakerError; then the before_call listeners."""
        binding = self._bind()
        permit: Permit | None = None
        refused: BreakerOpen | None = None
        with _Capture(binding.key) as transitions:
            try:
                permit = binding.breaker.acquire()
            except BreakerOpen as exc:
                refused = exc
        try:
            self._after(binding, transitions)
            self._notice(binding, permit)
            if permit is not None:
                self._dispatch("before_call", func, *args, **kwargs)
        except BaseException:
            if permit is not None:
                permit.ignore()
            raise
        if permit is None:
            assert refused is not None
            message = _REFUSALS.get(refused.reason, _REFUSALS["open"])
            raise _error(message, refused.reason, refused.retry_after)
        return permit

    def _settle(self, permit: Permit, exc: BaseException | None = None) -> CircuitBreakerError | None:
        """Record a call's outcome (exc: what it raised, None for a return) and tell
        the listeners; the CircuitBreakerError to raise instead, if any. All in the
        calling thread (a coroutine's: ``_settle_off_loop``)."""
        outcome = self._outcome(exc)
        return self._tell(outcome, exc, self._record(permit, outcome))

    async def _settle_off_loop(self, permit: Permit, exc: BaseException | None) -> CircuitBreakerError | None:
        """_settle for a coroutine: the record, which may wait on Redis, runs in a
        worker thread, never on the event loop; the exclusions and the listeners run
        in the loop's thread, as a sync call's run in its caller's. Recorded here
        instead: a GeneratorExit (the coroutine closed unfinished: it cannot wait), a
        KeyboardInterrupt or SystemExit (the process is going away), and a coroutine
        not run by asyncio (no loop to hand the thread's result back to)."""
        outcome = self._outcome(exc)
        if (exc is None or isinstance(exc, (Exception, asyncio.CancelledError))) and _on_asyncio():
            transitions = await asyncio.to_thread(self._record, permit, outcome)
        else:
            transitions = self._record(permit, outcome)
        return self._tell(outcome, exc, transitions)

    def _outcome(self, exc: BaseException | None) -> str:
        """An excluded exception is a success, as in pybreaker. A BaseException that
        is not an Exception (KeyboardInterrupt, GeneratorExit, cancellation) is
        neither: it says nothing about the service."""
        if exc is None:
            return "success"
        if not isinstance(exc, Exception):
            return "ignored"
        return "failure" if self.is_system_error(exc) else "success"

    def _record(self, permit: Permit, outcome: str) -> list[Transition]:
        """Record the permit's outcome (the script call, and pybreaker's failure count
        after a trial call): the transitions it made, for the listeners."""
        if outcome == "ignored":
            permit.ignore()
            return []
        binding = self._bind()
        with _Capture(binding.key) as transitions:
            permit.record(outcome)
        if outcome == "success" and permit.probe:
            _fail_counter_op(binding, "set", 0)  # pybreaker: a success resets the failure count
        return transitions

    def _tell(
        self, outcome: str, exc: BaseException | None, transitions: list[Transition]
    ) -> CircuitBreakerError | None:
        """The listeners hear of a recorded outcome in pybreaker's order; the
        CircuitBreakerError to raise for the call that tripped the breaker, if any."""
        if outcome == "ignored":
            return None
        binding = self._bind()
        if outcome == "success":
            self._after(binding, transitions)
            self._dispatch("success")
            return None
        self._dispatch("failure", exc)
        self._after(binding, transitions)
        tripped = next((t for t in transitions if t.new == "open" and t.old in ("closed", "half_open")), None)
        if tripped is None or not self._throw_new_error_on_trip:
            return None
        if tripped.old == "closed":
            return _error("Failures threshold reached, circuit breaker opened", "tripped")
        return _error("Trial call failed, circuit breaker opened", "tripped")

    def _generator(self, permit: Permit, generator: Generator[Any, Any, Any]) -> Generator[Any, Any, Any]:
        try:
            result = yield from generator
        except BaseException as exc:
            error = self._settle(permit, exc)
            if error is not None:
                raise error.with_traceback(exc.__traceback__) from exc
            raise
        self._settle(permit)
        return result

    async def _coroutine(self, permit: Permit, coroutine: Coroutine[Any, Any, T]) -> T:
        try:
            result = await coroutine
        except BaseException as exc:
            error = await self._settle_off_loop(permit, exc)
            if error is not None:
                raise error.with_traceback(exc.__traceback__) from exc
            raise
        await self._settle_off_loop(permit, None)
        return result

    @contextlib.contextmanager
    def calling(self) -> Iterator[None]:
        """``with cb.calling(): ...``: the block is the protected call."""
        permit = self._admit(_calling_block, (), {})
        try:
            yield
        except BaseException as exc:
            error = self._settle(permit, exc)
            if error is not None:
                raise error.with_traceback(exc.__traceback__) from exc
            raise
        self._settle(permit)

    def call_async(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call a tornado coroutine behind the breaker (pybreaker's; a tornado Future).

        The decision may ask Redis synchronously, as pybreaker's storage does; the
        outcome is recorded off the event loop (``_settle_off_loop``). asyncio code
        has breaker_redis.asyncio.
        """
        if not HAS_TORNADO_SUPPORT:
            raise ImportError("No module named tornado")
        from tornado import gen

        def wrapped() -> Generator[Any, Any, Any]:
            permit = self._admit(func, args, kwargs)
            try:
                result = yield func(*args, **kwargs)
            except GeneratorExit as exc:  # closed unfinished: nothing may be yielded any more
                self._settle(permit, exc)
                raise
            except BaseException as exc:
                error = yield self._settle_off_loop(permit, exc)
                if error is not None:
                    raise error.with_traceback(exc.__traceback__) from exc
                raise
            yield self._settle_off_loop(permit, None)
            return result

        return gen.coroutine(wrapped)()

    def __call__(self, *call_args: Any, **call_kwargs: bool) -> Callable[..., Any]:
        """``@cb`` (or ``@cb(__pybreaker_call_async=True)`` for tornado coroutines).
        An ``async def`` function stays one, its outcome recorded when awaited."""
        call_async = call_kwargs.pop("__pybreaker_call_async", False)
        if call_async and not HAS_TORNADO_SUPPORT:
            raise ImportError("No module named tornado")

        def outer(func: Callable[..., Any]) -> Callable[..., Any]:
            if inspect.iscoroutinefunction(func) and not call_async:

                @functools.wraps(func)
                async def awaiting(*args: Any, **kwargs: Any) -> Any:
                    return await self.call(func, *args, **kwargs)

                return awaiting

            @functools.wraps(func)
            def inner(*args: Any, **kwargs: Any) -> Any:
                if call_async:
                    return self.call_async(func, *args, **kwargs)
                return self.call(func, *args, **kwargs)

            return inner

        if call_args:
            return outer(*call_args)
        return outer

    # -- by hand ----------------------------------------------------------------

    def open(self) -> bool:
        """Open the breaker for ``reset_timeout`` (every process sees it), then half-open.
        Returns ``throw_new_error_on_trip``, as pybreaker's."""
        self._by_hand("open")
        return self._throw_new_error_on_trip

    def half_open(self) -> None:
        """Half-open the breaker: the next call is a trial call."""
        self._by_hand("half_open")

    def close(self) -> None:
        """Close the breaker (breaker_redis's reset: a clean window, no backoff, no force)."""
        binding = self._bind()
        with _Capture(binding.key) as transitions:
            binding.breaker.reset()
        self._after(binding, transitions)

    def _by_hand(self, op: str) -> None:
        binding = self._bind()
        snapshot = binding.breaker.snapshot()
        if snapshot["state"] == "closed":  # pybreaker keeps the failure count across open()
            _fail_counter_op(binding, "set", int(snapshot["consecutive_failures"]))
        with _Capture(binding.key) as transitions:
            _run_op(binding, op)
        self._after(binding, transitions)

    def __repr__(self) -> str:
        return f"<CircuitBreaker {self._name!r}>"


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
