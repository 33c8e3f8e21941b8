"""The wheel carries the Lua scripts inside the package and works from any directory."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_the_lua_and_runs_outside_the_checkout(tmp_path, redis_server):
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
    assert (target / "breaker_redis" / "lua" / "record.lua").is_file()
    for asset in ("dashboard.html", "dashboard.js", "dashboard.css"):  # the dashboard works offline
        assert (target / "breaker_redis" / "flask" / "static" / asset).is_file(), asset
    program = f"""
import breaker_redis, breaker_redis.storage.scripts as s
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


def test_the_core_never_imports_flask():
    program = (
        "import sys, breaker_redis, breaker_redis.fallbacks, breaker_redis.web.clients\n"
        "assert 'flask' not in sys.modules and 'werkzeug' not in sys.modules, sorted(sys.modules)\n"
        "assert 'requests' not in sys.modules and 'httpx' not in sys.modules, sorted(sys.modules)\n"
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
