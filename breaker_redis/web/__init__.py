"""The framework-free HTTP policy shared by every web integration.

Route tables, judging a status or an exception as an outcome, fallback keys,
the refusal response and its warnings. ``breaker_redis.wsgi``, ``.asgi``,
``.fastapi``, ``.flask``, ``.requests`` and ``.httpx`` keep only their
protocol's timing and I/O.
"""
