"""The suite's own layout (tests/README.md), held so that it cannot drift.

- A test file sits where a reader looking for a module's tests looks: in the
  folder that mirrors the module's package (tests/engine/ for
  breaker_redis/engine/, tests/ for the top-level modules), or in tests/system/
  for what crosses the layers. At the top of tests/ a test file is named after
  a top-level module (``test_wsgi.py`` for ``breaker_redis/wsgi.py``).
- Helpers live in tests/support/ and nowhere else; tests/support/ holds no test.
- No module of the suite imports a test module or a conftest: what tests share
  is a fixture in the conftest.py of their folder, or a helper in
  tests/support/. A test module imported by another runs its module-level code
  twice under two names, and its tests can be collected twice.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
PACKAGE = ROOT / "breaker_redis"
SYSTEM = TESTS / "system"
SUPPORT = TESTS / "support"


def suite_modules() -> list[Path]:
    return sorted(path for path in TESTS.rglob("*.py") if "__pycache__" not in path.parts)


def is_test_file(path: Path) -> bool:
    return path.name.startswith("test_") or path.name.endswith("_test.py")


def mirrored_package(folder: Path) -> Path:
    """breaker_redis/engine for tests/engine, breaker_redis for tests."""
    return PACKAGE / folder.relative_to(TESTS)


def misplaced(path: Path) -> str | None:
    """Why a test file is not where it belongs, or None."""
    folder = path.parent
    if folder.is_relative_to(SUPPORT):
        return "tests/support/ holds helpers, not tests"
    if folder == SYSTEM:
        return None
    if folder == TESTS:
        module = PACKAGE / f"{path.stem.removeprefix('test_')}.py"
        if module.is_file():
            return None
        return f"no breaker_redis/{module.name}: move it to the folder of what it tests, or to tests/system/"
    if not (mirrored_package(folder) / "__init__.py").is_file():
        return f"no package breaker_redis/{folder.relative_to(TESTS)} for its folder to mirror"
    return None


def imported_modules(source: str, package: str) -> set[str]:
    """Every module the source imports, relative imports resolved against ``package``
    ("tests.engine"), ``from a import b`` as a.b too."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".") if node.level else []
            if node.level > 1:
                base = base[: -(node.level - 1)]
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def is_test_module(name: str) -> bool:
    """tests.storage.test_acl, tests.conftest, and any name inside one (tests.conftest.Clock)."""
    parts = name.split(".")
    return parts[0] == "tests" and any(part.startswith("test_") or part == "conftest" for part in parts)


def test_every_test_file_sits_in_the_folder_of_what_it_tests() -> None:
    wrong = {
        str(path.relative_to(ROOT)): why
        for path in suite_modules()
        if is_test_file(path) and (why := misplaced(path)) is not None
    }
    assert wrong == {}


def test_helpers_live_in_tests_support_only() -> None:
    """Anything of the suite that is neither a test file, a conftest.py nor an __init__.py."""
    stray = [
        str(path.relative_to(ROOT))
        for path in suite_modules()
        if not is_test_file(path)
        and path.name not in ("conftest.py", "__init__.py")
        and not path.parent.is_relative_to(SUPPORT)
    ]
    assert stray == []


def test_every_folder_of_the_suite_is_a_package() -> None:
    """So that two folders may hold test files of the same name (tests/engine/test_breakers.py,
    tests/asyncio/test_breakers.py), and ``tests.support...`` imports the same way in pytest and
    in the processes the tests start (``python -m tests.support.http_client_worker``)."""
    folders = {path.parent for path in suite_modules()}
    assert sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file()) == []


def test_no_module_of_the_suite_imports_a_test_module() -> None:
    found = {}
    for path in suite_modules():
        package = ".".join(path.relative_to(ROOT).parts[:-1])
        imported = imported_modules(path.read_text("utf-8"), package)
        names = sorted(name for name in imported if is_test_module(name))
        if names:
            found[str(path.relative_to(ROOT))] = names
    assert found == {}


def test_the_import_check_sees_every_way_of_naming_a_test_module() -> None:
    """What the check above would report, so that it cannot pass by seeing nothing."""
    source = (
        "import tests.engine.test_config\n"
        "from tests.storage import test_acl\n"
        "from tests.conftest import Clock\n"
        "from .test_breakers import make\n"
        "from ..storage.test_eviction import CONFIG\n"
        "from tests.support.redis_server import RedisServer\n"
        "from . import conftest\n"
    )
    assert sorted(name for name in imported_modules(source, "tests.engine") if is_test_module(name)) == [
        "tests.conftest",
        "tests.conftest.Clock",
        "tests.engine.conftest",
        "tests.engine.test_breakers",
        "tests.engine.test_breakers.make",
        "tests.engine.test_config",
        "tests.storage.test_acl",
        "tests.storage.test_eviction",
        "tests.storage.test_eviction.CONFIG",
    ]
