"""A process's life around its Breakers (breaker_redis/base/background.py): one at-fork and
one at-exit hook however many Breakers come and go, a forked child that starts
afresh, batched counts sent at exit, threads named after their Breakers and
stopped by close(). Each scenario runs in a process of its own, whose hooks and
threads are its own."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from breaker_redis import Breakers
from breaker_redis.base.background import BackgroundThread, process_hooks, stop_all
from tests.support.redis_server import wait_until

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.real


def run_script(source: str, *argv: str) -> dict[str, Any]:
    """Run source in a new interpreter; the JSON object it prints last."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


HOOKS = """
    import atexit, gc, json, os, sys, threading, time
    from collections import Counter

    registered = Counter()

    def counted(kind, real):
        def register(*args, **kwargs):
            if sys._getframe(1).f_globals.get("__name__", "").startswith("breaker_redis"):
                registered[kind] += 1
            return real(*args, **kwargs)
        return register

    os.register_at_fork = counted("fork", os.register_at_fork)
    atexit.register = counted("exit", atexit.register)

    from breaker_redis import Breakers
    from breaker_redis.base.background import process_hooks
    from breaker_redis.groups import BreakerGroup
    from breaker_redis.ops.reader import Reader
    from breaker_redis.urls import client_from_url

    url = sys.argv[1]
    kept = Breakers(client_from_url(url), "lifecycle-kept")
    kept.get("pay").acquire().success()  # starts its listener
    deadline = time.monotonic() + 10
    while not kept.invalidator.healthy:
        assert time.monotonic() < deadline, "never subscribed"
        time.sleep(0.01)
    for _ in range(3):
        kept.get("pay").acquire().success()  # decided in memory and batched: its recorder starts
    for _ in range(200):
        breakers = Breakers(client_from_url(url), "lifecycle")
        breakers.get("pay").acquire().success()  # starts its listener and its recorder
        BreakerGroup(breakers, "pool", ["a", "b"])
        breakers.close()
        breakers.client.close()
    del breakers  # the last group lives as long as its Breakers: both gone now
    for _ in range(5):  # a dashboard's or a CLI's reads and switches
        reader = Reader(client_from_url(url), "lifecycle")
        reader.breakers().get("pay").force_open()
        reader.close()
    gc.collect()
    print(json.dumps({
        "fork": registered["fork"],
        "exit": registered["exit"],
        "owners": len(process_hooks),
        "kept": kept in process_hooks,
        "threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("breaker-redis")),
    }))
"""


def test_one_fork_and_one_exit_hook_however_many_breakers_come_and_go(redis_server):
    """200 Breakers (each with a breaker group) built, used and closed, and Readers that
    switch a breaker: the process registered one at-fork and one at-exit hook, holds
    only the Breakers still open, and runs only its threads."""
    redis_server.client().flushall()
    seen = run_script(HOOKS, redis_server.url)
    where = f"127.0.0.1:{redis_server.port}/0"
    assert (seen["fork"], seen["exit"]) == (1, 1)
    assert seen["owners"] == 1 and seen["kept"]
    assert seen["threads"] == [
        f"breaker-redis-events 'lifecycle-kept' at {where}",
        f"breaker-redis-recorder 'lifecycle-kept' at {where}",
    ]


FORK = """
    import json, os, sys, threading, time
    from breaker_redis import Breakers
    from breaker_redis.urls import client_from_url

    url = sys.argv[1]
    parent = Breakers(client_from_url(url), "lifecycle-fork")
    pay = parent.get("pay")
    pay.acquire().success()
    closed = Breakers(client_from_url(url), "lifecycle-closed")
    closed.get("pay").acquire().success()
    closed.close()
    parent.flush()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        def ours():
            return sorted(t.name for t in threading.enumerate() if t.name.startswith("breaker-redis"))

        pid = os.getpid()
        seen = {"inherited": ours(), "pid": parent.pid == pid, "closed_pid": closed.pid == pid}
        pay.acquire().success()  # the child's first call: its listener starts
        deadline = time.monotonic() + 10
        while not parent.invalidator.healthy and time.monotonic() < deadline:
            time.sleep(0.01)
        seen["subscribed"] = parent.invalidator.healthy
        for _ in range(3):
            pay.acquire().success()  # decided in memory and batched: its recorder starts
        seen["threads"] = ours()
        key = "lifecycle-fork:{pay}:stats"
        while int(parent.client.hget(key, "successes") or 0) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)  # sent by the child's own recorder thread
        seen["successes"] = int(parent.client.hget(key, "successes") or 0)
        os.write(write, json.dumps(seen).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        seen = json.loads(pipe.read())
    os.waitpid(child, 0)
    print(json.dumps(seen))
"""


def test_a_forked_child_starts_afresh_with_threads_of_its_own(redis_server):
    """A Breakers used before the fork: the child inherits no thread, takes the
    Breakers as its own, starts its listener and recorder at its first call, and its
    batched successes reach Redis. A Breakers closed before the fork is not reset."""
    redis_server.client().flushall()
    seen = run_script(FORK, redis_server.url)
    where = f"127.0.0.1:{redis_server.port}/0"
    assert seen["inherited"] == []
    assert seen["pid"] and not seen["closed_pid"]
    assert seen["subscribed"]
    assert seen["threads"] == [
        f"breaker-redis-events 'lifecycle-fork' at {where}",
        f"breaker-redis-recorder 'lifecycle-fork' at {where}",
    ]
    assert seen["successes"] == 5


EXIT = """
    import json, sys, time
    from breaker_redis import Breakers
    from breaker_redis.urls import client_from_url

    url = sys.argv[1]
    breakers = Breakers(client_from_url(url), "lifecycle-exit")
    held = []
    breakers.recorder.schedule = held.append  # no thread sends the batch: only the exit can
    pay = breakers.get("pay")
    pay.acquire().success()
    deadline = time.monotonic() + 10
    while not breakers.invalidator.healthy:  # then calls are decided, and batched, in memory
        assert time.monotonic() < deadline, "never subscribed"
        time.sleep(0.01)
    for _ in range(6):
        pay.acquire().success()
    print(json.dumps({"batched": len(held)}))
"""


def test_batched_successes_are_sent_at_exit(redis_server):
    """A worker that exits without close(): its batch is sent by the exit hook."""
    client = redis_server.client()
    client.flushall()
    seen = run_script(EXIT, redis_server.url)
    assert seen["batched"] >= 1  # some successes were in the batch, not sent by their call
    assert int(client.hget("lifecycle-exit:{pay}:stats", "successes") or 0) == 7


def test_close_stops_the_threads_and_leaves_the_process_hooks(redis_server):
    breakers = Breakers.from_url(redis_server.url, "lifecycle-close")
    pay = breakers.get("pay")
    pay.acquire().success()  # starts the listener
    wait_until(
        lambda: breakers.invalidator is not None and breakers.invalidator.healthy,
        timeout=10,
        what="the subscription",
    )
    for _ in range(3):
        pay.acquire().success()  # decided in memory and batched: the recorder starts
    threads = breakers.threads()
    assert breakers in process_hooks
    assert [t.name for t in threads if t.running] == [
        f"breaker-redis-recorder 'lifecycle-close' at 127.0.0.1:{redis_server.port}/0",
        f"breaker-redis-events 'lifecycle-close' at 127.0.0.1:{redis_server.port}/0",
    ]
    breakers.close()
    assert not any(t.running for t in threads)  # woken and joined, not left to time out
    assert breakers not in process_hooks


def test_a_background_thread_is_woken_to_stop_and_joined():
    """stop() wakes the thread from its wait (the wake callback) and joins it within
    the deadline; start() after stop() starts it again."""
    rounds: list[int] = []

    def loop() -> None:
        while not thread.stopped():
            rounds.append(1)
            thread.wait(3600)  # only stop() ends this wait

    thread = BackgroundThread(loop, "breaker-redis-test")
    thread.start()
    thread.start()  # already running: no second thread
    assert stop_all([thread], timeout=10)
    assert not thread.running and rounds == [1]
    thread.start()
    assert thread.stop(10) and rounds == [1, 1]
