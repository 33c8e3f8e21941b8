"""The wheel carries the Lua scripts inside the package and works from any directory."""

from __future__ import annotations

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
import breaker_redis, breaker_redis.scripts as s
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
        "import sys, breaker_redis, breaker_redis.fallbacks, breaker_redis.clients\n"
        "assert 'flask' not in sys.modules and 'werkzeug' not in sys.modules, sorted(sys.modules)\n"
        "assert 'requests' not in sys.modules and 'httpx' not in sys.modules, sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", program], cwd=ROOT, check=True)
