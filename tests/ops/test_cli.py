"""The breaker-redis CLI and `flask breakers ...`, against the session's
redis-server (and the embedded server where workers must hear a switch)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result
from flask import Flask

from breaker_redis import BreakerConfig, Breakers
from breaker_redis.flask import FlaskBreakers
from breaker_redis.ops import cli
from breaker_redis.ops.cli import formatting
from breaker_redis.urls import client_from_url
from tests.support.redis_server import RedisServer, free_port, wait_until
from tests.support.redis_waits import Waits, install, sitecustomize_in
from tests.support.redis_waits import read as read_waits
from tests.support.workers import admits, subscribed

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "breaker-redis"
COUNT_3 = BreakerConfig(
    trip="count", failure_threshold=3, window_seconds=60, window_buckets=6, open_seconds=30
)


@pytest.fixture
def prefix() -> str:
    return "cli" + uuid.uuid4().hex[:8]


@pytest.fixture
def url(redis_server) -> str:
    return str(redis_server.url)


@pytest.fixture
def client(url) -> Iterator[redis.Redis]:
    made = redis.Redis.from_url(url, decode_responses=True)
    yield made
    made.close()


@pytest.fixture
def app_breakers(url, prefix) -> Iterator[Breakers]:
    """An app's Breakers that sends every outcome at once and does not listen."""
    made = Breakers.from_url(url, prefix, listen=False, batch_successes=False)
    yield made
    made.close()


def run(url: str, prefix: str, *args: str) -> Result:
    return CliRunner().invoke(cli.main, ["--url", url, "--prefix", prefix, *args])


def run_sleeping(
    url: str, prefix: str, sleep: Callable[[float], None], *args: str, color: bool = False
) -> Result:
    """The commands on url and prefix, waiting with sleep (``watch`` between refreshes)
    instead of time.sleep: a test acts there."""
    commands = cli.command_group(
        "breaker-redis", lambda: cli.Target(client_from_url(url), prefix, sleep=sleep)
    )
    return CliRunner().invoke(commands, list(args), color=color)


def outcomes(breaker, successes: int = 0, failures: int = 0) -> None:
    for _ in range(successes):
        breaker.acquire().success()
    for _ in range(failures):
        breaker.acquire().failure()


def rows(output: str) -> dict[str, list[str]]:
    """The status table's rows by name, cells split on runs of two spaces."""
    lines = output.strip().splitlines()
    assert lines[0].split()[:2] == ["NAME", "STATE"]
    table = {}
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.split("  ") if cell.strip()]
        table[cells[0]] = cells[1:]
    return table


# -- status -----------------------------------------------------------------------


def test_status_table_and_json_after_a_trip(url, prefix, app_breakers):
    pay = app_breakers.get("pay", COUNT_3)  # 6 buckets of 10 s: not the default shape
    outcomes(pay, successes=4, failures=3)
    outcomes(app_breakers.get("api/v1/inventory"), successes=2)
    app_breakers.get("api/v1/inventory").force_open()

    result = run(url, prefix, "status")
    assert result.exit_code == 0, result.output
    table = rows(result.stdout)
    state, window, rate, calls, rejected, trips, retry_after = table["pay"]
    assert (state, window, rate, calls, rejected, trips) == ("open", "3/7", "42.9%", "7", "0", "1")
    assert 28 < float(retry_after.removesuffix(" s")) <= 30
    assert table["api/v1/inventory"][:2] == ["open (forced)", "0/2"]
    assert table["api/v1/inventory"][-1] == "-"

    result = run(url, prefix, "status", "--json")
    assert result.exit_code == 0, result.output
    snapshots = {s["name"]: s for s in json.loads(result.stdout)}
    assert sorted(snapshots) == ["api/v1/inventory", "pay"]
    snap = snapshots["pay"]
    assert (snap["state"], snap["forced"], snap["window_calls"], snap["window_failures"]) == (
        "open",
        None,
        7,
        3,
    )
    assert (snap["calls"], snap["failures"], snap["trips"]) == (7, 3, 1)
    assert 28 < snap["retry_after"] <= 30
    assert snapshots["api/v1/inventory"]["forced"] == "open"


def test_status_and_show_say_the_share_a_ramping_breaker_admits(url, prefix, app_breakers):
    """A ramp of an hour from 0.25 (docs/recovery.md): 25 % in the seconds the test takes."""
    pay = app_breakers.get("pay", BreakerConfig(failure_threshold=3, ramp_seconds=3600, ramp_from=0.25))
    outcomes(pay, failures=3)
    pay.reset()
    result = run(url, prefix, "status")
    assert result.exit_code == 0, result.output
    assert rows(result.stdout)["pay"][0] == "closed, ramp 25%"
    snap = json.loads(run(url, prefix, "status", "--json").stdout)[0]
    assert 0.25 <= snap["ramp_share"] < 0.26 and snap["ramp_until_ms"] > 0
    shown = run(url, prefix, "show", "pay")
    assert shown.exit_code == 0, shown.output
    assert "state        closed, ramping: 25% of calls admitted, all at " in shown.stdout
    app_breakers.get("cart").acquire().success()
    assert rows(run(url, prefix, "status").stdout)["cart"][0] == "closed"


def test_an_open_period_over_with_no_call_says_the_next_call_is_the_probe(url, prefix, app_breakers):
    """Open with no traffic past its open period: the breaker moves to half-open
    at its next call, so "retry after 0.0 s" would be wrong; it says so instead."""
    pay = app_breakers.get("pay", BreakerConfig(failure_threshold=1, open_seconds=0.001))
    outcomes(pay, failures=1)
    wait_until(lambda: pay.snapshot()["retry_after"] == 0, what="the 1 ms open period to end")

    table = rows(run(url, prefix, "status").stdout)
    assert table["pay"][0] == "open" and table["pay"][-1] == "next call"
    shown = run(url, prefix, "show", "pay").stdout
    assert "state        open, open period over: the next call is the probe" in shown


def test_retry_after_is_never_shown_as_zero_while_there_is_a_wait():
    assert [formatting.retry_text(value) for value in (None, 0.0, 0.001, 0.04, 0.1, 0.11, 29.96)] == [
        "-",
        "next call",
        "0.1 s",
        "0.1 s",
        "0.1 s",
        "0.2 s",
        "30.0 s",
    ]


def test_status_reads_the_window_with_the_workers_bucket_count(url, prefix, clock):
    """Read with the default config (1 s buckets) this window would be empty;
    read with the right width but 10 buckets instead of 5, it would slide out
    a second late. The app and the command read one test clock: on Redis time
    a stall of the test could slide the window before the first read, or past a
    wrong window's end before the second."""
    app = Breakers.from_url(url, prefix, listen=False, batch_successes=False, clock=clock)
    commands = cli.command_group(
        "breaker-redis", lambda: cli.Target(client_from_url(url), prefix, clock=clock)
    )
    try:
        short = app.get("short", BreakerConfig(trip="count", window_seconds=1, window_buckets=5))
        outcomes(short, successes=1, failures=2)
        assert rows(CliRunner().invoke(commands, ["status"]).stdout)["short"][1] == "2/3"
        clock.advance(1250)  # every 200 ms bucket has slid out of the 1 s window (not of a 2 s one)
        assert rows(CliRunner().invoke(commands, ["status"]).stdout)["short"][1:3] == ["0/0", "-"]
    finally:
        app.close()


def test_status_follows_a_live_override_of_the_window(url, prefix, app_breakers):
    pay = app_breakers.get("pay", COUNT_3)
    assert run(url, prefix, "config", "pay", "--create", "window_buckets=3").exit_code == 0
    outcomes(pay, successes=1, failures=1)  # written as 3 buckets of 20 s
    assert rows(run(url, prefix, "status").stdout)["pay"][1] == "1/2"


def test_status_without_breakers(url, prefix):
    result = run(url, prefix, "status")
    assert result.exit_code == 0
    assert f"no breakers under prefix {prefix!r}" in result.stdout
    assert json.loads(run(url, prefix, "status", "--json").stdout) == []


# -- show -------------------------------------------------------------------------


def test_show_an_override_and_the_last_transitions(url, prefix, app_breakers, client):
    pay = app_breakers.get("pay", COUNT_3)
    outcomes(pay, successes=1, failures=3)
    assert run(url, prefix, "config", "pay", "failure_threshold=4").exit_code == 0
    # written by hand, as redis-cli could: one the scripts skip, one they clamp to BreakerConfig's bounds
    client.hset(f"{prefix}:{{pay}}:config", mapping={"open_seconds": "soon", "failure_rate": "1.5"})
    for _ in range(6):
        pay.reset()

    result = run(url, prefix, "show", "pay")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "state        closed" in out
    assert "counters     calls 4 (successes 1, failures 3, ignored 0)" in out
    assert "trips 1" in out
    assert "probes       0 in flight" in out
    lines = {line.split("=")[0].strip(): line for line in out.splitlines() if " = " in line}
    assert lines["failure_threshold"].endswith("live override")
    assert "IGNORED by the scripts" in lines["open_seconds"]
    assert lines["open_seconds"].endswith("IGNORED by the scripts: not a number")
    assert lines["failure_rate"].endswith("live override, clamped to 1, the highest BreakerConfig allows")
    # the config in force: the worker's own (written with the state) and what the overrides change
    table = {
        line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and " = " not in line
    }
    assert table["failure_threshold"].split(None, 1)[1] == "4         live override (the worker's own: 3)"
    assert table["failure_rate"].split(None, 1)[1] == "1         live override (the worker's own: 0.5)"
    assert table["open_seconds"].split()[1:] == ["30"]  # 'soon' is skipped: the worker's own stays
    assert table["trip"].split()[1:] == ["count"]
    assert pay.snapshot()["config"]["failure_threshold"] == 4  # the same from the API
    transitions = [line for line in out.splitlines() if " -> " in line]
    assert len(transitions) == 7
    assert "closed -> closed  cause=reset" in transitions[0]  # newest first
    assert "closed -> open  cause=count" in transitions[-1]


def test_show_and_status_read_a_count_window_even_without_the_workers_config(
    url, prefix, app_breakers, client
):
    """window_calls: `show` names the window's size; with no config written (the cfg key
    gone) the readers read the ring by the size in the window hash, as a time window by
    its shape."""
    last = app_breakers.get("last", BreakerConfig(trip="rate", minimum_calls=50, window_calls=8))
    outcomes(last, successes=9, failures=2)  # the last 8: 6 successes, 2 failures
    out = run(url, prefix, "show", "last").stdout
    assert (
        "window       2 failures / 8 calls (25.0%), 0 slow; the last 8 calls, as the workers last wrote it"
        in out
    )
    assert "window_calls" in out and " 8" in next(line for line in out.splitlines() if "window_calls" in line)
    client.delete(f"{prefix}:{{last}}:cfg")
    status = run(url, prefix, "status").stdout
    assert "2/8" in next(line for line in status.splitlines() if line.startswith("last"))


def test_show_keeps_to_the_last_ten_transitions(url, prefix, app_breakers):
    pay = app_breakers.get("pay", COUNT_3)
    for _ in range(12):
        pay.reset()
    out = run(url, prefix, "show", "pay").stdout
    assert len([line for line in out.splitlines() if " -> " in line]) == 10


def test_show_says_when_no_worker_has_written_its_config(url, prefix, client):
    assert run(url, prefix, "reset", "fresh", "--create").exit_code == 0  # listed, never called
    out = run(url, prefix, "show", "fresh").stdout
    assert "config in force: no worker has written its config yet" in out
    client.set(f"{prefix}:{{fresh}}:cfg", "not json")  # a corrupted one reads the same way
    assert "no worker has written its config yet" in run(url, prefix, "show", "fresh").stdout


def test_show_an_unknown_breaker_exits_1(url, prefix):
    result = run(url, prefix, "show", "nope")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "unknown breaker 'nope'" in result.stderr
    assert "Traceback" not in result.output


# -- switches ---------------------------------------------------------------------


@pytest.fixture(params=["real", "embedded"])
def server_url(request: pytest.FixtureRequest) -> str:
    server = request.getfixturevalue("redis_server" if request.param == "real" else "embedded")
    return str(server.url)


def test_switches_reach_a_worker_deciding_from_memory(server_url, prefix):
    # Timeouts that only catch a hang, for the worker and the commands: the embedded server
    # answers from threads of this test's process, and a busy machine can hold a reply past
    # the 0.25 s a worker waits by default (the worker then decides alone and the command
    # finds no breaker 'pay') or the 0.5 s a command waits.
    client = redis.Redis.from_url(server_url, socket_timeout=10, socket_connect_timeout=10)
    worker = Breakers(client, prefix)  # listening: admits from what it knows

    def switch(*args: str) -> Result:
        return run(server_url, prefix, "--timeout", "10", *args)

    try:
        pay = worker.get("pay", COUNT_3)
        subscribed([worker])
        assert admits(pay) and admits(pay)

        result = switch("open", "pay")
        assert (result.exit_code, result.stdout) == (0, "pay: open (forced)\n"), result.output
        assert not admits(pay)  # at its very next call

        assert switch("close", "pay").stdout == "pay: closed (forced)\n"
        assert admits(pay)
        assert pay.snapshot()["forced"] == "closed"
        outcomes(pay, failures=5)  # forced closed never trips
        assert admits(pay)

        assert switch("auto", "pay").stdout == "pay: closed\n"
        assert pay.snapshot()["forced"] is None
        outcomes(pay, failures=3)
        assert not admits(pay)  # back to the rules: tripped

        assert switch("reset", "pay").stdout == "pay: closed\n"
        assert admits(pay)
        assert switch("auto", "pay").stdout == "pay: closed (it was not forced: unchanged)\n"
    finally:
        worker.close()
        client.close()


def test_switching_an_unknown_breaker_exits_1_unless_created(url, prefix):
    result = run(url, prefix, "open", "later")
    assert result.exit_code == 1
    assert "unknown breaker 'later'" in result.stderr
    assert "later" not in run(url, prefix, "status").stdout

    result = run(url, prefix, "open", "later", "--create")
    assert (result.exit_code, result.stdout) == (0, "later: open (forced)\n")
    assert rows(run(url, prefix, "status").stdout)["later"][0] == "open (forced)"


def test_the_options_may_follow_the_command(url, prefix):
    """`breaker-redis doctor --url ...`, as operators type it: the same as before the command."""
    assert run(url, prefix, "open", "pay", "--create").exit_code == 0
    before = run(url, prefix, "show", "pay")
    args = ["show", "pay", "--url", url, f"--prefix={prefix}", "--timeout", "3"]
    after = CliRunner().invoke(cli.main, args)
    assert (after.exit_code, after.stdout) == (0, before.stdout)
    assert "open (forced)" in after.stdout
    bad = CliRunner().invoke(cli.main, ["status", "--url", "nope://127.0.0.1"])
    assert bad.exit_code == 2 and "--url" in bad.stderr
    # a command's own options and arguments stay where they are, and nothing after --
    args = ["config", "pay", "--unset", "open_seconds", "--url", "u", "--", "--prefix", "p"]
    assert cli.group_options_first(args, cli.main.params) == [
        "--url",
        "u",
        "config",
        "pay",
        "--unset",
        "open_seconds",
        "--",
        "--prefix",
        "p",
    ]


# -- config -----------------------------------------------------------------------


def test_config_writes_overrides_every_worker_applies(url, prefix, app_breakers, client):
    pay = app_breakers.get("pay", COUNT_3)
    outcomes(pay, successes=1)
    result = run(url, prefix, "config", "pay", "failure_threshold=1", "open_seconds=90")
    assert (result.exit_code, result.stdout) == (0, "pay: failure_threshold=1, open_seconds=90\n")
    assert client.hgetall(f"{prefix}:{{pay}}:config") == {"failure_threshold": "1", "open_seconds": "90"}
    outcomes(pay, failures=1)
    assert 88 < pay.snapshot()["retry_after"] <= 90  # tripped at one failure, open for 90 s

    assert run(url, prefix, "config", "pay").stdout == "pay: failure_threshold=1, open_seconds=90\n"
    result = run(url, prefix, "config", "pay", "--unset", "open_seconds")
    assert (result.exit_code, result.stdout) == (0, "pay: failure_threshold=1\n")
    result = run(url, prefix, "config", "pay", "--unset", "failure_threshold")
    assert (result.exit_code, result.stdout) == (0, "pay: no live overrides\n")
    assert client.exists(f"{prefix}:{{pay}}:config") == 0


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["failure_rate=1.5"], "BreakerConfig.failure_rate must be > 0 and <= 1 (got 1.5)"),
        (["failure_threshold=three"], "BreakerConfig.failure_threshold must be an integer"),
        (["trip=sometimes"], "BreakerConfig.trip must be one of consecutive, count, rate"),
        (["failure_threshold=2", "colour=blue"], "unknown config field 'colour'"),
        (["--unset", "colour"], "unknown config field 'colour'"),
        # valid alone, not with the override already in force (open_seconds=100)
        (["max_open_seconds=50"], "BreakerConfig.max_open_seconds must be >= open_seconds"),
    ],
)
def test_config_with_a_bad_value_exits_2_names_the_field_and_writes_nothing(
    url, prefix, app_breakers, client, args, field
):
    outcomes(app_breakers.get("pay", COUNT_3), successes=1)
    assert run(url, prefix, "config", "pay", "open_seconds=100").exit_code == 0
    before = client.hgetall(f"{prefix}:{{pay}}:config")
    with client.pubsub() as pubsub:
        pubsub.subscribe(f"{prefix}:events")
        wait_until(lambda: pubsub.get_message(timeout=0.1), 10, "the subscription's confirmation")

        result = run(url, prefix, "config", "pay", *args)
        assert result.exit_code == 2, result.output
        assert field in result.stderr
        assert result.stdout == ""
        assert "Traceback" not in result.output
        assert client.hgetall(f"{prefix}:{{pay}}:config") == before
        assert pubsub.get_message(timeout=0.2) is None  # no config message either


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["failure_threshold"], "'failure_threshold' is not KEY=VALUE"),
        (["=3"], "'=3' is not KEY=VALUE"),
        (["failure_threshold="], "--unset failure_threshold removes an override"),
        (["failure_threshold=3", "failure_threshold=4"], "failure_threshold is given twice"),
        (["failure_threshold=3", "--unset", "failure_threshold"], "both set and unset"),
    ],
)
def test_config_usage_errors_exit_2(url, prefix, app_breakers, client, args, message):
    outcomes(app_breakers.get("pay", COUNT_3), successes=1)
    result = run(url, prefix, "config", "pay", *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert client.exists(f"{prefix}:{{pay}}:config") == 0


def test_config_of_an_unknown_breaker_exits_1_and_writes_nothing(url, prefix, client):
    result = run(url, prefix, "config", "ghost", "failure_threshold=3")
    assert result.exit_code == 1
    assert "unknown breaker 'ghost'" in result.stderr
    assert client.exists(f"{prefix}:{{ghost}}:config") == 0


# -- usage and unreachable Redis -----------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prefix", "no spaces", "status"], "invalid key prefix"),
        (["--url", "http://127.0.0.1:6379", "status"], "unsupported Redis URL"),
        (["--url", "memory://", "status"], "memory:// is a store inside one process"),
        (["show", "a b"], "invalid breaker name 'a b'"),
        (["open", "{pay}"], "invalid breaker name '{pay}'"),
        (["events", "a\tb"], "invalid breaker name"),
        (["watch", "--interval", "0"], "--interval"),
        (["nosuchcommand"], "No such command"),
    ],
)
def test_usage_errors_exit_2(url, args, message):
    result = CliRunner().invoke(cli.main, ["--url", url, *args] if args[0] != "--url" else args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["status", "--json"],
        ["watch", "--count", "1"],
        ["show", "pay"],
        ["open", "pay"],
        ["reset", "pay", "--create"],
        ["release", "pool", "pay"],
        ["config", "pay", "failure_threshold=3"],
        ["events"],
        ["events", "pay", "--follow", "--max-events", "1"],
    ],
)
def test_unreachable_redis_exits_1_with_a_message(args):
    port = free_port()  # nothing listens there
    result = CliRunner().invoke(cli.main, ["--url", f"redis://127.0.0.1:{port}/0", *args])
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"Error: cannot reach Redis at 127.0.0.1:{port}/0:")
    assert "Traceback" not in result.output
    assert result.stdout == ""


@pytest.fixture(params=["stopped", "hung"])
def dead_redis(request) -> Iterator[RedisServer]:
    """A real redis-server that was stopped (nothing listens: refused at once)
    or is SIGSTOPped (the kernel accepts the connection, nothing answers)."""
    server = RedisServer().start()
    assert server.process is not None
    pid = server.process.pid
    if request.param == "stopped":
        server.stop()
    else:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield server
    finally:
        if request.param == "hung":
            os.kill(pid, signal.SIGCONT)
        server.stop()


def _one_clear_line(stderr: str, server: RedisServer, hung: bool) -> None:
    assert stderr.endswith("\n") and stderr.count("\n") == 1, stderr
    assert stderr.startswith(f"Error: cannot reach Redis at 127.0.0.1:{server.port}/0: "), stderr
    if hung:
        assert stderr.endswith("(no answer within 0.5 s; --timeout waits longer)\n"), stderr
    else:
        assert "Connection refused" in stderr, stderr


@pytest.mark.parametrize(
    "args", [["status"], ["status", "--json"], ["metrics"], ["show", "pay"], ["open", "pay"], ["events"]]
)
@pytest.mark.processes
def test_a_dead_redis_fails_the_command_within_a_second(dead_redis, args, monkeypatch):
    """Within a second by construction, not by the machine's pace (tests/support/redis_waits.py):
    one connection, both timeouts at half a second, and on a hung server one reply waited
    for (it took 5 s when its client waited 5)."""
    install(waits := Waits(), monkeypatch.setattr)
    result = CliRunner().invoke(cli.main, ["--url", dead_redis.url, *args])
    hung = dead_redis.process is not None
    assert result.exit_code == 1, result.output
    _one_clear_line(result.stderr, dead_redis, hung=hung)
    assert result.stdout == ""
    assert waits == Waits([(0.5, 0.5)], 1 if hung else 0)


@pytest.mark.processes
def test_the_console_script_gives_up_on_a_dead_redis_within_a_second(dead_redis, tmp_path):
    """The installed command waits half a second for a dead Redis, not the 5 s it once
    did: counted in its own process as in the test above, not timed (its interpreter's
    start alone took from 0.4 s to over 2 s, as the machine was busy)."""
    hung = dead_redis.process is not None
    counts = tmp_path / "waits.json"
    done = subprocess.run(
        [str(SCRIPT), "--url", dead_redis.url, "status"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=sitecustomize_in(tmp_path, ROOT, counts),
    )
    assert done.returncode == 1, done.stderr
    _one_clear_line(done.stderr, dead_redis, hung=hung)
    assert done.stdout == ""
    assert read_waits(counts) == Waits([(0.5, 0.5)], 1 if hung else 0)


def test_the_timeout_comes_from_the_option_then_the_url_then_half_a_second():
    plain, own = "redis://127.0.0.1:1/0", "redis://127.0.0.1:1/0?socket_timeout=0.2"
    assert cli._timeouts(plain, None) == {"socket_connect_timeout": 0.5, "socket_timeout": 0.5}
    assert cli._timeouts(own, None) == {"socket_connect_timeout": 0.5, "socket_timeout": 0.2}
    assert cli._timeouts(own, 2.0) == {"socket_connect_timeout": 2.0, "socket_timeout": 2.0}
    result = CliRunner().invoke(cli.main, ["--timeout", "0", "status"])
    assert result.exit_code == 2 and "--timeout" in result.stderr


def test_validation_comes_before_reaching_redis():
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = CliRunner().invoke(cli.main, ["--url", url, "config", "pay", "failure_rate=7"])
    assert result.exit_code == 2
    assert "BreakerConfig.failure_rate" in result.stderr


def test_the_url_and_prefix_come_from_the_environment(url, prefix, app_breakers):
    outcomes(app_breakers.get("pay", COUNT_3), successes=1)
    env = {"BREAKER_REDIS_URL": url, "BREAKER_KEY_PREFIX": prefix}
    result = CliRunner(env=env).invoke(cli.main, ["status"])
    assert result.exit_code == 0
    assert "pay" in rows(result.stdout)


# -- watch ------------------------------------------------------------------------


def test_watch_refreshes_and_highlights_a_state_change(url, prefix, app_breakers):
    pay = app_breakers.get("pay", COUNT_3)
    outcomes(pay, successes=1)
    outcomes(app_breakers.get("other"), successes=1)
    sleeps: list[float] = []

    def between_refreshes(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 1:
            outcomes(pay, failures=3)  # trips between the first and the second refresh

    args = ("watch", "--interval", "0.5", "--count", "3")
    result = run_sleeping(url, prefix, between_refreshes, *args, color=True)
    assert result.exit_code == 0, result.output
    assert sleeps == [0.5, 0.5]
    frames = result.stdout.split("breaker-redis watch: ")[1:]
    assert len(frames) == 3
    assert "changed:" not in frames[0]
    for frame in frames[1:]:  # highlighted while the change is recent
        assert "changed: pay closed -> open at " in frame
        (pay_line,) = [line for line in frame.splitlines() if line.startswith("\x1b[7mpay")]
        assert "open" in pay_line
        assert not any(line.startswith("\x1b[7mother") for line in frame.splitlines())


def test_watch_stops_on_ctrl_c_with_exit_0(url, prefix, app_breakers):
    outcomes(app_breakers.get("pay", COUNT_3), successes=1)

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    result = run_sleeping(url, prefix, interrupted, "watch")
    assert result.exit_code == 0
    assert "pay" in result.stdout


@pytest.mark.processes
def test_watch_goes_on_when_redis_stops_answering_after_the_first_refresh(prefix):
    server = RedisServer().start()
    try:
        workers = Breakers.from_url(server.url, prefix, listen=False, batch_successes=False)
        outcomes(workers.get("pay", COUNT_3), successes=1)
        workers.close()
        result = run_sleeping(server.url, prefix, lambda seconds: server.stop(), "watch", "--count", "3")
    finally:
        server.stop()
    assert result.exit_code == 0, result.output
    frames = result.stdout.split("breaker-redis watch: ")[1:]
    assert "pay" in rows(frames[0].split("\n", 2)[2])
    for frame in frames[1:]:
        assert f"Redis at 127.0.0.1:{server.port}/0 does not answer" in frame
        assert "retrying" in frame


# -- events -----------------------------------------------------------------------


def test_events_history_of_one_and_of_all_breakers(url, prefix, app_breakers):
    pay, inventory = app_breakers.get("pay", COUNT_3), app_breakers.get("inventory")
    outcomes(inventory, successes=1)  # its first call lists it (names set)
    outcomes(pay, failures=3)  # closed -> open
    time.sleep(0.005)  # breakers are merged by Redis time, in ms: one ms apart at least
    inventory.force_open()
    time.sleep(0.005)
    pay.reset()

    lines = run(url, prefix, "events").stdout.splitlines()
    assert [line.split("  ")[1:3] for line in lines] == [
        ["pay", "closed -> open"],
        ["inventory", "closed -> open"],
        ["pay", "open -> closed"],
    ]
    assert "cause=count" in lines[0] and "open_until=" in lines[0]
    assert "cause=forced_open" in lines[1] and "forced=open" in lines[1]

    lines = run(url, prefix, "events", "pay").stdout.splitlines()
    assert [line.split("  ")[2] for line in lines] == ["closed -> open", "open -> closed"]
    assert run(url, prefix, "events", "pay", "-n", "1").stdout.count("\n") == 1
    unknown = run(url, prefix, "events", "nobody")
    assert (unknown.exit_code, unknown.stdout) == (0, "")


def follow(tmp_path, url: str, prefix: str, *args: str) -> tuple[subprocess.Popen[str], Path]:
    """The console script following events, once it says it has subscribed; its stderr file."""
    stderr = tmp_path / "stderr"
    with stderr.open("w") as err:
        argv = [str(SCRIPT), "--url", url, "--prefix", prefix, *args]
        follower = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        wait_until(lambda: "following" in stderr.read_text(), timeout=10, what="the follower to subscribe")
    except BaseException:
        follower.kill()
        raise
    return follower, stderr


def test_events_follow_prints_history_then_live_events(url, prefix, app_breakers, tmp_path):
    pay = app_breakers.get("pay", BreakerConfig(trip="rate", minimum_calls=3, failure_rate=0.5))
    pay.force_open()
    follower, stderr = follow(tmp_path, url, prefix, "events", "pay", "--follow", "--max-events", "3")
    try:
        pay.reset()  # a transition
        outcomes(pay, successes=1, failures=1)  # arms the rate rule: not shown without --verbose
        app_breakers.configure("pay", minimum_calls=10)  # a config write
        app_breakers.get("inventory").force_open()  # another breaker: not shown
        outcomes(pay, failures=2)  # 3 failures in 4 calls, minimum 10: no trip
        pay.force_open()
        out, _ = follower.communicate(timeout=10)
    finally:
        follower.kill()
    assert follower.returncode == 0, stderr.read_text()
    lines = out.splitlines()
    assert len(lines) == 4, out
    assert "pay  closed -> open  cause=forced_open" in lines[0]  # history
    assert "pay  open -> closed  cause=reset" in lines[1]
    assert "pay  config written: minimum_calls=10" in lines[2]
    assert "pay  closed -> open  cause=forced_open" in lines[3]
    assert "armed" not in out and "inventory" not in out


def test_events_follow_reads_forged_messages_without_failing(url, prefix, app_breakers, client, tmp_path):
    """Anyone may publish on the channel: a message no script writes (Infinity, NaN, 1e999,
    nesting past the JSON decoder's recursion) is shown with what it holds that a script
    could write, or dropped when it names no breaker; the follower goes on to the real ones."""
    pay = app_breakers.get("pay", BreakerConfig(trip="consecutive", failure_threshold=5))
    follower, stderr = follow(tmp_path, url, prefix, "events", "pay", "--follow", "--max-events", "2")
    try:
        channel = f"{prefix}:events"
        client.publish(channel, "[" * 100_000 + "]" * 100_000)
        client.publish(channel, '{"name": Infinity, "kind": "transition"}')
        forged = (
            '{"name": "pay", "kind": "transition", "from": "closed", "to": "open", "db": 0, '
            '"cause": "forged", "epoch": 1e999, "born": Infinity, "open_until": Infinity, "at": NaN}'
        )
        client.publish(channel, forged)
        pay.force_open()
        out, _ = follower.communicate(timeout=10)
    finally:
        follower.kill()
    assert follower.returncode == 0, stderr.read_text()
    lines = out.splitlines()
    assert len(lines) == 2, out
    assert lines[0].endswith("  pay  closed -> open  cause=forged epoch=None")
    assert "pay  closed -> open  cause=forced_open" in lines[1]


def test_events_follow_verbose_shows_arming(url, prefix, app_breakers, tmp_path):
    pay = app_breakers.get("pay", BreakerConfig(trip="consecutive", failure_threshold=5))
    outcomes(pay, successes=1)
    follower, _ = follow(tmp_path, url, prefix, "events", "-f", "-v", "--max-events", "1")
    try:
        outcomes(pay, failures=1)  # a failure arms the consecutive rule
        out, _ = follower.communicate(timeout=10)
    finally:
        follower.kill()
    assert follower.returncode == 0
    assert "pay  armed" in out


# -- entry points ------------------------------------------------------------------


@pytest.mark.processes
def test_the_console_script_and_the_module_run_from_the_venv():
    for argv in ([str(SCRIPT), "--help"], [sys.executable, "-m", "breaker_redis.ops.cli", "--help"]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("Usage: breaker-redis [OPTIONS] COMMAND [ARGS]...")
        for command in (
            "status",
            "watch",
            "show",
            "open",
            "close",
            "auto",
            "reset",
            "release",
            "config",
            "events",
        ):
            assert f"\n  {command} " in done.stdout


@pytest.mark.parametrize(
    "command", ["status", "watch", "show", "open", "close", "auto", "reset", "release", "config", "events"]
)
def test_every_command_has_help(command):
    result = CliRunner().invoke(cli.main, [command, "--help"])
    assert result.exit_code == 0
    assert result.stdout.startswith(f"Usage: breaker-redis {command} [OPTIONS]")


@pytest.mark.processes
def test_the_cli_never_imports_flask():
    program = (
        "import sys, breaker_redis.ops.cli\n"
        "assert 'flask' not in sys.modules and 'werkzeug' not in sys.modules, sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", program], cwd=ROOT, check=True)


# -- flask breakers ...----------------------------------------------------------------


def test_flask_breakers_runs_the_same_commands_on_the_apps_redis_and_prefix(url, prefix, app_breakers):
    app = Flask(__name__)
    app.config.update(BREAKER_REDIS_URL=url, BREAKER_KEY_PREFIX=prefix)
    extension = FlaskBreakers(app)
    with app.app_context():
        pay = extension.breaker("pay", trip="count", failure_threshold=2)
        outcomes(pay, failures=2)
    outcomes(app_breakers.get("other"), successes=1)  # same prefix, another process
    elsewhere = Breakers.from_url(url, prefix + "x", listen=False)
    outcomes(elsewhere.get("hidden"), successes=1)  # another prefix: not this app's
    elsewhere.close()

    runner = app.test_cli_runner()
    result = runner.invoke(args=["breakers", "status"])
    assert result.exit_code == 0, result.output
    table = rows(result.stdout)
    assert sorted(table) == ["other", "pay"]
    assert table["pay"][:2] == ["open", "2/2"]

    result = runner.invoke(args=["breakers", "reset", "pay"])
    assert (result.exit_code, result.stdout) == (0, "pay: closed\n")
    with app.app_context():
        assert extension.breaker("pay").snapshot()["state"] == "closed"

    result = runner.invoke(args=["breakers", "config", "pay", "failure_rate=2"])
    assert result.exit_code == 2
    assert "BreakerConfig.failure_rate" in result.stderr
    result = runner.invoke(args=["breakers", "show", "nope"])
    assert result.exit_code == 1
    assert "unknown breaker 'nope'" in result.stderr
    assert "Exit codes" in runner.invoke(args=["breakers", "--help"]).stdout
    extension.breakers.close()


def test_flask_breakers_with_redis_down_exits_1():
    app = Flask(__name__)
    app.config.update(BREAKER_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    FlaskBreakers(app)
    result = app.test_cli_runner().invoke(args=["breakers", "status"])
    assert result.exit_code == 1
    assert "cannot reach Redis at 127.0.0.1:" in result.stderr
    assert "Traceback" not in result.output


def test_flask_breakers_knows_the_breakers_the_app_declares_before_their_first_call(url, prefix):
    """`flask breakers open pay` works for a breaker the app declares (protect, a bare
    BREAKER_ROUTES name, breaker()) but never called, as POST /_breakers/pay/open does;
    `breaker-redis open pay`, which knows no app, still asks for --create."""
    app = Flask(__name__)
    app.config.update(
        BREAKER_REDIS_URL=url,
        BREAKER_KEY_PREFIX=prefix,
        BREAKER_ROUTES={"/cart": "cart"},
        BREAKER_ADMIN_TOKEN="t",
    )
    extension = FlaskBreakers(app)

    @app.post("/pay")
    @extension.protect("pay")
    def pay():
        return "ok"

    assert run(url, prefix, "open", "pay").exit_code == 1  # no app: Redis does not know it yet
    runner = app.test_cli_runner()
    result = runner.invoke(args=["breakers", "open", "pay"])
    assert (result.exit_code, result.stdout) == (0, "pay: open (forced)\n"), result.output
    result = runner.invoke(args=["breakers", "show", "cart"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1].split() == ["state", "closed"]
    result = runner.invoke(args=["breakers", "config", "cart", "failure_threshold=2"])
    assert (result.exit_code, result.stdout) == (0, "cart: failure_threshold=2\n"), result.output
    result = runner.invoke(args=["breakers", "open", "nope"])
    assert result.exit_code == 1 and "unknown breaker 'nope'" in result.stderr
    # the admin endpoint agrees, for the bare route name too
    answer = app.test_client().post("/_breakers/cart/open", headers={"Authorization": "Bearer t"})
    assert answer.status_code == 200 and answer.get_json()["forced"] == "open"
    # and from now on Redis knows them: the app-less command sees them
    assert rows(run(url, prefix, "status").stdout).keys() == {"cart", "pay"}
    assert run(url, prefix, "close", "pay").exit_code == 0
    extension.breakers.close()
