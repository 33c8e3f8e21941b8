"""The rules every HTTP integration shares (breaker_redis/web/http_policy.py), checked
once here where no integration's own tests reach them: the quiet log's minute
and its cap, and how an exception that ended a guarded request is judged.
"""

from __future__ import annotations

import logging

import fakeredis
import pytest

from breaker_redis import BreakerConfig, Breakers
from breaker_redis.base.errors import BreakerOpen
from breaker_redis.web.http_policy import Warnings, judge_exception
from breaker_redis.web.routes import hold, note_refusal


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "breaker_redis"]


def test_a_warning_is_logged_once_a_minute_per_breaker_and_message(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    warnings = Warnings(clock)
    with caplog.at_level(logging.ERROR, "breaker_redis"):
        warnings.warn("pay", "the fallback of breaker %r failed")
        clock.now += 59.9
        warnings.warn("pay", "the fallback of breaker %r failed")
        warnings.warn("cart", "the fallback of breaker %r failed")  # another breaker
        warnings.warn("pay", "could not record an outcome of breaker %r")  # another message
        clock.now += 0.1
        warnings.warn("pay", "the fallback of breaker %r failed")  # a minute after the first
    assert logged(caplog) == [
        "the fallback of breaker 'pay' failed",
        "the fallback of breaker 'cart' failed",
        "could not record an outcome of breaker 'pay'",
        "the fallback of breaker 'pay' failed",
    ]


def test_past_its_cap_the_log_forgets_every_pair_at_once(caplog: pytest.LogCaptureFixture) -> None:
    """Breakers named after hosts or tenants cannot grow it without end: past
    CAP remembered pairs it starts again, and a pair it forgot logs again."""
    assert Warnings.CAP == 10_000
    clock = Clock()
    warnings = Warnings(clock)
    warnings.CAP = 3
    with caplog.at_level(logging.ERROR, "breaker_redis"):
        for name in ("a", "b", "c", "d"):  # four remembered: one more than the cap
            warnings.warn(name, "breaker %r")
        warnings.warn("a", "breaker %r")  # still remembered: quiet
        warnings.warn("e", "breaker %r")  # the fifth: the four are forgotten, e is remembered
        warnings.warn("a", "breaker %r")  # forgotten: logged again
    assert logged(caplog) == [
        "breaker 'a'",
        "breaker 'b'",
        "breaker 'c'",
        "breaker 'd'",
        "breaker 'e'",
        "breaker 'a'",
    ]


def test_an_exception_is_ignored_when_a_breaker_refused_else_judged_by_the_config() -> None:
    breakers = Breakers(fakeredis.FakeRedis(), listen=False)
    try:
        pay = breakers.get("pay", BreakerConfig(record_exceptions=(ConnectionError,)))
        assert judge_exception(pay, ConnectionError("down"), None) == "failure"  # no guard noted anything
        assert judge_exception(pay, KeyError("not the service's"), None) == "ignored"
        assert judge_exception(pay, KeyboardInterrupt(), None) == "ignored"
        refused = BreakerOpen(3.0, "bank", "open")
        assert judge_exception(pay, refused, None) == "ignored"  # an outbound breaker refused
        environ: dict[str, object] = {}
        guards = hold(environ, "pay-guard", object())
        assert judge_exception(pay, ConnectionError("down"), guards) == "failure"
        note_refusal(environ, "bank")  # a guard of another breaker inside refused the request
        assert judge_exception(pay, ConnectionError("down"), guards) == "ignored"
    finally:
        breakers.close()
