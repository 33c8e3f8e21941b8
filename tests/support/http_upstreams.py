"""Real local upstream HTTP servers for the HTTP client tests: demo_app's flaky
upstream (its control and counters), served on a free loopback port from a
thread of the test process, so that a test can run several hosts at once."""

from __future__ import annotations

import contextlib
import socket
import struct
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
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
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


class RawUpstream:
    """A loopback HTTP/1.1 host whose answers are bytes a test writes: what demo_app's
    upstream, a well-behaved http.server, cannot send (a body cut short, a stall or a
    reset in the middle of a body, any header bytes, a redirect to any Location).
    It answers whatever request reaches it, so it serves as an HTTP proxy too: a
    client sends it a request for any host, which needs no DNS.

    ``answer(...)`` sets what every request gets from then on (``once=True``: the
    next request only, before the standing answer): a status line, the headers
    given (bytes, sent as they are), ``Content-Length`` (the body's length unless
    ``length`` says otherwise; none with ``chunked=True``, which sends
    ``Transfer-Encoding: chunked`` and the body as given, framed by the test) and
    ``Connection: close``, the body, and then:

    - ``"close"``: the connection is closed (FIN), so a body shorter than its
      Content-Length is cut short where it stops;
    - ``"stall"``: nothing more is sent until ``release()`` or ``stop()``: the
      client's read timeout ends the call;
    - ``"reset"``: the connection is reset (RST) when ``release()`` is called, so
      a test that read the headers first (a streamed response) sees the reset in
      the body, never in the headers.

    ``requests`` counts the requests received and ``targets`` lists their targets
    (``GET <target> HTTP/1.1``); ``wait_served(n)`` waits (with a deadline) until
    n answers are out, ``wait_reset(n)`` until n resets are.
    """

    STALL_LIMIT_SECONDS = 60.0

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.name = host_name(self.url)
        self.lock = threading.Condition()
        self.requests = 0
        self.targets: list[str] = []
        self.served = 0
        self.resets = 0
        self.once: list[tuple[bytes, str, threading.Event]] = []
        self.events: list[threading.Event] = []  # every answer's, so that stop() wakes every stalled call
        self.stopping = threading.Event()
        self.answer(200, body=b"{}")
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def answer(
        self,
        status: int = 200,
        headers: list[tuple[bytes, bytes]] | None = None,
        body: bytes = b"",
        *,
        length: int | None = None,
        chunked: bool = False,
        then: str = "close",
        once: bool = False,
    ) -> None:
        assert then in ("close", "stall", "reset"), then
        head = [f"HTTP/1.1 {status} X".encode(), *(name + b": " + value for name, value in headers or [])]
        if chunked:
            head.append(b"Transfer-Encoding: chunked")
        else:
            head.append(f"Content-Length: {len(body) if length is None else length}".encode())
        head.append(b"Connection: close")
        data = b"\r\n".join(head) + b"\r\n\r\n" + body
        with self.lock:
            release = threading.Event()
            self.events.append(release)
            if once:
                self.once.append((data, then, release))
            else:
                self.standing = (data, then, release)

    def reset(self) -> None:
        """Back to a plain 200 for every request, one-shot answers dropped, counters zeroed."""
        with self.lock:
            self.once.clear()
            self.requests = self.served = self.resets = 0
            self.targets.clear()
        self.answer(200, body=b"{}")

    def release(self) -> None:
        """Every call answered so far goes on (stalled ones end, reset ones are reset),
        and so do later calls given the same answer: set a new one to wait again."""
        with self.lock:
            for event in self.events:
                event.set()

    def wait_served(self, count: int, timeout: float = 10.0) -> None:
        with self.lock:
            if not self.lock.wait_for(lambda: self.served >= count, timeout):
                raise TimeoutError(f"{self.served} of {count} answers sent within {timeout} s")

    def wait_reset(self, count: int, timeout: float = 10.0) -> None:
        with self.lock:
            if not self.lock.wait_for(lambda: self.resets >= count, timeout):
                raise TimeoutError(f"{self.resets} of {count} resets sent within {timeout} s")

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            received = b""
            try:
                while b"\r\n\r\n" not in received:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    received += chunk
            except OSError:
                return
            with self.lock:
                self.requests += 1
                self.targets.append(received.split(b" ", 2)[1].decode("latin-1") if b" " in received else "")
                data, then, release = self.once.pop(0) if self.once else self.standing
            try:
                conn.sendall(data)
            except OSError:
                return
            with self.lock:
                self.served += 1
                self.lock.notify_all()
            if then == "stall":
                release.wait(self.STALL_LIMIT_SECONDS)
            elif then == "reset":
                release.wait(self.STALL_LIMIT_SECONDS)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                with self.lock:
                    self.resets += 1
                    self.lock.notify_all()

    def stop(self) -> None:
        self.stopping.set()
        self.release()
        with contextlib.suppress(OSError):  # wakes the accept() under way (close alone does not)
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(5)
