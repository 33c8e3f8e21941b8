"""The wheel carries the Lua scripts inside the package and works from any directory, and
installing it registers the pytest plugin of the testing kit."""

from __future__ import annotations

import ast
import configparser
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.plugin_user import PLUGIN, USES_THE_KIT_PASSED, loaded_by, write_user_tests

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from the checkout and installed in a folder of its own (its site)."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
        ],
        check=True,
    )
    (wheel,) = wheels.glob("breaker_redis-*.whl")
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
    )
    return target


def test_wheel_ships_the_lua_and_runs_outside_the_checkout(installed_wheel, tmp_path, redis_server):
    target = installed_wheel
    assert (target / "breaker_redis" / "lua" / "record.lua").is_file()
    for asset in ("dashboard.html", "dashboard.js", "dashboard.css"):  # the dashboard works offline
        assert (target / "breaker_redis" / "flask" / "static" / asset).is_file(), asset
    program = f"""
import breaker_redis, breaker_redis.storage.lua_source as s
assert breaker_redis.__file__.startswith({str(target)!r}), breaker_redis.__file__
assert str(s._lua_dir()).startswith({str(target)!r}), s._lua_dir()
b = breaker_redis.Breakers.from_url({redis_server.url!r}, prefix="wheeltest", listen=False)
pay = b.get("pay", breaker_redis.BreakerConfig(trip="consecutive", failure_threshold=1))
pay.acquire().failure()
print(pay.state)
"""
    out = subprocess.run(
        [sys.executable, "-c", program],
        cwd=tmp_path,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        check=True,
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == "open"


@pytest.mark.processes
def test_the_wheel_registers_the_pytest_plugin(installed_wheel, tmp_path):
    """A user's suite, run by pytest beside the installed wheel, gets the fixtures from the
    wheel's entry point alone, and naming the plugin with -p as well changes nothing."""
    (dist_info,) = installed_wheel.glob("breaker_redis-*.dist-info")
    entry_points = configparser.ConfigParser(delimiters=("=",))
    entry_points.optionxform = str  # names keep their case
    entry_points.read(dist_info / "entry_points.txt", "utf-8")
    assert dict(entry_points["pytest11"]) == {PLUGIN: PLUGIN}

    write_user_tests(tmp_path)
    for extra in ([], ["-p", PLUGIN]):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider", *extra, "test_checkout.py"],
            cwd=tmp_path,
            env={"PYTHONPATH": str(installed_wheel), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"{USES_THE_KIT_PASSED} passed" in done.stdout, done.stdout
        how = loaded_by(done.stdout)
        assert (
            how
            == f"the entry point of breaker-redis FROM {installed_wheel / 'breaker_redis' / '__init__.py'}"
        )


@pytest.mark.processes
def test_the_core_never_imports_flask():
    program = (
        "import sys, breaker_redis, breaker_redis.fallbacks, breaker_redis.web.clients\n"
        "assert 'flask' not in sys.modules and 'werkzeug' not in sys.modules, sorted(sys.modules)\n"
        "assert 'requests' not in sys.modules and 'httpx' not in sys.modules, sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", program], cwd=ROOT, check=True)


@pytest.mark.processes
def test_import_breaker_redis_alone_loads_no_engine_until_a_name_is_used():
    """pytest imports the package in every run, for the testing kit's entry point: a run that
    uses no breaker must not pay for redis-py and the engine (breaker_redis/__init__.py)."""
    program = (
        "import sys, breaker_redis, breaker_redis.testing.pytest_plugin\n"
        "assert 'redis' not in sys.modules, sorted(sys.modules)\n"
        "assert 'breaker_redis.engine' not in sys.modules, sorted(sys.modules)\n"
        "from breaker_redis import Breakers, urls\n"
        "assert Breakers.__module__ == 'breaker_redis.engine.breakers' and 'redis' in sys.modules\n"
        "assert breaker_redis.Breakers is Breakers and urls.__name__ == 'breaker_redis.urls'\n"
        "assert set(breaker_redis.__all__) <= set(dir(breaker_redis))\n"
        "assert all(getattr(breaker_redis, name) for name in breaker_redis.__all__)\n"
    )
    subprocess.run([sys.executable, "-c", program], cwd=ROOT, check=True)


LOG_CALLS = {"debug", "info", "warning", "error", "exception", "critical", "_warn_once"}


def _leading_text(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        return _leading_text(node.values[0])
    return ""


def test_no_log_message_repeats_the_loggers_name():
    """Every logger is breaker_redis or below it, so under the usual '%(name)s: %(message)s'
    a message beginning 'breaker_redis...:' shows the name twice."""
    found = []
    for path in sorted((ROOT / "breaker_redis").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called in LOG_CALLS and any(_leading_text(a).startswith("breaker_redis") for a in node.args):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


# redis-py's and fakeredis's internals (and asyncio's StreamReader buffer, read with them):
# only breaker_redis/storage/internals.py reaches them, behind its version checks.
INTERNALS_MODULE = "breaker_redis/storage/internals.py"
INTERNAL_ATTRIBUTES = {
    "_sock",
    "_selector",
    "_writer",
    "_reader",
    "_buffer",
    "_connections",
    "_free",
    "_client_info",
    "_killed",
    "_client_class",
    "_lua_modules",
    "_server",
    "_connect",
    "_normalize_keys",
    "encoder",
    "shard_channels",
    "sentinels",
    "send_packed_command",
}
THIRD_PARTY = ("redis", "fakeredis")


def _internal_uses(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in INTERNAL_ATTRIBUTES:
            mine = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if not mine:  # an attribute of an object of ours (self._sock of embedded's _Output) is ours
                found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr", "hasattr", "setattr"):
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.Constant) and name.value in INTERNAL_ATTRIBUTES:
                found.append((node.lineno, f"{node.func.id}(..., {name.value!r})"))  # type: ignore[attr-defined]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            plain = isinstance(node, ast.Import)
            modules = [alias.name for alias in node.names] if plain else [node.module or ""]
            for module in modules:
                parts = module.split(".")
                if parts[0] in THIRD_PARTY and any(part.startswith("_") for part in parts[1:]):
                    found.append((node.lineno, f"import {module}"))
    return found


def test_only_the_internals_module_touches_redis_py_and_fakeredis_internals():
    """A minor release of either library may change its internals: every use of them is in
    one module, which checks each and names the supported versions (tests/storage/test_internals.py)."""
    found = []
    for path in sorted((ROOT / "breaker_redis").rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        if where != INTERNALS_MODULE:
            uses = _internal_uses(ast.parse(path.read_text("utf-8")))
            found += [f"{where}:{line}: {what}" for line, what in uses]
    assert found == [], "use breaker_redis/storage/internals.py instead:\n" + "\n".join(found)


def test_the_internals_scan_finds_what_it_looks_for():
    source = (
        "from fakeredis._clients._sync import FakeRedisConnection\n"
        "import redis._parsers\n"
        "sock = getattr(pubsub.connection, '_sock', None)\n"
        "node._connections.clear()\n"
        "pool.sentinel_manager.sentinels.reverse()\n"
        "self._sock.close()\n"
        "import fakeredis, redis.asyncio\n"
    )
    assert _internal_uses(ast.parse(source)) == [
        (1, "import fakeredis._clients._sync"),
        (2, "import redis._parsers"),
        (3, "getattr(..., '_sock')"),
        (4, "._connections"),
        (5, ".sentinels"),
    ]
