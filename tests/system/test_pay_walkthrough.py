"""A payment service failing and recovering behind /pay, on 4 gunicorn workers and a real Redis.

The classic OpenResty breaker kept in a ``lua_shared_dict``, as the demo runs
it: the payment service answers the first 3 payments, then fails 80 % of
them; the breaker trips after 5 failures in 10 s, answers a friendly 503
while open, goes half-open after the open period and closes after 2
successes. Here the open period is shortened to 2 s and the 80 % is drawn
from a fixed random sequence, so that the run is reproducible.

The count rule trips on the fifth failure in the window, not the fourth: the
test asserts exactly 5 failures, then refusals.
"""

from __future__ import annotations

import pytest

from demo_app import settings
from tests.support.demo_stack import FRIENDLY, Stack, start_stack

pytestmark = [pytest.mark.real, pytest.mark.multiprocess]

OPEN_SECONDS = 2


@pytest.fixture
def pay_stack(redis_server, upstream_url, tmp_path):
    # on a clock the test moves (demo_app/clock.py): the 10 s failure window and the open
    # period last as long as a busy machine takes to send the walkthrough's requests
    s, gunicorn = start_stack(
        redis_server, upstream_url, [], tmp_path / "clock", DEMO_PAY_OPEN_SECONDS=str(OPEN_SECONDS)
    )
    yield s
    gunicorn.stop()
    s.pool.shutdown()
    log = gunicorn.output()
    gunicorn.remove_log()
    assert "Traceback" not in log, log[-3000:]


def test_the_pay_walkthrough(pay_stack: Stack):
    s = pay_stack
    s.reset_upstream()
    # the first 3 payments succeed, afterwards 80 % fail
    s.control(path="/pay", succeed_first=3, fail_rate=0.8, seed=2026)

    for _ in range(3):
        answer = s.pay()
        assert (answer.status_code, answer.json()["message"]) == (200, "Payment accepted.")

    # for i in {1..N}; do curl -X POST http://localhost/pay; done
    failures = successes = 0
    while True:
        answer = s.pay()
        if answer.status_code == 503:
            break
        assert answer.status_code in (200, 502), answer.text
        failures += answer.status_code == 502
        successes += answer.status_code == 200
        assert failures <= 5, "still admitted after 5 failures"
        assert successes + failures < 200, "the breaker never opened"
    assert failures == 5
    assert s.hits() == 3 + successes + 5
    assert s.transitions()[0][2] == "count"

    # the next ones are refused, friendly, with Retry-After
    hits = s.hits()
    for _ in range(5):
        answer = s.pay()
        assert answer.status_code == 503
        assert FRIENDLY in answer.text
        assert answer.text.strip() == settings.PAY_UNAVAILABLE
        assert 1 <= int(answer.headers["Retry-After"]) <= OPEN_SECONDS
    assert s.hits() == hits

    # The payment service recovers; after the open period one probe at a time, 2 successes close it.
    s.control(path="/pay", fail_rate=0.0)
    _, open_until = s.state()
    assert s.clock is not None
    s.clock.advance_to(open_until)  # the open period ends: the next call is the probe
    assert s.pay().status_code == 200
    assert s.state()[0] == "half_open"
    assert s.pay().status_code == 200
    assert s.state()[0] == "closed"
    for _ in range(5):
        assert s.pay().status_code == 200
    assert s.transitions() == [
        ("closed", "open", "count"),
        ("open", "half_open", "open_elapsed"),
        ("half_open", "closed", "probes_succeeded"),
    ]
    assert s.statuses[500] == 0
