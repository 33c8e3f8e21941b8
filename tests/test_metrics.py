"""Prometheus metrics read from Redis (breaker_redis.metrics), parsed with
prometheus_client's own parser: from the collector, the CLI and the Flask
extension, across a trip and a recovery."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import fakeredis
import pytest
import requests
from click.testing import CliRunner
from flask import Flask
from prometheus_client import CollectorRegistry, generate_latest

from breaker_redis import BreakerConfig, BreakerOpen, Breakers
from breaker_redis.flask import FlaskBreakers
from breaker_redis.groups import BreakerGroup
from breaker_redis.metrics import BreakerCollector, Family, exposition, render
from breaker_redis.ops import cli
from tests.support.clock import Clock
from tests.support.prometheus import of, samples
from tests.support.redis_server import free_port, wait_until
from tests.support.workers import TRIP_AT_3, fail

ROOT = Path(__file__).resolve().parent.parent
RECOVERS = BreakerConfig(trip="consecutive", failure_threshold=3, open_seconds=10, half_open_successes=1)


def states(found, breaker: str) -> list[float]:
    """breaker_redis_state for closed, open, half_open."""
    return [of(found, "breaker_redis_state", breaker, state=s) for s in ("closed", "open", "half_open")]


def test_every_metric_across_a_trip_and_a_recovery(redis_server):
    client = redis_server.client()
    client.flushall()
    seconds, micros = client.time()
    clock = Clock(start=seconds * 1000 + micros // 1000)  # a scrape reads the window at Redis time
    breakers = Breakers(client, clock=clock, listen=False)
    pay, cart = breakers.get("pay", RECOVERS), breakers.get("cart", RECOVERS)
    cart.acquire().success()
    fail(pay, 3)
    with pytest.raises(BreakerOpen):
        pay.acquire()
    pay.flush_batch()
    found = samples(exposition(client).decode())
    assert found[("breaker_redis_up", ())] == 1
    assert states(found, "pay") == [0, 1, 0]
    assert of(found, "breaker_redis_state", "cart", state="closed") == 1
    assert of(found, "breaker_redis_calls_total", "pay", outcome="failure") == 3
    assert of(found, "breaker_redis_calls_total", "cart", outcome="success") == 1
    assert of(found, "breaker_redis_trips_total", "pay") == 1
    assert of(found, "breaker_redis_rejected_total", "pay") == 1
    assert of(found, "breaker_redis_window_failures", "pay") == 3
    assert of(found, "breaker_redis_window_calls", "pay") == 3
    assert of(found, "breaker_redis_slow_calls_total", "pay") == 0
    assert of(found, "breaker_redis_forced", "pay") == 0
    assert 0 < of(found, "breaker_redis_retry_after_seconds", "pay") <= 10
    assert of(found, "breaker_redis_state_lost_total", "pay") == 0

    clock.advance(10_000)
    pay.acquire().success()  # the probe closes it
    found = samples(exposition(client).decode())
    assert states(found, "pay") == [1, 0, 0]
    assert of(found, "breaker_redis_calls_total", "pay", outcome="success") == 1
    assert of(found, "breaker_redis_retry_after_seconds", "pay") == 0
    pay.force_open()
    found = samples(exposition(client).decode())
    assert of(found, "breaker_redis_forced", "pay") == 1
    breakers.close()


def test_a_scrape_with_redis_down_says_so_instead_of_failing():
    server = fakeredis.FakeServer()
    client = fakeredis.FakeRedis(server=server)
    Breakers(client, listen=False).get("pay").acquire().failure()
    server.connected = False
    found = samples(exposition(client).decode())
    assert found == {
        ("breaker_redis_up", ()): 0.0,
        ("breaker_redis_up_error", (("missing", ""), ("reason", "unavailable"))): 1.0,
    }


def test_a_ramping_breaker_shows_the_share_it_admits(redis_server):
    """After a close with ramp_seconds the scrape reads the share admitted at Redis time: a
    ramp of an hour from 0.25 has barely moved in the seconds the test takes."""
    client = redis_server.client()
    client.flushall()
    breakers = Breakers(client, listen=False)
    ramp = BreakerConfig(failure_threshold=3, ramp_seconds=3600, ramp_from=0.25)
    pay, cart = breakers.get("pay", ramp), breakers.get("cart", ramp)
    cart.acquire().success()
    fail(pay, 3)
    pay.reset()  # closing a breaker that refused calls starts the ramp
    found = samples(exposition(client).decode())
    assert 0.25 <= of(found, "breaker_redis_ramp_share", "pay") < 0.26
    assert of(found, "breaker_redis_ramp_share", "cart") == 1
    breakers.close()


def written_by_prometheus_client(collector: BreakerCollector, families: list) -> bytes:
    """generate_latest of a registry holding the collector, scraping ``families``."""
    collector.families = lambda: families  # type: ignore[method-assign]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)


def test_the_exposition_is_byte_for_byte_what_prometheus_client_writes(redis_server):
    """exposition() writes the text format itself (metrics.render), not through
    generate_latest: for names whose label values need escaping or hold '%', reporters'
    series, a group, an open breaker's retry_after, a counter written with an exponent,
    values of every kind of float, and the families of a scrape that cannot read Redis,
    the bytes are the ones generate_latest writes of the collector's families."""
    client = redis_server.client()
    client.flushall()
    quorum = BreakerConfig(trip="count", failure_threshold=5, open_seconds=30, min_reporters=2)
    made = [Breakers(client, listen=False, reporter=name) for name in ("web-a", "web-b")]
    web_a = made[0]
    names = ['say"hi"', "back\\slash", "ünïcode/v1/pay", "100%s%d"]
    for name in names:
        fail(web_a.get(name, TRIP_AT_3), 3)  # open: retry_after just under 30 s
    for _ in range(5):
        web_a.get("pay", quorum).acquire().failure()  # web-a isolated, failing
    made[1].get("pay", quorum).acquire().success()
    pool = BreakerGroup(web_a, "pool", ["pool-a", "pool-b"])
    pool.settle()  # joins: the group is listed
    client.hset('breaker:{say"hi"}:stats', "trips", 123456789)
    for breakers in made:
        breakers.close()
    collector = BreakerCollector(client)
    floats = [0.1, 2.5e-07, 1e6, 12345678.9, 1e22, -3.0, float("inf"), float("-inf"), float("nan"), 7]
    families = [
        *collector.families(),
        Family(
            "breaker_redis_floats",
            "gauge",
            'a \\ "help"\nover two lines',
            ("zz", "breaker", "outcome"),
            [("z", f"b{i}", "o\n", value) for i, value in enumerate(floats)],
        ),
    ]
    text = render(families)
    assert text == written_by_prometheus_client(collector, families)
    decoded = text.decode()
    for line in (
        'breaker_redis_trips_total{breaker="say\\"hi\\""} 1.23456789e+08',
        'breaker_redis_trips_total{breaker="back\\\\slash"} 1.0',
        'breaker_redis_state{breaker="100%s%d",state="open"} 1.0',
        'breaker_redis_reporter_failures{breaker="pay",reporter="web-a"} 5.0',
        'breaker_redis_group_members{group="pool"} 2.0',
        '# HELP breaker_redis_floats a \\\\ "help"\\nover two lines',
        'breaker_redis_floats{breaker="b3",outcome="o\\n",zz="z"} 1.23456789e+07',
        'breaker_redis_floats{breaker="b8",outcome="o\\n",zz="z"} NaN',
    ):
        assert f"\n{line}\n" in decoded
    retry_after = of(samples(decoded), "breaker_redis_retry_after_seconds", "ünïcode/v1/pay")
    assert 0 < retry_after <= 30
    assert samples(exposition(client).decode()).keys() == samples(render(families[:-1]).decode()).keys()

    server = fakeredis.FakeServer()
    server.connected = False
    down = BreakerCollector(fakeredis.FakeRedis(server=server))
    families = down.families()
    assert [family.name for family in families] == ["breaker_redis_up", "breaker_redis_up_error"]
    assert render(families) == written_by_prometheus_client(down, families)


def test_a_scrape_refused_a_permission_names_it(redis_server, caplog):
    """A user without +time (the scripts' clock): breaker_redis_up 0, and why, and one
    ERROR with the rule to grant, however many scrapes."""
    from breaker_redis.storage import acl

    admin = redis_server.client()
    admin.flushall()
    Breakers(admin, listen=False).get("pay").acquire().failure()
    rules = acl.setuser_line().split(" ", 3)[3].replace(">PASSWORD", ">secret").replace(" +time", "")
    admin.execute_command("ACL", "SETUSER", "scraper", "reset", *rules.split())
    scraper = redis_server.client(username="scraper", password="secret")
    try:
        for _ in range(3):
            found = samples(exposition(scraper).decode())
        assert found == {
            ("breaker_redis_up", ()): 0.0,
            ("breaker_redis_up_error", (("missing", "+time"), ("reason", "permission"))): 1.0,
        }
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and "ACL SETUSER scraper +time" in errors[0]
        admin.execute_command("ACL", "SETUSER", "scraper", "+time")
        found = samples(exposition(scraper).decode())
        assert found[("breaker_redis_up", ())] == 1
        assert of(found, "breaker_redis_state_lost_total", "pay") == 0
    finally:
        admin.execute_command("ACL", "DELUSER", "scraper")


def test_a_scrape_with_no_breaker_listed_still_names_a_missing_permission(redis_server):
    """The workers of a user without +time list no breaker (their scripts are refused
    before they could): the scrape must not say up 1 over an empty list."""
    from breaker_redis.storage import acl

    admin = redis_server.client()
    admin.flushall()
    rules = acl.setuser_line().split(" ", 3)[3].replace(">PASSWORD", ">secret").replace(" +time", "")
    admin.execute_command("ACL", "SETUSER", "lister", "reset", *rules.split())
    url = f"redis://lister:secret@127.0.0.1:{redis_server.port}/0"
    worker = Breakers.from_url(url, listen=False)
    scraper = redis_server.client(username="lister", password="secret")
    try:
        with pytest.raises(ZeroDivisionError):
            worker.get("pay").call(lambda: 1 / 0)  # refused by Redis: decided on the local store
        assert admin.smembers("breaker:names") == set()
        found = samples(exposition(scraper).decode())
        assert found == {
            ("breaker_redis_up", ()): 0.0,
            ("breaker_redis_up_error", (("missing", "+time"), ("reason", "permission"))): 1.0,
        }
        admin.execute_command("ACL", "SETUSER", "lister", "+time")
        assert samples(exposition(scraper).decode()) == {("breaker_redis_up", ()): 1.0}
    finally:
        worker.close()
        scraper.close()
        admin.execute_command("ACL", "DELUSER", "lister")
        admin.close()


def test_cli_prints_the_exposition_and_fails_without_redis(redis_server):
    redis_server.client().flushall()
    breakers = Breakers.from_url(redis_server.url, listen=False)
    fail(breakers.get("pay", TRIP_AT_3), 3)
    breakers.close()
    result = CliRunner().invoke(cli.main, ["--url", redis_server.url, "metrics"])
    assert result.exit_code == 0, result.output
    assert of(samples(result.output), "breaker_redis_state", "pay", state="open") == 1
    down = CliRunner().invoke(cli.main, ["--url", f"redis://127.0.0.1:{free_port()}/0", "metrics"])
    assert down.exit_code == 1 and "cannot reach Redis" in down.output


def test_cli_serves_metrics_on_a_port(redis_server):
    redis_server.client().flushall()
    breakers = Breakers.from_url(redis_server.url, listen=False)
    fail(breakers.get("pay", TRIP_AT_3), 3)
    breakers.close()
    port = free_port()
    argv = [sys.executable, "-m", "breaker_redis.ops.cli", "--url", redis_server.url]
    argv += ["metrics", "--port", str(port)]
    # Ctrl-C as at a terminal: SIGINT at its default in the child, whatever this process
    # inherited (a suite started in the background by a non-interactive shell ignores
    # SIGINT, and so would the child: Python then installs no KeyboardInterrupt handler
    # and the command serves on, as a command started with '&' should)
    process = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:

        def scraped() -> str | None:
            try:
                answer = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
            except requests.ConnectionError:
                return None
            return answer.text if answer.status_code == 200 else None

        text = wait_until(scraped, timeout=20, what="breaker-redis metrics --port to serve")
        assert of(samples(text), "breaker_redis_trips_total", "pay") == 1
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0


def test_flask_serves_metrics_behind_the_admin_token(clock):
    app = Flask(__name__)
    app.config["BREAKER_ADMIN_TOKEN"] = "s3cret"
    server = fakeredis.FakeServer()
    ext = FlaskBreakers(app, client=fakeredis.FakeRedis(server=server), clock=clock, listen=False)

    @app.post("/pay")
    @ext.protect("pay", trip="consecutive", failure_threshold=2)
    def pay():
        return "upstream down", 502

    web = app.test_client()
    for _ in range(3):
        web.post("/pay")
    assert web.get("/_breakers/metrics").status_code == 401
    answer = web.get("/_breakers/metrics", headers={"Authorization": "Bearer s3cret"})
    assert answer.status_code == 200
    assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    found = samples(answer.get_data(as_text=True))
    assert of(found, "breaker_redis_state", "pay", state="open") == 1
    assert of(found, "breaker_redis_calls_total", "pay", outcome="failure") == 2
    assert of(found, "breaker_redis_rejected_total", "pay") == 1
    # the seconds left are counted on the breakers' clock, as the app decides, not on Redis's
    # (fakeredis' is the real time, years after this test clock's)
    assert of(found, "breaker_redis_retry_after_seconds", "pay") == 30
    clock.advance(12_500)
    answer = web.get("/_breakers/metrics", headers={"Authorization": "Bearer s3cret"})
    assert of(samples(answer.get_data(as_text=True)), "breaker_redis_retry_after_seconds", "pay") == 17.5
