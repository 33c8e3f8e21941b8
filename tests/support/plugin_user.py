"""A user's test files, run by pytest in a directory of their own, outside the checkout
(tests/testing/test_pytest_plugin.py, and tests/system/test_packaging.py on the installed
wheel): they use the fixtures of breaker_redis's pytest plugin as a user's suite would."""

from __future__ import annotations

from pathlib import Path

PLUGIN = "breaker_redis.testing.pytest_plugin"

# Each test prints how the plugin was loaded; ``loaded_by`` reads it back.
USES_THE_KIT = """
import sys
import threading
import time

import breaker_redis
from breaker_redis import BreakerConfig, BreakerOpen, State
from breaker_redis.testing import ManualClock, forced_closed, forced_open

PAY = BreakerConfig(trip="consecutive", failure_threshold=3, open_seconds=600)
STARTED = time.monotonic()
LEFT = {}


def refused(breaker):
    try:
        breaker.acquire().ignore()
    except BreakerOpen as refusal:
        return refusal.reason, refusal.retry_after
    return None


def breaker_threads():
    return [thread.name for thread in threading.enumerate() if thread.name.startswith("breaker-redis")]


def test_the_plugin_is_loaded(pytestconfig):
    manager = pytestconfig.pluginmanager
    plugin = manager.get_plugin("breaker_redis.testing.pytest_plugin")
    assert plugin is not None
    dists = [dist.metadata["Name"] for loaded, dist in manager.list_plugin_distinfo() if loaded is plugin]
    print(f"LOADED-BY {'the entry point of ' + dists[0] if dists else '-p'} FROM {breaker_redis.__file__}")


def test_trip_then_the_probe_once_open_seconds_have_passed(memory_breakers, breaker_clock):
    assert isinstance(breaker_clock, ManualClock)
    pay = memory_breakers.get("pay", PAY)
    for _ in range(3):
        pay.acquire().failure()
    assert pay.state is State.OPEN
    assert refused(pay) == ("open", 600.0)
    breaker_clock.advance(599.999)
    assert refused(pay) == ("open", 0.001)
    breaker_clock.advance(0.001)
    probe = pay.acquire()  # admitted: the half-open probe
    assert pay.state is State.HALF_OPEN
    probe.success()
    assert pay.state is State.CLOSED


def test_forced_open_and_closed_for_a_block(memory_breakers):
    pay = memory_breakers.get("pay", PAY)
    with forced_open(pay):
        assert refused(pay) == ("forced_open", None)
    assert refused(pay) is None
    with forced_closed(pay):
        for _ in range(5):
            pay.acquire().failure()
        assert pay.state is State.CLOSED
    assert pay.snapshot()["window_failures"] == 0


def test_a_test_that_leaves_its_breakers_tripped_and_forced(memory_breakers, breaker_clock):
    pay = memory_breakers.get("pay", PAY)
    for _ in range(3):
        pay.acquire().failure()
    memory_breakers.get("stock").force_open()
    breaker_clock.advance(3600)
    assert breaker_threads() != []  # its listener runs until the fixture closes it
    LEFT["now_ms"] = breaker_clock.now_ms


def test_the_next_test_starts_afresh(memory_breakers, breaker_clock):
    assert breaker_threads() == []
    assert memory_breakers.names() == []
    assert memory_breakers.get("pay", PAY).state is State.CLOSED
    assert memory_breakers.get("stock").state is State.CLOSED
    assert breaker_clock.now_ms < LEFT["now_ms"] - 3_000_000  # a clock of its own, not advanced
    assert abs(breaker_clock.now_ms - time.time() * 1000) < 60_000


def test_nothing_slept():
    assert time.monotonic() - STARTED < 300  # 600 s open, 3600 s advanced
"""
USES_THE_KIT_PASSED = 6

# A suite that never asks for the kit: the plugin is loaded, and nothing of it runs.
DOES_NOT_USE_IT = """
import sys
import threading


def test_plain(pytestconfig):
    assert pytestconfig.pluginmanager.get_plugin("breaker_redis.testing.pytest_plugin") is not None
    assert "breaker_redis.engine" not in sys.modules and "redis" not in sys.modules  # paid nothing for them
    assert "fakeredis" not in sys.modules  # no store was made
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("breaker-redis")]
"""


def write_user_tests(folder: Path) -> None:
    (folder / "test_checkout.py").write_text(USES_THE_KIT, "utf-8")
    (folder / "test_plain.py").write_text(DOES_NOT_USE_IT, "utf-8")


def loaded_by(output: str) -> str:
    """How the user's run loaded the plugin: 'the entry point of breaker-redis FROM ...' or '-p FROM ...'."""
    lines = [line for line in output.splitlines() if "LOADED-BY " in line]
    assert len(lines) == 1, output
    return lines[0].partition("LOADED-BY ")[2]
