"""One sick host (docs/one-sick-host.md): with min_reporters=N above 1, a shared
trip needs failures from N reporters, and a reporter failing alone is isolated
instead, until its own probe succeeds. Each reporter here is a Breakers of its
own, on fakeredis, the real redis-server and a Redis Cluster, with the test
clock; tests/system/test_quorum_processes.py runs the same with worker processes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from breaker_redis import BreakerConfig, BreakerOpen, Breakers
from breaker_redis.engine.reporters import default_reporter, validate_reporter
from tests.support.stores import STORES, make_store
from tests.support.workers import subscribed

COUNT = BreakerConfig(trip="count", failure_threshold=5, window_seconds=10, open_seconds=30, min_reporters=2)


@pytest.fixture(params=[*STORES, "cluster"])
def store(request: pytest.FixtureRequest):
    client = make_store(request)
    yield client
    client.close()


def refusal(breaker: Any) -> BreakerOpen | None:
    """The BreakerOpen an acquire raises, or None when the call is admitted (and ignored)."""
    try:
        breaker.acquire().ignore()
    except BreakerOpen as refused:
        return refused
    return None


def hosts(make_breakers: Any, config: BreakerConfig, *names: str) -> list[Any]:
    return [make_breakers(reporter=name).get("pay", config) for name in names]


def test_a_host_failing_alone_is_isolated_and_the_others_go_on(make_breakers, clock):
    a, b, c = hosts(make_breakers, COUNT, "a", "b", "c")
    for _ in range(4):
        a.acquire().failure()
        b.acquire().success()
        c.acquire().success()
    assert refusal(a) is None
    a.acquire().failure()  # a's 5th: the count rule holds, from one reporter
    refused = refusal(a)
    assert refused is not None and (refused.reason, refused.retry_after) == ("isolated", 30.0)
    assert refusal(b) is None and refusal(c) is None
    snap = b.snapshot()
    assert (snap["state"], snap["trips"], snap["isolated"]) == ("closed", 0, ["a"])
    assert snap["failing_reporters"] == 1
    assert snap["reporters"] == {"a": {"failures": 5, "isolated_until_ms": clock.now + 30_000}}
    assert snap["isolations"] == 1
    clock.advance(10_000)  # a's failures slid out of the window; a is still isolated
    for _ in range(4):
        b.acquire().failure()
        assert refusal(c) is None
    b.acquire().failure()  # b's 5th: the rule holds again, and a and b make 2 reporters
    for breaker in (a, b, c):
        refused = refusal(breaker)
        assert refused is not None and refused.reason == "open"
    snap = c.snapshot()
    assert (snap["state"], snap["trips"], snap["isolated"], snap["failing_reporters"]) == ("open", 1, [], 0)


def test_with_min_reporters_1_one_host_trips_the_breaker_for_everyone(make_breakers):
    config = BreakerConfig(trip="count", failure_threshold=5, window_seconds=10, open_seconds=30)
    a, b = hosts(make_breakers, config, "a", "b")
    for _ in range(5):
        a.acquire().failure()
    assert [getattr(refusal(x), "reason", None) for x in (a, b)] == ["open", "open"]
    assert b.snapshot()["reporters"] == {}


def test_the_isolated_host_probes_and_recovers_by_itself_or_waits_longer(make_breakers, clock, store):
    a, b = hosts(make_breakers, COUNT, "a", "b")
    for _ in range(5):
        a.acquire().failure()
    clock.advance(30_000)
    probe = a.acquire()  # its own probe
    assert probe.lease.startswith("i:")
    refused = refusal(a)  # one probe per reporter
    assert refused is not None and refused.reason == "isolated"
    probe.failure()  # isolated again, for open_seconds x 2 (plus up to 10 % jitter)
    until = b.snapshot()["reporters"]["a"]["isolated_until_ms"]
    assert 60_000 <= until - clock.now <= 66_000
    clock.advance(until - clock.now)
    a.acquire().success()  # the probe succeeds: a is back
    assert refusal(a) is None
    snap = b.snapshot()
    assert (snap["state"], snap["isolated"], snap["reporters"]) == ("closed", [], {})


def test_a_reset_ends_every_isolation(make_breakers):
    a, b = hosts(make_breakers, COUNT, "a", "b")
    for _ in range(5):
        a.acquire().failure()
    assert getattr(refusal(a), "reason", None) == "isolated"
    b.reset()
    assert refusal(a) is None
    assert b.snapshot()["isolated"] == []


def test_consecutive_rule_the_run_that_reaches_the_threshold_needs_the_quorum(make_breakers):
    config = BreakerConfig(trip="consecutive", failure_threshold=3, open_seconds=30, min_reporters=2)
    a, b, c = hosts(make_breakers, config, "a", "b", "c")
    a.acquire().failure()
    c.acquire().success()  # ends the shared run; a's own run goes on
    a.acquire().failure()
    a.acquire().failure()  # a's 3rd in a row: isolated (the shared run is 2)
    assert getattr(refusal(a), "reason", None) == "isolated"
    a_isolated = a.snapshot()
    assert (a_isolated["state"], a_isolated["consecutive_failures"]) == ("closed", 2)
    assert a_isolated["isolated"] == ["a"]
    b.acquire().failure()  # a run of 3, from a and b: trips
    assert [getattr(refusal(x), "reason", None) for x in (a, b, c)] == ["open"] * 3


def test_consecutive_rule_a_run_from_one_host_isolates_it(make_breakers):
    config = BreakerConfig(trip="consecutive", failure_threshold=3, open_seconds=30, min_reporters=2)
    a, b = hosts(make_breakers, config, "a", "b")
    for _ in range(3):
        a.acquire().failure()
    assert [getattr(refusal(x), "reason", None) for x in (a, b)] == ["isolated", None]
    b.acquire().success()
    assert a.snapshot()["state"] == "closed"


def test_rate_rule_a_host_whose_own_rate_holds_is_isolated(make_breakers):
    config = BreakerConfig(
        trip="rate", failure_rate=0.5, minimum_calls=10, window_seconds=60, open_seconds=30, min_reporters=2
    )
    a, b = hosts(make_breakers, config, "a", "b")
    for _ in range(20):
        b.acquire().success()
    for i in range(10):
        assert refusal(a) is None, i
        a.acquire().failure()
    assert getattr(refusal(a), "reason", None) == "isolated"
    assert refusal(b) is None
    assert b.snapshot()["state"] == "closed"


def test_on_transition_reports_an_isolation_and_its_end(make_breakers, clock):
    seen: list[tuple[str, str, str, str | None]] = []
    made = make_breakers(reporter="a")
    made.on_transition(lambda t: seen.append((t.old, t.new, t.cause, t.reporter)))
    a = made.get("pay", COUNT)
    for _ in range(5):
        a.acquire().failure()
    clock.advance(30_000)
    a.acquire().success()
    assert seen == [("closed", "isolated", "count", "a"), ("isolated", "closed", "probe_succeeded", "a")]


def test_a_reporter_is_validated():
    for bad in ("", "two words", "a,b", "x" * 65, "{a}", 7):
        with pytest.raises(ValueError, match="reporter"):
            Breakers(None, reporter=bad)  # type: ignore[arg-type]
    assert validate_reporter("web-01.example.com") == "web-01.example.com"
    assert validate_reporter(default_reporter()) == default_reporter()


def test_operators_see_the_isolated_reporters_in_show_status_metrics_and_dashboard(redis_server, monkeypatch):
    """On Redis's own clock, as the CLI, a scrape and the dashboard read it."""
    from click.testing import CliRunner
    from flask import Flask

    from breaker_redis.flask import FlaskBreakers
    from breaker_redis.flask import dashboard as dashboard_module
    from breaker_redis.metrics import exposition
    from breaker_redis.ops import cli

    client = redis_server.client()
    client.flushall()
    made = [Breakers(client, listen=False, reporter=name) for name in ("web-a", "web-b")]
    a, b = (breakers.get("pay", COUNT) for breakers in made)
    for _ in range(5):
        a.acquire().failure()
    b.acquire().success()
    for breakers in made:
        breakers.close()

    def run(*args: str) -> str:
        result = CliRunner().invoke(cli.main, ["--url", redis_server.url, *args])
        assert result.exit_code == 0, result.output
        return result.output

    shown = run("show", "pay")
    assert "  reporters    a trip needs 2; 1 failing in the window, 1 isolated; isolations 1\n" in shown
    assert "               web-a (5 failures, isolated until " in shown
    assert "pay   closed, 1 isolated  " in run("status")

    scraped = exposition(client).decode()
    assert 'breaker_redis_isolated_reporters{breaker="pay"} 1.0' in scraped
    assert 'breaker_redis_failing_reporters{breaker="pay"} 1.0' in scraped
    assert 'breaker_redis_reporter_failures{breaker="pay",reporter="web-a"} 5.0' in scraped
    assert 'reporter="web-b"' not in scraped  # a reporter that did not fail has no series

    monkeypatch.setattr(dashboard_module, "STREAM_SECONDS", 0)
    app = Flask(__name__)
    app.config.update({"BREAKER_ADMIN_TOKEN": "s3cret", "BREAKER_DASHBOARD": True})
    FlaskBreakers(app, client=client, listen=False)
    body = app.test_client().get("/_breakers/stream", headers={"Authorization": "Bearer s3cret"})
    frame = next(line for line in body.get_data(as_text=True).split("\n") if line.startswith("data: "))
    (pay,) = json.loads(frame[6:])["breakers"]
    assert (pay["state"], pay["isolated"], pay["failing_reporters"]) == ("closed", ["web-a"], 1)
    assert pay["reporters"]["web-a"]["failures"] == 5


@pytest.mark.parametrize("threshold", [1000, 1], ids=["failing", "isolated"])
def test_a_reporter_that_failed_costs_at_most_64_bytes(redis_server, threshold):
    """MEMORY USAGE of the reporters hash, from 10 to 40 reporters named like hosts
    (11 characters): failing in the window (docs/one-sick-host.md: 36 bytes each) and isolated (64)."""
    client = redis_server.client()
    client.flushall()
    config = BreakerConfig(trip="count", failure_threshold=threshold, window_seconds=60, min_reporters=100)
    sizes = {}
    for i in range(1, 41):
        breakers = Breakers(client, listen=False, reporter=f"web-{i:02d}.prod")
        breakers.get("pay", config).acquire().failure()
        breakers.close()
        sizes[i] = client.memory_usage("breaker:{pay}:reporters", samples=0)
    assert (sizes[40] - sizes[10]) / 30 <= 64
    assert client.object("encoding", "breaker:{pay}:reporters") == b"listpack"


def test_reporters_that_stop_failing_leave_no_key_behind(redis_server):
    """On Redis's clock: the reporters key expires a window after the last failure it
    records (here 0.3 s), without any other call."""
    from tests.support.redis_server import wait_until

    client = redis_server.client()
    client.flushall()
    config = BreakerConfig(trip="count", failure_threshold=5, window_seconds=0.3, min_reporters=2)
    breakers = Breakers(client, listen=False, reporter="web-a")
    seconds, micros = client.time()
    before = seconds * 1000 + micros // 1000
    breakers.get("pay", config).acquire().failure()
    (seconds, micros), left = (
        client.pipeline(transaction=True).time().pttl("breaker:{pay}:reporters").execute()
    )
    breakers.close()
    # Its expiry is 300 ms of Redis time after the failure, which came between `before` and
    # now (no wall-clock bound: a test held up past it finds the key gone, and Redis's clock
    # shows the 300 ms went by).
    now = seconds * 1000 + micros // 1000
    expired = left == -2 and now >= before + 300
    assert expired or (left > 0 and before + 300 - now <= left <= 300), (left, now - before)
    wait_until(lambda: not client.exists("breaker:{pay}:reporters"), timeout=10, what="the key to expire")
    assert sorted(key.decode() for key in client.keys("breaker:{pay}:*")) == [
        "breaker:{pay}:cfg",
        "breaker:{pay}:state",
        "breaker:{pay}:stats",
        "breaker:{pay}:window",
    ]


def test_a_corrupted_reporters_key_is_repaired_and_the_calls_go_on(make_breakers, store, caplog):
    """A field that does not parse counts as no entry and is dropped at the next failure; a key
    of another type is dropped with the breaker's other keys (as any key of the wrong type)."""
    a, b = hosts(make_breakers, COUNT, "a", "b")
    a.acquire().failure()
    store.hset("breaker:{pay}:reporters", mapping={"a": "not numbers", "x": "1 2"})
    for _ in range(5):
        a.acquire().failure()  # a's entry starts again: its 5th failure from here isolates it
    assert [getattr(refusal(x), "reason", None) for x in (a, b)] == ["isolated", None]
    assert sorted(store.hkeys("breaker:{pay}:reporters")) == [b" n", b"a"]
    store.delete("breaker:{pay}:reporters")
    store.set("breaker:{pay}:reporters", "a string")
    b.acquire().failure()
    assert store.type("breaker:{pay}:reporters") == b"hash"
    assert "had a corrupted key" in caplog.text


def test_numbers_in_a_reporters_entry_no_worker_wrote_are_dropped_or_clamped(
    make_breakers, store, clock, caplog
):
    """A number beyond 2^53 made every failure a script error (PEXPIRE 1e23) and sent the whole
    process to its local store, where its other breakers admitted calls another worker had
    tripped. Now the entry is dropped by the script that finds it, and a plausible entry with
    times no worker could have written is clamped to what the config allows."""
    made = make_breakers(reporter="a")
    pay, other = made.get("pay", COUNT), made.get("other", BreakerConfig(trip="count", failure_threshold=5))
    assert refusal(other) is None
    key = "breaker:{pay}:reporters"
    store.hset(
        key,
        mapping={
            "someone": "99999999999999999999999 1 1 1 1 1",
            " run": "1" + "0" * 30,
            "late": f"{clock.now} 0 1 1 1 0 {10**15} {10**15} {10**15}",
        },
    )
    pay.acquire().failure()
    assert made.gate.healthy
    assert store.hget(key, " run") == b"0"
    elsewhere = make_breakers(reporter="b").get("other", BreakerConfig(trip="count", failure_threshold=5))
    for _ in range(5):
        elsewhere.acquire().failure()
    refused = refusal(other)  # tripped by another worker: refused here too
    assert refused is not None and refused.reason == "open"
    assert set(pay.snapshot()["reporters"]) == {"a", "late"}  # (readers skip a corrupted entry)
    late = pay.snapshot()["reporters"]["late"]
    assert late["isolated_until_ms"] == clock.now + 330_000  # max_open_seconds 300 with 10 % jitter
    assert 0 < store.pttl(key) <= 330_000 + 10_000
    assert "corrupted breaker:{pay}:reporters repaired" in caplog.text
    store.hdel(key, "late")  # (isolated, it would make the quorum with a)
    for _ in range(4):
        pay.acquire().failure()  # a's own 5 failures: isolated, as without the corruption
    assert getattr(refusal(pay), "reason", None) == "isolated"
    assert store.hget(key, "someone") is None  # dropped by the failure that counted the reporters


def test_a_probe_the_bulkhead_refuses_is_given_back_not_counted_as_failed(make_breakers, clock, store):
    """With max_concurrent_calls, the isolated reporter's probe refused for want of a slot was left
    in its record, so it timed out as a failed probe and isolated it again with the backoff."""
    config = BreakerConfig(
        trip="count",
        failure_threshold=5,
        window_seconds=10,
        open_seconds=30,
        min_reporters=2,
        max_concurrent_calls=1,
    )
    a, b = hosts(make_breakers, config, "a", "b")
    for _ in range(5):
        a.acquire().failure()
    clock.advance(30_000)
    slot = b.acquire()  # the only slot
    refused = refusal(a)
    assert refused is not None and refused.reason == "bulkhead"
    assert b.snapshot()["reporters"]["a"]["isolated_until_ms"] == clock.now  # not isolated again
    slot.success()
    probe = a.acquire()  # the slot is free: a's probe, at once
    assert probe.lease.startswith("i:")
    probe.success()
    snap = b.snapshot()
    assert (snap["isolated"], snap["reporters"], snap["isolations"]) == ([], {}, 1)
    assert refusal(a) is None


def test_batched_successes_sent_late_do_not_end_the_reporters_own_run(make_breakers):
    """Two workers of one reporter, listening (so a calm breaker's successes are batched): the
    successes one worker batched reach Redis after the other worker's failures (held back
    here by its send lock, as a busy worker's are). They happened before the run, so, as they
    never end the shared run, they do not end the reporter's own: it is isolated at exactly
    its 5th failure in a row (it was at the 6th to 9th)."""
    config = BreakerConfig(trip="consecutive", failure_threshold=5, open_seconds=30, min_reporters=2)
    workers = [make_breakers(reporter="a", listen=True, batch_successes=True) for _ in range(2)]
    for w in workers:
        w.recorder.schedule = lambda *args: None  # type: ignore[method-assign]  # no timed flush
    first, second = (w.get("pay", config) for w in workers)
    subscribed(workers)  # (after get: on a cluster each breaker has a channel of its own)
    for _ in range(3):
        first.acquire().success()
    assert first._batch_count == 3  # calm: batched in memory
    with first._send_lock:  # first's batch waits while second fails
        for _ in range(4):
            second.acquire().failure()
        assert refusal(second) is None
    first.acquire().failure()  # the batch reaches Redis now, and a's 5th failure in a row
    for worker in (first, second):
        refused = refusal(worker)
        assert refused is not None and refused.reason == "isolated"
    snap = first.snapshot()
    assert (snap["state"], snap["isolated"], snap["successes"], snap["failures"]) == ("closed", ["a"], 3, 5)


def _scripts_run(client: Any) -> int:
    """Scripts the server ran (FCALL, EVALSHA, EVAL), from its commandstats."""
    stats = client.info("commandstats")
    return sum(
        int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval")
    )


def test_while_its_probe_is_in_flight_the_reporters_other_workers_refuse_from_memory(
    redis_server, clock, monkeypatch
):
    """docs/boundary.md "Cost": an isolated reporter costs about 0 commands per call. While one
    of its workers held the probe, each call of its other workers ran the acquire script to be
    refused (about 525 in a 3 s probe); now the first is refused until the probe's lease
    expires, and the others from memory, until the probe's outcome is published."""
    from breaker_redis.engine import core as core_module
    from tests.support.redis_server import wait_until

    monkeypatch.setattr(core_module, "FLUSH_SECONDS", 3600.0)  # no refusal counts sent in the loop
    client = redis_server.client()
    client.flushall()
    workers = [Breakers(client, clock=clock, reporter="a") for _ in range(2)]
    try:
        prober, other = (w.get("pay", COUNT) for w in workers)
        subscribed(workers)
        for _ in range(5):
            prober.acquire().failure()
        assert getattr(refusal(other), "reason", None) == "isolated"  # other learns of it
        clock.advance(30_000)  # the isolation's end: the next call of either asks Redis
        probe = prober.acquire()
        assert probe.lease.startswith("i:")
        before = _scripts_run(client)
        refused = [refusal(worker) for worker in (other, prober) * 100]
        assert _scripts_run(client) - before == 1  # other's first call; then none
        assert {(r.reason, r.retry_after) for r in refused if r is not None} == {("isolated", 30.0)}
        assert None not in refused
        probe.success()  # published: both workers ask Redis again at their next call
        wait_until(lambda: refusal(other) is None, timeout=10, what="the recovery heard")
        assert refusal(prober) is None
    finally:
        for w in workers:
            w.close()


def _commands_run(client: Any, command: str) -> int:
    """How often the server ran a command, scripts' own commands included (commandstats)."""
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


CAP = 128  # lua/_lib.lua REP_CAP: reporters tracked per breaker


def test_a_breaker_tracks_at_most_128_reporters_and_a_sick_one_still_gets_isolated(make_breakers, store):
    """150 reporters fail once each (their runs broken by another's success): the hash keeps the
    latest 128, so snapshot, metrics and every script read at most that many; a sick reporter
    arriving then takes the place of the oldest and is isolated at exactly its 5th failure."""
    config = BreakerConfig(trip="consecutive", failure_threshold=5, open_seconds=30, min_reporters=2)
    healthy = make_breakers(reporter="healthy").get("pay", config)
    for i in range(150):
        make_breakers(reporter=f"web-{i:03d}").get("pay", config).acquire().failure()
        healthy.acquire().success()
    reporters = healthy.snapshot()["reporters"]
    assert sorted(reporters) == [f"web-{i:03d}" for i in range(150 - CAP, 150)]
    assert store.hlen("breaker:{pay}:reporters") == CAP + 2  # and the shared run's number, the count
    sick = make_breakers(reporter="sick").get("pay", config)
    for _ in range(4):
        sick.acquire().failure()
    assert refusal(sick) is None
    sick.acquire().failure()
    refused = refusal(sick)
    assert refused is not None and refused.reason == "isolated"
    snap = healthy.snapshot()
    assert (snap["state"], snap["isolated"], len(snap["reporters"])) == ("closed", ["sick"], CAP)
    assert "web-022" not in snap["reporters"] and "web-023" in snap["reporters"]


def test_a_failure_reads_only_its_own_reporters_entry_while_the_rule_does_not_hold(redis_server):
    """The record script's work does not grow with the reporters (it took 96 µs with none and
    4.8 ms with 1,000): a failure reads the shared run and its own entry (HMGET), not the hash;
    only a failure on which the shared rule holds counts the reporters (at most 128)."""
    client = redis_server.client()
    client.flushall()
    config = BreakerConfig(trip="count", failure_threshold=1000, window_seconds=60, min_reporters=2)
    made = [Breakers(client, listen=False, reporter=f"web-{i:02d}") for i in range(40)]
    try:
        for breakers in made:
            breakers.get("pay", config).acquire().failure()
        pay = made[0].get("pay", config)
        scripts, reads = _scripts_run(client), _commands_run(client, "hgetall")
        for _ in range(10):
            pay.acquire().failure()
        assert _scripts_run(client) - scripts == 20  # an acquire and a record per call
        assert _commands_run(client, "hgetall") - reads == 20  # each script's config hash, no more
        assert client.hlen("breaker:{pay}:reporters") == 40 + 1  # and their count
    finally:
        for breakers in made:
            breakers.close()
