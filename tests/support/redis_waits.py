"""What a command waits on a dead Redis for, counted rather than timed: the connections
redis-py opens (with their connect and read timeouts) and the replies it reads.

A busy machine keeps a thread or a starting interpreter from the CPU for seconds, so a
wall-clock bound on "gives up within a second" fails by chance; the counts do not: one
connection with both timeouts at 0.5 s, and at most one reply waited for, cannot wait
longer than that whatever the machine's pace. ``install`` counts in this process;
``sitecustomize_in`` makes a process the test starts (the installed console script)
count too and write its counts, as JSON, to a file at exit.
"""

from __future__ import annotations

import atexit
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from redis.connection import Connection

ENVIRONMENT = "BREAKER_TEST_REDIS_WAITS"  # the file a started process writes its counts to


@dataclass
class Waits:
    connects: list[tuple[float | None, float | None]] = field(default_factory=list)  # (connect, read)
    replies: int = 0


def install(waits: Waits, set_attribute: Callable[[Any, str, Any], None] = setattr) -> None:
    """Count into waits from now on (pass monkeypatch.setattr to undo it after a test)."""
    connect, read = Connection._connect, Connection.read_response

    def counted_connect(connection: Connection) -> Any:
        waits.connects.append((connection.socket_connect_timeout, connection.socket_timeout))
        return connect(connection)

    def counted_read(connection: Connection, *args: Any, **kwargs: Any) -> Any:
        waits.replies += 1
        return read(connection, *args, **kwargs)

    set_attribute(Connection, "_connect", counted_connect)
    set_attribute(Connection, "read_response", counted_read)


def sitecustomize_in(folder: Path, root: Path, into: Path) -> dict[str, str]:
    """The environment for a process that counts and writes its Waits to into at exit."""
    (folder / "sitecustomize.py").write_text(
        "from tests.support.redis_waits import _from_environment\n\n_from_environment()\n"
    )
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(root)]), ENVIRONMENT: str(into)}


def read(path: Path) -> Waits:
    found = json.loads(path.read_text())
    return Waits([tuple(pair) for pair in found["connects"]], found["replies"])


def _from_environment() -> None:
    if path := os.environ.get(ENVIRONMENT):
        waits = Waits()
        install(waits)
        atexit.register(lambda: Path(path).write_text(json.dumps(asdict(waits))))
