"""Hostile or careless data in Redis: live config written by hand, corrupted
fields, keys that must outlive a short TTL.

- A value written with redis-cli (no configure() call, no flag) holds from the
  next script, also after the state hash is rebuilt.
- Live values are held to BreakerConfig's own bounds inside Lua: skipped when
  they do not parse, are not integers where one is due or are below the
  lowest, clamped when above the highest. The Python reading of a value
  (config.live_value, used by the CLI) and the Lua one agree on any string
  (hypothesis); the scripts' rules are written from BreakerConfig's fields, and
  hold each field to its declared bounds.
- A field that does not parse in the state, stats or window hash is repaired by
  the call that finds it, with one log line naming the key; the breaker keeps
  deciding; reset repairs a counter too.
- TTLs are renewed every quarter of the TTL; the names set is renewed by
  running workers.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from breaker_redis import BreakerConfig, BreakerOpen
from breaker_redis.base.config import LIVE_FIELDS, LUA_FIELDS, OFF_VALUES, live_value
from breaker_redis.base.fields import LiveField
from breaker_redis.engine.snapshot import snapshot_dict
from breaker_redis.storage.lua_rules import live_rules
from breaker_redis.storage.lua_source import OPERATIONS, library, prelude, script_source
from breaker_redis.storage.scripts import ScriptRunner
from tests.support.workers import admits, fail

COUNT_5 = BreakerConfig(trip="count", failure_threshold=5, window_seconds=60, open_seconds=30)
CONFIG = "breaker:{pay}:config"
STATE = "breaker:{pay}:state"


def in_force(breaker) -> dict:
    return breaker.snapshot()["config"]


# A config away from every bound, so that a live value skipped, applied or clamped shows
AWAY = BreakerConfig(
    trip="count",
    failure_threshold=5,
    failure_rate=0.3,
    minimum_calls=20,
    slow_call_seconds=2,
    slow_call_rate=0.5,
    window_seconds=10,
    window_buckets=10,
    window_calls=50,
    open_seconds=20,
    open_backoff=2,
    max_open_seconds=600,
    half_open_max_calls=2,
    half_open_successes=2,
    probe_timeout_seconds=30,
    max_concurrent_calls=5,
    mode="observe",
    min_reporters=2,
    ramp_seconds=5,
    ramp_from=0.5,
)
SKIPPED = object()  # the scripts keep the worker's own value


def probes(rule: LiveField) -> list[tuple[str, object]]:
    """Live values at and around a field's rules as BreakerConfig declares them
    (config.LIVE_FIELDS), each with what the scripts must put in force: the value,
    None (off) or SKIPPED."""
    own = getattr(AWAY, rule.name)
    if rule.words:
        return [*((word, word) for word in rule.words if word != own), ("sometimes", SKIPPED)]
    low, high = rule.low, rule.high
    found: list[tuple[str, object]] = [
        (f"{high * 10:g}", high),
        ("1e999", high),
        (f"{high:g}", high),
        (f"{low:g}", SKIPPED if rule.low_open else low),
        (f"{low - 1:g}", SKIPPED),
        ("nan", SKIPPED),
    ]
    if rule.integer:
        found.append((f"{low + 1.5:g}", SKIPPED))
    found += [(value, None) for value in OFF_VALUES] if rule.off else [("off", SKIPPED)]
    return found


@pytest.mark.parametrize("functions", [True, False], ids=["FCALL", "EVALSHA"])
@pytest.mark.parametrize("rule", LIVE_FIELDS, ids=[rule.name for rule in LIVE_FIELDS])
def test_the_scripts_hold_live_values_to_each_fields_declared_rules(redis_server, rule, functions):
    """The rules the scripts apply are written into them from BreakerConfig's fields
    (lua_rules.py): on a real server, as a library of functions and as EVALSHA
    scripts, a value above a field's highest is clamped to it, one below its lowest,
    or not an integer where one is due, is skipped, and an off value turns it off."""
    client = redis_server.client()
    client.flushall()
    client.config_resetstat()
    runner = ScriptRunner(client, "breaker", 60_000, functions=functions)
    own = getattr(AWAY, rule.name)
    for raw, expected in probes(rule):
        assert expected != own, (rule.name, raw)  # else a skipped value would pass for an applied one
        client.hset(CONFIG, rule.name, raw)
        reply = runner.run("snapshot", "pay", None, [AWAY.to_lua(), 0, 0, 0, 0, 0, 0, 0])
        in_force = snapshot_dict("pay", reply, "redis")["config"][rule.name]
        assert in_force == (own if expected is SKIPPED else expected), (rule.name, raw)
        applied, _ = live_value(rule.name, raw)  # the CLI's reading of it
        assert applied == {SKIPPED: None, None: "off"}.get(expected, expected), (rule.name, raw)  # type: ignore[call-overload]
    sent, unsent = ("cmdstat_fcall", "cmdstat_evalsha") if functions else ("cmdstat_evalsha", "cmdstat_fcall")
    stats = client.info("commandstats")
    assert stats[sent]["calls"] >= len(probes(rule)) and unsent not in stats


def test_the_scripts_text_is_written_from_the_declared_rules(monkeypatch):
    """The prelude's rules come from config.LIVE_FIELDS when the scripts' text is built:
    none is left out, and a changed bound changes the text (and so the scripts' SHA1)."""
    assert all("--@LIVE_RULES@" not in script_source(op) for op in OPERATIONS)
    assert "--@LIVE_RULES@" not in library()[0]
    assert live_rules() in prelude()
    for rule in LIVE_FIELDS:
        assert f"    {rule.name} = {{" in live_rules()
    widened = [dataclasses.replace(f, high=2000) if f.name == "window_buckets" else f for f in LIVE_FIELDS]
    monkeypatch.setattr("breaker_redis.storage.lua_rules.LIVE_FIELDS", widened)
    assert "window_buckets = {'buckets', 1, 1, false, 2000, true, false}," in live_rules()


def test_a_value_written_with_redis_cli_holds_from_the_next_call(make_breakers, store):
    pay = make_breakers().get("pay", COUNT_5)
    fail(pay, 2)
    store.hset(CONFIG, "failure_threshold", "3")  # by hand: no configure(), no message
    fail(pay)
    assert not admits(pay)  # the third failure tripped it
    assert in_force(pay)["failure_threshold"] == 3


def test_a_hand_written_value_survives_the_state_hash_being_rebuilt(make_breakers, store):
    pay = make_breakers().get("pay", COUNT_5)
    pay.acquire().success()
    store.hset(CONFIG, "failure_threshold", "2")
    store.delete(STATE)  # evicted, or deleted by hand
    fail(pay, 2)
    assert not admits(pay)


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("window_buckets", "1e6", 100),  # measured before: blocked Redis 3.8 s in one call
        ("open_seconds", "1e999", 86400.0),  # measured before: open with a negative open_until
        ("half_open_successes", "1e999", 10000),  # measured before: half-open for ever
        ("failure_threshold", "0.01", 5),  # measured before: tripped on the first failure; now skipped
        ("failure_threshold", "0", 5),
        ("failure_threshold", "-3", 5),
        ("failure_rate", "1.5", 1),
        ("open_backoff", "nan", 2.0),
        ("probe_timeout_seconds", "0x10", 30.0),
        ("minimum_calls", " 7", 20),
        ("minimum_calls", "7", 7),
        ("slow_call_seconds", "off", None),
        ("trip", "sometimes", "count"),
        ("mode", "observe", "observe"),
    ],
)
def test_hostile_live_values_are_skipped_or_clamped(make_breakers, store, field, value, expected):
    pay = make_breakers().get("pay", COUNT_5)
    store.hset(CONFIG, field, value)
    assert in_force(pay)[field] == expected


def test_a_huge_open_period_is_clamped_not_negative(make_breakers, store, clock):
    pay = make_breakers().get("pay", COUNT_5)
    store.hset(CONFIG, "open_seconds", "1e999")
    fail(pay, 5)
    snap = pay.snapshot()
    assert snap["state"] == "open"
    assert snap["open_until_ms"] == clock.now + 86400 * 1000
    with pytest.raises(BreakerOpen) as refused:
        pay.acquire()
    assert refused.value.retry_after == 86400


def test_a_huge_window_bucket_count_costs_100_buckets(make_breakers, store, clock):
    pay = make_breakers().get("pay", COUNT_5)
    store.hset(CONFIG, "window_buckets", "1e6")
    for _ in range(3):
        fail(pay)
        clock.advance(60_000)  # every bucket slides out: the most work a call can do
    assert int(store.hget("breaker:{pay}:window", "nb")) == 100
    assert store.hlen("breaker:{pay}:window") <= 6 + 3 * 3


# the characters a careless hand might type, and whole values worth trying
_VALUES = st.one_of(
    st.text(alphabet="0123456789.eE+-", max_size=8),
    st.sampled_from(
        [
            "1e999",
            "-1e999",
            "inf",
            "nan",
            "0x10",
            " 5",
            "5 ",
            "1_0",
            "",
            "off",
            "none",
            "consecutive",
            "rate",
            "observe",
            "1e-999",
            "0.0",
            "600",
            "601",
            "3.0",
        ]
    ),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(min_value=-10, max_value=2_000_000).map(str),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(LUA_FIELDS), value=_VALUES)
def test_python_reads_a_live_value_as_the_scripts_do(make_breakers, store, field, value):
    store.flushall()
    base = BreakerConfig(trip="rate", window_seconds=10, window_buckets=10, open_seconds=20)
    pay = make_breakers().get("pay", base)
    own = in_force(pay)
    store.hset(CONFIG, field, value)
    got = in_force(pay)[field]
    applied, why = live_value(field, value)
    if applied is None:
        assert got == own[field], (field, value, why)
    elif applied == "off":
        assert got is None
    elif field == "window_seconds":  # buckets of whole milliseconds, at least 1
        assert got == max(1, math.floor(applied * 1000 / 10)) * 10 / 1000
    elif field == "max_open_seconds":  # never below the open period in force
        # read back through Lua's number formatting (14 significant digits)
        assert got == pytest.approx(max(applied, own["open_seconds"]), rel=1e-13, abs=0), (field, value)
    else:
        assert got == pytest.approx(applied), (field, value)


# -- corrupted fields ----------------------------------------------------------------------


def test_a_corrupted_counter_is_repaired_with_one_log_line(make_breakers, store, caplog):
    pay = make_breakers().get("pay", COUNT_5)
    fail(pay)
    store.hset("breaker:{pay}:stats", "failures", "abc")
    with caplog.at_level(logging.WARNING, logger="breaker_redis"):
        fail(pay, 4)  # keeps deciding: the fifth failure in the window trips it
    assert not admits(pay)
    repairs = [r.getMessage() for r in caplog.records if "corrupted" in r.getMessage()]
    assert len(repairs) == 1 and "breaker:{pay}:stats" in repairs[0]
    assert int(store.hget("breaker:{pay}:stats", "failures")) == 4  # counted again from the repair


def test_reset_repairs_a_corrupted_counter(make_breakers, store, caplog):
    pay = make_breakers().get("pay", COUNT_5)
    pay.acquire().success()
    store.hset("breaker:{pay}:stats", mapping={"rejected": "many", "trips": "1.5"})
    with caplog.at_level(logging.WARNING, logger="breaker_redis"):
        pay.reset()
    assert store.hmget("breaker:{pay}:stats", "rejected", "trips") == [b"0", b"0"]
    assert "breaker:{pay}:stats" in caplog.text


@pytest.mark.parametrize(
    ("field", "value"),
    [("epoch", "abc"), ("open_until", "soon"), ("consec", "inf"), ("state", "ajar"), ("born", "nan")],
)
def test_a_corrupted_state_field_starts_a_fresh_breaker_with_a_newer_epoch(
    make_breakers, store, caplog, clock, field, value
):
    """The state is repaired as a fresh breaker with a newer epoch, and what it was is
    restored: from the last transition for a worker that knows nothing, from what it
    knew for one that does (as after an eviction: lua/_lib.lua restore_lost)."""
    pay = make_breakers().get("pay", COUNT_5)
    fail(pay, 5)
    epoch = pay.snapshot()["epoch"]
    store.hset(STATE, field, value)
    clock.advance(1_000)  # (an epoch edited away is guessed from the time: epochs grow with it)
    newcomer = make_breakers().get("pay", COUNT_5)
    with caplog.at_level(logging.WARNING, logger="breaker_redis"):
        assert not admits(newcomer)  # open, as the last transition said; no other exception
    assert "breaker:{pay}:state" in caplog.text and "lost its state" not in caplog.text  # a repair
    snap = newcomer.snapshot()
    assert snap["state"] == "open" and snap["epoch"] > epoch and snap["state_lost"] == 0
    store.hset(STATE, field, value)
    store.delete("breaker:{pay}:events")
    clock.advance(1_000)
    fresh = make_breakers().get("pay", COUNT_5)
    assert admits(fresh)  # nothing to restore from: a fresh closed breaker
    assert fresh.snapshot()["epoch"] > snap["epoch"]  # epochs never go backwards
    assert not admits(pay)  # the worker that knew it open restores it


def test_a_window_head_far_in_the_future_is_repaired(make_breakers, store, caplog):
    pay = make_breakers().get("pay", COUNT_5)
    fail(pay, 2)
    store.hset("breaker:{pay}:window", "head", "99999999999999")  # the window would never slide
    with caplog.at_level(logging.WARNING, logger="breaker_redis"):
        fail(pay)
    assert "breaker:{pay}:window" in caplog.text
    assert pay.snapshot()["window_failures"] == 1  # a fresh window
    fail(pay, 4)
    assert not admits(pay)


# -- TTLs and the names set ----------------------------------------------------------------------


def test_use_is_stamped_every_quarter_of_the_ttl_and_old_ttls_are_dropped(make_breakers, store, clock):
    pay = make_breakers(key_ttl_seconds=8).get("pay", COUNT_5)
    fail(pay)
    created = int(store.hget(STATE, "ttl_at"))
    for key in ("state", "window", "stats"):  # as an older version left them
        store.pexpire(f"breaker:{{pay}}:{key}", 60_000)
    clock.advance(1_999)
    fail(pay)
    assert int(store.hget(STATE, "ttl_at")) == created  # not yet
    clock.advance(1)
    fail(pay)
    assert int(store.hget(STATE, "ttl_at")) == created + 2_000  # a quarter of 8 s
    for key in ("state", "window", "stats", "cfg"):
        assert store.pttl(f"breaker:{{pay}}:{key}") == -1  # no TTL: never an eviction candidate


def test_idle_breakers_are_swept_and_busy_ones_kept(make_breakers, store, clock):
    """Keys carry no TTL, so idle breakers are removed by a sweep: a worker sweeps a
    few names at random at its first listing and every quarter of the key TTL."""
    breakers = make_breakers(key_ttl_seconds=8)
    idle, busy = breakers.get("idle", COUNT_5), breakers.get("busy", COUNT_5)
    fail(idle)
    fail(busy)
    breakers.configure("configured", open_seconds=5)  # overrides before first use: kept
    runner = breakers._runner
    assert sorted(runner.sweep(clock())) == []
    clock.advance(7_999)
    fail(busy)  # stamps its use (a quarter of the TTL has passed)
    assert runner.sweep(clock()) == []  # nothing idle for 8 s yet
    clock.advance(1)
    assert runner.sweep(clock()) == ["idle"]
    assert store.keys("breaker:{idle}:*") == []
    assert {n.decode() for n in store.smembers("breaker:names")} == {"busy", "configured"}
    assert store.exists("breaker:{busy}:state") and store.exists("breaker:{configured}:config")
    store.sadd("breaker:names", "ghost")  # listed, no key left: the name goes
    assert runner.sweep(clock()) == ["ghost"]
    assert admits(idle)  # a swept breaker starts again closed at its next use


def test_a_process_with_a_shorter_key_ttl_does_not_sweep_what_others_use(make_breakers, store, clock):
    """Idle means unused for the longer of the sweeper's TTL and the user's (stored with
    the state): a user with a 7-day TTL stamps its use only once a minute."""
    long_lived = make_breakers()  # 7 days
    fail(long_lived.get("pay", COUNT_5))
    short = make_breakers(key_ttl_seconds=5)
    clock.advance(50_000)
    assert short._runner.sweep(clock()) == []
    assert store.exists(STATE)


def test_running_workers_keep_the_names_set(make_breakers, store, clock):
    """Listed again every quarter of the key TTL, timed by the Breakers' clock."""
    pay = make_breakers(key_ttl_seconds=8).get("pay", COUNT_5)
    pay.acquire().success()
    assert store.smembers("breaker:names") == {b"pay"}
    store.delete("breaker:names")  # expired while the worker ran on
    clock.advance(1_900)
    pay.acquire().failure()
    assert store.smembers("breaker:names") == set()  # listed again only every quarter TTL
    clock.advance(100)
    pay.acquire().failure()
    assert store.smembers("breaker:names") == {b"pay"}


# -- a rolling deploy: two configs for one breaker ---------------------------------------------


OLD = BreakerConfig(trip="count", failure_threshold=5, window_seconds=10, open_seconds=30)
NEW = BreakerConfig(trip="count", failure_threshold=5, window_seconds=30, open_seconds=30)


def test_two_window_sizes_share_one_window_during_a_rolling_deploy(make_breakers, store, clock):
    """Old workers (10 s window) and new ones (30 s) alternate: before, each wiped the
    other's window, so it could not trip during the overlap. Now the window keeps the
    shape it has while a caller of that shape still writes it."""
    old, new = make_breakers().get("pay", OLD), make_breakers().get("pay", NEW)
    for n in range(4):
        fail(old if n % 2 == 0 else new)
        clock.advance(500)
    assert store.hmget("breaker:{pay}:window", "bms", "tf") == [b"1000", b"4"]  # the old shape, kept
    fail(new)  # the fifth failure, by the new config's rule on the shared window
    assert not admits(old) and not admits(new)


def test_the_new_shape_takes_over_when_no_worker_claims_the_old_one(make_breakers, store, clock):
    old, new = make_breakers().get("pay", OLD), make_breakers().get("pay", NEW)
    fail(old)
    start = clock.now
    shapes = []
    for _ in range(12):  # the old workers are gone; a new one fails every 5 s
        clock.advance(5_000)
        fail(new)
        shapes.append((clock.now - start, int(store.hget("breaker:{pay}:window", "bms"))))
    # adopted while the old shape's claim is younger than 60 s, then one reset to the new shape
    assert shapes == [(5_000 * n, 1000) for n in range(1, 12)] + [(60_000, 3000)]
    assert int(store.hget("breaker:{pay}:window", "tf")) == 1  # the reset started a fresh window
