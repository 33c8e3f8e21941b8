"""Capacity on paper: protected calls per second one Redis core sustains for one breaker.

``python bench/capacity.py`` starts its own redis-server (as bench/overhead.py
does), runs 20,000 protected calls per case from one client, and reads the
server time the breaker cost from ``INFO commandstats`` (FCALL or EVALSHA plus the PING
that follows a change). Server time per call is what bounds one breaker: all
its keys live on one Redis (one cluster shard), and Redis runs scripts on one
core. Calls per second per core = 1 / server time per call. Client time and
round trips are left out: they scale with the workers, not with Redis.

Cases: healthy, armed (a rate rule within reach of its threshold, so every
outcome goes to Redis at once) and open, each as a subscribed worker runs
them (memory decisions and batching: on a single server, and on a Redis
Cluster through its sharded subscriptions) and as a worker without a
subscription runs them (``listen=False``, or while its subscription is down:
every call runs the acquire script). bench/traffic.py measures a cluster
worker on a real 3-master cluster.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from overhead import Boom, fail, noop, redis_server

from breaker_redis import BreakerConfig, BreakerOpen, Breakers

CALLS = 20_000
HEALTHY = BreakerConfig(trip="consecutive", failure_threshold=5, open_seconds=600)
# 1 % failures (every 100th call, never more) against a 1.1 % rule: within reach of
# it all along (lua/includes/rules.lua update_armed), so armed, and it never trips
ARMED = BreakerConfig(trip="rate", failure_rate=0.011, minimum_calls=20, open_seconds=600)


def server_usec(control: redis.Redis) -> tuple[int, float]:
    """(scripts run, µs of server time) since the last CONFIG RESETSTAT."""
    stats = control.info("commandstats")
    scripts = [stats.get(f"cmdstat_{name}", {}) for name in ("fcall", "evalsha")]
    ping = stats.get("cmdstat_ping", {})
    calls = sum(int(s.get("calls", 0)) for s in scripts)
    return calls, sum(float(s.get("usec", 0)) for s in scripts) + float(ping.get("usec", 0))


def one_case(
    url: str,
    control: redis.Redis,
    listen: bool,
    config: BreakerConfig,
    call: Callable[[Any, int], None],
    prepare: Callable[[Any], None],
) -> tuple[float, float]:
    breakers = Breakers.from_url(url, prefix=f"capacity-{time.monotonic_ns()}", listen=listen)
    try:
        breaker = breakers.get("svc", config)
        prepare(breaker)
        control.config_resetstat()
        for i in range(CALLS):
            call(breaker, i)
        breakers.flush()
        scripts, usec = server_usec(control)
        return scripts / CALLS, usec / CALLS
    finally:
        breakers.close()
        breakers.client.close()


def healthy(breaker, i) -> None:
    breaker.call(noop)


def armed(breaker, i) -> None:
    if i % 100 == 99:
        with contextlib.suppress(Boom):
            breaker.call(fail)
    else:
        breaker.call(noop)


def refused(breaker, i) -> None:
    with contextlib.suppress(BreakerOpen):
        breaker.call(noop)


def warm(breaker) -> None:
    for _ in range(200):
        breaker.call(noop)


def warm_armed(breaker) -> None:
    for i in range(200):
        armed(breaker, i)


def trip(breaker) -> None:
    breaker.force_open()
    breaker.clear_force()
    for _ in range(5):
        with contextlib.suppress(Boom, BreakerOpen):
            breaker.call(fail)


def main() -> int:
    with redis_server() as url:
        control = redis.Redis.from_url(url)
        version = control.info("server")["redis_version"]
        print(
            f"# breaker_redis capacity per Redis core, one breaker (redis-server {version}, "
            f"{CALLS:,} calls per case)\n"
        )
        print("| case | worker | scripts per call | server µs per call | protected calls/s per Redis core |")
        print("|---|---|---|---|---|")
        cases = [
            ("healthy", HEALTHY, healthy, warm),
            ("armed (1 % failures, rate rule 1.1 %)", ARMED, armed, warm_armed),
            ("open (refused calls)", HEALTHY, refused, trip),
        ]
        for label, config, call, prepare in cases:
            for listen, worker in ((True, "subscribed"), (False, "no subscription")):
                per_call, usec = one_case(url, control, listen, config, call, prepare)
                rate = f"{1e6 / usec:,.0f}" if usec > 0 else "no server time"
                print(f"| {label} | {worker} | {per_call:.3f} | {usec:.2f} | {rate} |")
        control.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
