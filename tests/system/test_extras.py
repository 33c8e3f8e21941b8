"""Each extra alone is enough for its module (pyproject.toml, docs/install.md).

The wheel is built once; then each extra, and the package with none, is
installed as a user installs it (pip, from the registry, with every
dependency) into a fresh venv of its own, where its modules are imported.
So an import an extra forgot fails here rather than at a user's, and so do
the core's promises: ``import breaker_redis`` and the ``breaker-redis``
command work with no extra, and the modules whose dependency is missing say
which extra brings it.

The venvs are made without pip (the suite's pip installs into each, with
``--python``), and pip's cache is shared, so the cost is mostly unpacking;
the installs run a few at a time.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# extra -> the modules it must be enough for ("": the package with no extra)
EXTRAS: dict[str, tuple[str, ...]] = {
    "": ("breaker_redis", "breaker_redis.asyncio", "breaker_redis.wsgi", "breaker_redis.asgi"),
    "flask": ("breaker_redis.flask", "breaker_redis.metrics"),
    "fastapi": ("breaker_redis.fastapi",),
    "requests": ("breaker_redis.requests",),
    "httpx": ("breaker_redis.httpx",),
    "prometheus": ("breaker_redis.metrics",),
    "opentelemetry": ("breaker_redis.opentelemetry",),
}

# with no extra: each optional module's ImportError names the extra that brings it
MISSING = """
import importlib
optional = {"breaker_redis.metrics": "prometheus", "breaker_redis.opentelemetry": "opentelemetry"}
for module, extra in optional.items():
    try:
        importlib.import_module(module)
    except ImportError as error:
        assert f"pip install 'breaker-redis[{extra}]'" in str(error), error
    else:
        raise AssertionError(f"{module} imported with no extra")
"""


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, check=False, cwd="/")


def installed(wheel: Path, venvs: Path, extra: str) -> tuple[str, Path, str]:
    """A fresh venv holding the wheel with ``extra``: (extra, its python, pip's complaint or '')."""
    venv = venvs / (extra or "core")
    made = run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    if made.returncode:
        return extra, python, made.stderr
    spec = f"{wheel}[{extra}]" if extra else str(wheel)
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--disable-pip-version-check"]
    done = run(*pip, spec)
    return extra, python, done.stderr if done.returncode else ""


@pytest.mark.processes
def test_each_extra_alone_is_enough_for_its_modules(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    build = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        ROOT,
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        wheels,
    ]
    assert run(*build).returncode == 0
    (wheel,) = wheels.glob("breaker_redis-*.whl")
    with ThreadPoolExecutor(max_workers=3) as pool:
        venvs = list(pool.map(lambda extra: installed(wheel, tmp_path, extra), EXTRAS))
    problems = [f"[{extra}] install: {complaint}" for extra, _, complaint in venvs if complaint]
    for extra, python, complaint in venvs:
        if complaint:
            continue
        imported = run(python, "-c", "import " + ", ".join(EXTRAS[extra]))
        if imported.returncode:
            problems.append(f"[{extra}] import {', '.join(EXTRAS[extra])}:\n{imported.stderr}")
    core = tmp_path / "core" / "bin"
    for what, done in (
        ("the optional modules' messages", run(core / "python", "-c", MISSING)),
        ("breaker-redis --help", run(core / "breaker-redis", "--help")),
    ):
        if done.returncode:
            problems.append(f"[] {what}:\n{done.stdout}{done.stderr}")
    metrics = run(core / "breaker-redis", "--url", "redis://127.0.0.1:9", "metrics")
    if metrics.returncode != 1 or "pip install 'breaker-redis[prometheus]'" not in metrics.stderr:
        problems.append(f"[] breaker-redis metrics ({metrics.returncode}):\n{metrics.stdout}{metrics.stderr}")
    assert not problems, "\n".join(problems)
