"""Outbound HTTP behind shared breakers: breaker_redis.requests.BreakerAdapter and
breaker_redis.httpx.BreakerTransport / AsyncBreakerTransport (docs/http-clients.md).

Every test runs for each client (requests, httpx, httpx with asyncio breakers)
against real local upstream HTTP servers (demo_app's flaky upstream, one per
host, and tests/support/http_upstreams.py's RawUpstream where a test needs bytes no
well-behaved server sends: a body cut short, stalled or reset, hostile
headers, hosts without DNS through it as a proxy) and the session's real
redis-server. Time is the test clock (``Breakers(clock=...)``), except where
two processes share a breaker. Property tests (hypothesis) feed the clients
hostile headers, hosts and bodies cut anywhere, one real call per example.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import itertools
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from redis.cluster import key_slot
from urllib3.util.retry import Retry

from breaker_redis import BreakerConfig, BreakerOpen, Breakers
from breaker_redis.asyncio import Breakers as AsyncBreakers
from breaker_redis.base.names import validate_name
from breaker_redis.groups import AsyncBreakerGroup, BreakerGroup
from breaker_redis.httpx import AsyncBreakerTransport, BreakerTransport
from breaker_redis.httpx import BreakerRefused as HttpxRefused
from breaker_redis.ops.reader import parse_event
from breaker_redis.requests import BreakerAdapter
from breaker_redis.requests import BreakerRefused as RequestsRefused
from breaker_redis.storage.scripts import text
from breaker_redis.web.clients import host_name, parsed_header, retry_after_seconds
from breaker_redis.web.hosts import request_name
from demo_app.stack import wait_until
from tests.support.http_upstreams import LocalUpstream, RawUpstream, refused_url

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[2]
CONFIG = BreakerConfig(trip="consecutive", failure_threshold=5, open_seconds=10)
KINDS = ["requests", "httpx", "httpx_async"]
_prefixes = itertools.count()


class Client:
    """One kind of HTTP client behind breakers, driven synchronously by the tests."""

    kind: str
    base_error: type[BaseException]
    timeout_error: type[BaseException]
    connect_error: type[BaseException]

    def __init__(self, breakers: Any, proxy: str | None = None, **options: Any) -> None:
        self.breakers = breakers
        self.options = options

    def get(self, url: str, timeout: float = 5.0) -> int:
        raise NotImplementedError

    def attempt(self, url: str, timeout: float = 5.0) -> int | str:
        """One GET: its status, ``refused:<breaker>``, or the class name of what it raised."""
        try:
            return self.get(url, timeout)
        except BreakerOpen as refused:
            return f"refused:{refused.breaker}"
        except Exception as exc:
            return type(exc).__name__

    def open_stream(self, url: str) -> Any:
        """A streamed GET, its body not read yet: the client's response."""
        raise NotImplementedError

    def read_stream(self, response: Any) -> bytes:
        raise NotImplementedError

    def close_stream(self, response: Any) -> None:
        raise NotImplementedError

    def start_get(self, url: str) -> Pending:
        """A GET sent from another thread (an asyncio task for the async client), whose
        wait for a pooled connection has no deadline."""
        raise NotImplementedError

    def names(self) -> list[str]:
        return sorted(self.breakers.names())

    def reset_breaker(self, name: str) -> None:
        """Closed again, counters and all (an operator's reset)."""
        self.breaker(name).reset()

    def call_directly(self, name: str) -> str:
        """Another caller's successful call on the breaker, without the client: "success",
        or the reason it was refused."""
        try:
            self.breaker(name).acquire().success()
        except BreakerOpen as refused:
            return refused.reason
        return "success"

    def record_failures(self, name: str, count: int) -> None:
        """count failures recorded on a breaker by hand, as another worker's calls would."""
        breaker = self.breaker(name)
        for _ in range(count):
            breaker.acquire().failure()

    def stream_unread(self, url: str) -> int:
        """A streamed GET whose body is never read (nor the response closed)."""
        raise NotImplementedError

    def many(self, url: str, n: int) -> list[int | BaseException]:
        """n GETs sent at once."""
        raise NotImplementedError

    def snapshot(self, name: str) -> dict[str, Any]:
        return self.breaker(name).snapshot()  # type: ignore[no-any-return]

    def breaker(self, name: str) -> Any:
        """The breaker of name: the one the client made, or one with the client's config (so
        that the client, asking for it next, finds the config it gives)."""
        try:
            return self.breakers.get(name, self.options["config"])
        except ValueError:  # the client made it with another (configs, a group's)
            return self.breakers.get(name)

    def group(self) -> Any:
        return self.options["groups"][0]

    def group_status(self) -> dict[str, Any]:
        return self.group().status()  # type: ignore[no-any-return]

    def close(self) -> None:
        self.breakers.close()


class RequestsClient(Client):
    kind = "requests"
    base_error = requests.RequestException
    own_errors: tuple[type[BaseException], ...] = (requests.RequestException,)
    timeout_error = requests.Timeout
    connect_error = requests.ConnectionError

    def __init__(self, breakers: Any, proxy: str | None = None, **options: Any) -> None:
        super().__init__(breakers, **options)
        self.session = requests.Session()
        self.session.mount("http://", BreakerAdapter(breakers, **options))
        if proxy is not None:
            self.session.proxies = {"http": proxy}

    def get(self, url: str, timeout: float = 5.0) -> int:
        return self.session.get(url, timeout=timeout).status_code

    def stream_unread(self, url: str) -> int:
        return self.session.get(url, timeout=5, stream=True).status_code

    def open_stream(self, url: str) -> Any:
        return self.session.get(url, timeout=5, stream=True)

    def read_stream(self, response: Any) -> bytes:
        return response.content  # type: ignore[no-any-return]

    def close_stream(self, response: Any) -> None:
        response.close()

    def start_get(self, url: str) -> Pending:
        return Pending(lambda: self.get(url))

    def many(self, url: str, n: int) -> list[int | BaseException]:
        barrier = threading.Barrier(n)

        def one(_: int) -> int | BaseException:
            barrier.wait(5)
            try:
                return self.get(url)
            except BreakerOpen as refused:
                return refused

        with ThreadPoolExecutor(n) as pool:
            return list(pool.map(one, range(n)))

    def close(self) -> None:
        self.session.close()
        super().close()


class HttpxClient(RequestsClient):
    kind = "httpx"
    base_error = httpx.TransportError
    own_errors = (httpx.HTTPError, httpx.InvalidURL)
    timeout_error = httpx.TimeoutException
    connect_error = httpx.ConnectError

    def __init__(self, breakers: Any, proxy: str | None = None, **options: Any) -> None:
        Client.__init__(self, breakers, **options)
        transport_options = options if proxy is None else {**options, "proxy": proxy}
        self.client = httpx.Client(
            transport=BreakerTransport(breakers, **transport_options), follow_redirects=True
        )

    def get(self, url: str, timeout: float = 5.0) -> int:
        return self.client.get(url, timeout=timeout).status_code

    def stream_unread(self, url: str) -> int:
        return self.client.send(self.client.build_request("GET", url), stream=True).status_code

    def open_stream(self, url: str) -> Any:
        return self.client.send(self.client.build_request("GET", url), stream=True)

    def read_stream(self, response: Any) -> bytes:
        return response.read()  # type: ignore[no-any-return]

    def start_get(self, url: str) -> Pending:
        return Pending(lambda: self.client.get(url, timeout=httpx.Timeout(5.0, pool=None)).status_code)

    def close(self) -> None:
        self.client.close()
        Client.close(self)


class AsyncHttpxClient(Client):
    kind = "httpx_async"
    base_error = httpx.TransportError
    own_errors = (httpx.HTTPError, httpx.InvalidURL)
    timeout_error = httpx.TimeoutException
    connect_error = httpx.ConnectError

    def __init__(self, breakers: Any, proxy: str | None = None, **options: Any) -> None:
        super().__init__(breakers, **options)
        self.loop = asyncio.new_event_loop()
        transport_options = options if proxy is None else {**options, "proxy": proxy}
        self.client = httpx.AsyncClient(
            transport=AsyncBreakerTransport(breakers, **transport_options), follow_redirects=True
        )

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def get(self, url: str, timeout: float = 5.0) -> int:
        return int(self.run(self.client.get(url, timeout=timeout)).status_code)

    def stream_unread(self, url: str) -> int:
        request = self.client.build_request("GET", url)
        return int(self.run(self.client.send(request, stream=True)).status_code)

    def open_stream(self, url: str) -> Any:
        return self.run(self.client.send(self.client.build_request("GET", url), stream=True))

    def read_stream(self, response: Any) -> bytes:
        return self.run(response.aread())  # type: ignore[no-any-return]

    def close_stream(self, response: Any) -> None:
        self.run(response.aclose())

    def start_get(self, url: str) -> Pending:
        async def get() -> int:
            return (await self.client.get(url, timeout=httpx.Timeout(5.0, pool=None))).status_code

        return Pending(self.loop.create_task(get()), self.run)

    def names(self) -> list[str]:
        return sorted(self.run(self.breakers.names()))

    def reset_breaker(self, name: str) -> None:
        self.run(self.breaker(name).reset())

    def call_directly(self, name: str) -> str:
        async def call() -> str:
            try:
                await (await self.breaker(name).acquire()).success()
            except BreakerOpen as refused:
                return refused.reason
            return "success"

        return self.run(call())  # type: ignore[no-any-return]

    def record_failures(self, name: str, count: int) -> None:
        async def fail() -> None:
            breaker = self.breaker(name)
            for _ in range(count):
                await (await breaker.acquire()).failure()

        self.run(fail())

    def many(self, url: str, n: int) -> list[int | BaseException]:
        async def one() -> int | BaseException:
            try:
                return (await self.client.get(url, timeout=5)).status_code
            except BreakerOpen as refused:
                return refused

        async def all_of() -> list[int | BaseException]:
            return list(await asyncio.gather(*(one() for _ in range(n))))

        return self.run(all_of())  # type: ignore[no-any-return]

    def snapshot(self, name: str) -> dict[str, Any]:
        return self.run(self.breaker(name).snapshot())  # type: ignore[no-any-return]

    def group_status(self) -> dict[str, Any]:
        return self.run(self.group().status())  # type: ignore[no-any-return]

    def close(self) -> None:
        self.run(self.client.aclose())
        self.run(self.breakers.aclose())
        self.loop.close()


POOL_WAITS = frozenset({"_get_conn", "wait_for_connection"})  # urllib3's pool, httpcore's


class Pending:
    """A GET under way in a thread of its own, or an asyncio task on the client's
    loop (stepped by ``run``, which the async client's calls drive)."""

    def __init__(self, call: Any, run: Callable[[Any], Any] | None = None) -> None:
        self.run = run
        self.answer: list[Any] = []
        if run is None:
            self.thread: threading.Thread | None = threading.Thread(
                target=self._call, args=(call,), daemon=True
            )
            self.thread.start()
            self.task = None
        else:
            self.thread, self.task = None, call

    def _call(self, call: Callable[[], Any]) -> None:
        try:
            self.answer.append(call())
        except BaseException as exc:
            self.answer.append(exc)

    def stack(self) -> list[str]:
        """The functions the call is in now, outermost first."""
        if self.thread is not None:
            frame = sys._current_frames().get(self.thread.ident or 0)
            names = []
            while frame is not None:
                names.append(frame.f_code.co_name)
                frame = frame.f_back
            return names[::-1]
        assert self.run is not None and self.task is not None
        self.run(asyncio.sleep(0))  # let the task go on until it waits
        names, awaited = [], self.task.get_coro()  # (Task.get_stack shows a suspended task's outermost frame)
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is None:
                break
            names.append(frame.f_code.co_name)
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        return names

    def waiting_in_pool(self) -> bool:
        return bool(POOL_WAITS & set(self.stack()))

    def result(self, timeout: float = 10.0) -> Any:
        if self.thread is not None:
            self.thread.join(timeout)
            assert not self.thread.is_alive(), f"the call is still under way: {self.stack()}"
            return self.answer[0]
        assert self.run is not None and self.task is not None

        async def done() -> Any:
            return await asyncio.wait_for(asyncio.shield(self.task), timeout)  # type: ignore[arg-type]

        return self.run(done())


CLIENTS: dict[str, type[Client]] = {
    "requests": RequestsClient,
    "httpx": HttpxClient,
    "httpx_async": AsyncHttpxClient,
}
REFUSALS: dict[str, type[BaseException]] = {
    "requests": RequestsRefused,
    "httpx": HttpxRefused,
    "httpx_async": HttpxRefused,
}


@pytest.fixture(scope="module")
def hosts() -> Iterator[list[LocalUpstream]]:
    made = [LocalUpstream() for _ in range(2)]
    yield made
    for host in made:
        host.stop()


@pytest.fixture
def a(hosts: list[LocalUpstream]) -> LocalUpstream:
    hosts[0].reset()
    return hosts[0]


@pytest.fixture
def b(hosts: list[LocalUpstream]) -> LocalUpstream:
    hosts[1].reset()
    return hosts[1]


@pytest.fixture
def make_client(request, redis_server, clock) -> Iterator[Callable[..., Client]]:
    """make_client(kind, **options): that kind of client on fresh breakers (the test clock,
    a prefix of its own) on the session's redis-server."""
    made: list[Client] = []

    def make(
        kind: str,
        *,
        breakers_options: dict[str, Any] | None = None,
        url: str | None = None,
        group: dict[str, Any] | None = None,
        **options: Any,
    ) -> Client:
        prefix = f"http{next(_prefixes)}"
        settings = {"clock": clock, "listen": False, **(breakers_options or {})}
        if kind == "httpx_async":
            breakers: Any = AsyncBreakers.from_url(url or redis_server.url, prefix, **settings)
        else:
            breakers = Breakers.from_url(url or redis_server.url, prefix, **settings)
        options.setdefault("config", CONFIG)
        if group is not None:  # a pool of replicas: the group is built first, on the same breakers
            kind_of_group = AsyncBreakerGroup if kind == "httpx_async" else BreakerGroup
            options["groups"] = [kind_of_group(breakers, config=options["config"], **group)]
        client = CLIENTS[kind](breakers, **options)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def transitions(redis: Any, client: Client, name: str) -> list[tuple[str, str, str]]:
    found = reversed(redis.lrange(f"{client.breakers.prefix}:{{{name}}}:events", 0, -1))  # newest first
    return [(e["from"], e["to"], e["cause"]) for e in map(parse_event, found) if e is not None]


@pytest.mark.parametrize("kind", KINDS)
def test_five_failures_open_the_hosts_breaker_and_a_probe_closes_it(
    kind: str, make_client, a: LocalUpstream, b: LocalUpstream, clock, redis_server
):
    client = make_client(kind)
    a.control(fail_rate=1.0)
    assert [client.get(a.url + "/pay") for _ in range(5)] == [500] * 5
    assert a.hits() == 5

    # refused without reaching the upstream; the refusal is the client's own exception too
    for _ in range(3):
        with pytest.raises(REFUSALS[kind]) as refused:
            client.get(a.url + "/pay")
        assert isinstance(refused.value, BreakerOpen) and isinstance(refused.value, client.base_error)
        found = (refused.value.breaker, refused.value.reason, refused.value.retry_after)
        assert found == (a.name, "open", 10.0)
    assert a.hits() == 5

    # the other host has a breaker of its own, untouched
    assert [client.get(b.url + "/pay") for _ in range(3)] == [200] * 3
    assert client.snapshot(b.name)["state"] == "closed"
    assert client.snapshot(a.name)["state"] == "open"

    # after open_seconds, of 4 calls at once one probe reaches the upstream; its success closes it
    clock.advance(10_000)
    a.control(fail_rate=0.0, latency_ms=300)  # the probe holds its lease while the others arrive
    answers = client.many(a.url + "/pay", 4)
    assert sorted(x for x in answers if isinstance(x, int)) == [200]
    assert Counter(x.reason for x in answers if isinstance(x, BreakerOpen)) == {"half_open_full": 3}
    assert a.hits() == 6
    assert client.snapshot(a.name)["state"] == "closed"
    assert transitions(redis_server.client(), client, a.name) == [
        ("closed", "open", "consecutive"),
        ("open", "half_open", "open_elapsed"),
        ("half_open", "closed", "probes_succeeded"),
    ]
    a.control(latency_ms=0)
    assert client.get(a.url + "/pay") == 200 and a.hits() == 7


def run_worker(spec: dict[str, Any]) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.http_client_worker", json.dumps(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and done.stderr == "", done.stdout + done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", KINDS)
def test_two_processes_with_their_own_clients_share_the_hosts_breaker(
    kind: str, make_client, a: LocalUpstream, redis_server
):
    # real time and a subscription: this process decides from memory, and hears of the trip
    client = make_client(
        kind,
        breakers_options={"clock": None, "listen": True},
        config=BreakerConfig(failure_threshold=5, open_seconds=30),
    )
    assert client.get(a.url + "/pay") == 200
    a.control(fail_rate=1.0)
    spec = {
        "kind": kind,
        "redis": redis_server.url,
        "prefix": client.breakers.prefix,
        "urls": [a.url + "/pay"],
        "calls": 7,
        "config": {"failure_threshold": 5, "open_seconds": 30},
    }
    assert run_worker(spec) == ["500"] * 5 + [f"refused:{a.name}"] * 2
    assert a.hits() == 6
    with pytest.raises(BreakerOpen) as refused:
        client.get(a.url + "/pay")
    assert refused.value.breaker == a.name and 0 < refused.value.retry_after <= 30
    assert a.hits() == 6, "the second process reached the host its breaker had opened"


@pytest.mark.parametrize("kind", KINDS)
def test_timeouts_and_refused_connections_fail_404_and_400_do_not(kind: str, make_client, a: LocalUpstream):
    client = make_client(kind)
    a.control(hang=True)
    with pytest.raises(client.timeout_error):
        client.get(a.url + "/pay", timeout=0.2)
    a.reset()
    closed = refused_url()
    with pytest.raises(client.connect_error):
        client.get(closed + "/pay")
    for status in (404, 400):
        a.control(fail_rate=1.0, fail_status=status)
        assert client.get(a.url + "/pay") == status
    counted = client.snapshot(a.name)
    assert (counted["failures"], counted["successes"], counted["consecutive_failures"]) == (1, 2, 0)
    assert client.snapshot(closed.removeprefix("http://"))["failures"] == 1
    for status in (429, 503, 502):
        a.control(fail_rate=1.0, fail_status=status)
        assert client.get(a.url + "/pay") == status
    assert client.snapshot(a.name)["consecutive_failures"] == 3


@pytest.mark.parametrize("kind", KINDS)
def test_a_503_with_retry_after_counts_and_holds_the_breaker_open_that_long(
    kind: str, make_client, a: LocalUpstream, clock
):
    client = make_client(kind)
    a.control(fail_rate=1.0, fail_status=503, retry_after="120")
    assert [client.get(a.url + "/pay") for _ in range(5)] == [503] * 5
    with pytest.raises(BreakerOpen) as refused:
        client.get(a.url + "/pay")
    assert (refused.value.reason, refused.value.retry_after) == ("open", 120.0)  # not open_seconds (10)
    clock.advance(10_000)  # the breaker's own open period is over: still open for the service's 120 s
    with pytest.raises(BreakerOpen) as refused:
        client.get(a.url + "/pay")
    assert refused.value.retry_after == 110.0
    assert a.hits() == 5
    clock.advance(110_000)
    a.reset()
    assert client.get(a.url + "/pay") == 200
    assert client.snapshot(a.name)["state"] == "closed"


@pytest.mark.parametrize("kind", KINDS)
def test_retry_after_is_capped_by_max_open_seconds_and_can_be_ignored(
    kind: str, make_client, a: LocalUpstream, b: LocalUpstream
):
    config = BreakerConfig(failure_threshold=1, open_seconds=10, max_open_seconds=60)
    capped = make_client(kind, config=config)
    a.control(fail_rate=1.0, fail_status=429, retry_after="3600")
    assert capped.get(a.url + "/pay") == 429
    with pytest.raises(BreakerOpen) as refused:
        capped.get(a.url + "/pay")
    assert refused.value.retry_after == 60.0
    ignoring = make_client(
        kind, config=BreakerConfig(failure_threshold=1, open_seconds=10), honor_retry_after=False
    )
    b.control(fail_rate=1.0, fail_status=503, retry_after="Wed, 21 Oct 2099 07:28:00 GMT")
    assert ignoring.get(b.url + "/pay") == 503
    with pytest.raises(BreakerOpen) as refused:
        ignoring.get(b.url + "/pay")
    assert refused.value.retry_after == 10.0


@pytest.fixture(scope="module")
def raw_host() -> Iterator[RawUpstream]:
    made = RawUpstream()
    yield made
    made.stop()


@pytest.fixture
def raw(raw_host: RawUpstream) -> RawUpstream:
    raw_host.reset()
    return raw_host


def counted(client: Client, name: str) -> tuple[str, int, int, int]:
    snapshot = client.snapshot(name)
    return snapshot["state"], snapshot["successes"], snapshot["failures"], snapshot["ignored"]


# Retry-After values a service may send that say nothing usable: each must be ignored (the
# breaker opens for its own open_seconds), and the failing response reach the caller.
MALFORMED_RETRY_AFTER = [
    "²".encode("latin-1"),  # a superscript two: str.isdigit() says yes, float() says no
    "²".encode(),  # the same in UTF-8
    "٣".encode(),  # an Arabic-Indic three: a digit to Python, not to HTTP
    b"Wed, 21 Oct 2099 99:28:00 GMT",  # hour 99
    b"Wed, 21 Oct 2099 99999999999999999999:28:00 GMT",  # an hour past a C long: OverflowError
    b"Wed, 21 Oct 2099 07:28:00 +99999999999999999999",  # a zone past a C int
    b"Wed, 31 Feb 2099 07:28:00 GMT",
    b"-1",
    b"1e3",
    b"0x10",
    b" ",
    b"\xff\xfe",
]


@pytest.mark.parametrize("kind", KINDS)
def test_a_malformed_retry_after_is_ignored_and_the_failing_response_kept(
    kind: str, make_client, raw: RawUpstream
):
    for value in MALFORMED_RETRY_AFTER:
        client = make_client(kind, config=BreakerConfig(failure_threshold=1, open_seconds=10))
        raw.answer(503, headers=[(b"Retry-After", value)], body=b"{}")
        assert client.attempt(raw.url + "/pay") == 503, value  # tripped: the header was read
        with pytest.raises(BreakerOpen) as refused:
            client.get(raw.url + "/pay")
        assert (refused.value.reason, refused.value.retry_after) == ("open", 10.0), value
        assert counted(client, raw.name) == ("open", 0, 1, 0)


_HEADER_NAMES = st.sampled_from([b"Retry-After", b"retry-after", b"RETRY-AFTER", b"X-Other", b"Date"])
# a header value: any bytes but CR and LF (which would end it and frame another header)
_HEADER_VALUES = st.one_of(
    st.binary(max_size=60).map(lambda value: value.replace(b"\r", b"").replace(b"\n", b"")),
    st.text(max_size=40).map(
        lambda value: value.encode("utf-8", "surrogatepass").replace(b"\r", b"").replace(b"\n", b"")
    ),
    st.integers(-(10**30), 10**30).map(lambda n: str(n).encode()),
    st.builds(
        lambda day, year, hour, zone: f"Wed, {day} Oct {year} {hour}:28:00 {zone}".encode(),
        st.integers(-99, 10**12),
        st.integers(-(10**6), 10**25),
        st.integers(-(10**3), 10**22),
        st.sampled_from(["GMT", "-0000", "+2359", "+99999999999999999999", "UT", "XYZ", ""]),
    ),
)


@settings(max_examples=500, deadline=None, database=None)
@given(
    value=st.one_of(
        st.none(),
        st.text(),
        st.binary(),
        _HEADER_VALUES,
        st.integers(),
        st.floats(),
        st.text(alphabet=st.characters(categories=["Nd", "No", "Nl"]), min_size=1),
    )
)
def test_any_retry_after_is_read_without_raising(value: Any):
    """Property: parsed_header never raises; what it reads is a wait in (0, a day], and
    only ASCII digits (or an HTTP date) read as one."""
    for headers in ({"Retry-After": value}, requests.structures.CaseInsensitiveDict({"retry-after": value})):
        seconds = parsed_header(headers, "Retry-After", retry_after_seconds)
        assert seconds is None or 0 < seconds <= 86400.0
        if isinstance(value, str) and value.strip(" \t").isascii() and value.strip(" \t").isdigit():
            assert seconds == (min(float(int(value)), 86400.0) if int(value) else None)
    assert parsed_header(None, "Retry-After", retry_after_seconds) is None  # no headers at all
    assert retry_after_seconds(value) is None or 0 < retry_after_seconds(value) <= 86400.0  # type: ignore[operator]


def test_retry_after_reads_what_http_allows():
    now = 1_700_000_000.0  # 2023-11-14 22:13:20 GMT
    assert [retry_after_seconds(v, now) for v in ["120", " 7\t", "0", "99999999999999999999999"]] == [
        120.0,
        7.0,
        None,
        86400.0,
    ]
    # an IMF-fixdate, the obsolete RFC 850 and asctime forms (asctime has no zone: GMT)
    assert [
        retry_after_seconds(v, now)
        for v in [
            "Tue, 14 Nov 2023 22:15:20 GMT",
            "Tuesday, 14-Nov-23 22:15:20 GMT",
            "Tue Nov 14 22:15:20 2023",
        ]
    ] == [120.0, 120.0, 120.0]
    assert retry_after_seconds("Tue, 14 Nov 2023 22:13:19 GMT", now) is None  # in the past


@pytest.mark.parametrize("kind", KINDS)
def test_hostile_headers_on_a_failing_response_never_cost_the_caller_its_response(
    kind: str, make_client, raw: RawUpstream
):
    """Property: whatever headers a failing response carries, the client returns it or
    raises its own exception (httpx refuses some header bytes as a protocol error), and
    the breaker counts one failure, opened for between open_seconds and max_open_seconds."""
    config = BreakerConfig(failure_threshold=1, open_seconds=10, max_open_seconds=60)
    client = make_client(kind, config=config)
    calls = []

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(headers=st.lists(st.tuples(_HEADER_NAMES, _HEADER_VALUES), max_size=3))
    @example(headers=[(b"Retry-After", MALFORMED_RETRY_AFTER[0])])
    @example(headers=[(b"Retry-After", MALFORMED_RETRY_AFTER[4]), (b"retry-after", b"120")])
    def check(headers: list[tuple[bytes, bytes]]) -> None:
        client.reset_breaker(raw.name)
        raw.answer(503, headers=headers, body=b"{}")
        answer = client.attempt(raw.url + "/pay")
        assert answer in (503, "RemoteProtocolError"), (answer, headers)
        with pytest.raises(BreakerOpen) as refused:
            client.get(raw.url + "/pay")
        assert refused.value.retry_after is not None and 10.0 <= refused.value.retry_after <= 60.0
        calls.append(answer)

    check()
    assert len(calls) >= 40 and counted(client, raw.name)[2] == len(calls)


# What each client raises when a body fails mid-read: the upstream stalls past the read
# timeout, or closes the connection before the Content-Length it announced.
BODY_ERRORS = {
    ("requests", "stall"): "ConnectionError",
    ("requests", "close"): "ChunkedEncodingError",
    ("httpx", "stall"): "ReadTimeout",
    ("httpx", "close"): "RemoteProtocolError",
    ("httpx_async", "stall"): "ReadTimeout",
    ("httpx_async", "close"): "RemoteProtocolError",
}


RESET_ERRORS = {"requests": "ChunkedEncodingError", "httpx": "ReadError", "httpx_async": "ReadError"}


@pytest.mark.parametrize("ending", ["stall", "close"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_body_that_fails_mid_read_is_a_failure(kind: str, ending: str, make_client, raw: RawUpstream):
    # 200 and Content-Length: 1000, then 10 bytes and a stall (or the connection closed):
    # the caller gets the client's error, and the breaker a failure, not a success
    client = make_client(kind)
    raw.answer(200, body=b"0123456789", length=1000, then=ending)
    answers = [client.attempt(raw.url + "/pay", timeout=0.5) for _ in range(12)]
    assert answers == [BODY_ERRORS[kind, ending]] * 5 + [f"refused:{raw.name}"] * 7
    assert raw.requests == 5
    assert counted(client, raw.name) == ("open", 0, 5, 0)


def chunked(body: bytes, pieces: int) -> bytes:
    """body in Transfer-Encoding: chunked framing, in at most ``pieces`` chunks."""
    size = max(1, -(-len(body) // pieces))
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"


@pytest.mark.parametrize("kind", KINDS)
def test_any_body_cut_anywhere_is_counted_as_the_caller_saw_it(kind: str, make_client, raw: RawUpstream):
    """Property: a 200 whose body (Content-Length or chunked) is cut at any byte, read
    plainly, streamed to the end, or streamed and closed unread, is one outcome: a
    failure when the caller got the client's error, else a success; a body sent whole
    is read whole and is a success."""
    client = make_client(kind, config=BreakerConfig(failure_threshold=1_000_000))
    outcomes: Counter[str] = Counter()

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(
        body=st.binary(max_size=200),
        pieces=st.integers(1, 4),
        framing=st.sampled_from(["length", "chunked"]),
        cut=st.one_of(st.none(), st.integers(0, 400)),
        how=st.sampled_from(["get", "read", "close"]),
    )
    def check(body: bytes, pieces: int, framing: str, cut: int | None, how: str) -> None:
        wire = chunked(body, pieces) if framing == "chunked" else body
        sent = wire if cut is None else wire[:cut]
        raw.answer(200, body=sent, length=len(body), chunked=framing == "chunked")
        before = counted(client, raw.name)
        got: Any
        if how == "get":
            got = client.attempt(raw.url + "/pay")
        else:
            response = client.open_stream(raw.url + "/pay")
            try:
                got = client.read_stream(response) if how == "read" else "closed"
            except client.own_errors as exc:
                got = type(exc).__name__
            finally:
                client.close_stream(response)
        after = counted(client, raw.name)
        failed = isinstance(got, str) and got != "closed"
        assert (after[1] - before[1], after[2] - before[2]) == ((0, 1) if failed else (1, 0)), got
        if sent == wire:
            assert got == (200 if how == "get" else body if how == "read" else "closed")
        outcomes["failure" if failed else "success"] += 1

    check()
    assert counted(client, raw.name) == ("closed", outcomes["success"], outcomes["failure"], 0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_streamed_response_settles_when_its_body_is_read_to_the_end_or_closed(
    kind: str, make_client, raw: RawUpstream, clock, redis_server
):
    client = make_client(kind)
    raw.answer(500, body=b"{}")
    # a failing status settles at once: five streams never read nor closed trip the breaker
    unread = [client.open_stream(raw.url + "/pay") for _ in range(5)]
    assert [response.status_code for response in unread] == [500] * 5
    assert counted(client, raw.name) == ("open", 0, 5, 0)

    # a good status waits for the body: the probe holds its slot while its body is unread ...
    clock.advance(10_000)
    raw.answer(200, body=b"x" * 100)
    probe = client.open_stream(raw.url + "/pay")
    assert probe.status_code == 200
    snapshot = client.snapshot(raw.name)
    assert (snapshot["state"], snapshot["probes_in_flight"], snapshot["successes"]) == ("half_open", 1, 0)
    assert client.attempt(raw.url + "/pay") == f"refused:{raw.name}"
    # ... and its end settles it: a success, which closes the breaker
    assert client.read_stream(probe) == b"x" * 100
    snapshot = client.snapshot(raw.name)
    assert (snapshot["state"], snapshot["probes_in_flight"], snapshot["successes"]) == ("closed", 0, 1)

    # closed by the caller before its end, after a good status: a success (the caller chose to stop)
    early = client.open_stream(raw.url + "/pay")
    assert counted(client, raw.name) == ("closed", 1, 5, 0)
    client.close_stream(early)
    assert counted(client, raw.name) == ("closed", 2, 5, 0)

    # reset in the middle of its body: a failure, whatever the status said
    raw.answer(200, body=b"0123456789", length=1000, then="reset")
    broken = client.open_stream(raw.url + "/pay")
    raw.release()
    raw.wait_reset(1)
    with pytest.raises(client.base_error) as raised:
        client.read_stream(broken)
    assert type(raised.value).__name__ == RESET_ERRORS[kind]
    client.close_stream(broken)
    assert counted(client, raw.name) == ("closed", 2, 6, 0)
    assert transitions(redis_server.client(), client, raw.name) == [
        ("closed", "open", "consecutive"),
        ("open", "half_open", "open_elapsed"),
        ("half_open", "closed", "probes_succeeded"),
    ]
    for response in unread:
        client.close_stream(response)
    assert counted(client, raw.name) == ("closed", 2, 6, 0)  # settled once, at their status


@pytest.mark.parametrize("kind", KINDS)
def test_a_stream_dropped_unclosed_is_settled_once_collected(kind: str, make_client, raw: RawUpstream, clock):
    client = make_client(kind)
    client.record_failures(raw.name, 5)
    clock.advance(10_000)
    raw.answer(200, body=b"x" * 100)
    # the probe: never read, never closed, dropped (the status read and the response let go)
    assert client.stream_unread(raw.url + "/pay") == 200
    gc.collect()  # httpx's responses are reference cycles: collected by the collector, not at once
    # the Settler thread (the event loop for httpx_async, which each snapshot runs) records it
    wait_until(lambda: client.snapshot(raw.name)["state"] == "closed", 10, "the dropped probe's success")
    snapshot = client.snapshot(raw.name)
    assert (snapshot["probes_in_flight"], snapshot["successes"], snapshot["failures"]) == (0, 1, 5)


# A valid DNS name of 231 characters (four labels of at most 63): its host:port is longer
# than a breaker name may be (200)
LONG_HOST = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 39])


@pytest.mark.parametrize("kind", KINDS)
def test_a_host_that_cannot_be_a_breaker_name_gets_a_derived_one(kind: str, make_client, raw: RawUpstream):
    # the raw host answers every request, for any host, as the client's HTTP proxy: no DNS needed
    client = make_client(kind, proxy=raw.url, configs={f"http://{LONG_HOST}": {"failure_threshold": 2}})
    digest = hashlib.sha256(f"{LONG_HOST}:80".encode()).hexdigest()[:16]
    derived = f"{LONG_HOST[:180]}~{digest}:80"
    assert len(LONG_HOST) == 231 and len(derived) == 200
    assert client.get(f"http://{LONG_HOST}/pay") == 200
    raw.answer(302, headers=[(b"Location", f"http://{LONG_HOST}/cart".encode())], once=True)
    assert client.get(raw.url + "/redirect") == 200  # a redirect to it: the same breaker
    assert raw.targets == [f"http://{LONG_HOST}/pay", raw.url + "/redirect", f"http://{LONG_HOST}/cart"]
    assert client.names() == sorted([raw.name, derived])
    assert counted(client, derived) == ("closed", 2, 0, 0)
    # protected as any host is, with the config given for its URL: two failures trip it
    raw.answer(503, body=b"{}")
    answers = [client.attempt(f"http://{LONG_HOST}/pay") for _ in range(3)]
    assert answers == [503, 503, f"refused:{derived}"]
    if kind != "requests":  # (http.client cannot send to a host holding braces: an AssertionError of its own)
        raw.reset()
        raw.answer(302, headers=[(b"Location", b"http://a{b}.example/pay")], once=True)
        assert client.get(raw.url + "/redirect") == 200
        braces = "a_b_.example~" + hashlib.sha256(b"a{b}.example:80").hexdigest()[:16] + ":80"
        assert client.names() == sorted([raw.name, derived, braces])
        assert counted(client, braces) == ("closed", 1, 0, 0)


_LABEL = st.text(alphabet="abcxyz019-", min_size=1, max_size=63)
_HOSTS = st.one_of(
    st.lists(_LABEL, min_size=1, max_size=6).map(".".join),
    st.lists(st.sampled_from(["a" * 63, "b" * 40, "c"]), min_size=3, max_size=8).map(".".join),
)


@pytest.mark.parametrize("kind", KINDS)
def test_any_host_a_client_accepts_is_protected_under_a_valid_name(kind: str, make_client, raw: RawUpstream):
    """Property: for any host (through a proxy, so that none needs DNS), the client
    answers or raises its own exception, never a breaker's ValueError; an answer is
    counted on the breaker ``request_name`` gives, a valid name."""
    client = make_client(kind, proxy=raw.url, config=BreakerConfig(failure_threshold=1_000_000))
    braces = st.sampled_from(["", "{x}", "}", " "]) if kind != "requests" else st.just("")
    answered: Counter[str] = Counter()

    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(host=_HOSTS, extra=braces, port=st.sampled_from(["", ":80", ":8080", ":65535"]))
    def check(host: str, extra: str, port: str) -> None:
        url = f"http://{host}{extra}{port}/pay"
        try:
            status = client.get(url)
        except client.own_errors:
            return
        assert status == 200
        sent = raw.targets[-1]  # the URL as the client sent it (httpx encodes some characters)
        answered[validate_name(request_name(sent))] += 1

    check()
    for name, count in answered.items():
        assert counted(client, name)[1] == count


@settings(max_examples=1000, deadline=None, database=None)
@given(
    host=st.text(max_size=300),
    port=st.sampled_from(["", ":0", ":1", ":443", ":65535", ":99999", ":x"]),
    scheme=st.sampled_from(["http", "https", "HTTP", "ws", "gopher"]),
)
def test_request_name_is_always_a_valid_breaker_name(host: str, scheme: str, port: str):
    """Property: whatever a URL holds, its request's breaker name is valid, the same
    every time, and a host that is a valid name as it is keeps ``host:port``."""
    url = f"{scheme}://{host}{port}/x"
    name = request_name(url)
    assert validate_name(name) == name and len(name) <= 200
    assert request_name(url) == name
    try:
        plain = host_name(url)
    except ValueError:  # no host in it, or a port urlsplit refuses: derived from the URL
        return
    assert plain == name


# One connection per host, and a request waits for it as long as it takes (requests:
# pool_block; httpx: max_connections, and start_get's pool timeout of None)
ONE_CONNECTION: dict[str, dict[str, Any]] = {
    "requests": {"pool_block": True, "pool_maxsize": 1, "pool_connections": 1},
    "httpx": {"limits": httpx.Limits(max_connections=1)},
    "httpx_async": {"limits": httpx.Limits(max_connections=1)},
}


@pytest.mark.parametrize("kind", KINDS)
def test_a_request_waiting_for_a_pooled_connection_holds_no_probe_slot(
    kind: str, make_client, a: LocalUpstream, clock, redis_server
):
    client = make_client(kind, **ONE_CONNECTION[kind])
    held = client.open_stream(a.url + "/pay")  # neither read nor closed (yet): the only connection
    assert held.status_code == 200
    if kind != "requests":  # httpx gives up waiting after timeout.pool: PoolTimeout, not the service's
        with pytest.raises(httpx.PoolTimeout):
            call = client.client.get(a.url + "/pay", timeout=httpx.Timeout(5.0, pool=0.05))
            if kind == "httpx_async":
                client.run(call)  # type: ignore[attr-defined]
        assert counted(client, a.name) == ("closed", 0, 0, 0)  # (the held stream is not settled yet)
    client.record_failures(a.name, 5)  # another worker's failures open the breaker
    clock.advance(10_000)  # its open period is over: the next caller to ask is the probe
    waiting = client.start_get(a.url + "/pay")
    try:
        wait_until(waiting.waiting_in_pool, 10, "the call to wait for a pooled connection")
        # longer than probe_timeout_seconds (30 s): a probe slot the waiting call held would have
        # expired, reopening the breaker for everyone (probe_timeout); it holds none, so another
        # caller is the probe, and its success closes the breaker
        clock.advance(31_000)
        assert client.call_directly(a.name) == "success"
        assert client.snapshot(a.name)["state"] == "closed"
    finally:
        client.close_stream(held)  # the connection comes back: the waiting call asks, and goes on
    assert waiting.result() == 200
    assert transitions(redis_server.client(), client, a.name) == [
        ("closed", "open", "consecutive"),
        ("open", "half_open", "open_elapsed"),
        ("half_open", "closed", "probes_succeeded"),
    ]
    assert counted(client, a.name) == ("closed", 3, 5, 0)  # the stream, the probe, the waiting call


@pytest.mark.parametrize("kind", KINDS)
def test_a_naming_rule_and_per_breaker_configs(kind: str, make_client, a: LocalUpstream):
    def by_service(request: Any) -> str:
        return "pay" if "/pay" in str(request.url) else "shop"

    client = make_client(kind, name=by_service, configs={"pay": {"failure_threshold": 2}})
    a.control(fail_rate=1.0, path="/pay")
    assert [client.get(a.url + "/pay") for _ in range(2)] == [500, 500]
    with pytest.raises(BreakerOpen) as refused:
        client.get(a.url + "/pay")
    assert refused.value.breaker == "pay"
    assert client.get(a.url + "/cart") == 200  # the same host, another breaker
    assert client.snapshot("shop")["state"] == "closed"
    assert client.breakers.get("pay").config.failure_threshold == 2


@pytest.mark.parametrize("kind", KINDS)
def test_a_classifier_and_status_lists(kind: str, make_client, a: LocalUpstream):
    client = make_client(
        kind,
        failure_statuses={502},
        ignore_statuses={503},
        classify=lambda response: "failure" if response.status_code == 418 else None,
    )
    for status in (500, 503, 418, 502):
        a.control(fail_rate=1.0, fail_status=status)
        assert client.get(a.url + "/pay") == status
    counted = client.snapshot(a.name)
    assert (counted["successes"], counted["ignored"], counted["failures"]) == (1, 1, 2)


def test_the_adapter_passes_its_own_arguments_through(make_client, a: LocalUpstream):
    client = make_client(
        "requests", max_retries=Retry(total=2, status_forcelist=[503], backoff_factor=0), pool_maxsize=3
    )
    adapter = client.session.get_adapter(a.url)  # type: ignore[attr-defined]
    assert adapter._pool_maxsize == 3
    a.control(fail_rate=1.0, fail_status=503)
    with pytest.raises(requests.exceptions.RetryError):
        client.get(a.url + "/pay")
    assert a.hits() == 3  # urllib3 retried twice inside one send ...
    assert client.snapshot(a.name)["failures"] == 1  # ... which is one outcome


def test_the_transport_passes_its_own_arguments_through(make_client):
    client = make_client("httpx", retries=1)
    assert client.client._transport.transport._pool._retries == 1  # type: ignore[attr-defined]
    closed = refused_url()
    with pytest.raises(httpx.ConnectError):
        client.get(closed + "/pay")
    assert client.snapshot(closed.removeprefix("http://"))["failures"] == 1


def test_bad_options_are_errors_naming_them(redis_server):
    breakers = Breakers.from_url(redis_server.url, "badopts", listen=False)
    async_breakers = AsyncBreakers.from_url(redis_server.url, "badopts", listen=False)
    cases: list[tuple[Callable[[], Any], type[Exception], str]] = [
        (
            lambda: BreakerAdapter(breakers, failure_statuses=502),
            TypeError,
            "BreakerAdapter: failure_statuses must be a collection of HTTP status codes",
        ),
        (
            lambda: BreakerAdapter(breakers, ignore_statuses=[700]),
            ValueError,
            "BreakerAdapter: ignore_statuses holds 700",
        ),
        (lambda: BreakerAdapter(breakers, name=42), TypeError, "BreakerAdapter: name must be"),
        (
            lambda: BreakerAdapter(breakers, name="a b"),
            ValueError,
            "BreakerAdapter: name: invalid breaker name",
        ),
        (
            lambda: BreakerAdapter(breakers, configs={"http://x:1": {"failure_threshold": 0}}),
            ValueError,
            "BreakerAdapter: configs['http://x:1']: BreakerConfig.failure_threshold",
        ),
        (
            lambda: BreakerAdapter(breakers, configs={"pay": 3}),
            TypeError,
            "configs['pay']: give a BreakerConfig",
        ),
        (
            lambda: BreakerAdapter(breakers, classify="5xx"),
            TypeError,
            "BreakerAdapter: classify must be callable",
        ),
        (
            lambda: BreakerAdapter(async_breakers),
            TypeError,
            "BreakerAdapter: breakers must be a breaker_redis.Breakers",
        ),
        (
            lambda: AsyncBreakerTransport(breakers),
            TypeError,
            "AsyncBreakerTransport: breakers must be a breaker_redis.asyncio.Breakers",
        ),
        (
            lambda: BreakerTransport(breakers, httpx.HTTPTransport(), retries=2),
            TypeError,
            "BreakerTransport: give a transport or its options, not both (got retries)",
        ),
    ]
    other = Breakers.from_url(redis_server.url, "other", listen=False)
    breakers.get("10.0.0.9:80", BreakerConfig(failure_threshold=3))
    cases += [
        (
            lambda: BreakerGroup(
                breakers, "pool", ["http://10.0.0.1", "http://10.0.0.2"], max_open_fraction=0
            ),
            ValueError,
            "BreakerGroup 'pool': max_open_fraction must be > 0 and <= 1 (got 0)",
        ),
        (
            lambda: BreakerGroup(breakers, "pool", ["http://10.0.0.1", "10.0.0.1:80"]),
            ValueError,
            "BreakerGroup 'pool': member '10.0.0.1:80' is given twice",
        ),
        (
            lambda: BreakerGroup(breakers, "pool", "http://10.0.0.1"),
            TypeError,
            "BreakerGroup 'pool': members must be a list",
        ),
        (
            lambda: BreakerGroup(breakers, "pool", []),
            ValueError,
            "BreakerGroup 'pool': needs at least one member",
        ),
        (
            lambda: BreakerGroup(breakers, "p{x}", ["http://10.0.0.1"]),
            ValueError,
            "BreakerGroup: invalid breaker name 'p{x}'",
        ),
        (
            lambda: BreakerGroup(breakers, "pool", ["http://10.0.0.9"]),
            ValueError,
            "BreakerGroup 'pool': member '10.0.0.9:80': breaker '10.0.0.9:80' already exists with another",
        ),
        (
            lambda: BreakerGroup(async_breakers, "pool", ["http://10.0.0.1"]),
            TypeError,
            "BreakerGroup: breakers must be a breaker_redis.Breakers",
        ),
        (
            lambda: BreakerAdapter(other, groups=[BreakerGroup(breakers, "a", ["http://10.0.0.3"])]),
            ValueError,
            "BreakerAdapter: group 'a' is built on other Breakers",
        ),
        (
            lambda: BreakerAdapter(
                breakers,
                configs={"http://10.0.0.4": {"failure_threshold": 2}},
                groups=[BreakerGroup(breakers, "b", ["http://10.0.0.4"])],
            ),
            ValueError,
            "BreakerAdapter: '10.0.0.4:80' has a config in configs and in group 'b'",
        ),
        (
            lambda: BreakerGroup(breakers, "c", ["http://10.0.0.4"]),
            ValueError,
            "BreakerGroup 'c': member '10.0.0.4:80' is already in group 'b'",
        ),
        (
            lambda: BreakerGroup(breakers, "b", ["http://10.0.0.4"]),
            ValueError,
            "BreakerGroup 'b': member '10.0.0.4:80' is already in group 'b'",
        ),
        (
            lambda: AsyncBreakerTransport(
                async_breakers, groups=[BreakerGroup(breakers, "d", ["10.0.0.5:1"])]
            ),
            TypeError,
            "AsyncBreakerTransport: groups must hold AsyncBreakerGroups",
        ),
    ]
    for build, error, message in cases:
        with pytest.raises(error) as raised:
            build()
        assert message in str(raised.value)
    other.close()
    session = requests.Session()
    session.mount("http://", BreakerAdapter(breakers, name=lambda request: "{pay}"))
    with pytest.raises(ValueError, match=r"BreakerAdapter: name\(request\): invalid breaker name '\{pay\}'"):
        session.get("http://127.0.0.1:9/pay")
    breakers.close()


# -- pools of replicas: breaker groups ------------------------------------------------------------


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[LocalUpstream]]:
    made = [LocalUpstream() for _ in range(4)]
    yield made
    for replica in made:
        replica.stop()


@pytest.fixture
def pool(replicas: list[LocalUpstream]) -> list[LocalUpstream]:
    for replica in replicas:
        replica.reset()
    return replicas


def pool_group(pool: list[LocalUpstream]) -> dict[str, Any]:
    return {"name": "inventory", "members": [replica.url for replica in pool], "max_open_fraction": 0.5}


def call_round(client: Client, pool: list[LocalUpstream]) -> list[int | str]:
    """One call to each replica, in order: its status, or the refusing breaker."""
    answers: list[int | str] = []
    for replica in pool:
        try:
            answers.append(client.get(replica.url + "/stock"))
        except BreakerOpen as refused:
            answers.append(refused.breaker)
    return answers


def states(client: Client, pool: list[LocalUpstream]) -> list[str]:
    return [client.snapshot(replica.name)["state"] for replica in pool]


@pytest.mark.parametrize("kind", KINDS)
def test_a_pool_opens_at_most_its_share_of_replicas_and_another_opens_when_one_recovers(
    kind: str, make_client, pool: list[LocalUpstream], clock
):
    pool_story(make_client(kind, group=pool_group(pool)), pool, clock)


def test_a_pool_on_redis_cluster_decides_across_slots(make_client, pool: list[LocalUpstream], clock, cluster):
    cluster.flushall()
    member_slots = {key_slot(f"{{{replica.name}}}".encode()) for replica in pool}
    name = next(
        f"inventory{i}"
        for i in itertools.count()
        if key_slot(f"{{inventory{i}}}".encode()) not in member_slots
    )  # the group's hash in a slot no member's keys are in
    client = make_client("requests", url=cluster.url, group={**pool_group(pool), "name": name})
    pool_story(client, pool, clock)


def pool_story(client: Client, pool: list[LocalUpstream], clock: Any) -> None:
    r0, r1, r2, r3 = pool
    for replica in pool:
        replica.control(fail_rate=1.0)
    answers = [call_round(client, pool) for _ in range(8)]
    assert answers[:5] == [[500] * 4] * 5
    # from the 6th round on, the first two to reach 5 failures are open; the other two keep being called
    assert answers[5:] == [[r0.name, r1.name, 500, 500]] * 3
    assert [replica.hits("/stock") for replica in pool] == [5, 5, 8, 8]
    assert states(client, pool) == ["open", "open", "closed", "closed"]
    assert client.snapshot(r2.name)["consecutive_failures"] == 8  # held back at the cap, still counting
    status = client.group_status()
    assert (status["cap"], status["open"], status["holders"]) == (2, [r0.name, r1.name], [r0.name, r1.name])
    assert status["held"] >= 6 and status["grants"] == 2

    # r0 recovers: its probe closes it and gives its grant back; r2's next failure opens r2
    clock.advance(10_000)
    r0.reset()
    assert client.get(r0.url + "/stock") == 200
    assert states(client, pool) == ["closed", "open", "closed", "closed"]
    assert client.group_status()["holders"] == [r1.name]
    assert client.get(r2.url + "/stock") == 500
    assert states(client, pool) == ["closed", "open", "open", "closed"]
    assert client.get(r3.url + "/stock") == 500  # at the cap again: r3 stays closed and called
    assert states(client, pool) == ["closed", "open", "open", "closed"]
    with pytest.raises(BreakerOpen):
        client.get(r2.url + "/stock")
    status = client.group_status()
    assert (status["open"], status["holders"]) == ([r1.name, r2.name], [r1.name, r2.name])


def test_a_grant_left_by_a_worker_that_died_between_the_two_steps_is_reclaimed(
    make_client, pool: list[LocalUpstream]
):
    client = make_client("requests", group=pool_group(pool))
    group, breakers = client.group(), client.breakers
    r0, r1, _, r3 = pool
    for replica in (r0, r3):
        replica.control(fail_rate=1.0)
    for _ in range(5):
        assert client.get(r0.url + "/stock") == 500
    assert states(client, pool)[0] == "open"
    # a worker was granted r1's slot by the group, then died before member.lua kept it
    granted, _ = breakers.gate.run("group", "inventory", breakers.clock_ms(), ["", "", "ask", r1.name, "2"])
    assert int(granted[0]) == 1 and client.group_status()["holders"] == [r0.name, r1.name]
    for _ in range(5):
        assert client.get(r3.url + "/stock") == 500
    # at the cap, r3's worker found r1 closed: it revoked r1's grant, took the slot, and opened
    assert states(client, pool) == ["open", "closed", "closed", "open"]
    assert client.group_status()["holders"] == [r0.name, r3.name]
    # the dead worker's grant, arriving now, is refused: r1 cannot open with it
    late = group.breaker(r1.name).run_script("member", ["grant", text(granted[1])])
    assert (late.allowed, late.reason) == (0, "revoked")


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", ["requests", "httpx_async"])
def test_eight_processes_racing_never_open_more_than_the_pools_share(
    kind: str, pool: list[LocalUpstream], redis_server
):
    for replica in pool:
        replica.control(fail_rate=1.0)
    prefix = f"race{next(_prefixes)}"
    # the workers' clients wait up to 0.9 s for a reply, as the other process tests'
    # do: 8 free-running processes on a busy 2-core machine can stall a reply past
    # the default 0.25 s, and a worker in its local store prints that on stderr
    url = redis_server.url + "?socket_timeout=0.9&socket_connect_timeout=0.9"
    spec = {
        "kind": kind,
        "redis": url,
        "prefix": prefix,
        "urls": [replica.url + "/stock" for replica in pool],
        "calls": 40,
        "config": {"failure_threshold": 5, "open_seconds": 60},
        "group": pool_group(pool),
        "start_at": time.time() + 3,
    }
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.http_client_worker", json.dumps(spec)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    outputs = [child.communicate(timeout=120) for child in children]
    for child, (_, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0 and err == "", outputs
    answers = [answer for out, _ in outputs for answer in json.loads(out)]
    redis = redis_server.client()
    opened = [replica.name for replica in pool if redis.lrange(f"{prefix}:{{{replica.name}}}:events", 0, -1)]
    # nothing recovers here, so a member that ever opened is open still: never more than 2 at once
    assert len(opened) == 2, opened
    assert [
        redis.hget(f"{prefix}:{{{replica.name}}}:state", "state").decode()
        for replica in pool
        if replica.name in opened
    ] == ["open", "open"]
    held_back = [replica for replica in pool if replica.name not in opened]
    for replica in held_back:  # every call to a held-back replica reached it
        assert replica.hits("/stock") == 8 * 40 // 4
        assert f"refused:{replica.name}" not in answers
    holders = sorted(
        key.decode()[2:] for key in redis.hkeys(f"{prefix}:group:{{inventory}}") if key.startswith(b"h:")
    )
    assert holders == sorted(opened)
    print(
        f"8 processes x 40 calls over 4 failing replicas, max_open_fraction=0.5: opened {opened}, "
        f"held back {[r.name for r in held_back]} ({Counter(answers)})"
    )


def test_a_pool_shows_in_status_the_metrics_and_the_dashboard(
    make_client, pool: list[LocalUpstream], redis_server, monkeypatch
):
    from click.testing import CliRunner
    from flask import Flask
    from prometheus_client.parser import text_string_to_metric_families

    from breaker_redis.flask import FlaskBreakers
    from breaker_redis.flask import dashboard as dashboard_module
    from breaker_redis.metrics import exposition
    from breaker_redis.ops import cli
    from tests.support.sse import events

    client = make_client("requests", group=pool_group(pool))
    prefix = client.breakers.prefix
    for replica in pool:
        replica.control(fail_rate=1.0)
    for _ in range(7):
        call_round(client, pool)
    r0, r1, r2, r3 = (replica.name for replica in pool)
    held = client.group_status()["held"]
    assert held >= 4

    shown = CliRunner().invoke(cli.main, ["--url", redis_server.url, "--prefix", prefix, "status"])
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines()[-1] == (
        f"group inventory: 2 of 4 members open (at most 2, max_open_fraction 0.5): {r0}, {r1}; "
        f"{held} trips held back at the cap"
    )
    as_json = CliRunner().invoke(
        cli.main, ["--url", redis_server.url, "--prefix", prefix, "status", "--json"]
    )
    assert {s["name"]: s.get("group") for s in json.loads(as_json.output)} == dict.fromkeys(
        (r0, r1, r2, r3), "inventory"
    )

    scraped = exposition(redis_server.client(), prefix).decode()
    found = {
        s.name: (s.labels["group"], s.value)
        for family in text_string_to_metric_families(scraped)
        for s in family.samples
        if s.name.startswith("breaker_redis_group")
    }
    assert found == {
        "breaker_redis_group_members": ("inventory", 4),
        "breaker_redis_group_max_open": ("inventory", 2),
        "breaker_redis_group_open": ("inventory", 2),
        "breaker_redis_group_held_back_total": ("inventory", held),
    }

    monkeypatch.setattr(dashboard_module, "STREAM_SECONDS", 0)  # the stream ends after one frame
    app = Flask(__name__)
    app.config.update(BREAKER_ADMIN_TOKEN="t", BREAKER_DASHBOARD=True, BREAKER_KEY_PREFIX=prefix)
    FlaskBreakers(app, client=redis_server.client(), listen=False)
    answer = app.test_client().get("/_breakers/stream", headers={"Authorization": "Bearer t"})
    ((_, frame),) = events(answer.get_data(as_text=True))
    (group,) = frame["groups"]
    assert (group["name"], group["open"], group["holders"], group["cap"]) == (
        "inventory",
        [r0, r1],
        [r0, r1],
        2,
    )
    assert group["states"] == {r0: "open", r1: "open", r2: "closed", r3: "closed"}
