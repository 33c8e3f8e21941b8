"""breaker_redis.asgi.BreakerMiddleware and breaker_redis.fastapi, in process.

Every test runs on fakeredis's asyncio client and on the session's real
redis-server (the ``env`` fixture), through httpx's ASGITransport or by
calling the middleware with hand-made ASGI messages (cancellation, client
disconnects, lifespan). Counts are read from the breaker's snapshot; waits
are conditions with deadlines.
"""

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

import anyio
import fakeredis
import httpx
import pytest
import redis
import redis.asyncio
from fastapi import Depends, FastAPI, HTTPException, Response
from fastapi.responses import JSONResponse

from breaker_redis.asgi import BreakerMiddleware, ResponseInfo, RouteSpec, parse_routes, request_path
from breaker_redis.asyncio import BreakerConfig, BreakerOpen, Breakers, Permit
from breaker_redis.fallbacks import FallbackContext, FallbackResponse, cached, chain, function, static
from breaker_redis.fastapi import BreakerGuard, add_refusal_handler, protect
from breaker_redis.web.refusal import Refusal, default_message

_prefixes = itertools.count()
FRIENDLY = "temporarily unavailable, please retry later"


@dataclass
class Env:
    kind: str
    aclient: Callable[[], Any]
    sclient: Callable[[], Any]


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.real)])
def env(request: pytest.FixtureRequest) -> Env:
    if request.param == "fake":
        server = fakeredis.FakeServer()
        return Env(
            "fake",
            lambda: fakeredis.FakeAsyncRedis(server=server),
            lambda: fakeredis.FakeRedis(server=server),
        )
    real = request.getfixturevalue("redis_server")
    real.client().flushall()
    return Env("real", lambda: redis.asyncio.Redis(host="127.0.0.1", port=real.port), lambda: real.client())


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


class App:
    """A bare ASGI app whose next answer each test sets: a status and body, an
    exception, a hang, no response at all, or a body cut by an exception."""

    def __init__(self) -> None:
        self.status = 200
        self.body = b'{"ok": true}'
        self.headers: list[tuple[bytes, bytes]] = [(b"content-type", b"application/json")]
        self.mode = "respond"
        self.exc: BaseException = RuntimeError("boom")
        self.calls = 0
        self.entered: asyncio.Event | None = None
        self.lifespan: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                self.lifespan.append(message["type"])
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        self.calls += 1
        if self.entered is not None:
            self.entered.set()
        if self.mode == "raise":
            raise self.exc
        if self.mode == "hang":
            await asyncio.Event().wait()
        if self.mode == "no_response":
            return
        await send({"type": "http.response.start", "status": self.status, "headers": list(self.headers)})
        if self.mode == "raise_mid_body":
            await send({"type": "http.response.body", "body": self.body[:3], "more_body": True})
            raise self.exc
        if self.mode == "chunks":
            for byte in self.body:
                await send({"type": "http.response.body", "body": bytes([byte]), "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.body", "body": self.body})


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


@dataclass
class Harness:
    app: Any
    mw: BreakerMiddleware
    breakers: Breakers
    http: httpx.AsyncClient

    async def snap(self, name: str = "pay") -> dict[str, Any]:
        return await self.mw.breaker(name).snapshot()


@contextlib.asynccontextmanager
async def harness(
    env: Env,
    routes: Any,
    app: Any = None,
    *,
    clock: Clock | None = None,
    raise_app_exceptions: bool = True,
    client: Any = None,
    **options: Any,
) -> AsyncIterator[Harness]:
    app = app if app is not None else App()
    breakers = Breakers(client or env.aclient(), f"asgi{next(_prefixes)}", clock=clock)
    mw = BreakerMiddleware(app, breakers, routes, **options)
    transport = httpx.ASGITransport(app=mw, raise_app_exceptions=raise_app_exceptions)  # type: ignore[arg-type]
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            yield Harness(app, mw, breakers, http)
    finally:
        await breakers.aclose()


async def eventually(condition: Callable[[], Awaitable[bool]], what: str, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def scope_for(path: str, method: str = "GET", headers: list[Any] | None = None) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers or [],
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 5000),
    }


async def never_receive() -> dict[str, Any]:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


PAY = {"breaker": "pay", "failure_threshold": 3, "open_seconds": 10}


# -- routes ---------------------------------------------------------------------------------


def test_routes_longest_prefix_on_a_segment_boundary() -> None:
    routes, configs = parse_routes(
        {"/pay": "pay", "/pay/refund": {"breaker": "refund", "open_seconds": 5}, "/api/": "api"}
    )
    assert [prefix for prefix, _ in routes] == ["/pay/refund", "/api/", "/pay"]
    assert configs == {"refund": {"open_seconds": 5}}
    mw = BreakerMiddleware(
        App(), Breakers(fakeredis.FakeAsyncRedis()), {"/pay": "pay", "/pay/refund": "refund", "/api/": "api"}
    )

    def name(path: str) -> str | None:
        spec = mw.route_for(path)
        return None if spec is None else spec.name

    assert name("/pay") == name("/pay/") == name("/pay/x/y") == "pay"
    assert name("/pay/refund") == name("/pay/refund/7") == "refund"
    assert name("/payment") is None and name("/pay-x") is None and name("/") is None
    assert name("/api") == name("/api/v1") == "api"
    # the path the app routes on: root_path removed when the server included it
    assert request_path({"path": "/shop/pay", "root_path": "/shop"}) == "/pay"
    assert request_path({"path": "/pay", "root_path": "/shop"}) == "/pay"


def test_bad_routes_fail_at_start_up() -> None:
    breakers = Breakers(fakeredis.FakeAsyncRedis())
    with pytest.raises(ValueError, match="unknown option 'colour'"):
        BreakerMiddleware(App(), breakers, {"/pay": {"breaker": "pay", "colour": "red"}})
    with pytest.raises(ValueError, match="needs 'breaker'"):
        BreakerMiddleware(App(), breakers, {"/pay": {"failure_threshold": 2}})
    with pytest.raises(ValueError, match="configured differently"):
        BreakerMiddleware(
            App(),
            breakers,
            {"/a": {"breaker": "x", "failure_threshold": 2}, "/b": {"breaker": "x", "failure_threshold": 3}},
        )
    with pytest.raises(ValueError, match="must start with '/'"):
        BreakerMiddleware(App(), breakers, {"pay": "pay"})
    with pytest.raises(ValueError, match="failure_threshold"):
        BreakerMiddleware(App(), breakers, {"/pay": {"breaker": "pay", "failure_threshold": 0}})
    with pytest.raises(TypeError, match=r"asyncio\.Breakers"):
        from breaker_redis import Breakers as SyncBreakers

        BreakerMiddleware(App(), SyncBreakers(fakeredis.FakeRedis()), {"/pay": "pay"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cache_client"):
        degrade = chain(cached(), static({"items": []}))
        BreakerMiddleware(App(), breakers, {"/cart": {"breaker": "cart", "fallback": degrade}})


def test_only_the_routes_prefix_is_guarded(env: Env) -> None:
    async def scenario() -> None:
        async with harness(env, {"/pay": {**PAY, "failure_threshold": 1}, "/pay/refund": "refund"}) as h:
            h.app.status = 502
            assert (await h.http.post("/pay/charge")).status_code == 502  # trips "pay"
            h.app.status = 200
            refused = await h.http.post("/pay")
            assert refused.status_code == 503 and refused.headers["x-breaker"] == "pay"
            assert (await h.http.post("/pay/anything")).status_code == 503
            assert (await h.http.post("/payment")).status_code == 200
            assert (await h.http.post("/pay/refund/1")).status_code == 200  # its own breaker
            assert (await h.http.options("/pay")).status_code == 200  # CORS preflight: never refused
            assert h.app.calls == 4
            snap = await h.snap()
            assert (snap["state"], snap["calls"], snap["failures"], snap["rejected"]) == ("open", 1, 1, 2)

    run(scenario())


# -- the refusal -------------------------------------------------------------------------------


def test_refusal_is_the_common_503_as_text_or_json(env: Env) -> None:
    async def scenario() -> None:
        async with harness(env, {"/pay": {**PAY, "message": "Payments are resting."}, "/cart": "cart"}) as h:
            h.app.status = 500
            for _ in range(3):
                assert (await h.http.get("/pay")).status_code == 500
            text = await h.http.get("/pay", headers={"accept": "*/*"})
            assert text.status_code == 503
            assert text.headers["content-type"] == "text/plain; charset=utf-8"
            assert text.text == "Payments are resting.\n"
            assert text.headers["retry-after"] == "10"
            assert (text.headers["x-breaker"], text.headers["x-breaker-reason"]) == ("pay", "open")
            assert int(text.headers["content-length"]) == len(text.content)
            as_json = await h.http.get("/pay", headers={"accept": "application/json"})
            assert as_json.headers["content-type"] == "application/json"
            assert as_json.json() == {
                "error": "service_unavailable",
                "message": "Payments are resting.",
                "breaker": "pay",
                "reason": "open",
                "retry_after": 10,
            }
            # the very bytes every integration sends (breaker_redis.web.refusal)
            expected = Refusal.build(
                BreakerOpen(10.0, "pay", "open"), as_json=True, message="Payments are resting."
            )
            assert as_json.content == expected.body
            xhr = await h.http.get("/pay", headers={"x-requested-with": "XMLHttpRequest"})
            assert xhr.headers["content-type"] == "application/json"
            head = await h.http.head("/pay")
            assert head.status_code == 503 and head.content == b""
            # a forced-open breaker advertises its open period; the default message
            await h.mw.breaker("cart").force_open()
            forced = await h.http.get("/cart")
            assert forced.status_code == 503 and forced.headers["x-breaker-reason"] == "forced_open"
            assert forced.headers["retry-after"] == str(int(BreakerConfig().open_seconds))
            assert forced.text == default_message("cart") + "\n" and FRIENDLY in forced.text
            assert h.app.calls == 3
            assert (await h.snap())["rejected"] == 4

    run(scenario())


# -- classification ------------------------------------------------------------------------------


def test_statuses_classify_the_response(env: Env) -> None:
    async def scenario() -> None:
        routes = {
            "/pay": PAY,
            "/tuned": {
                "breaker": "tuned",
                "failure_statuses": [429, 502],
                "ignore_statuses": [503],
                "failure_threshold": 100,
            },
        }
        async with harness(env, routes) as h:
            for status in (200, 201, 404, 400, 302, 500, 200):
                h.app.status = status
                assert (await h.http.get("/pay")).status_code == status
            snap = await h.snap()
            assert (snap["calls"], snap["successes"], snap["failures"], snap["state"]) == (7, 6, 1, "closed")
            assert snap["consecutive_failures"] == 0
            for status in (429, 502, 500, 503, 200):
                h.app.status = status
                await h.http.get("/tuned")
            snap = await h.snap("tuned")
            assert (snap["successes"], snap["failures"], snap["ignored"]) == (2, 2, 1)

    run(scenario())


def test_classify_callable_sees_status_and_headers(env: Env) -> None:
    seen: list[ResponseInfo] = []

    def classify(info: ResponseInfo) -> str | bool | None:
        seen.append(info)
        verdict = info.headers.get("X-Verdict")
        return {"fail": True, "ok": False, "skip": "ignored", "broken": 42}.get(verdict or "")  # type: ignore[return-value]

    async def scenario() -> None:
        async with harness(
            env, {"/pay": {"breaker": "pay", "classify": classify, "failure_threshold": 100}}
        ) as h:
            for verdict, status in (
                ("fail", 200),
                ("ok", 500),
                ("skip", 500),
                ("", 500),
                ("", 200),
                ("broken", 200),
            ):
                h.app.status = status
                h.app.headers = [(b"x-verdict", verdict.encode())]
                await h.http.get("/pay")
            snap = await h.snap()
            # fail->failure, ok->success, skip->ignored, None->status (500 failure, 200 success), 42->failure
            assert (snap["failures"], snap["successes"], snap["ignored"]) == (3, 2, 1)
            assert seen[0].status_code == 200 and seen[0].status == "200 OK"
            assert seen[0].scope["path"] == "/pay"

    run(scenario())


def test_exceptions_are_classified_by_the_config_and_reraised(env: Env) -> None:
    async def scenario() -> None:
        routes = {
            "/pay": {
                "breaker": "pay",
                "failure_threshold": 2,
                "record_exceptions": (ConnectionError,),
                "ignore_exceptions": (ConnectionResetError,),
            }
        }
        async with harness(env, routes) as h:
            h.app.mode = "raise"
            for exc in (ValueError("not ours"), ConnectionResetError("ignored"), ConnectionError("down")):
                h.app.exc = exc
                with pytest.raises(type(exc)):
                    await h.http.get("/pay")
            snap = await h.snap()
            assert (snap["calls"], snap["failures"], snap["ignored"], snap["state"]) == (3, 1, 2, "closed")
            with pytest.raises(ConnectionError):
                await h.http.get("/pay")
            assert (await h.snap())["state"] == "open"
            assert (await h.http.get("/pay")).status_code == 503

    run(scenario())


def test_an_exception_after_the_start_is_counted_by_the_status(env: Env) -> None:
    async def scenario() -> None:
        async with harness(env, {"/pay": PAY}) as h:
            h.app.mode = "raise_mid_body"
            with pytest.raises(RuntimeError):
                await h.http.get("/pay")
            h.app.status = 502
            with pytest.raises(RuntimeError):
                await h.http.get("/pay")
            snap = await h.snap()
            assert (snap["calls"], snap["successes"], snap["failures"]) == (2, 1, 1)

    run(scenario())


def test_the_outcome_is_recorded_before_the_status_reaches_the_server(env: Env) -> None:
    """The boundary: when the server gets the start of the tripping response,
    Redis already holds the trip."""

    async def scenario() -> None:
        async with harness(env, {"/pay": PAY}) as h:
            h.app.status = 502
            states: list[str] = []

            async def send(message: Any) -> None:
                if message["type"] == "http.response.start":
                    states.append((await h.snap())["state"])

            for _ in range(3):
                await h.mw(scope_for("/pay"), never_receive, send)
            assert states == ["closed", "closed", "open"]

    run(scenario())


# -- fallbacks ------------------------------------------------------------------------------------


def test_static_and_function_fallbacks_answer_a_refusal(env: Env) -> None:
    from starlette.responses import JSONResponse, StreamingResponse

    contexts: list[FallbackContext] = []

    def simplified(context: FallbackContext) -> Any:
        contexts.append(context)
        return {"items": ["bestseller"], "why": type(context.cause).__name__}

    async def as_tuple(context: FallbackContext) -> Any:
        await asyncio.sleep(0)
        return ("queued", 202, {"X-Queue": "1"})

    def starlette_response(context: FallbackContext) -> Any:
        return JSONResponse({"from": "starlette"}, status_code=200, headers={"x-extra": "yes"})

    def streamed(context: FallbackContext) -> Any:
        async def parts() -> AsyncIterator[bytes]:
            yield b"part1,"
            yield b"part2"

        return StreamingResponse(parts(), media_type="text/plain")

    def broken(context: FallbackContext) -> Any:
        raise RuntimeError("the fallback itself fails")

    async def scenario() -> None:
        one = {"failure_threshold": 1, "fallback_on_failure": False}
        routes = {
            "/static": {
                "breaker": "s",
                "fallback": static({"items": []}, headers={"X-Degraded": "1"}),
                **one,
            },
            "/function": {"breaker": "f", "fallback": simplified, **one},
            "/tuple": {"breaker": "t", "fallback": function(as_tuple), **one},
            "/starlette": {"breaker": "r", "fallback": starlette_response, **one},
            "/stream": {"breaker": "st", "fallback": streamed, **one},
            "/chain": {
                "breaker": "c",
                "fallback": chain(function(lambda c: None), function(broken), static("last resort")),
                **one,
            },
            "/broken": {"breaker": "b", "fallback": broken, **one},
        }
        async with harness(env, routes) as h:
            h.app.status = 500
            for path in routes:
                assert (await h.http.get(path)).status_code == 500  # trips each (no fallback on failure)
            answer = await h.http.get("/static")
            assert (answer.status_code, answer.json()) == (200, {"items": []})
            assert answer.headers["x-breaker-fallback"] == "static"
            assert (answer.headers["x-breaker"], answer.headers["x-breaker-reason"]) == ("s", "open")
            assert answer.headers["x-degraded"] == "1"
            answer = await h.http.get("/function?q=1")
            assert answer.json() == {"items": ["bestseller"], "why": "BreakerOpen"}
            assert answer.headers["x-breaker-fallback"] == "function"
            assert contexts[0].key == "GET /function?q=1" and contexts[0].request["path"] == "/function"
            assert contexts[0].store is h.breakers.client  # the asyncio client: a function may await it
            answer = await h.http.get("/tuple")
            assert (answer.status_code, answer.text, answer.headers["x-queue"]) == (202, "queued", "1")
            answer = await h.http.get("/starlette")
            assert answer.json() == {"from": "starlette"} and answer.headers["x-extra"] == "yes"
            assert answer.headers["x-breaker-fallback"] == "function"
            answer = await h.http.get("/stream")
            assert answer.text == "part1,part2" and answer.headers["x-breaker-fallback"] == "function"
            answer = await h.http.get("/chain")
            assert (answer.text, answer.headers["x-breaker-fallback"]) == ("last resort", "static")
            answer = await h.http.get("/broken")  # a broken fallback never becomes a 500
            assert answer.status_code == 503 and answer.headers["x-breaker"] == "b"
            assert "x-breaker-fallback" not in answer.headers
            assert h.app.calls == len(routes)

    run(scenario())


def test_a_fallback_answers_a_failed_response_or_exception(env: Env) -> None:
    async def scenario() -> None:
        routes = {
            "/pay": {**PAY, "failure_threshold": 10, "fallback": static({"queued": True}, status=202)},
            "/raw": {
                "breaker": "raw",
                "failure_threshold": 10,
                "fallback": static("x"),
                "fallback_on_failure": False,
            },
        }
        async with harness(env, routes) as h:
            h.app.status = 502
            h.app.mode = "chunks"  # the app keeps sending body messages after its start: dropped
            answer = await h.http.get("/pay")
            assert (answer.status_code, answer.json()) == (202, {"queued": True})
            assert answer.headers["x-breaker-fallback"] == "static"
            assert "x-breaker-reason" not in answer.headers
            h.app.mode = "raise"
            h.app.exc = ConnectionError("upstream down")
            answer = await h.http.get("/pay")  # answered by the fallback, not re-raised
            assert (answer.status_code, answer.json()) == (202, {"queued": True})
            h.app.mode = "respond"
            assert (await h.http.get("/raw")).status_code == 502
            snap = await h.snap()
            assert (snap["calls"], snap["failures"]) == (2, 2)  # exactly once each

    run(scenario())


def test_cached_fallback_runs_in_a_thread_and_is_shared_with_sync_workers(env: Env) -> None:
    async def scenario() -> None:
        sync_client = env.sclient()
        routes = {
            "/cart": {
                "breaker": "cart",
                "failure_threshold": 2,
                "fallback": chain(cached(ttl=60, refresh_seconds=0), static({"items": []})),
            }
        }
        async with harness(env, routes, cache_client=sync_client) as h:
            h.app.body = b'{"items": ["tea"]}'
            h.app.mode = "chunks"  # kept across body messages
            assert (await h.http.get("/cart?user=1")).json() == {"items": ["tea"]}
            h.app.mode = "respond"
            assert (await h.http.post("/cart")).status_code == 200  # POST: never cached
            h.app.status = 500
            answer = await h.http.get("/cart?user=1")  # a failure: the last good response
            assert answer.status_code == 200 and answer.json() == {"items": ["tea"]}
            assert answer.headers["x-breaker-fallback"] == "cached" and "age" in answer.headers
            answer = await h.http.get("/cart?user=2")  # nothing cached for it: the static one
            assert (answer.json(), answer.headers["x-breaker-fallback"]) == ({"items": []}, "static")
            assert (await h.snap("cart"))["state"] == "open"
            answer = await h.http.get("/cart?user=1")  # refused: still the cached one
            assert answer.json() == {"items": ["tea"]} and answer.headers["x-breaker-reason"] == "open"
            # the entry is the format the Flask extension and the WSGI middleware use: a
            # response a sync worker remembered is served here (and the other way round)
            prefix = h.breakers.prefix
            sync_context = FallbackContext("cart", None, "GET /cart?user=3", "GET", sync_client, prefix)
            cached(ttl=60).remember(
                sync_context,
                FallbackResponse(b'{"items": ["cup"]}', 200, (("Content-Type", "application/json"),)),
            )
            assert (await h.http.get("/cart?user=3")).json() == {"items": ["cup"]}
            keys = sync_client.keys(f"{prefix}:{{cart}}:fallback:*")
            assert len(keys) == 2

    run(scenario())


# -- outbound refusals, lifespan, websockets ------------------------------------------------------


def test_an_outbound_refusal_escaping_the_app_is_the_503_of_that_breaker(env: Env) -> None:
    async def scenario() -> None:
        async with harness(env, {"/pay": PAY}) as h:
            h.app.mode = "raise"
            h.app.exc = BreakerOpen(4.2, "inventory", "open")
            for path in ("/pay", "/elsewhere"):
                answer = await h.http.get(path, headers={"accept": "application/json"})
                assert answer.status_code == 503
                assert answer.json()["breaker"] == "inventory" and answer.headers["retry-after"] == "5"
            snap = await h.snap()
            assert (snap["calls"], snap["ignored"], snap["failures"]) == (1, 1, 0)  # pay was not asked

    run(scenario())


def test_lifespan_and_websocket_scopes_pass_through() -> None:
    async def scenario() -> None:
        app = App()
        mw = BreakerMiddleware(app, Breakers(fakeredis.FakeAsyncRedis()), {"/": "everything"})
        incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
        sent: list[Any] = []

        async def receive() -> Any:
            return incoming.pop(0)

        async def send(message: Any) -> None:
            sent.append(message)

        await mw({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
        assert app.lifespan == ["lifespan.startup", "lifespan.shutdown"]
        assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
        seen: list[Any] = []

        async def ws_app(scope: Any, receive: Any, send: Any) -> None:
            seen.append((scope["type"], send))

        await BreakerMiddleware(ws_app, Breakers(fakeredis.FakeAsyncRedis()), {"/": "x"})(
            {"type": "websocket", "path": "/chat"}, receive, send
        )
        assert seen == [("websocket", send)]  # the server's own send: untouched

    run(scenario())


# -- permits never leak --------------------------------------------------------------------------


async def half_open(h: Harness, clock: Clock) -> None:
    """Trip pay (threshold 1) and let its open period pass: the next call is the one probe."""
    h.app.status = 500
    assert (await h.http.get("/pay")).status_code == 500
    clock.now += 10_001
    h.app.status = 200


PROBE = {
    "breaker": "pay",
    "failure_threshold": 1,
    "open_seconds": 10,
    "half_open_max_calls": 1,
    "record_exceptions": (ConnectionError,),
}


def test_an_exception_hands_the_probe_back(env: Env) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with harness(env, {"/pay": PROBE}, clock=clock) as h:
            await half_open(h, clock)
            h.app.mode = "raise"
            h.app.exc = ValueError("a bug, not an outage: ignored")
            with pytest.raises(ValueError):
                await h.http.get("/pay")
            snap = await h.snap()
            assert (snap["state"], snap["probes_in_flight"], snap["ignored"]) == ("half_open", 0, 1)
            h.app.mode = "respond"
            assert (await h.http.get("/pay")).status_code == 200  # the slot was free again
            assert (await h.snap())["state"] == "closed"

    run(scenario())


def test_a_client_that_leaves_before_the_response_hands_the_probe_back(env: Env) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with harness(env, {"/pay": PROBE}, clock=clock) as h:
            await half_open(h, clock)
            h.app.mode = "no_response"  # the app saw http.disconnect and returned
            sent: list[Any] = []

            async def send(message: Any) -> None:
                sent.append(message)

            await h.mw(scope_for("/pay"), never_receive, send)
            assert sent == []
            snap = await h.snap()
            assert (snap["state"], snap["probes_in_flight"], snap["ignored"]) == ("half_open", 0, 1)

    run(scenario())


def test_a_cancelled_request_hands_the_probe_back(env: Env) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with harness(env, {"/pay": PROBE}, clock=clock) as h:
            await half_open(h, clock)
            h.app.mode = "hang"
            h.app.entered = asyncio.Event()

            async def send(message: Any) -> None:
                return None

            task = asyncio.ensure_future(h.mw(scope_for("/pay"), never_receive, send))
            await asyncio.wait_for(h.app.entered.wait(), 5)
            assert (await h.snap())["probes_in_flight"] == 1
            busy = await h.http.get("/pay")
            assert (busy.status_code, busy.headers["x-breaker-reason"]) == (503, "half_open_full")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

            async def released() -> bool:
                return (await h.snap())["probes_in_flight"] == 0

            await eventually(released, "the cancelled probe's lease to be released")
            h.app.mode = "respond"
            assert (await h.http.get("/pay")).status_code == 200
            snap = await h.snap()
            assert (snap["state"], snap["ignored"], snap["successes"]) == ("closed", 1, 1)

    run(scenario())


def test_an_anyio_cancel_scope_cannot_cut_the_record_short(env: Env) -> None:
    """anyio cancels every await inside a cancelled scope (Starlette's task groups,
    ``anyio.fail_after``): the record still reaches Redis."""

    async def scenario() -> None:
        clock = Clock()
        async with harness(env, {"/pay": PROBE}, clock=clock) as h:
            await half_open(h, clock)
            h.app.mode = "hang"

            async def send(message: Any) -> None:
                return None

            with anyio.move_on_after(0.05) as scope:
                await h.mw(scope_for("/pay"), never_receive, send)
            assert scope.cancelled_caught

            async def released() -> bool:
                return (await h.snap())["probes_in_flight"] == 0

            await eventually(released, "the probe's lease to be released")
            assert (await h.snap())["ignored"] == 1

    run(scenario())


class LateReplies:
    """An asyncio client whose script replies can be held back: the script has run
    in Redis (a probe slot taken) and its reply is still in flight when the
    request is cancelled."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.hold = False
        self.holding = asyncio.Event()
        self.gate = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def evalsha(self, *args: Any) -> Any:
        reply = await self._client.evalsha(*args)
        if self.hold:
            self.holding.set()
            await self.gate.wait()
        return reply


def test_a_request_cancelled_while_acquiring_hands_the_probe_back(env: Env) -> None:
    async def scenario() -> None:
        clock = Clock()
        held = LateReplies(env.aclient())
        async with harness(env, {"/pay": PROBE}, clock=clock, client=held) as h:
            await half_open(h, clock)

            async def send(message: Any) -> None:
                return None

            held.hold = True
            task = asyncio.ensure_future(h.mw(scope_for("/pay"), never_receive, send))
            await asyncio.wait_for(held.holding.wait(), 5)  # the script took the probe slot...
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            held.hold = False
            held.gate.set()  # ...and its reply arrives after the request is gone

            async def settled() -> bool:
                snap = await h.snap()
                return bool(snap["ignored"] == 1 and snap["probes_in_flight"] == 0)

            await eventually(settled, "the orphaned permit to be handed back")
            assert h.app.calls == 1  # only the tripping call ran the app
            assert (await h.http.get("/pay")).status_code == 200
            assert (await h.snap())["state"] == "closed"

    run(scenario())


def test_a_breaker_that_cannot_be_asked_lets_the_request_through(env: Env, caplog: Any) -> None:
    """A bug (not an outage: the store gate answers those) must not become the outage."""

    async def scenario() -> None:
        async with harness(env, {"/pay": PAY}) as h:
            breaker = h.mw.breaker("pay")

            async def broken() -> Any:
                raise RuntimeError("a bug in acquire")

            breaker.acquire = broken  # type: ignore[method-assign]
            assert (await h.http.get("/pay")).status_code == 200
            assert (await h.http.get("/pay")).status_code == 200
            assert h.app.calls == 2
            async with fastapi_client(env) as (breakers, http):
                breakers.get("pay").acquire = broken  # type: ignore[method-assign]
                assert (await http.get("/ok")).status_code == 200

    run(scenario())
    warnings = [r for r in caplog.records if "goes through unprotected" in r.getMessage()]
    assert len(warnings) == 2  # once a minute per breaker and integration, with the traceback
    assert all(r.exc_info for r in warnings)


# -- Starlette ------------------------------------------------------------------------------------


def test_starlette_add_middleware(env: Env) -> None:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def pay(request: Any) -> Any:
        if request.query_params.get("fail"):
            raise ConnectionError("upstream down")
        return JSONResponse({"ok": True}, status_code=int(request.query_params.get("status", 200)))

    async def scenario() -> None:
        app = Starlette(routes=[Route("/pay", pay, methods=["GET", "POST"])])
        breakers = Breakers(env.aclient(), f"asgi{next(_prefixes)}")
        app.add_middleware(BreakerMiddleware, breakers=breakers, routes={"/pay": PAY})
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
                assert (await http.get("/pay")).status_code == 200
                assert (await http.get("/pay?status=502")).status_code == 502
                assert (await http.get("/pay?fail=1")).status_code == 500  # Starlette's own 500
                assert (await http.get("/pay?status=503")).status_code == 503
                refused = await http.get("/pay")
                assert refused.status_code == 503 and refused.headers["x-breaker-reason"] == "open"
            snap = await breakers.get("pay").snapshot()
            assert (snap["calls"], snap["failures"], snap["successes"], snap["rejected"]) == (4, 3, 1, 1)
        finally:
            await breakers.aclose()

    run(scenario())


# -- FastAPI: the dependency ----------------------------------------------------------------------
# (no ``from __future__ import annotations`` in this module: FastAPI reads the endpoints' annotations,
# and ``Annotated[Permit, guard.depends()]`` names a local)


def fastapi_app(breakers: Breakers, *, handler: bool = True) -> Any:
    app = FastAPI()
    if handler:
        add_refusal_handler(app, breakers)
    config = BreakerConfig(failure_threshold=3, open_seconds=10, ignore_exceptions=(KeyError,))
    guard = BreakerGuard(breakers, "pay", config, message="Payments are resting.", ignore_statuses=[409])
    inventory = breakers.get("inventory")

    @app.get("/ok", dependencies=[guard.depends()])
    async def ok() -> Any:
        return {"ok": True}

    @app.get("/http/{code}", dependencies=[guard.depends()])
    async def http_error(code: int) -> Any:
        raise HTTPException(code, "upstream said no")

    @app.get("/raise/{kind}", dependencies=[guard.depends()])
    async def raises(kind: str) -> Any:
        raise KeyError(kind) if kind == "key" else ConnectionError(kind)

    @app.get("/set/{code}", dependencies=[guard.depends()])
    async def set_status(code: int, response: Response) -> Any:
        response.status_code = code
        return {"code": code}

    @app.get("/explicit")
    async def explicit(permit: Annotated[Permit, guard.depends()]) -> Any:
        await permit.failure()  # the route knows better than any status; the guard's record is a no-op
        return JSONResponse({"ok": False}, status_code=502)

    @app.get("/validate", dependencies=[guard.depends()])
    async def validate(n: int) -> Any:
        return {"n": n}

    @app.get("/outbound", dependencies=[guard.depends()])
    async def outbound() -> Any:
        return await inventory.call(lambda: {"never": "called"})

    @app.get("/plain/{code}", dependencies=[Depends(guard)])  # the default scope: exits after the response
    async def plain(code: int) -> Any:
        raise HTTPException(code)

    @app.get("/other", dependencies=[protect(breakers, "other", BreakerConfig(failure_threshold=1))])
    async def other() -> Any:
        raise HTTPException(500)

    return app


@contextlib.asynccontextmanager
async def fastapi_client(env: Env, *, handler: bool = True) -> AsyncIterator[tuple[Breakers, Any]]:
    breakers = Breakers(env.aclient(), f"fastapi{next(_prefixes)}")
    transport = httpx.ASGITransport(app=fastapi_app(breakers, handler=handler), raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            yield breakers, http
    finally:
        await breakers.aclose()


def test_fastapi_dependency_records_each_outcome_once(env: Env) -> None:
    async def scenario() -> None:
        async with fastapi_client(env) as (breakers, http):
            pay = breakers.get("pay")

            async def counts() -> tuple[int, int, int, int]:
                snap = await pay.snapshot()
                return snap["calls"], snap["successes"], snap["failures"], snap["ignored"]

            assert (await http.get("/ok")).status_code == 200
            assert (await http.get("/http/404")).status_code == 404  # a client error: success
            assert (await http.get("/http/409")).status_code == 409  # ignore_statuses
            assert (await http.get("/raise/key")).status_code == 500  # ignore_exceptions
            assert (await http.get("/validate?n=x")).status_code == 422  # never reached the service
            assert (await http.get("/set/201")).status_code == 201
            assert await counts() == (6, 3, 0, 3)
            assert (await http.get("/explicit")).status_code == 502
            assert (await http.get("/set/503")).status_code == 503  # the injected Response's status
            assert (await pay.snapshot())["state"] == "closed"
            assert (await http.get("/http/502")).status_code == 502  # the third failure trips it
            assert await counts() == (9, 3, 3, 3)
            # recorded before the response went out (scope="function"): the next call is refused
            refused = await http.get("/ok", headers={"accept": "application/json"})
            assert refused.status_code == 503
            assert refused.json() == {
                "error": "service_unavailable",
                "message": "Payments are resting.",
                "breaker": "pay",
                "reason": "open",
                "retry_after": 10,
            }
            assert refused.headers["retry-after"] == "10" and refused.headers["x-breaker"] == "pay"
            text = await http.get("/raise/down")
            assert (text.status_code, text.text) == (503, "Payments are resting.\n")
            assert (await pay.snapshot())["rejected"] == 2

    run(scenario())


def test_fastapi_exception_classified_by_config_and_outbound_refusal(env: Env) -> None:
    async def scenario() -> None:
        async with fastapi_client(env) as (breakers, http):
            assert (await http.get("/raise/down")).status_code == 500  # ConnectionError: a failure
            await breakers.get("inventory").force_open()
            answer = await http.get("/outbound", headers={"accept": "application/json"})
            assert answer.status_code == 503 and answer.json()["breaker"] == "inventory"
            assert answer.json()["reason"] == "forced_open"
            assert answer.headers["retry-after"] == str(int(BreakerConfig().open_seconds))
            snap = await breakers.get("pay").snapshot()
            assert (snap["calls"], snap["failures"], snap["ignored"]) == (2, 1, 1)  # pay was not asked
            assert (await http.get("/plain/502")).status_code == 502
            assert (await http.get("/plain/404")).status_code == 404
            snap = await breakers.get("pay").snapshot()
            assert (snap["calls"], snap["failures"], snap["successes"]) == (4, 2, 1)
            assert (await http.get("/other")).status_code == 500
            assert (await http.get("/other")).headers["x-breaker"] == "other"

    run(scenario())


def test_fastapi_refusal_without_the_handler_is_still_a_503_with_the_headers(env: Env) -> None:
    async def scenario() -> None:
        async with fastapi_client(env, handler=False) as (breakers, http):
            await breakers.get("pay").force_open()
            answer = await http.get("/ok")
            assert answer.status_code == 503
            assert answer.json() == {"detail": "Payments are resting."}  # FastAPI's own body
            assert answer.headers["x-breaker"] == "pay"
            assert answer.headers["x-breaker-reason"] == "forced_open"
            assert int(answer.headers["retry-after"]) >= 1

    run(scenario())


def test_fastapi_and_middleware_send_the_same_refusal(env: Env) -> None:
    """One client, two integrations: the same status, headers and bytes."""

    async def scenario() -> None:
        async with fastapi_client(env) as (breakers, http):
            await breakers.get("pay").force_open()
            via_guard = await http.get("/ok", headers={"accept": "application/json"})
        route = {
            "breaker": "pay",
            "message": "Payments are resting.",
            "failure_threshold": 3,
            "open_seconds": 10,
        }
        async with harness(env, {"/pay": route}) as h:
            await h.mw.breaker("pay").force_open()
            via_middleware = await h.http.get("/pay", headers={"accept": "application/json"})
        assert via_guard.content == via_middleware.content
        names = ("retry-after", "x-breaker", "x-breaker-reason", "content-type", "content-length")
        assert [via_guard.headers[n] for n in names] == [via_middleware.headers[n] for n in names]
        assert json.loads(via_guard.content)["reason"] == "forced_open"

    run(scenario())


def test_route_spec_objects_are_accepted() -> None:
    spec = RouteSpec("pay", failure_statuses=frozenset({502}))
    routes, _ = parse_routes({"/pay": spec})
    assert routes[0][1].failure_statuses == frozenset({502})
