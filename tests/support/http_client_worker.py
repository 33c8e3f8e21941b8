"""One worker process with its own HTTP client, for the HTTP client tests:
``python -m tests.support.http_client_worker SPEC`` where SPEC is JSON:

    {"kind": "requests" | "httpx" | "httpx_async", "redis": URL, "prefix": P,
     "urls": [...], "calls": N, "config": {BreakerConfig fields},
     "group": null | {"name": G, "members": [...], "max_open_fraction": F},
     "start_at": unix time to start at (a race between processes) or null}

It makes N calls, round robin over the URLs, through its own Session or
Client on its own Breakers, and prints one JSON line: each call's answer
(the status, "refused:<breaker>" or the exception's class name).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from breaker_redis import BreakerConfig, BreakerOpen, Breakers


def answer(call: Any) -> str:
    try:
        return str(call().status_code)
    except BreakerOpen as refused:
        return f"refused:{refused.breaker}"
    except Exception as exc:
        return type(exc).__name__


def main() -> int:
    spec = json.loads(sys.argv[1])
    config = BreakerConfig(**spec["config"])
    urls, calls, kind = spec["urls"], spec["calls"], spec["kind"]
    start_at = spec.get("start_at")
    answers: list[str] = []
    if kind == "httpx_async":
        answers = asyncio.run(run_async(spec, config, urls, calls, start_at))
    else:
        breakers = Breakers.from_url(spec["redis"], spec["prefix"])
        extra = _groups(breakers, spec, config)
        if kind == "requests":
            import requests

            from breaker_redis.requests import BreakerAdapter

            session = requests.Session()
            session.mount("http://", BreakerAdapter(breakers, config=config, **extra))
            get: Any = session.get
        else:
            import httpx

            from breaker_redis.httpx import BreakerTransport

            client = httpx.Client(transport=BreakerTransport(breakers, config=config, **extra))
            get = client.get
        _wait(start_at)
        for i in range(calls):
            url = urls[i % len(urls)]
            answers.append(answer(lambda url=url: get(url, timeout=5)))
        breakers.close()
    print(json.dumps(answers))
    return 0


async def run_async(
    spec: dict[str, Any], config: BreakerConfig, urls: list[str], calls: int, start_at: float | None
) -> list[str]:
    import httpx

    from breaker_redis.asyncio import Breakers as AsyncBreakers
    from breaker_redis.httpx import AsyncBreakerTransport

    breakers = AsyncBreakers.from_url(spec["redis"], spec["prefix"])
    extra = _groups(breakers, spec, config)
    answers = []
    async with httpx.AsyncClient(transport=AsyncBreakerTransport(breakers, config=config, **extra)) as client:
        _wait(start_at)
        for i in range(calls):
            try:
                answers.append(str((await client.get(urls[i % len(urls)], timeout=5)).status_code))
            except BreakerOpen as refused:
                answers.append(f"refused:{refused.breaker}")
            except Exception as exc:
                answers.append(type(exc).__name__)
    await breakers.aclose()
    return answers


def _groups(breakers: Any, spec: dict[str, Any], config: BreakerConfig) -> dict[str, Any]:
    """The adapter's or transport's ``groups=`` option, when the spec names a group."""
    group = spec.get("group")
    if not group:
        return {}
    from breaker_redis.groups import AsyncBreakerGroup, BreakerGroup

    kind = AsyncBreakerGroup if spec["kind"] == "httpx_async" else BreakerGroup
    return {
        "groups": [
            kind(
                breakers,
                group["name"],
                group["members"],
                max_open_fraction=group["max_open_fraction"],
                config=config,
            )
        ]
    }


def _wait(start_at: float | None) -> None:
    if start_at is not None:
        time.sleep(max(0.0, start_at - time.time()))


if __name__ == "__main__":
    sys.exit(main())
