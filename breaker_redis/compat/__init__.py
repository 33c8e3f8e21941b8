"""Drop-in replacements for other circuit-breaker libraries, backed by breaker_redis.

``breaker_redis.compat.pybreaker`` exposes pybreaker's public names over
breakers whose state lives in Redis (docs/pybreaker-migration.md): migrating
is ``import breaker_redis.compat.pybreaker as pybreaker``.

This package imports nothing itself, so that importing one compat module
never imports another, nor their optional dependencies (tornado).
"""

from __future__ import annotations
