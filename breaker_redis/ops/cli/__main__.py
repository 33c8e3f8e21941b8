"""``python -m breaker_redis.ops.cli``: the ``breaker-redis`` command."""

from __future__ import annotations

from breaker_redis.ops.cli import main

main(prog_name="breaker-redis")
