"""``python -m demo_app``: a payment service failing and recovering behind /pay, on 4 gunicorn workers.

Starts Redis (the URL given, else a local redis-server, else an embedded
fakeredis server), the flaky upstream and gunicorn; then drives traffic
through healthy -> failing -> open -> half_open -> recovered and prints what
each worker answered, the breaker state as Redis has it, and how often the
upstream was actually called. At the end it checks the story (5 failures
trip it, the upstream is spared while open, one probe at a time, 2 successes
close it on every worker, no 500 anywhere), stops everything it started and
exits 0 (1 if a check failed). Ctrl-C stops everything just as cleanly.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

import redis
import requests

from breaker_redis import BreakerConfig, Breakers
from breaker_redis.ops.reader import parse_event

from . import settings, stack

REQUEST_TIMEOUT = 5.0
BURST = 16


@dataclass
class Answer:
    path: str
    status: int
    worker: str
    retry_after: str | None
    fallback: str | None
    text: str


@dataclass
class Story:
    """What happened, for the checks at the end."""

    statuses: Counter[int] = field(default_factory=Counter)
    product_statuses: Counter[int] = field(default_factory=Counter)
    failures_before_trip: int = 0
    hits_at_trip: int = -1
    hits_after_open: int = -1
    burst: Counter[int] = field(default_factory=Counter)
    burst_hits: int = -1
    closed_workers: set[str] = field(default_factory=set)
    closed_non_200: int = 0
    workers_refusing: set[str] = field(default_factory=set)


class Demo:
    def __init__(self, app_url: str, upstream_url: str, redis_url: str, prefix: str, workers: int) -> None:
        self.app_url = app_url
        self.upstream_url = upstream_url
        self.redis = redis.Redis.from_url(redis_url, socket_timeout=2, decode_responses=True)
        self.prefix = prefix
        self.workers = workers
        self.labels: dict[str, str] = {}
        self.labels_lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=BURST)
        self.story = Story()
        self.t0 = time.monotonic()
        self.redis_t0_ms = self.redis_now_ms()

    # -- talking to the stack ---------------------------------------------------

    def label(self, pid: str | None) -> str:
        if not pid:
            return "w?"
        with self.labels_lock:
            if pid not in self.labels:
                self.labels[pid] = f"w{len(self.labels) + 1}"
            return self.labels[pid]

    def request(self, path: str, method: str = "GET") -> Answer:
        response = requests.request(method, self.app_url + path, timeout=REQUEST_TIMEOUT)
        answer = Answer(
            path,
            response.status_code,
            self.label(response.headers.get("X-Worker-Pid")),
            response.headers.get("Retry-After"),
            response.headers.get("X-Breaker-Fallback"),
            response.text.strip(),
        )
        if path == "/products":
            self.story.product_statuses[answer.status] += 1
        else:
            self.story.statuses[answer.status] += 1
        return answer

    def many(self, calls: Sequence[tuple[str, str]]) -> list[Answer]:
        """Send the calls at once (a barrier makes them really concurrent)."""
        barrier = threading.Barrier(len(calls))

        def one(call: tuple[str, str]) -> Answer:
            barrier.wait(5)
            return self.request(call[0], call[1])

        return list(self.pool.map(one, calls))

    def control(self, **body: Any) -> None:
        requests.post(self.upstream_url + "/_control", json=body, timeout=REQUEST_TIMEOUT).raise_for_status()

    def pay_hits(self) -> int:
        stats = requests.get(self.upstream_url + "/_stats", timeout=REQUEST_TIMEOUT).json()
        return int(stats["hits"].get("/pay", 0))

    def redis_now_ms(self) -> int:
        seconds, micros = self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def pay_state(self) -> tuple[str, int]:
        state, open_until = self.redis.hmget(f"{self.prefix}:{{pay}}:state", "state", "open_until")
        return str(state or "closed"), int(open_until or 0)

    # -- printing ---------------------------------------------------------------------

    def line(self, phase: str, answers: str, extra: str = "") -> None:
        state, _ = self.pay_state()
        elapsed = time.monotonic() - self.t0
        hits = self.pay_hits()
        print(f"{elapsed:6.1f}s  {phase:<10} {answers:<52} {state:<10} {hits:>5}  {extra}".rstrip())
        sys.stdout.flush()

    @staticmethod
    def by_worker(answers: Sequence[Answer]) -> str:
        groups: dict[str, Counter[str]] = {}
        for a in answers:
            shown = f"{a.status}" + (f"({a.retry_after}s)" if a.retry_after else "")
            groups.setdefault(a.worker, Counter())[shown] += 1
        parts = []
        for worker in sorted(groups):
            inner = " ".join(f"{s}x{n}" if n > 1 else s for s, n in sorted(groups[worker].items()))
            parts.append(f"{worker}:{inner}")
        return "  ".join(parts)

    def others(self) -> str:
        """One request to each other route, answered at the same moment."""
        cart, recommend, products = self.many([("/cart", "GET"), ("/recommend", "GET"), ("/products", "GET")])
        cart_source = cart.fallback or "live"
        rec_source = "bestsellers" if "bestsellers" in recommend.text else "live"
        return (
            f"cart {cart.status} {cart_source:<6} recommend {recommend.status} {rec_source:<11} "
            f"products {products.status}"
        )

    def tick(self, phase: str) -> list[Answer]:
        answers = self.many([("/pay", "POST")] * 8)
        self.line(phase, self.by_worker(answers), self.others())
        return answers

    # -- the story -------------------------------------------------------------------------

    def warm_up(self) -> None:
        """Every worker answers once (and so gets its worker label) before the story starts."""

        def all_seen() -> bool:
            self.many([("/products", "GET")] * 8)
            return len(self.labels) >= self.workers

        stack.wait_until(all_seen, 30, f"all {self.workers} workers to answer", interval=0.05)
        self.request("/cart")  # a good cart, remembered in Redis for every worker
        pairs = sorted(self.labels.items(), key=lambda item: item[1])
        order = ", ".join(f"{label}=pid {pid}" for pid, label in pairs)
        print(f"workers: {order}\n")

    def run(self, open_seconds: float) -> None:
        print(
            f"{'time':>7}  {'phase':<10} {'/pay answers by worker (status, Retry-After)':<52} "
            f"{'state':<10} {'hits':>5}  other routes"
        )
        story = self.story

        # healthy: the first three payments succeed.
        for _ in range(3):
            a = self.request("/pay", "POST")
            self.line("healthy", f"POST /pay -> {a.worker}:{a.status}")
        self.tick("healthy")

        # failing: the payment service now fails 80 % of the calls (a fixed random sequence).
        self.control(fail_rate=0.8, seed=7)
        print("        -- the upstream now fails 80% of calls --")
        failures = 0
        for _ in range(60):
            a = self.request("/pay", "POST")
            if a.status == 503:
                story.failures_before_trip = failures
                story.hits_at_trip = self.pay_hits()
                self.line("open", f"POST /pay -> {a.worker}:503 Retry-After {a.retry_after}s")
                print(f"        friendly message: {a.text}")
                break
            failures += a.status >= 500
            note = f"failure {failures} of 5" if a.status >= 500 else "success"
            self.line("failing", f"POST /pay -> {a.worker}:{a.status} ({note})")
        else:
            print("        the breaker never opened")
            return

        # open: every worker refuses from memory; the upstream recovers unseen. A round of
        # requests starts only while the open period has longer to run than the last round
        # took (a busy machine makes rounds slow), so none runs into the half-open probe;
        # the upstream's count is the one before any round that did all the same.
        first, round_ms = True, 0.0
        story.hits_after_open = self.pay_hits()
        while True:
            state, open_until = self.pay_state()
            if state != "open" or open_until - self.redis_now_ms() <= 1.5 * round_ms:
                break
            started = time.monotonic()
            answers = self.tick("open")
            round_ms = (time.monotonic() - started) * 1000
            if self.redis_now_ms() >= open_until:
                break  # it ran into the open period's end: its hits are not the open period's
            story.hits_after_open = self.pay_hits()
            story.workers_refusing |= {a.worker for a in answers if a.status == 503}
            if first:
                first = False
                self.control(fail_rate=0.0, latency_ms=700)
                print("        -- the upstream recovers (slowly: 700 ms); no worker calls it to find out --")
            if len(story.workers_refusing) < self.workers:
                continue  # the next round at once: a busy machine may leave time for few
            remaining = (open_until - self.redis_now_ms()) / 1000.0
            time.sleep(max(0.0, min(1.0, remaining - 1.5 * round_ms / 1000 + 0.05)))

        # half_open: of 16 concurrent requests exactly one is let through as a probe.
        stack.wait_until(lambda: self.redis_now_ms() >= self.pay_state()[1] + 50, 5, "the open period to end")
        burst = self.many([("/pay", "POST")] * BURST)
        story.burst = Counter(a.status for a in burst)
        story.burst_hits = self.pay_hits() - story.hits_after_open
        probe = [a for a in burst if a.status == 200]
        probe_text = ", ".join(f"{a.worker}:200" for a in probe) or "none"
        self.line(
            "half_open",
            f"{BURST} at once: probe {probe_text}, {story.burst[503]}x 503",
            "(one probe at a time, cluster-wide)",
        )
        self.control(latency_ms=0)
        a = self.request("/pay", "POST")
        self.line("recovered", f"POST /pay -> {a.worker}:{a.status} (2nd successful probe)")

        # recovered: every worker admits again.
        for _ in range(10):
            answers = self.tick("recovered")
            story.closed_workers |= {x.worker for x in answers if x.status == 200}
            story.closed_non_200 += sum(x.status != 200 for x in answers)
            if len(story.closed_workers) >= self.workers:
                break

    def transitions(self) -> None:
        print("\nthe pay breaker's transitions, from its history in Redis:")
        lines = cast(list[str], self.redis.lrange(f"{self.prefix}:{{pay}}:events", 0, -1))
        for f in [e for e in map(parse_event, reversed(lines)) if e is not None]:  # oldest first
            at = (int(f["at"]) - self.redis_t0_ms) / 1000.0
            if at < 0:
                continue  # the reset that gave the demo a clean start
            print(f"{at:6.1f}s  {f['from']:>9} -> {f['to']:<9} ({f['cause']})")

    def checks(self, workers: int) -> list[tuple[bool, str]]:
        s = self.story
        return [
            (s.failures_before_trip == 5, f"opened after exactly 5 failures (saw {s.failures_before_trip})"),
            (
                s.hits_at_trip >= 0 and s.hits_after_open == s.hits_at_trip,
                f"no upstream /pay call while open ({s.hits_at_trip} at the trip, {s.hits_after_open} after)",
            ),
            (
                len(s.workers_refusing) == workers,
                f"every worker refused while open ({len(s.workers_refusing)} of {workers})",
            ),
            (
                s.burst[200] == 1 and s.burst_hits == 1,
                f"{BURST} concurrent half-open requests let exactly one probe through "
                f"({s.burst[200]} answered 200, {s.burst_hits} upstream call)",
            ),
            (
                len(s.closed_workers) == workers and s.closed_non_200 == 0,
                f"closed after 2 successes, on every worker ({len(s.closed_workers)} of {workers})",
            ),
            (
                set(s.product_statuses) == {200},
                f"/products answered 200 throughout ({dict(s.product_statuses)})",
            ),
            (s.statuses[500] == 0 and s.product_statuses[500] == 0, "no 500 anywhere"),
        ]


def _stop_on_sigterm() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo_app", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("BREAKER_REDIS_URL"),
        help="use this Redis instead of starting one (default: $BREAKER_REDIS_URL)",
    )
    parser.add_argument(
        "--redis",
        choices=("auto", "server", "embedded"),
        default=os.environ.get("BREAKER_DEMO_REDIS", "auto"),
        help="what to start when no URL is given: auto (redis-server if installed, "
        "else embedded), server, embedded (default: $BREAKER_DEMO_REDIS or auto)",
    )
    parser.add_argument(
        "--open-seconds", type=float, default=10.0, help="how long /pay stays open (default 10 s)"
    )
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="keep the stack running afterwards for curl and redis-cli, until Ctrl-C",
    )
    args = parser.parse_args(argv)
    _stop_on_sigterm()

    started: list[stack.Child] = []
    exit_code = 0
    began = time.monotonic()
    try:
        print("breaker_redis demo: one /pay breaker in Redis, shared by 4 gunicorn workers")
        print(
            f"/pay: trip after 5 failures in 10 s, open {args.open_seconds:g} s, one probe at a time, "
            "2 successes to close\n"
        )
        if args.redis_url:
            redis_url, kind = args.redis_url, "the Redis you gave"
        else:
            redis_url, child, kind = stack.start_redis(args.redis)
            started.append(child)
        prefix = os.environ.get("BREAKER_KEY_PREFIX", "breaker")
        _reset(redis_url, prefix)
        upstream_url, child = stack.start_upstream()
        started.append(child)
        env = {
            "DEMO_PAY_OPEN_SECONDS": str(args.open_seconds),
            "BREAKER_KEY_PREFIX": prefix,
            "BREAKER_ADMIN_TOKEN": os.environ.get("BREAKER_ADMIN_TOKEN", "demo"),
        }
        app_url, child = stack.start_gunicorn(redis_url, upstream_url, env=env)
        started.append(child)
        print(f"redis    {redis_url} ({kind})\nupstream {upstream_url}")
        print(f"app      {app_url} (gunicorn, 4 workers)")

        demo = Demo(app_url, upstream_url, redis_url, prefix, workers=4)
        demo.warm_up()
        demo.run(args.open_seconds)
        demo.transitions()
        print()
        for ok, text in demo.checks(4):
            print(f"  [{'ok' if ok else 'FAILED'}] {text}")
            exit_code = exit_code or (0 if ok else 1)
        if args.keep_running:
            _explore(app_url, upstream_url, redis_url, prefix, env["BREAKER_ADMIN_TOKEN"])
    except KeyboardInterrupt:
        print("\ninterrupted: stopping everything the demo started")
    except Exception as exc:  # the stack failed to start or answer: say why, then clean up
        print(f"\ndemo failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        for child in started:
            if not child.alive():
                print(f"--- {child.name} output ---\n{child.output()[-2000:]}", file=sys.stderr)
        exit_code = 1
    finally:
        _stop_all(started)
    print(f"stopped everything; {time.monotonic() - began:.1f}s in all")
    return exit_code


def _reset(redis_url: str, prefix: str) -> None:
    """Start from closed breakers even on a Redis that a previous run left open."""
    breakers = Breakers.from_url(redis_url, prefix, listen=False)
    try:
        for name, config in (
            ("pay", settings.pay_config()),
            ("cart", settings.cart_config()),
            ("recommend", settings.recommend_config()),
        ):
            breakers.get(name, BreakerConfig(**config)).reset()
    finally:
        breakers.close()


def _stop_all(children: list[stack.Child]) -> None:
    """gunicorn first, then the upstream, then Redis; Ctrl-C here is ignored."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for child in reversed(children):
            child.stop()
            child.remove_log()
    finally:
        signal.signal(signal.SIGINT, previous)


def _explore(app_url: str, upstream_url: str, redis_url: str, prefix: str, token: str) -> None:
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    print(f"""
The stack keeps running; press Ctrl-C to stop it.
  curl -i -X POST {app_url}/pay
  curl -i -H 'Accept: application/json' -X POST {app_url}/pay
  curl -X POST {upstream_url}/_control -d '{{"fail_rate": 1}}'      # make the upstream fail
  curl {upstream_url}/_stats
  redis-cli -p {port} HGET '{prefix}:{{pay}}:state' state
  curl -H 'Authorization: Bearer {token}' {app_url}/_breakers
  curl -X POST -H 'Authorization: Bearer {token}' {app_url}/_breakers/pay/open    # or close, auto, reset
  curl -H 'Authorization: Bearer {token}' {app_url}/_breakers/metrics             # Prometheus
  open {app_url}/_breakers/ in a browser: the live dashboard (token: {token})
  .venv/bin/breaker-redis --url {redis_url} --prefix {prefix} status              # or watch, show pay,
  .venv/bin/breaker-redis --url {redis_url} --prefix {prefix} events --follow     # open pay, metrics""")
    wait_forever: Callable[[], None] = getattr(signal, "pause", lambda: time.sleep(3600))
    while True:
        wait_forever()
