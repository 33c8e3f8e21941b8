"""The framework-free refusal every integration answers with (breaker_redis.engine.refusal)."""

from __future__ import annotations

import json

import pytest

from breaker_redis import BreakerConfig, BreakerOpen
from breaker_redis.engine.refusal import Refusal, retry_after_seconds, wants_json


@pytest.mark.parametrize(
    ("accept", "content_type", "requested_with", "expected"),
    [
        (None, None, None, False),
        ("*/*", None, None, False),
        ("*/*", "application/json", None, True),
        (None, None, "XMLHttpRequest", True),
        ("application/json", None, None, True),
        ("application/problem+json", None, None, True),
        ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", None, None, False),
        ("text/html;q=0.5, application/json", None, None, True),
        ("application/json;q=0.5, text/html", None, None, False),
        ("application/json;q=0", None, None, False),
        ("application/json;q=oops, text/html", None, None, False),
        ("text/plain", "application/json", None, False),
    ],
)
def test_wants_json(accept: str | None, content_type: str | None, requested_with: str | None, expected: bool):
    assert wants_json(accept, content_type, requested_with) is expected


def test_retry_after_rounds_up_and_has_a_floor():
    assert retry_after_seconds(BreakerOpen(2.01, "pay", "open")) == 3
    assert retry_after_seconds(BreakerOpen(0.0, "pay", "open")) == 1
    assert retry_after_seconds(BreakerOpen(None, "pay", "half_open_full")) == 1
    assert retry_after_seconds(BreakerOpen(None, "pay", "forced_open"), BreakerConfig(open_seconds=45)) == 45


def test_json_and_text_refusals_carry_the_same_facts():
    refused = BreakerOpen(4.2, "pay", "open")
    as_json = Refusal.build(refused, as_json=True)
    assert as_json.status == 503
    headers = dict(as_json.headers)
    assert headers["Retry-After"] == "5"
    assert headers["X-Breaker"] == "pay"
    assert headers["X-Breaker-Reason"] == "open"
    assert headers["Content-Type"] == "application/json"
    assert int(headers["Content-Length"]) == len(as_json.body)
    assert json.loads(as_json.body) == {
        "error": "service_unavailable",
        "message": "The pay service is temporarily unavailable, please retry later.",
        "breaker": "pay",
        "reason": "open",
        "retry_after": 5,
    }
    as_text = Refusal.build(refused, as_json=False, message="Payments are resting.")
    assert as_text.body == b"Payments are resting.\n"
    assert dict(as_text.headers)["Content-Type"] == "text/plain; charset=utf-8"
