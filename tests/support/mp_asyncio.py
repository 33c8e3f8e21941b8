"""An asyncio worker process (breaker_redis.asyncio) driven by the test, as mp_workers.py's
serve() drives a sync one: Team.start(..., target=serve_asyncio).

It lives in an importable module so the 'spawn' start method can find it: every
process builds its own Breakers, as a worker of an asyncio server would.
"""

from __future__ import annotations

import asyncio
from typing import Any

from breaker_redis import BreakerConfig, BreakerOpen
from breaker_redis.asyncio import Breakers as AsyncBreakers


def serve_asyncio(
    url: str,
    name: str,
    config: BreakerConfig,
    conn: Any,
    batch_successes: bool = True,
    reporter: str | None = None,
    now_ms: int | None = None,
) -> None:
    """serve() for an asyncio worker: the same commands but "hold", "release-<outcome>",
    "trusted", "run S" and "failure-opens", answered from its event loop, which reads the
    subscription while it waits for the next command. With ``now_ms``, a test clock that
    the command "clock <ms>" sets, as serve()'s."""
    if reporter is not None:
        raise ValueError("serve_asyncio takes no reporter")
    asyncio.run(_serve_asyncio(url, name, config, conn, batch_successes, now_ms))


async def _serve_asyncio(
    url: str, name: str, config: BreakerConfig, conn: Any, batch_successes: bool, now_ms: int | None
) -> None:
    clock = [now_ms or 0]
    breakers = AsyncBreakers.from_url(
        url, batch_successes=batch_successes, clock=None if now_ms is None else (lambda: clock[0])
    )
    breaker = breakers.get(name, config)
    breakers.ensure_loop()
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue[str] = asyncio.Queue()
    loop.add_reader(conn.fileno(), lambda: commands.put_nowait(conn.recv()))
    while not (breakers.invalidator is not None and breakers.invalidator.healthy):
        await asyncio.sleep(0.01)  # the loop reads the subscription meanwhile; the test has the deadline
    conn.send("ready")
    while True:
        command = await commands.get()
        if command == "stop":
            break
        if command.startswith("clock "):
            clock[0] = int(command.split()[1])
            conn.send(True)
            continue
        try:
            if command == "admits":
                await (await breaker.acquire()).ignore()
            elif command == "listening":
                await (await breaker.acquire()).ignore()
                conn.send(breakers.invalidator is not None and breakers.invalidator.healthy)
                continue
            elif command == "store":
                conn.send((await breaker.snapshot())["store"])
                continue
            elif command.startswith("share "):  # N calls: (admitted, the refusals' reasons), batch sent
                answer = await _share(breaker, int(command.split()[1]))
                await breakers.flush()
                conn.send(answer)
                continue
            elif command.startswith("calm "):
                for _ in range(int(command.split()[1])):
                    await (await breaker.acquire()).success()
                await breakers.flush()
            else:  # "success" | "failure"
                await (await breaker.acquire()).record(command)
            conn.send(True)
        except BreakerOpen:
            conn.send(False)
    loop.remove_reader(conn.fileno())
    await breakers.aclose()
    conn.send("stopped")


async def _share(breaker: Any, n: int) -> tuple[int, list[str]]:
    """n calls: how many were admitted, and the reasons of the refusals."""
    admitted, reasons = 0, set()
    for _ in range(n):
        try:
            await (await breaker.acquire()).success()
            admitted += 1
        except BreakerOpen as refusal:
            reasons.add(refusal.reason)
    return admitted, sorted(reasons)
