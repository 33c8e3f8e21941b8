"""Another process running pybreaker code migrated by its import line, for
tests/compat/test_pybreaker.py. It finds Redis through BREAKER_REDIS_URL only.

    python -m tests.support.compat_worker NAME fail N     # N failing calls
    python -m tests.support.compat_worker NAME call       # one successful call

Prints one JSON object: what each call raised, the breaker's state and
fail_counter afterwards, and what its listener heard.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import breaker_redis.compat.pybreaker as pybreaker


class Recorder(pybreaker.CircuitBreakerListener):
    def __init__(self) -> None:
        self.events: list[str] = []

    def state_change(self, cb: Any, old_state: Any, new_state: Any) -> None:
        self.events.append(f"{old_state.name if old_state else None}->{new_state.name}")


def main(argv: list[str]) -> None:
    name, action = argv[1], argv[2]
    listener = Recorder()
    cb = pybreaker.CircuitBreaker(fail_max=2, reset_timeout=60, name=name, listeners=[listener])
    outcomes: list[str] = []

    def fail() -> None:
        raise ConnectionError("upstream down")

    calls = int(argv[3]) if action == "fail" else 1
    for _ in range(calls):
        try:
            cb.call(fail if action == "fail" else (lambda: None))
            outcomes.append("ok")
        except Exception as exc:
            outcomes.append(type(exc).__name__)
    print(
        json.dumps(
            {
                "outcomes": outcomes,
                "state": cb.current_state,
                "fail_counter": cb.fail_counter,
                "events": listener.events,
                "storage": cb._state_storage.name,
            }
        )
    )
    cb.breakers.close()


if __name__ == "__main__":
    main(sys.argv)
