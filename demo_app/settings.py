"""The demo's breaker numbers, shared by the app and the runner.

``/pay`` uses the numbers of the classic OpenResty breaker kept in a
``lua_shared_dict``: trip after 5 failures in 10 s, stay open 10 s, let one
probe through at a time, close after 2 successes. The open period can be
shortened with ``DEMO_PAY_OPEN_SECONDS`` so that the tests run in seconds,
and ``DEMO_PAY_MIN_REPORTERS`` asks for failures from that many hosts before a
shared trip (docs/one-sick-host.md); the other numbers stay.
``DEMO_CLOCK_FILE`` names a clock file a test moves (demo_app/clock.py): the
breakers of every worker then decide by its time instead of their own.
"""

from __future__ import annotations

import os
from typing import Any

from .clock import FileClock


def _seconds(variable: str, default: float) -> float:
    raw = os.environ.get(variable, "")
    return float(raw) if raw.strip() else default


def clock_options() -> dict[str, Any]:
    """``FlaskBreakers`` keyword arguments: ``clock`` when ``DEMO_CLOCK_FILE`` is set, else none."""
    path = os.environ.get("DEMO_CLOCK_FILE", "").strip()
    if not path:
        return {}
    return {"clock": FileClock(path)}


def pay_config() -> dict[str, Any]:
    return {
        "trip": "count",
        "failure_threshold": 5,
        "window_seconds": 10.0,
        "open_seconds": _seconds("DEMO_PAY_OPEN_SECONDS", 10.0),
        "half_open_max_calls": 1,
        "half_open_successes": 2,
        "probe_timeout_seconds": 5.0,
        "min_reporters": int(os.environ.get("DEMO_PAY_MIN_REPORTERS", "").strip() or 1),
    }


def cart_config() -> dict[str, Any]:
    return {
        "trip": "consecutive",
        "failure_threshold": 3,
        "open_seconds": _seconds("DEMO_CART_OPEN_SECONDS", 5.0),
        "half_open_successes": 1,
        "probe_timeout_seconds": 5.0,
    }


def recommend_config() -> dict[str, Any]:
    return {
        "trip": "consecutive",
        "failure_threshold": 3,
        "open_seconds": _seconds("DEMO_RECOMMEND_OPEN_SECONDS", 5.0),
        "probe_timeout_seconds": 5.0,
    }


# Seconds the app waits for the upstream (the design's 1 s; DEMO_UPSTREAM_TIMEOUT for a test
# whose upstream answers but a busy machine may take longer than that).
UPSTREAM_TIMEOUT = _seconds("DEMO_UPSTREAM_TIMEOUT", 1.0)
PAY_UNAVAILABLE = "The payment service is temporarily unavailable, please retry later."
