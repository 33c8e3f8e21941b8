"""What a CircuitBreaker knows of its breaker: where it lives (bound at first use),
the state its listeners see and when they hear of a change, its listeners and the
exceptions it excludes. The calls and pybreaker's arguments: breaker.py."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis

from breaker_redis.base.config import BreakerConfig
from breaker_redis.compat.pybreaker.binding import _Binding
from breaker_redis.compat.pybreaker.fail_counter import _read_fail_counter
from breaker_redis.compat.pybreaker.patched import package
from breaker_redis.compat.pybreaker.registry import _bound_to, _hook, _register
from breaker_redis.compat.pybreaker.settings import _breaker_for, _config, _known, _reconfigure, _run_op
from breaker_redis.compat.pybreaker.states import (
    _FROM_REDIS,
    STATE_CLOSED,
    STATE_HALF_OPEN,
    STATE_OPEN,
    CircuitBreakerState,
    _pybreaker_state,
)
from breaker_redis.compat.pybreaker.stores import _LOCK
from breaker_redis.engine.breaker import Breaker
from breaker_redis.engine.breakers import Breakers
from breaker_redis.engine.permit import Permit
from breaker_redis.engine.transitions import Transition
from breaker_redis.storage.store import StoreUnavailable

log = logging.getLogger("breaker_redis.compat.pybreaker")  # the package's one logger


class _Listener(Protocol):
    """What a CircuitBreaker calls of its listeners: listeners.py's CircuitBreakerListener,
    which names the CircuitBreaker it is given (``cb``) and so stands above it."""

    def before_call(self, cb: Any, func: Callable[..., Any], *args: Any, **kwargs: Any) -> None: ...
    def failure(self, cb: Any, exc: BaseException) -> None: ...
    def success(self, cb: Any) -> None: ...
    def state_change(
        self, cb: Any, old_state: CircuitBreakerState | None, new_state: CircuitBreakerState
    ) -> None: ...


class _Tracking:
    """The part of CircuitBreaker that follows its breaker (set by CircuitBreaker.__init__)."""

    _lock: threading.RLock
    _fail_max: int
    _reset_timeout: float
    _success_threshold: int
    _options: dict[str, Any]
    _excluded_exceptions: list[type[BaseException] | Callable[[Any], bool]]
    _listeners: list[_Listener]
    _label: str | None
    _state_storage: Any  # a CircuitBreakerStorage
    _binding: _Binding | None
    _state: CircuitBreakerState | None
    _seen_epoch: int  # the newest epoch this object has told its listeners about
    _incarnation: tuple[int, int] | None  # (store generation, born) of what it saw

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
            log.warning("breaker %r not put in its initial state (%s: %s)", name, type(exc).__name__, exc)
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

    # -- counters -------------------------------------------------------------

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

    # -- state ----------------------------------------------------------------

    def _create_new_state(
        self, new_state: str, prev_state: CircuitBreakerState | None = None, notify: bool = False
    ) -> CircuitBreakerState:
        """The state object for a state name (looked up at each call, as pybreaker does)."""
        state_map: dict[str, Callable[..., CircuitBreakerState]] = {  # the package's: tests patch them there
            STATE_CLOSED: package().CircuitClosedState,
            STATE_OPEN: package().CircuitOpenState,
            STATE_HALF_OPEN: package().CircuitHalfOpenState,
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
    def listeners(self) -> tuple[_Listener, ...]:
        return tuple(self._listeners)

    def add_listener(self, listener: _Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def add_listeners(self, *listeners: _Listener) -> None:
        for listener in listeners:
            self.add_listener(listener)

    def remove_listener(self, listener: _Listener) -> None:
        with self._lock:
            self._listeners.remove(listener)

    def _dispatch(self, event: str, *args: Any, **kwargs: Any) -> None:
        """Call one event of every listener, one CircuitBreaker's listeners at a time."""
        if not self._listeners:
            return
        with self._lock:
            for listener in tuple(self._listeners):
                getattr(listener, event)(self, *args, **kwargs)
