"""breaker_redis's pytest plugin as a user's suite meets it: test files in a directory
outside the checkout (tests/support/plugin_user.py), run by pytest in a process of its own.

The plugin comes from the installed product's ``pytest11`` entry point when the
installed breaker-redis declares it (pyproject.toml), and from ``-p`` until then;
either way the user's tests read which (tests/system/test_packaging.py installs the
wheel, whose entry point must be the one that loads it).
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import pytest

from tests.support.plugin_user import PLUGIN, USES_THE_KIT_PASSED, loaded_by, write_user_tests

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]


def installed_entry_point() -> bool:
    return any(ep.value == PLUGIN for ep in importlib.metadata.entry_points(group="pytest11"))


@pytest.fixture
def user_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    # this checkout's breaker_redis, wherever pytest runs; what else the path holds stays
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    write_user_tests(pytester.path)
    return pytester


def test_a_users_suite_gets_the_fixtures_and_nothing_carries_over(user_suite: pytest.Pytester) -> None:
    installed = installed_entry_point()
    result = user_suite.runpytest_subprocess("-s", *([] if installed else ["-p", PLUGIN]), "test_checkout.py")
    result.assert_outcomes(passed=USES_THE_KIT_PASSED)
    how = loaded_by(result.stdout.str())
    assert how.startswith("the entry point of breaker-redis " if installed else "-p "), how
    assert how.endswith(str(ROOT / "breaker_redis" / "__init__.py")), how


def test_naming_the_plugin_with_p_is_the_same_plugin(user_suite: pytest.Pytester) -> None:
    """Its entry point has the module's name, so ``-p`` (or ``pytest_plugins``) beside the
    entry point loads it once, instead of failing as a plugin registered twice."""
    result = user_suite.runpytest_subprocess("-s", "-p", PLUGIN, "test_checkout.py")
    result.assert_outcomes(passed=USES_THE_KIT_PASSED)
    how = loaded_by(result.stdout.str())
    assert how.startswith("the entry point of breaker-redis " if installed_entry_point() else "-p "), how


def test_p_no_turns_it_off(user_suite: pytest.Pytester) -> None:
    """``-p no:`` and the module's name: its fixtures are gone (the loaded check fails, the
    four tests asking for them cannot start, the one asking for none passes)."""
    result = user_suite.runpytest_subprocess(f"-p no:{PLUGIN}", "test_checkout.py")
    result.assert_outcomes(passed=1, failed=1, errors=USES_THE_KIT_PASSED - 2)
    result.stdout.fnmatch_lines(["*fixture 'memory_breakers' not found*"])


def test_a_suite_that_does_not_use_it_meets_nothing_of_it(user_suite: pytest.Pytester) -> None:
    """Loaded, it defines fixtures and nothing else: no store, no thread, no warning."""
    installed = installed_entry_point()
    result = user_suite.runpytest_subprocess(*([] if installed else ["-p", PLUGIN]), "test_plain.py")
    result.assert_outcomes(passed=1, warnings=0)
