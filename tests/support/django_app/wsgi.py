"""``gunicorn tests.support.django_app.wsgi:application``: Django behind BreakerMiddleware.

This is the whole integration: wrap Django's WSGI application. ``/pay`` is
protected by the ``pay`` breaker (5 consecutive failures open it for
``DJANGO_PAY_OPEN_SECONDS``; 2 probes, both needed to close it); every
other path goes straight to Django. Reads ``BREAKER_REDIS_URL``,
``BREAKER_KEY_PREFIX`` and ``UPSTREAM_URL`` (views.py).

Nothing here connects to Redis: the client connects on first use, in the
worker, so ``--preload`` is safe too. The outer ``worker_pid`` wrapper adds
``X-Worker-Pid`` to every response, refusals included, so the tests can
tell which of the 4 workers answered.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from django.core.wsgi import get_wsgi_application

from breaker_redis import Breakers
from breaker_redis.wsgi import BreakerMiddleware
from demo_app import settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.django_app.settings")

PAY = {
    "trip": "consecutive",
    "failure_threshold": 5,
    "open_seconds": float(os.environ.get("DJANGO_PAY_OPEN_SECONDS", "5")),
    "open_backoff": 1.0,
    "half_open_max_calls": 2,
    "half_open_successes": 2,
}

breakers = Breakers.from_url(
    os.environ.get("BREAKER_REDIS_URL", "redis://127.0.0.1:6379/0"),
    os.environ.get("BREAKER_KEY_PREFIX", "breaker"),
    **settings.clock_options(),  # the test's clock when DEMO_CLOCK_FILE names one (demo_app/clock.py)
)
protected = BreakerMiddleware(
    get_wsgi_application(),
    breakers,
    routes={"/pay": {"breaker": "pay", **PAY}},
)


def application(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    """Every response says which worker answered."""
    pid = str(os.getpid())

    def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        return start_response(status, [*headers, ("X-Worker-Pid", pid)], exc_info)

    return protected(environ, start)
