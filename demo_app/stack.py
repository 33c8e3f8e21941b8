"""Start and stop the demo's processes: Redis, the upstream, gunicorn.

Used by the demo runner and by the end-to-end tests, so that both start the
stack the same way. Every child runs in its own session: a Ctrl-C in the
terminal reaches only the runner, which then stops the children in order
(gunicorn first, so no worker is left talking to a Redis that is gone).
Readiness is always a condition polled with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import requests

ROOT = Path(__file__).resolve().parent.parent
CONF = Path(__file__).resolve().parent / "gunicorn.conf.py"
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(
    condition: Callable[[], T], timeout: float = 10.0, what: str = "condition", interval: float = 0.01
) -> T:
    """Poll condition() until it is truthy; fail naming `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class Child:
    """One child process in its own session, its output kept in a log file."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.log_path = Path(tempfile.mkstemp(prefix=f"breaker-demo-{name}-", suffix=".log")[1])
        self._log = self.log_path.open("wb")
        full_env = {**os.environ, **(env or {})}
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full_env.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text("utf-8", "replace")

    def check_alive(self) -> bool:
        """True, or RuntimeError with the child's output: waiting on a dead child is pointless."""
        if not self.alive():
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.output()[-3000:]}")
        return True

    def stop(self, timeout: float = 8.0) -> None:
        """SIGTERM, then SIGKILL of the child's own process group if it lingers."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        # Workers of a stopped gunicorn master share its group; none may outlive it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self._log.close()

    def remove_log(self) -> None:
        with contextlib.suppress(OSError):
            self.log_path.unlink()


def _http_ok(url: str) -> bool:
    try:
        return requests.get(url, timeout=0.5).status_code < 500
    except requests.RequestException:
        return False


def _redis_answers(port: int) -> bool:
    import redis

    try:
        return bool(redis.Redis(host="127.0.0.1", port=port, socket_timeout=0.5).ping())
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return False


def redis_server_argv(binary: str, port: int, data_dir: str) -> list[str]:
    """A loopback-only redis-server that keeps nothing on disk (the demo, tests and benches)."""
    return [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        data_dir,
        "--protected-mode",
        "no",
    ]


def start_redis(mode: str = "auto") -> tuple[str, Child, str]:
    """(url, child, kind): a redis-server when installed (or asked for), else the embedded one."""
    binary = shutil.which("redis-server")
    if mode == "server" and binary is None:
        raise RuntimeError("redis-server is not installed (use --redis embedded)")
    port = free_port()
    if mode != "embedded" and binary is not None:
        data_dir = tempfile.mkdtemp(prefix="breaker-demo-redis-")
        argv = redis_server_argv(binary, port, data_dir)
        child, kind = Child("redis-server", argv), "redis-server"
    else:
        argv = [sys.executable, "-m", "breaker_redis.embedded", "--port", str(port)]
        child, kind = Child("embedded-redis", argv), "embedded server: python -m breaker_redis.embedded"
    try:
        wait_until(lambda: child.check_alive() and _redis_answers(port), 20, f"{kind} on port {port}")
    except BaseException:
        child.stop()
        raise
    return f"redis://127.0.0.1:{port}/0", child, kind


def start_upstream(port: int | None = None) -> tuple[str, Child]:
    port = port or free_port()
    child = Child("upstream", [sys.executable, "-m", "demo_app.upstream", "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: child.check_alive() and _http_ok(url + "/_stats"), 20, "the upstream")
    except BaseException:
        child.stop()
        raise
    return url, child


@contextlib.contextmanager
def redis_and_upstream() -> Iterator[tuple[str, str, str]]:
    """(Redis URL, its kind, the upstream's URL): start_redis() and start_upstream(), both
    stopped and their logs removed after (the benchmarks that serve the demo's stack)."""
    redis_url, redis_child, redis_kind = start_redis()
    try:
        upstream_url, upstream_child = start_upstream()
    except BaseException:
        redis_child.stop()
        raise
    try:
        yield redis_url, redis_kind, upstream_url
    finally:
        upstream_child.stop()
        redis_child.stop()
        upstream_child.remove_log()
        redis_child.remove_log()


def start_gunicorn(
    redis_url: str,
    upstream_url: str,
    *,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    app: str = "demo_app.app:app",
    ready_path: str = "/products",
) -> tuple[str, Child]:
    port = port or free_port()
    argv = [
        sys.executable,
        "-m",
        "gunicorn",
        "-c",
        str(CONF),
        "-b",
        f"127.0.0.1:{port}",
        *extra_args,
        app,
    ]
    child_env: dict[str, Any] = {"BREAKER_REDIS_URL": redis_url, "UPSTREAM_URL": upstream_url, **(env or {})}
    child = Child("gunicorn", argv, child_env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: child.check_alive() and _http_ok(url + ready_path), 30, "gunicorn")
    except BaseException:
        child.stop()
        raise
    return url, child
