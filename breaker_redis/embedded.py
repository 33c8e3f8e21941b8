"""An embedded Redis server with Redis's pub/sub ordering: ``python -m breaker_redis.embedded --port P``.

For demos, tests and machines without a ``redis-server``; not for production
(one process, no persistence, no memory limits, far slower than Redis). It is
fakeredis's TCP server (the Redis protocol, Lua through lupa, pub/sub), so
every gunicorn worker shares it over TCP exactly as it would share Redis.

Why not plain ``fakeredis.TcpFakeServer``: there, PUBLISH (also
``redis.call('PUBLISH', ...)`` inside EVAL/EVALSHA) only queues the message for
the subscriber; the subscriber's connection thread writes it out on its next
poll, milliseconds *after* the publisher got its reply. Redis writes a
published message to every subscriber's socket in the same event-loop turn as
the publisher's reply, and breaker_redis relies on that: once the worker that
ran a script got its reply, the transition's message is already waiting in
every worker's subscription socket, and a worker that polls that socket
(without waiting) before deciding from memory never misses it.

How this server keeps that order (fakeredis is used as installed, not
patched):

- Every client connection gets a fakeredis ``FakeSocket`` subclass whose
  ``put_response`` (the one place fakeredis hands a connection a reply, a
  published message, a subscribe confirmation or a keyspace notification)
  encodes the value and writes it to that client's TCP socket at once, from
  whichever thread produced it, under the connection's write lock, instead of
  queueing it for the connection's own thread. Those fakeredis internals are
  reached through breaker_redis/storage/internals.py (``FakeClient``), which
  says which fakeredis versions have them.
- PUBLISH runs on the publisher's thread and, like every command, completes
  before fakeredis hands the publisher its reply. So each subscriber's message
  is written to the subscriber's socket (``send`` has returned) before the
  first byte of the publisher's reply is written.
- Sockets are non-blocking with ``TCP_NODELAY``. When a client's socket buffer
  is full (a subscriber that stopped reading), what does not fit waits in that
  connection's output buffer, in order, and its own thread writes it as the
  socket drains, as Redis does with its client output buffers; a subscriber
  whose backlog exceeds 32 MiB is disconnected (Redis's default
  ``client-output-buffer-limit pubsub``). Only such a lagging subscriber can
  see a message later than the publisher's reply.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import selectors
import signal
import socket
import socketserver
import sys
import threading
from types import FrameType, TracebackType
from typing import Any

import fakeredis
import redis

from breaker_redis.storage.internals import FakeClient, fake_wire

__all__ = ["EmbeddedServer", "EmbeddedTcpServer", "main"]

log = logging.getLogger("breaker_redis.embedded")

# How long a connection's thread waits in select() before it looks at the
# server's stop flag and at CLIENT KILL; data to read or write wakes it at once.
_POLL_SECONDS = 0.05
# Pushed data (messages, notifications) beyond this backlog drops the client.
_PUSH_LIMIT_BYTES = 32 << 20
_RECV_BYTES = 1 << 16


class _Output:
    """The write side of one client's socket, shared by every thread that has data for it.

    ``write`` sends at once (non-blocking); what the kernel does not take
    stays in ``pending``, in order, and later writes queue behind it.
    """

    def __init__(self, sock: socket.socket, owner: int) -> None:
        self._sock = sock
        self._owner = owner  # the connection's own thread
        self._lock = threading.Lock()
        self._pending = bytearray()
        self._closed = False

    @property
    def backlog(self) -> int:
        return len(self._pending)

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._closed:
                return
            if self._pending:
                self._pending += data
            else:
                sent = self._send(data)
                if sent < len(data):
                    self._pending += data[sent:]
            if len(self._pending) > _PUSH_LIMIT_BYTES and threading.get_ident() != self._owner:
                log.warning("dropping a client that does not read: %d bytes unsent", len(self._pending))
                self._abort_locked()

    def flush(self) -> None:
        """Send what the socket takes now of the pending bytes."""
        with self._lock:
            if self._pending and not self._closed:
                del self._pending[: self._send(self._pending)]

    def abort(self) -> None:
        """Stop writing and wake the connection's thread (its next read sees EOF)."""
        with self._lock:
            self._abort_locked()

    def close(self, linger: float = 1.0) -> None:
        """Send what is pending (for up to `linger` seconds), then stop writing."""
        with self._lock:
            if not self._closed and self._pending:
                with contextlib.suppress(OSError):
                    self._sock.settimeout(linger)
                    self._sock.sendall(self._pending)
            self._pending.clear()
            self._closed = True

    def _send(self, data: bytes | bytearray) -> int:
        """Bytes of `data` the kernel took; all of it when the peer is gone (nothing left to do)."""
        sent = 0
        with memoryview(data) as view:  # released before the caller trims `data`
            try:
                while sent < len(view):
                    sent += self._sock.send(view[sent:])
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:  # reset, broken pipe: the connection's thread will see it and finish
                self._closed = True
                return len(view)
        return sent

    def _abort_locked(self) -> None:
        self._closed = True
        self._pending.clear()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)


class _Handler(socketserver.BaseRequestHandler):
    """One client connection: reads commands on its own thread; anyone may write to it."""

    server: EmbeddedTcpServer
    request: socket.socket

    def setup(self) -> None:
        sock = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        self.output = _Output(sock, threading.get_ident())
        # a fresh connection speaks RESP2 until the client's own HELLO
        self.fake = FakeClient(
            self.server.fake_server,
            {"laddr": sock.getsockname(), "addr": sock.getpeername(), "fd": sock.fileno()},
            self._deliver,
        )
        self.server.track(self, True)

    def _deliver(self, msg: Any) -> None:
        """Encode for this client's protocol and write now (called by whichever thread produced msg)."""
        try:
            data = self.fake.encode(msg)
        except TypeError as exc:  # never let a bad value break the thread that produced it
            log.error("cannot encode a reply: %s", exc)
            data = self.fake.encode(RuntimeError(f"embedded server cannot encode a reply: {exc}"))
        self.output.write(data)

    def handle(self) -> None:
        sock, output = self.request, self.output
        with selectors.DefaultSelector() as selector:
            events = selectors.EVENT_READ
            selector.register(sock, events)
            while not self.server.closing.is_set() and not self.fake.killed:
                # Like Redis, it keeps reading while replies wait to be sent.
                wanted = selectors.EVENT_READ | (selectors.EVENT_WRITE if output.backlog else 0)
                if wanted != events:
                    events = wanted
                    selector.modify(sock, events)
                ready = 0
                for _key, mask in selector.select(_POLL_SECONDS):
                    ready |= mask
                if ready & selectors.EVENT_WRITE:
                    output.flush()
                if not ready & selectors.EVENT_READ:
                    continue
                try:
                    data = sock.recv(_RECV_BYTES)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    return
                if not data:
                    return
                try:
                    # Parses and runs the commands; replies and messages are
                    # written by _WireSocket.put_response as they are produced.
                    self.fake.feed(data)
                except redis.exceptions.ConnectionError:  # CLIENT KILL
                    return
                except Exception as exc:  # a protocol error: fakeredis's parser cannot go on
                    log.debug("closing a client after %r", exc)
                    self._deliver(exc)
                    return

    def finish(self) -> None:
        self.server.track(self, False)
        self.fake.close()
        self.output.close()


class EmbeddedTcpServer(fakeredis.TcpFakeServer):
    """fakeredis.TcpFakeServer whose connections write pub/sub messages before the publisher's reply."""

    def __init__(self, server_address: tuple[str, int], bind_and_activate: bool = True) -> None:
        fake_wire()  # UnsupportedVersion now, for a fakeredis it cannot build on, not at the first client
        if ":" in server_address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(server_address, bind_and_activate, server_type="redis")
        self.RequestHandlerClass = _Handler
        self.daemon_threads = True
        self.block_on_close = False
        self.closing = threading.Event()
        self._handlers: set[_Handler] = set()
        self._handlers_lock = threading.Lock()
        self._handlers_changed = threading.Condition(self._handlers_lock)

    def track(self, handler: _Handler, alive: bool) -> None:
        with self._handlers_changed:
            if alive:
                self._handlers.add(handler)
            else:
                self._handlers.discard(handler)
            self._handlers_changed.notify_all()

    def close_clients(self, timeout: float = 5.0) -> None:
        """Drop every client connection and wait (up to `timeout`) until their threads are done."""
        self.closing.set()
        with self._handlers_changed:
            for handler in self._handlers:
                handler.output.abort()
            self._handlers_changed.wait_for(lambda: not self._handlers, timeout)


class EmbeddedServer:
    """The embedded server, serving in a background thread.

    >>> server = EmbeddedServer(port=0).start()   # port 0: any free port
    >>> server.url                                # doctest: +SKIP
    'redis://127.0.0.1:40123/0'
    >>> server.stop()

    Also a context manager (``with EmbeddedServer() as server: ...``).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 6379) -> None:
        self.host = host
        self.port = port
        self._server: EmbeddedTcpServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``redis://host:port/0``; with port 0, known once started."""
        if self.port == 0:
            raise RuntimeError("the port is chosen when the server starts")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"redis://{host}:{self.port}/0"

    def start(self) -> EmbeddedServer:
        """Bind and serve in a daemon thread; returns self. Raises OSError when the port is taken."""
        if self._server is not None:
            raise RuntimeError("already started")
        server = self._server = EmbeddedTcpServer((self.host, self.port))
        self.port = int(server.server_address[1])
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": _POLL_SECONDS},
            name=f"embedded-redis-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, close every client connection and the listening socket."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self._server = self._thread = None
        server.shutdown()  # returns once serve_forever has
        thread.join()
        server.close_clients()
        server.server_close()

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m breaker_redis.embedded",
        description="An embedded Redis (fakeredis over TCP) with Redis's pub/sub ordering, for demos, "
        "tests and machines without redis-server; not for production. Prints its URL, then serves "
        "until SIGTERM or SIGINT.",
    )
    parser.add_argument("--port", type=int, default=6379, help="TCP port (0: any free port; default 6379)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    args = parser.parse_args(argv)

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server = EmbeddedServer(args.host, args.port).start()
    except OSError as exc:
        print(f"breaker_redis.embedded: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    print(server.url, flush=True)
    try:
        stop.wait()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
