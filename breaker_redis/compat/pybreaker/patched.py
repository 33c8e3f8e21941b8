"""What tests patch on the package, read from there at each use.

pybreaker's own tests patch ``HAS_TORNADO_SUPPORT`` and the state classes on
the module they import (``mock.patch("pybreaker.CircuitOpenState")``), so
breaker.py and tracking.py read them on the package at each use, as pybreaker
reads its own globals. The package imports every module here, so none of them
imports it back (docs/design.md, section 1: no import cycle): the package
hands itself over as it is imported (``hand_over``), and they read it here.
"""

from __future__ import annotations

from types import ModuleType

_package: list[ModuleType] = []  # breaker_redis.compat.pybreaker, once imported


def hand_over(package: ModuleType) -> None:
    _package[:] = [package]


def package() -> ModuleType:
    """The package, as tests may have patched it."""
    return _package[0]
