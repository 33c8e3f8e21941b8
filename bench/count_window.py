"""The count window (``window_calls``): Redis memory per breaker and the record script's server time.

``python bench/count_window.py`` starts its own redis-server (as bench/overhead.py
does). Memory: one breaker per window, driven through a full window with a 10 %
failure rate (one outcome at a time, on a clock moved 10 ms per call so that the
time window's 10 buckets are all written), then ``MEMORY USAGE key SAMPLES 0``
summed over every key of the breaker (the seven declared ones and the undeclared
ring). Server time: ``INFO commandstats`` (FCALL) per record call, for one outcome
and for a batch of successes as long as the window, on a full window: what bounds
``window_calls`` (docs/configuration.md, "The count window").
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from overhead import redis_server

from breaker_redis import BreakerConfig, Breakers
from breaker_redis.storage.keys import breaker_keys, undeclared_keys
from breaker_redis.storage.scripts import ScriptRunner

WINDOWS: tuple[int | None, ...] = (None, 100, 1_000, 10_000)
START_MS = 1_700_000_000_000


def config_of(window_calls: int | None) -> BreakerConfig:
    return BreakerConfig(
        trip="rate", failure_rate=0.5, minimum_calls=20, window_calls=window_calls, open_seconds=600
    )


def breaker_bytes(control: redis.Redis, name: str) -> dict[str, int]:
    """MEMORY USAGE of each key of the breaker that exists (SAMPLES 0: every element)."""
    found = {}
    for key in [*breaker_keys("breaker", name), *undeclared_keys("breaker", name)]:
        used = control.memory_usage(key, samples=0)
        if used:
            found[key.rsplit(":", 1)[1]] = int(used)
    return found


def fill(url: str, name: str, window_calls: int | None) -> int:
    """A full window, 10 % failing; returns the clock's time after it."""
    now = [START_MS]
    breakers = Breakers.from_url(url, clock=lambda: now[0], listen=False, batch_successes=False)
    breaker = breakers.get(name, config_of(window_calls))
    for i in range(max(window_calls or 0, 1_000)):
        breaker.acquire().record("failure" if i % 10 == 0 else "success")
        now[0] += 10
    breakers.close()
    return now[0]


def usec_per_record(control: redis.Redis, url: str, name: str, window_calls: int | None, batch: int) -> float:
    """Server µs per record call on the full window: one success (batch 0) or a batch alone."""
    now = fill(url, name, window_calls)
    runner = ScriptRunner(redis.Redis.from_url(url), "breaker", 7 * 86_400_000)
    epoch = int(control.hget(f"breaker:{{{name}}}:state", "epoch") or 0)
    config = config_of(window_calls).to_lua()
    runs = 20 if batch else 2_000
    control.config_resetstat()
    for _ in range(runs):
        now += 10
        outcome, batched = ("", batch) if batch else ("success", 0)
        args: list[Any] = [config, 0, epoch, outcome, 0, "", 0, 0, 0, 0, 0, 0, epoch, batched, ""]
        runner.run("record", name, now, args)
    stats = control.info("commandstats")
    fcall = stats.get("cmdstat_fcall") or stats["cmdstat_evalsha"]
    return float(fcall["usec"]) / int(fcall["calls"])


def main() -> None:
    with redis_server() as url:
        control = redis.Redis.from_url(url)
        print("window             bytes per breaker (window + ring)   µs per record: one outcome, a batch")
        for window_calls in WINDOWS:
            label = "time (10 s / 10)" if window_calls is None else f"last {window_calls} calls"
            name = f"mem-{window_calls}"
            fill(url, name, window_calls)
            used = breaker_bytes(control, name)
            windowed = used.get("window", 0) + used.get("ring", 0)
            one = usec_per_record(control, url, f"one-{window_calls}", window_calls, 0)
            many = usec_per_record(control, url, f"batch-{window_calls}", window_calls, window_calls or 1_000)
            print(f"{label:<18} {sum(used.values()):>6} ({windowed:>6}){'':<20} {one:>6.1f}  {many:>8.1f}")
            print(f"{'':<18} {used}")


if __name__ == "__main__":
    main()
