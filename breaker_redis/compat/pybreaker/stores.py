"""The stores named CircuitBreakers without a storage live in: the Redis of
``configure()`` or ``BREAKER_REDIS_URL``, else this process's in-process store,
and one Breakers per (client, prefix, policy) for CircuitRedisStorage."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from breaker_redis.engine.breakers import Breakers

log = logging.getLogger("breaker_redis.compat.pybreaker")  # the package's one logger

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
