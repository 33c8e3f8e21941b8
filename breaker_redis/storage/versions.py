"""Which redis-py and fakeredis are installed, against the range the product declares.

The seam with internals.py: that module touches the libraries' internals, and
each of its functions checks what it relies on; this one only reads installed
metadata (no internal of either library) to say which versions are in range,
warn at import about one that is not, and build the error that names the
library, its version and the supported range when an internal is gone.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterable
from importlib import metadata

log = logging.getLogger("breaker_redis")

DISTRIBUTION = "breaker-redis"
LIBRARIES = ("redis", "fakeredis")


class UnsupportedVersion(RuntimeError):
    """redis-py or fakeredis lacks an internal breaker_redis relies on."""


def installed_version(library: str) -> str | None:
    try:
        return metadata.version(library)
    except metadata.PackageNotFoundError:
        return None


def declared_range(library: str, requires: Iterable[str] | None = None) -> str | None:
    """The version range breaker_redis requires of library (">=5.0,<9"), from its installed
    metadata (pyproject.toml's dependencies); None when breaker_redis is not installed."""
    if requires is None:
        try:
            requires = metadata.requires(DISTRIBUTION) or []
        except metadata.PackageNotFoundError:
            return None
    for requirement in requires:
        found = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[[^\]]*\])?\s*(.*?)\s*", requirement.split(";")[0])
        if found and found.group(1).lower().replace("_", "-") == library:
            # the floor first, as pyproject.toml writes it: installed metadata may
            # list the clauses in another order ("<9,>=5.0")
            clauses = found.group(2).replace(" ", "").split(",")
            return ",".join(sorted(clauses, key=lambda clause: not clause.startswith(">")))
    return None


def _numbers(version: str) -> tuple[int, ...]:
    found = re.match(r"\d+(?:\.\d+)*", version)
    parts = tuple(int(part) for part in found.group(0).split(".")) if found else (0,)
    return (*parts, 0, 0, 0)[:3]


def in_range(version: str, spec: str) -> bool:
    """Whether version meets every clause of spec (">=5.0,<9"); an operator other than
    >=, >, <=, <, ==, != is not judged here."""
    have = _numbers(version)
    checks: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
        ">=": lambda a, b: a >= b,
        ">": lambda a, b: a > b,
        "<=": lambda a, b: a <= b,
        "<": lambda a, b: a < b,
        "==": lambda a, b: a == b,
        "!=": lambda a, b: a != b,
    }
    for clause in filter(None, spec.split(",")):
        found = re.fullmatch(r"(>=|<=|==|!=|>|<)([0-9][0-9.]*)\*?", clause)
        if found and not checks[found.group(1)](have, _numbers(found.group(2))):
            return False
    return True


def version_warnings(installed: dict[str, str | None], declared: dict[str, str | None]) -> list[str]:
    """What to say about each library installed outside its declared range."""
    said = []
    for library in LIBRARIES:
        version, spec = installed.get(library), declared.get(library)
        if version and spec and not in_range(version, spec):
            said.append(
                f"{library} {version} is installed; this breaker_redis supports {library}{spec}. "
                f"It relies on a few of {library}'s internals (breaker_redis/storage/internals.py): "
                f"if something misbehaves, install {library}{spec}"
            )
    return said


def check_versions(
    installed: Callable[[str], str | None] = installed_version,
    declared: Callable[[str], str | None] = declared_range,
) -> list[str]:
    """Log one WARNING per library outside its declared range; what was said."""
    said = version_warnings(
        {library: installed(library) for library in LIBRARIES},
        {library: declared(library) for library in LIBRARIES},
    )
    for warning in said:
        log.warning("%s", warning)
    return said


def unsupported(library: str, needed: str, supported: str | None = None) -> UnsupportedVersion:
    """The error for an internal that is gone: logged once (a background task that gets
    it only retries), returned for the caller to raise."""
    spec = supported or declared_range(library) or ""
    message = (
        f"{library} {installed_version(library) or '(version unknown)'} has no {needed}, which "
        f"breaker_redis needs; this breaker_redis supports {library}{spec}"
    )
    _log_once(message)
    return UnsupportedVersion(message)


@functools.cache
def _log_once(message: str) -> None:
    log.error("%s", message)
