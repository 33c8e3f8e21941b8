"""Real local upstream HTTP servers for the HTTP client tests: demo_app's flaky
upstream (its control and counters), served on a free loopback port from a
thread of the test process, so that a test can run several hosts at once."""

from __future__ import annotations

import socket
import threading
from typing import Any

from breaker_redis.web.clients import host_name
from demo_app.upstream import Server, Upstream, make_handler


class LocalUpstream:
    """One upstream host: ``url``, ``name`` (its breaker's default name), control and hits."""

    def __init__(self) -> None:
        self.upstream = Upstream()
        self.server = Server(("127.0.0.1", 0), make_handler(self.upstream))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.name = host_name(self.url)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def control(self, **body: Any) -> None:
        self.upstream.control(body)

    def reset(self) -> None:
        self.upstream.reset()

    def hits(self, path: str = "/pay") -> int:
        return int(self.upstream.stats()["hits"].get(path, 0))

    def stop(self) -> None:
        self.upstream.reset()  # wakes hung calls
        self.server.shutdown()
        self.server.server_close()


def refused_url() -> str:
    """A loopback URL nothing listens on: connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
