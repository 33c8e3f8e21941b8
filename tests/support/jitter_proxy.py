"""A TCP proxy for tests that reorders what a server writes ACROSS connections.

Servers with I/O threads (Valkey 8, Redis 8 with io-threads) and TCP proxies that
carry each connection on its own keep the order of the bytes within a connection,
not across connections: a reply written to one client after a message published
to another may reach its client first. ``JitterProxy`` reproduces that in front of
any server: what the server sends back is delivered to each client late, each
connection on its own schedule, its own order kept. A chunk read from the server
at ``arrival`` is delivered at::

    max(that connection's previous delivery, arrival + base + uniform(0, jitter))

with (base, jitter) the command delays until the client sends a SUBSCRIBE,
SSUBSCRIBE or PSUBSCRIBE (the name of a RESP array command, any case), the
subscription delays from then on. What a client sends is forwarded at once.
Closing either side closes the other; what the server sent before it closed is
delivered first. Each connection draws its jitter from its own
``random.Random``, seeded with the proxy's seed and the connection's number.

The proxy serves in an asyncio loop of a daemon thread of the process that
starts it, on a free loopback port::

    with JitterProxy(6379) as proxy:
        client = redis.Redis(port=proxy.port)
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from dataclasses import dataclass, field
from typing import Any

SUBSCRIBING = frozenset({b"SUBSCRIBE", b"SSUBSCRIBE", b"PSUBSCRIBE"})
CHUNK = 65536


@dataclass(frozen=True)
class Delays:
    """Milliseconds: a base delay, and the width of the uniform jitter added to it."""

    base_ms: float
    jitter_ms: float

    def draw(self, rng: random.Random) -> float:
        """One delay in seconds."""
        return (self.base_ms + rng.uniform(0.0, self.jitter_ms)) / 1000


COMMAND_DELAYS = Delays(base_ms=0.0, jitter_ms=1.0)
SUBSCRIPTION_DELAYS = Delays(base_ms=5.0, jitter_ms=3.0)


class CommandNames:
    """The names of the commands in a client's byte stream, upper-cased: RESP arrays of
    bulk strings (what clients send), or an inline command (one line of words)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        names = []
        while (name := self._next()) is not None:
            names.append(name)
        return names

    def _next(self) -> bytes | None:
        """The name of the first complete command in the buffer, which it leaves; None
        while the buffer holds no complete command."""
        buffer = self._buffer
        end = buffer.find(b"\r\n")
        if end < 0:
            return None
        if buffer[:1] != b"*":  # an inline command
            words = bytes(buffer[:end]).split()
            del buffer[: end + 2]
            return words[0].upper() if words else b""
        name, position = b"", end + 2
        for index in range(int(buffer[1:end])):
            end = buffer.find(b"\r\n", position)
            if end < 0:
                return None
            start = end + 2
            stop = start + int(buffer[position + 1 : end])  # "$<length>"
            if len(buffer) < stop + 2:
                return None
            if index == 0:
                name = bytes(buffer[start:stop]).upper()
            position = stop + 2
        del buffer[:position]
        return name


@dataclass(eq=False)
class _Link:
    """One client's connection and the proxy's connection to the server for it."""

    number: int
    rng: random.Random
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    subscription: bool = False
    due: float = 0.0  # when its last chunk was (or will be) delivered, on the loop's clock


class JitterProxy:
    """Forwards a loopback port to ``target_host:target_port``, delaying what the
    server sends back (see the module's docstring). ``target_port`` may be set after
    ``start()``: the proxy connects to the target when a client connects.

    ``connections`` and ``subscriptions`` count the clients accepted and those that
    subscribed, so a test can check that the delays it relies on were applied."""

    def __init__(
        self,
        target_port: int = 0,
        target_host: str = "127.0.0.1",
        *,
        commands: Delays = COMMAND_DELAYS,
        subscriptions: Delays = SUBSCRIPTION_DELAYS,
        seed: int = 0,
        host: str = "127.0.0.1",
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.command_delays = commands
        self.subscription_delays = subscriptions
        self.seed = seed
        self.host = host
        self.port = 0
        self.connections = 0
        self.subscriptions = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._links: set[_Link] = set()

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> JitterProxy:
        loop = self._loop = asyncio.new_event_loop()
        listening = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._listen())
            listening.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name=f"jitter-proxy to {self.target_port}", daemon=True)
        self._thread.start()
        if not listening.wait(10):
            raise RuntimeError("the proxy did not listen within 10 s")
        return self

    def stop(self) -> None:
        """Close the listening socket and every connection, then end the thread."""
        if self._loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> JitterProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- in the proxy's loop --------------------------------------------------------------

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accepted, self.host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in self._links:
            _close(link)
        if self._tasks:  # each ends once its sockets are closed
            await asyncio.wait(self._tasks, timeout=5)

    async def _accepted(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        link = _Link(self.connections, random.Random(f"{self.seed}:{self.connections}"), [client_writer])
        self._links.add(link)
        try:
            server_reader, server_writer = await asyncio.open_connection(self.target_host, self.target_port)
            link.writers.append(server_writer)
            await asyncio.gather(
                self._upstream(link, client_reader, server_writer),
                self._downstream(link, server_reader, client_writer),
            )
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            _close(link)
            self._links.discard(link)
            self._tasks.discard(task)

    async def _upstream(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Client to server, at once; watches for the first subscribing command."""
        names = CommandNames()
        while data := await reader.read(CHUNK):
            if not link.subscription and SUBSCRIBING.intersection(names.feed(data)):
                link.subscription = True
                self.subscriptions += 1
            writer.write(data)
            await writer.drain()
        _close(link)

    async def _downstream(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Server to client: each chunk at its due time, in order (a queue and a writer)."""
        loop = asyncio.get_running_loop()
        due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        deliver = asyncio.ensure_future(_deliver(due, writer))
        try:
            while data := await reader.read(CHUNK):
                delays = self.subscription_delays if link.subscription else self.command_delays
                link.due = max(link.due, loop.time() + delays.draw(link.rng))
                due.put_nowait((link.due, data))
            due.put_nowait((0.0, b""))  # the server closed: the client too, after what came before
            await deliver
        finally:
            deliver.cancel()
        _close(link)


async def _deliver(due: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter) -> None:
    loop = asyncio.get_running_loop()
    while True:
        at, data = await due.get()
        if not data:
            return
        if at > loop.time():
            await asyncio.sleep(at - loop.time())
        writer.write(data)
        await writer.drain()


def _close(link: _Link) -> None:
    for writer in link.writers:
        with contextlib.suppress(Exception):
            writer.close()


class Proxies:
    """The proxies a test starts (``proxies(port)``), each in front of a port of this
    host, with the same options; ``stop()`` stops them all."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.made: list[JitterProxy] = []

    def __call__(self, port: int) -> JitterProxy:
        proxy = JitterProxy(port, **self.options).start()
        self.made.append(proxy)
        return proxy

    @property
    def subscriptions(self) -> int:
        return sum(proxy.subscriptions for proxy in self.made)

    def stop(self) -> None:
        for proxy in self.made:
            proxy.stop()
        self.made.clear()
