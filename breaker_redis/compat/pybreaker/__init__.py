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

The modules: breaker (CircuitBreaker: arguments, calls, by-hand operations),
tracking (what a CircuitBreaker knows of its breaker: binding, state,
listeners), awaiting (coroutines' outcomes, recorded off the event loop),
states, errors, listeners, storages (where a breaker lives), stores (the
default store, ``configure``), registry (which CircuitBreakers use which
breaker, the transitions they hear of), binding (a CircuitBreaker's breaker),
fail_counter, settings (pybreaker's arguments as a BreakerConfig). This
package re-exports every name the single module had, and is where tests patch
``HAS_TORNADO_SUPPORT`` and the state classes: the code reads those here at
each use (patched.py), and no module imports the package back.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from breaker_redis.compat.pybreaker import patched, stores
from breaker_redis.compat.pybreaker.awaiting import _on_asyncio as _on_asyncio
from breaker_redis.compat.pybreaker.binding import _Binding as _Binding
from breaker_redis.compat.pybreaker.breaker import CircuitBreaker as CircuitBreaker
from breaker_redis.compat.pybreaker.breaker import T as T
from breaker_redis.compat.pybreaker.breaker import _calling_block as _calling_block
from breaker_redis.compat.pybreaker.errors import _REFUSALS as _REFUSALS
from breaker_redis.compat.pybreaker.errors import CircuitBreakerError as CircuitBreakerError
from breaker_redis.compat.pybreaker.errors import _error as _error
from breaker_redis.compat.pybreaker.fail_counter import _PROBE_FAILURES as _PROBE_FAILURES
from breaker_redis.compat.pybreaker.fail_counter import _TRIP_CAUSES as _TRIP_CAUSES
from breaker_redis.compat.pybreaker.fail_counter import _fail_counter_key as _fail_counter_key
from breaker_redis.compat.pybreaker.fail_counter import _fail_counter_op as _fail_counter_op
from breaker_redis.compat.pybreaker.fail_counter import _keep_fail_counter as _keep_fail_counter
from breaker_redis.compat.pybreaker.fail_counter import _read_fail_counter as _read_fail_counter
from breaker_redis.compat.pybreaker.listeners import CircuitBreakerListener as CircuitBreakerListener
from breaker_redis.compat.pybreaker.registry import _REGISTRY_LOCK as _REGISTRY_LOCK
from breaker_redis.compat.pybreaker.registry import _bound as _bound
from breaker_redis.compat.pybreaker.registry import _bound_to as _bound_to
from breaker_redis.compat.pybreaker.registry import _Capture as _Capture
from breaker_redis.compat.pybreaker.registry import _hook as _hook
from breaker_redis.compat.pybreaker.registry import _hooked as _hooked
from breaker_redis.compat.pybreaker.registry import _local as _local
from breaker_redis.compat.pybreaker.registry import _made as _made
from breaker_redis.compat.pybreaker.registry import _on_rules_transition as _on_rules_transition
from breaker_redis.compat.pybreaker.registry import _on_transition as _on_transition
from breaker_redis.compat.pybreaker.registry import _register as _register
from breaker_redis.compat.pybreaker.settings import _COMPAT_DEFAULTS as _COMPAT_DEFAULTS
from breaker_redis.compat.pybreaker.settings import _MAPPED as _MAPPED
from breaker_redis.compat.pybreaker.settings import _OPTIONS as _OPTIONS
from breaker_redis.compat.pybreaker.settings import _breaker_for as _breaker_for
from breaker_redis.compat.pybreaker.settings import _config as _config
from breaker_redis.compat.pybreaker.settings import _is_new as _is_new
from breaker_redis.compat.pybreaker.settings import _known as _known
from breaker_redis.compat.pybreaker.settings import _reconfigure as _reconfigure
from breaker_redis.compat.pybreaker.settings import _run_op as _run_op
from breaker_redis.compat.pybreaker.states import _FROM_REDIS as _FROM_REDIS
from breaker_redis.compat.pybreaker.states import _OPS as _OPS
from breaker_redis.compat.pybreaker.states import STATE_CLOSED as STATE_CLOSED
from breaker_redis.compat.pybreaker.states import STATE_HALF_OPEN as STATE_HALF_OPEN
from breaker_redis.compat.pybreaker.states import STATE_OPEN as STATE_OPEN
from breaker_redis.compat.pybreaker.states import CircuitBreakerState as CircuitBreakerState
from breaker_redis.compat.pybreaker.states import CircuitClosedState as CircuitClosedState
from breaker_redis.compat.pybreaker.states import CircuitHalfOpenState as CircuitHalfOpenState
from breaker_redis.compat.pybreaker.states import CircuitOpenState as CircuitOpenState
from breaker_redis.compat.pybreaker.states import _check_state as _check_state
from breaker_redis.compat.pybreaker.states import _NamedState as _NamedState
from breaker_redis.compat.pybreaker.states import _pybreaker_state as _pybreaker_state
from breaker_redis.compat.pybreaker.storages import CircuitBreakerStorage as CircuitBreakerStorage
from breaker_redis.compat.pybreaker.storages import CircuitMemoryStorage as CircuitMemoryStorage
from breaker_redis.compat.pybreaker.storages import CircuitRedisStorage as CircuitRedisStorage
from breaker_redis.compat.pybreaker.storages import _BreakersStorage as _BreakersStorage
from breaker_redis.compat.pybreaker.storages import _DefaultStorage as _DefaultStorage
from breaker_redis.compat.pybreaker.storages import _key_name as _key_name
from breaker_redis.compat.pybreaker.stores import _LOCK as _LOCK
from breaker_redis.compat.pybreaker.stores import _breakers_on as _breakers_on
from breaker_redis.compat.pybreaker.stores import _default_breakers as _default_breakers
from breaker_redis.compat.pybreaker.stores import _from_env as _from_env
from breaker_redis.compat.pybreaker.stores import _memory_breakers as _memory_breakers
from breaker_redis.compat.pybreaker.stores import _on_clients as _on_clients
from breaker_redis.compat.pybreaker.stores import _redis_configured as _redis_configured
from breaker_redis.compat.pybreaker.stores import _warn_once as _warn_once
from breaker_redis.compat.pybreaker.stores import _warned as _warned
from breaker_redis.compat.pybreaker.stores import configure as configure
from breaker_redis.compat.pybreaker.stores import log as log

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

# pybreaker's flags. The tornado one is read here at each use, as pybreaker reads its own.
HAS_TORNADO_SUPPORT = importlib.util.find_spec("tornado") is not None
HAS_REDIS_SUPPORT = True

# Tracebacks and error trackers name the error as before the module became a package
# (breaker_redis.compat.pybreaker.CircuitBreakerError); pickles find it here too.
CircuitBreakerError.__module__ = __name__

# breaker.py and tracking.py read HAS_TORNADO_SUPPORT and the state classes here (patched.py)
patched.hand_over(sys.modules[__name__])

# The default store's settings, rebound by configure() and at first use: read where they live.
_REBOUND = ("_configured", "_memory")


def __getattr__(name: str) -> Any:
    if name in _REBOUND:
        return getattr(stores, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_REBOUND])
