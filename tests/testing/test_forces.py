"""forced_open and forced_closed: a force for the span of a block, cleared however the block
ends, so that a test on a shared Redis leaves no force to the tests after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from breaker_redis import BreakerConfig, BreakerOpen, Breakers, State
from breaker_redis.testing import ManualClock, forced_closed, forced_open

PAY = BreakerConfig(trip="consecutive", failure_threshold=2, open_seconds=30)


class Boom(Exception):
    pass


@pytest.fixture
def breakers() -> Iterator[Breakers]:
    made = Breakers.from_url("memory://", clock=ManualClock())
    yield made
    made.close()


def refusal(breaker) -> str | None:
    try:
        breaker.acquire().ignore()
    except BreakerOpen as refused:
        return refused.reason
    return None


def test_forced_open_refuses_in_the_block_only(breakers: Breakers) -> None:
    pay = breakers.get("pay", PAY)
    with forced_open(pay) as forced:
        assert forced is pay
        assert refusal(pay) == "forced_open"
        assert pay.snapshot()["forced"] == "open"
    assert refusal(pay) is None
    assert (pay.state, pay.snapshot()["forced"]) == (State.CLOSED, None)


def test_forced_closed_never_trips_in_the_block_and_leaves_a_clean_window(breakers: Breakers) -> None:
    pay = breakers.get("pay", PAY)
    with forced_closed(pay):
        for _ in range(5):
            pay.acquire().failure()
        assert pay.state is State.CLOSED
        assert pay.snapshot()["forced"] == "closed"
    snapshot = pay.snapshot()
    assert (snapshot["forced"], snapshot["window_failures"], snapshot["consecutive_failures"]) == (None, 0, 0)
    pay.acquire().failure()
    assert pay.state is State.CLOSED  # one failure of two: the block's five are not counted


@pytest.mark.parametrize("force", [forced_open, forced_closed])
def test_the_force_is_cleared_when_the_block_raises(breakers: Breakers, force) -> None:
    pay = breakers.get("pay", PAY)
    with pytest.raises(Boom), force(pay):
        raise Boom
    assert pay.snapshot()["forced"] is None
    assert refusal(pay) is None


def test_every_worker_sees_the_force_of_the_block(breakers: Breakers) -> None:
    """A force is the operator's switch, for every worker on the store, not this one's alone."""
    client = breakers.client
    other = Breakers(client, clock=ManualClock(), listen=False)
    try:
        with forced_open(breakers.get("pay", PAY)):
            assert refusal(other.get("pay", PAY)) == "forced_open"
        assert refusal(other.get("pay", PAY)) is None
    finally:
        other.close()
