"""pybreaker's ``fail_counter`` while the breaker is not closed.

pybreaker's fail_counter counts failures since the last success or close, across
open and half-open; breaker_redis's consecutive count restarts at each trip. While
the breaker is not closed, the count is this key's, kept by the process that made
each transition (it decides nothing: it is what fail_counter reports).
"""

from __future__ import annotations

import logging

from breaker_redis.compat.pybreaker.binding import _Binding
from breaker_redis.engine.transitions import Transition

log = logging.getLogger("breaker_redis.compat.pybreaker")  # the package's one logger

_TRIP_CAUSES = frozenset({"consecutive", "count", "rate", "slow"})
_PROBE_FAILURES = frozenset({"probe_failed", "probe_timeout"})


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
        log.debug("fail_counter of %r not kept (%s)", binding.breaker.name, exc)


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
