"""End to end: a Django app (tests/support/django_app) behind breaker_redis.wsgi.BreakerMiddleware
in its wsgi.py, on a real gunicorn with 4 workers (sync, gthread, --preload), a real
redis-server and the flaky upstream (demo_app.upstream), all in separate processes.

The upstream fails -> after exactly 5 failures (5 upstream calls) the breaker is
open; every one of the 4 workers then refuses /pay with 503, Retry-After and the
X-Breaker headers, as text or as JSON when asked, and the upstream is called no
more; /products answers 200 throughout. After the open period 16 concurrent
requests let exactly 2 probes through (they hang at the upstream until the test
has seen the 14 others refused), and their 2 successes close the breaker on
every worker. No 500 anywhere. Every wait is a condition with a deadline; the
workers decide by a clock the test moves (demo_app/clock.py), so the open
period lasts until the test ends it, however slow the machine.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from pathlib import Path

import pytest
import requests

from breaker_redis.ops.reader import Reader
from demo_app import stack
from demo_app.clock import ClockWriter
from tests.support.demo_stack import Stack
from tests.support.redis_server import wait_until

pytestmark = [pytest.mark.real, pytest.mark.multiprocess]

WORKERS = 4
OPEN_SECONDS = 8  # on the workers' clock, which the test moves (Stack.clock)
# The probes hang at the upstream until every other request of their burst has
# been answered (at most PROBE_WAIT_SECONDS, below the upstream's own 60 s limit on
# a hang): no timeout on the way (client, view, gunicorn worker) may be shorter.
PROBE_WAIT_SECONDS = 45
HANG_LIMIT_SECONDS = 90
THRESHOLD = 5  # tests/support/django_app/wsgi.py: consecutive, 5 failures
PROBES = 2  # half_open_max_calls = half_open_successes = 2
FRIENDLY = "The pay service is temporarily unavailable, please retry later.\n"
_prefixes = itertools.count()


def start_django(
    redis_server, upstream_url: str, extra_args: list[str], clock_file: Path
) -> tuple[Stack, stack.Child]:
    prefix = f"django{next(_prefixes)}"
    clock = ClockWriter(clock_file)
    app_url, child = stack.start_gunicorn(
        redis_server.url,
        upstream_url,
        extra_args=["-w", str(WORKERS), "--timeout", str(HANG_LIMIT_SECONDS + 30), *extra_args],
        env={
            "BREAKER_KEY_PREFIX": prefix,
            "DJANGO_PAY_OPEN_SECONDS": str(OPEN_SECONDS),
            "DJANGO_UPSTREAM_TIMEOUT": str(HANG_LIMIT_SECONDS),
            "DJANGO_SETTINGS_MODULE": "tests.support.django_app.settings",
            "DEMO_CLOCK_FILE": str(clock_file),
        },
        app="tests.support.django_app.wsgi:application",
        ready_path="/products",
    )
    s = Stack(app_url, upstream_url, redis_server.client(), prefix)
    s.clock = clock
    return s, child


def check_refusal(response: requests.Response, as_json: bool) -> None:
    """The Flask extension's refusal, exactly (breaker_redis.web.refusal)."""
    assert response.status_code == 503, (response.status_code, response.text)
    retry_after = int(response.headers["Retry-After"])
    assert retry_after == OPEN_SECONDS  # the clock stands still while open
    assert (response.headers["X-Breaker"], response.headers["X-Breaker-Reason"]) == ("pay", "open")
    assert int(response.headers["Content-Length"]) == len(response.content)
    if as_json:
        assert response.headers["Content-Type"] == "application/json"
        assert response.json() == {
            "error": "service_unavailable",
            "message": FRIENDLY.strip(),
            "breaker": "pay",
            "reason": "open",
            "retry_after": retry_after,
        }
    else:
        assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
        assert response.text == FRIENDLY


def warm_up(s: Stack) -> None:
    """Every worker has used the pay breaker (and listens to its events)."""
    s.reset_upstream()
    s.control(latency_ms=50)  # overlapping requests spread over the workers
    s.every_worker_answers("/pay", "POST")
    wait_until(lambda: s.subscribed_workers() >= WORKERS, timeout=15, what="every worker to subscribe")
    s.reset_upstream()
    assert s.state()[0] == "closed" and s.transitions() == []


def trip(s: Stack) -> int:
    """Exactly THRESHOLD failures open the breaker; returns open_until (the clock's ms)."""
    s.control(path="/pay", fail_rate=1.0)
    for n in range(THRESHOLD):
        assert s.state()[0] == "closed", f"opened after {n} failures"
        answer = s.pay()
        assert answer.status_code == 502, (answer.status_code, answer.text)
    state, open_until = s.state()
    assert state == "open"  # recorded before the last failure's response was sent
    assert s.clock is not None and open_until == s.clock.now_ms + OPEN_SECONDS * 1000
    assert s.hits() == THRESHOLD
    return open_until


def burst(s: Stack, calls: list[tuple[str, str, dict[str, str]]]) -> list[requests.Response]:
    """All calls at the same moment (a barrier releases them together), with headers."""
    barrier = threading.Barrier(len(calls))

    def one(call: tuple[str, str, dict[str, str]]) -> requests.Response:
        barrier.wait(10)
        return s.send(call[0], call[1], headers=call[2])

    return list(s.pool.map(one, calls))


def every_worker_refuses(s: Stack, open_until: int) -> None:
    """Each of the 4 workers refuses; every refusal is JSON when asked, else text;
    /products stays 200."""
    refusing: set[str] = set()
    calls = [("/pay", "POST", {"Accept": "application/json" if n % 2 else "*/*"}) for n in range(8)]
    calls += [("/products", "GET", {})] * 2

    def seen_everywhere() -> bool:
        for (path, _method, headers), response in zip(calls, burst(s, calls), strict=True):
            if path == "/products":
                assert response.status_code == 200 and response.json()["items"]
                continue
            as_json = headers["Accept"] == "application/json"
            check_refusal(response, as_json)
            refusing.add(response.headers["X-Worker-Pid"])
        return len(refusing) >= WORKERS

    # open until the clock moves: no time limit but a hang guard
    wait_until(seen_everywhere, timeout=30, interval=0.01, what="every worker to refuse")
    assert s.state() == ("open", open_until)
    assert s.hits() == THRESHOLD, "a refused request reached the upstream"


def patient_pay(s: Stack) -> requests.Response:
    """POST /pay with a client timeout longer than a probe may hang (Stack.send has 10 s)."""
    response = requests.post(s.app_url + "/pay", timeout=HANG_LIMIT_SECONDS + 30)
    with s.lock:
        s.statuses[response.status_code] += 1
    return response


def exactly_n_probes(s: Stack, open_until: int) -> None:
    """16 concurrent requests after the open period: exactly PROBES reach the upstream.

    The probes hang at the upstream until the other 14 have been answered, so
    no probe can finish (and free its slot) while the rest are being decided:
    exact whatever the machine's speed.
    """
    s.control(path="/pay", fail_rate=0.0, hang=True)
    assert s.clock is not None
    s.clock.advance_to(open_until)  # the open period ends: the next calls may probe
    futures = [s.pool.submit(patient_pay, s) for _ in range(16)]

    def in_flight() -> int:
        return int(s.upstream_stats()["in_flight"].get("/pay", 0))

    # both, since an admitted probe may reach the upstream after the others were refused:
    # a probe hangs there for good, so a third one admitted would still be counted below;
    # all 16 answered, none hangs there and no more can come (then the asserts below say why)
    wait_until(
        lambda: (
            (done := sum(f.done() for f in futures)) == 16 or (done >= 16 - PROBES and in_flight() >= PROBES)
        ),
        timeout=PROBE_WAIT_SECONDS,
        what=f"{16 - PROBES} requests to be refused while {PROBES} probes hang",
    )
    assert in_flight() == PROBES
    early = [f.result() for f in futures if f.done()]
    assert len(early) == 16 - PROBES
    assert {r.status_code for r in early} == {503}
    assert {r.headers["X-Breaker-Reason"] for r in early} <= {"half_open_full", "open"}
    assert all(
        r.headers["Retry-After"] == "1" for r in early if r.headers["X-Breaker-Reason"] == "half_open_full"
    )
    assert s.state()[0] == "half_open"
    s.control(path="/pay", hang=False)  # releases the hung probes: both succeed
    statuses = Counter(f.result(timeout=HANG_LIMIT_SECONDS).status_code for f in futures)
    assert statuses == {200: PROBES, 503: 16 - PROBES}, statuses
    assert s.hits() == THRESHOLD + PROBES
    wait_until(lambda: s.state()[0] == "closed", timeout=10, what="the probes' successes to close it")


def every_worker_admits(s: Stack) -> None:
    admitted: set[str] = set()

    def all_admit() -> bool:
        for response in s.burst([("/pay", "POST")] * 8):
            assert response.status_code == 200, (response.status_code, response.text)
            admitted.add(response.headers["X-Worker-Pid"])
        return len(admitted) >= WORKERS

    wait_until(all_admit, timeout=30, interval=0.01, what="every worker to admit again")


@pytest.mark.parametrize(
    "extra_args",
    [[], ["-k", "gthread", "--threads", "4"], ["--preload"]],
    ids=["sync", "gthread", "preload"],
)
def test_django_behind_the_middleware_shares_one_breaker(redis_server, upstream_url, extra_args, tmp_path):
    s, gunicorn = start_django(redis_server, upstream_url, extra_args, tmp_path / "clock")
    try:
        warm_up(s)
        open_until = trip(s)
        every_worker_refuses(s, open_until)
        exactly_n_probes(s, open_until)
        every_worker_admits(s)
        assert s.transitions() == [
            ("closed", "open", "consecutive"),
            ("open", "half_open", "open_elapsed"),
            ("half_open", "closed", "probes_succeeded"),
        ]
        reader = Reader(s.redis, s.prefix, owns_client=False)
        snapshot = reader.snapshot("pay")
        assert (snapshot["state"], snapshot["trips"], snapshot["failures"]) == ("closed", 1, THRESHOLD)
        assert snapshot["probes_in_flight"] == 0
        reader.close()
        assert s.statuses[500] == 0, s.statuses
        assert set(s.statuses) <= {200, 502, 503}, s.statuses
        assert s.send("/products").status_code == 200
    finally:
        gunicorn.stop()
        s.pool.shutdown()
    log = gunicorn.output()
    gunicorn.remove_log()
    assert "Traceback" not in log, log[-3000:]
