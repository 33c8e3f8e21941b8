"""The engine under a least-privilege Redis user, and what a missing permission says.

A Redis user is a configuration, not an outage: the whole engine runs under
exactly ``acl.setuser_line()`` (with Redis Functions, and without them, when
the scripts run with EVALSHA), and a user that lacks one permission gets one
ERROR naming it and the ACL line that grants it, while the breakers keep
protecting per process; granting it brings the workers back to the shared
state by themselves.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import re
from collections.abc import Iterator

import pytest

from breaker_redis import BreakerConfig, BreakerOpen, Breakers
from breaker_redis.metrics import exposition
from breaker_redis.ops.reader import Reader
from breaker_redis.storage import acl
from breaker_redis.storage.lua_source import OPERATIONS, script_source
from tests.support.acl import rules_of
from tests.support.redis_server import RedisServer, wait_until
from tests.support.workers import subscribed

_users = itertools.count()


@pytest.fixture
def make_user(redis_server: RedisServer) -> Iterator:
    """ACL users on the session's server, removed at teardown; returns their URL."""
    admin = redis_server.client()
    made: list[str] = []

    def make(rules: str) -> str:
        user = f"acl-test-{next(_users)}"
        made.append(user)
        admin.execute_command("ACL", "SETUSER", user, "reset", *rules.split())
        return f"redis://{user}:secret@127.0.0.1:{redis_server.port}/0"

    admin.flushall()
    admin.function_flush()
    yield make
    for user in made:
        admin.execute_command("ACL", "DELUSER", user)
    admin.close()


def user_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "breaker_redis" and r.levelno >= logging.WARNING
    ]


def test_the_health_script_calls_every_command_the_breaker_scripts_call() -> None:
    """The store gate's probe fails exactly when the scripts would: same commands."""
    pattern = re.compile(r"redis\.p?call\('([A-Z]+)'")
    scripts = {c for op in OPERATIONS if op != "health" for c in pattern.findall(script_source(op))}
    health = set(pattern.findall(script_source("health")))
    assert scripts <= health
    assert health == scripts  # PEXPIRE too: the health key and a breaker's reporters key expire
    assert {c.upper() for c in acl.script_commands()} == scripts | health


@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "evalsha"])
def test_the_whole_engine_runs_under_the_least_privilege_user(
    make_user, functions: bool, caplog: pytest.LogCaptureFixture, clock
) -> None:
    caplog.set_level(logging.INFO, logger="breaker_redis")
    url = make_user(rules_of(acl.setuser_line(functions=functions)))
    config = BreakerConfig(trip="consecutive", failure_threshold=3, open_seconds=10, half_open_successes=1)
    one, two = Breakers.from_url(url, clock=clock), Breakers.from_url(url, clock=clock)
    try:
        pay, pay_two = one.get("pay", config), two.get("pay", config)
        for breaker in (pay, pay_two):  # both subscribed: the boundary from memory
            breaker.call(lambda: "ok")
        wait_until(
            lambda: one.invalidator.healthy and two.invalidator.healthy, timeout=10, what="both subscriptions"
        )
        for _ in range(3):
            with pytest.raises(ZeroDivisionError):
                pay.call(lambda: 1 / 0)
        with pytest.raises(BreakerOpen):
            pay_two.call(lambda: "refused")  # heard of the trip through the subscription
        clock.advance(10_000)
        assert pay_two.call(lambda: "probe") == "probe"  # half_open, one probe, closed
        one.configure("pay", failure_threshold=5)
        pay.force_open()
        with pytest.raises(BreakerOpen):
            pay_two.call(lambda: "forced")
        pay.clear_force()
        pay.reset()
        snap = pay.snapshot()
        assert (snap["state"], snap["trips"], snap["store"]) == ("closed", 1, "redis")
        assert one.names() == ["pay"]
        reader = Reader(one.client, "breaker", owns_client=False)
        assert [s["name"] for s in reader.snapshots()] == ["pay"]
        assert b"breaker_redis_up 1.0" in exposition(one.client)
        assert one.gate.healthy and two.gate.healthy
        assert one.gate.remote.use_functions is functions
        assert user_errors(caplog) == []
    finally:
        one.close()
        two.close()


# (the rule left out, the failing calls before the local breaker refuses: 2 when the
# first acquire already fails, 3 when only the first record does, since an outcome
# admitted by Redis is not replayed on the local store)
@pytest.mark.parametrize(
    ("without", "failures"),
    [("+time", 2), ("+hincrby", 3), ("~breaker:*", 2), ("&breaker:*", 3), ("+evalsha", 2)],
)
def test_a_missing_permission_is_one_error_that_names_it_and_protection_goes_on(
    make_user, redis_server: RedisServer, without: str, failures: int, caplog: pytest.LogCaptureFixture
) -> None:
    named = without
    caplog.set_level(logging.INFO, logger="breaker_redis")
    rules = rules_of(acl.setuser_line(functions=False), without=without)
    if without.startswith(("~", "&")):
        rules += " ~other:*" if without[0] == "~" else " &other:*"
    url = make_user(rules)
    user = url.split("//")[1].split(":")[0]
    breakers = Breakers.from_url(url, listen=False)
    try:
        pay = breakers.get("pay", BreakerConfig(failure_threshold=2, open_seconds=30))
        for _ in range(failures):
            with pytest.raises(ZeroDivisionError):
                pay.call(lambda: 1 / 0)
        for _ in range(20):  # refused: the local breaker tripped at its threshold
            with pytest.raises(BreakerOpen):
                pay.call(lambda: "refused")
        assert not breakers.gate.healthy
        errors = user_errors(caplog)
        assert len(errors) == 1, errors
        assert [r.levelno for r in caplog.records if r.levelno >= logging.WARNING] == [logging.ERROR]
        assert f"ACL SETUSER {user} {named}" in errors[0]
        assert acl.setuser_line("breaker", user) in errors[0]
        assert "Redis unavailable" not in errors[0]
        assert breakers.gate.problem is not None and named in breakers.gate.problem

        # the probe (lua/health.lua) is refused the same permission: still the one error
        wait_until(
            lambda: breakers.gate._delay > breakers.gate._min_backoff,
            timeout=10,
            what="the store gate's probe to be refused",
        )
        assert len(user_errors(caplog)) == 1
        admin = redis_server.client()
        admin.execute_command("ACL", "SETUSER", user, named)
        wait_until(lambda: breakers.gate.healthy, timeout=15, what="the workers back on Redis once granted")
        admin.close()
        assert breakers.gate.problem is None
        assert pay.call(lambda: "shared again") == "shared again"
        assert pay.snapshot()["store"] == "redis"
        assert len(user_errors(caplog)) == 2  # the error, then "answers again"
    finally:
        breakers.close()


def test_a_subscription_the_user_may_not_make_is_one_error(
    make_user, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="breaker_redis")
    rules = rules_of(acl.setuser_line(functions=False), without="+subscribe")
    url = make_user(rules)
    breakers = Breakers.from_url(url)
    try:
        pay = breakers.get("pay")
        assert pay.call(lambda: "ok") == "ok"  # no subscription: every call asks Redis, exactly
        wait_until(lambda: user_errors(caplog), timeout=10, what="the subscription's error")
        assert pay.call(lambda: "ok") == "ok"
        errors = user_errors(caplog)
        assert len(errors) == 1 and "the event subscription" in errors[0] and "+subscribe" in errors[0]
        assert breakers.gate.healthy
    finally:
        breakers.close()


def test_a_script_line_error_names_the_command_on_that_line() -> None:
    source = script_source("acquire")
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "redis.call('TIME')" in text)
    sha = hashlib.sha1(source.encode()).hexdigest()
    message = (
        "The user executing the script can't run this command or subcommand "
        f"script: {sha}, on @user_script:{line}."
    )
    assert acl.missing_rule(Exception(message)) == "+time"
    assert acl.missing_rule(Exception("WRONGTYPE Operation against a key")) is None


def test_the_docs_acl_line_is_the_one_the_engine_needs() -> None:
    """docs/memory-and-permissions.md's least-privilege user grants exactly
    acl.setuser_line()'s rules."""
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs" / "memory-and-permissions.md"
    block = page.read_text("utf-8").split("redis-cli ACL SETUSER breaker", 1)[1].split("```", 1)[0]
    rules = {rule.strip("'").replace("\\|", "|") for rule in block.replace("\\\n", " ").split()}
    assert rules == set(acl.setuser_line().split()[3:])


def test_the_engine_runs_on_a_cluster_under_the_cluster_users_line(cluster, clock) -> None:
    """setuser_line(cluster=True): what redis-py's cluster client needs besides."""
    user = f"acl-cluster-{next(_users)}"
    rules = rules_of(acl.setuser_line(cluster=True))
    for port in cluster.ports:
        cluster.node(port).execute_command("ACL", "SETUSER", user, "reset", *rules.split())
    cluster.flushall()
    url = cluster.url.replace("://", f"://{user}:secret@", 1)
    breakers = Breakers.from_url(url, clock=clock)
    try:
        pay = breakers.get("pay", BreakerConfig(failure_threshold=2, open_seconds=10))
        assert pay.call(lambda: "ok") == "ok"
        subscribed([breakers])  # the sharded subscription, ROLE to its node included
        for _ in range(2):
            with pytest.raises(ZeroDivisionError):
                pay.call(lambda: 1 / 0)
        with pytest.raises(BreakerOpen):
            pay.call(lambda: "refused")
        assert pay.snapshot()["store"] == "redis" and breakers.gate.healthy
        assert breakers.names() == ["pay"]
    finally:
        breakers.close()
        for port in cluster.ports:
            cluster.node(port).execute_command("ACL", "DELUSER", user)


def test_the_least_privilege_user_works_on_another_database(make_user, redis_server: RedisServer) -> None:
    url = make_user(rules_of(acl.setuser_line())).replace("/0", "/2")  # redis-py sends SELECT 2
    breakers = Breakers.from_url(url, listen=False)
    try:
        pay = breakers.get("pay", BreakerConfig(failure_threshold=2))
        for _ in range(2):
            with pytest.raises(ZeroDivisionError):
                pay.call(lambda: 1 / 0)
        with pytest.raises(BreakerOpen):
            pay.call(lambda: "refused")
        assert breakers.gate.healthy
        assert redis_server.client(db=2).hget("breaker:{pay}:state", "state") == b"open"
    finally:
        breakers.close()
        redis_server.client(db=2).flushdb()
