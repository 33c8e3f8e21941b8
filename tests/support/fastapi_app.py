"""The FastAPI twin of the demo shop's ``/pay``: ``tests.support.fastapi_app:app``.

Served by ``gunicorn -k uvicorn.workers.UvicornWorker -w 4 tests.support.fastapi_app:app``
next to the Flask demo (``demo_app.app:app`` on sync workers) in
tests/system/test_mixed_workers.py: both read the demo's environment
(``BREAKER_REDIS_URL``, ``BREAKER_KEY_PREFIX``, ``UPSTREAM_URL``,
``DEMO_PAY_OPEN_SECONDS``, ``DEMO_CLOCK_FILE``) and protect ``/pay`` with the same breaker, ``pay``,
with the same BreakerConfig (``demo_app.settings.pay_config()``: 5 failures
in 10 s open it for 10 s), so they share one breaker in Redis.

- ``/pay``: behind ``breaker_redis.asgi.BreakerMiddleware``; calls the
  upstream with the demo's 1 s timeout and answers as the Flask view does
  (502 for an upstream error, 504 for a timeout);
- ``/pay-guarded``: the same breaker through the FastAPI dependency
  (``breaker_redis.fastapi.protect``); a failed upstream call is raised as
  ``HTTPException(502)``, which the dependency sees;
- ``/products``: unprotected and local.

Every response carries ``X-Worker-Pid``, refusals included.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse

from breaker_redis.asgi import BreakerMiddleware, Message, Receive, Scope, Send
from breaker_redis.asyncio import BreakerConfig, Breakers
from breaker_redis.fastapi import add_refusal_handler, protect
from demo_app import settings

UPSTREAM_URL = os.environ.get("UPSTREAM_URL", "http://127.0.0.1:8081").rstrip("/")
PAY_CONFIG = BreakerConfig(**settings.pay_config())

# Built without I/O: each uvicorn worker binds it to its own loop at its first call.
breakers = Breakers.from_url(
    os.environ.get("BREAKER_REDIS_URL", "redis://127.0.0.1:6379/0"),
    os.environ.get("BREAKER_KEY_PREFIX", "breaker"),
    **settings.clock_options(),  # the test's clock when it names one, as the demo's
)
_http: dict[str, httpx.AsyncClient] = {}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    _http["client"] = httpx.AsyncClient(timeout=settings.UPSTREAM_TIMEOUT)
    try:
        yield
    finally:
        await _http.pop("client").aclose()
        await breakers.aclose()  # sends the successes still batched


api = FastAPI(lifespan=lifespan)
add_refusal_handler(api, breakers)


async def upstream_pay() -> tuple[int, dict[str, Any]]:
    """The demo's /pay view, awaited: a 5xx answer is what the breaker counts."""
    try:
        answer = await _http["client"].post(UPSTREAM_URL + "/pay")
    except httpx.TimeoutException:
        return 504, {"ok": False, "message": "The payment service did not answer in time."}
    except httpx.HTTPError:
        return 502, {"ok": False, "message": "The payment service could not be reached."}
    if answer.status_code >= 500:
        return 502, {"ok": False, "message": "The payment service failed, please try again."}
    return 200, {"ok": True, "message": "Payment accepted."}


@api.api_route("/pay", methods=["GET", "POST"])
async def pay() -> Any:
    status, body = await upstream_pay()
    return JSONResponse(body, status_code=status)


@api.api_route(
    "/pay-guarded",
    methods=["GET", "POST"],
    dependencies=[protect(breakers, "pay", PAY_CONFIG, message=settings.PAY_UNAVAILABLE)],
)
async def pay_guarded() -> Any:
    status, body = await upstream_pay()
    if status >= 500:
        raise HTTPException(status, body["message"])  # seen by the dependency
    return body


@api.get("/products")
async def products() -> Any:
    return {"items": [{"sku": "tea-01", "name": "Oolong"}, {"sku": "cup-07", "name": "Tea cup"}]}


class WorkerPid:
    """``X-Worker-Pid`` on every response, outside the breaker so refusals carry it too."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        pid = str(os.getpid()).encode()  # after the fork: the worker's own

        async def marked(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (b"x-worker-pid", pid)]}
            await send(message)

        await self.app(scope, receive, marked)


app = WorkerPid(
    BreakerMiddleware(
        api,
        breakers,
        routes={"/pay": {"breaker": "pay", "message": settings.PAY_UNAVAILABLE, **settings.pay_config()}},
    )
)
