"""Property test: random histories of one breaker, the implementation (Lua on
fakeredis and on a real redis-server, through the public Python API) against
the pure-Python reference model in tests/support/model.py.

After every step the snapshot must equal the model's, and every acquire must
give the same answer (allowed or not, probe or not, epoch, reason, retry_after).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from breaker_redis import BreakerConfig, BreakerOpen, Permit
from tests.support.model import BreakerModel, Decision, ModelPermit

START_MS = 1_700_000_000_000
COMPARED = (
    "state",
    "forced",
    "epoch",
    "retry_after",
    "window_calls",
    "window_failures",
    "window_slow",
    "consecutive_failures",
    "half_open_successes",
    "calls",
    "successes",
    "failures",
    "ignored",
    "slow",
    "rejected",
    "would_reject",
    "trips",
    "stale",
)
_names = itertools.count()


# -- strategies ----------------------------------------------------------------------


@st.composite
def configs(draw: st.DrawFn) -> BreakerConfig:
    open_seconds = draw(st.sampled_from([0.5, 1.0, 2.0, 5.0]))
    return BreakerConfig(
        trip=draw(st.sampled_from(["consecutive", "count", "rate"])),
        failure_threshold=draw(st.integers(1, 4)),
        failure_rate=draw(st.sampled_from([0.2, 0.34, 0.5, 0.75, 1.0])),
        minimum_calls=draw(st.integers(1, 5)),
        slow_call_seconds=draw(st.sampled_from([None, None, 0.05, 0.3, 1.0])),
        slow_call_rate=draw(st.sampled_from([0.3, 0.5, 1.0])),
        window_seconds=draw(st.sampled_from([0.5, 1.0, 2.5, 10.0])),
        window_buckets=draw(st.integers(1, 10)),
        open_seconds=open_seconds,
        open_backoff=draw(st.sampled_from([1.0, 1.5, 2.0, 3.0])),
        max_open_seconds=open_seconds * draw(st.sampled_from([1, 1.7, 4])),
        half_open_max_calls=draw(st.integers(1, 3)),
        half_open_successes=draw(st.integers(1, 3)),
        probe_timeout_seconds=draw(st.sampled_from([0.3, 1.0, 3.0])),
        mode=draw(st.sampled_from(["enforce", "enforce", "enforce", "observe"])),
    )


# Time steps, biased to small values; ("to", boundary, offset) lands exactly on
# (or 1 ms around) the next open_until, probe-lease expiry or bucket edge.
small_ms = st.integers(0, 20)
boundaries = st.sampled_from(["open_until", "lease", "bucket", "window"])


@st.composite
def advance(draw: st.DrawFn) -> tuple[Any, ...]:
    kind = draw(st.integers(0, 9))
    if kind < 4:
        return ("by", draw(small_ms))
    if kind < 6:
        return ("by", draw(st.integers(0, 15_000)))
    if kind < 9:
        return ("to", draw(boundaries), draw(st.integers(-1, 1)))
    return ("back", draw(st.integers(1, 2000)))  # the Redis clock stepping back


# Before a record: wait a little, or until the permit's age is exactly around
# slow_call_seconds or probe_timeout_seconds.
wait = st.one_of(
    st.tuples(st.just("by"), small_ms),
    st.tuples(st.just("by"), st.integers(0, 4000)),
    st.tuples(st.just("age"), st.sampled_from(["slow", "probe"]), st.integers(-1, 1)),
    st.tuples(st.just("age"), st.sampled_from(["slow", "probe"]), st.integers(-1, 1)),
)
outcome = st.sampled_from(["failure", "failure", "success", "success", "ignored"])
admin = st.sampled_from(["force_open", "force_closed", "clear_force", "reset"])


@st.composite
def steps(draw: st.DrawFn) -> tuple[Any, ...]:
    """One step, out of 40: a whole call (acquire, wait, record) 12, an acquire
    whose permit is kept 8, a record of a kept permit 8, time 11, an admin op 1."""
    kind = draw(st.integers(0, 39))
    if kind < 12:
        return ("call", draw(outcome), draw(wait))
    if kind < 20:
        return ("acquire",)
    if kind < 28:
        return ("record", draw(st.integers(0, 7)), draw(outcome), draw(wait))
    if kind < 39:
        return ("advance", draw(advance()))
    return ("admin", draw(admin))


# -- the driver ----------------------------------------------------------------------


class Run:
    """One example: a fresh breaker, its model, the permits not recorded yet."""

    def __init__(self, breakers: Any, clock: Any, config: BreakerConfig) -> None:
        self.clock = clock
        self.batching = breakers.batch_successes
        self.breaker = breakers.get(f"model-{next(_names)}", config)
        self.model = BreakerModel(config)
        self.outstanding: list[tuple[Permit, ModelPermit]] = []
        self.log: list[str] = []

    def boundary(self, kind: str) -> int | None:
        m, now = self.model, self.clock.now
        if kind == "open_until":
            return m.open_until or None
        if kind == "lease":
            return min(m.leases.values(), default=None)
        edge = m.window.bucket_ms * (now // m.window.bucket_ms + 1)
        return edge if kind == "bucket" else edge + m.window.bucket_ms * (m.window.buckets - 1)

    def advance(self, spec: tuple[Any, ...]) -> None:
        if spec[0] == "by":
            self.clock.advance(spec[1])
        elif spec[0] == "back":
            self.clock.advance(-spec[1])
        else:
            target = self.boundary(spec[1])
            if target is not None and target + spec[2] > self.clock.now:
                self.clock.now = target + spec[2]

    def step(self, step: tuple[Any, ...]) -> None:
        kind = step[0]
        self.log.append(f"{step} @ {self.clock.now - START_MS}")
        if kind in ("acquire", "call"):
            admitted = self.acquire()
            if kind == "call" and admitted:
                self.compare()
                self.record(len(self.outstanding) - 1, step[1], step[2])
        elif kind == "record" and self.outstanding:
            self.record(step[1] % len(self.outstanding), step[2], step[3])
        elif kind == "advance":
            self.advance(step[1])
        elif kind == "admin":
            self.model.seed(self.clock.now)
            getattr(self.breaker, step[1])()
            getattr(self.model, step[1])()
        self.log[-1] += f" -> {self.clock.now - START_MS}"
        self.compare()

    def acquire(self) -> bool:
        want: Decision = self.model.acquire(self.clock.now)
        try:
            permit = self.breaker.acquire()
        except BreakerOpen as refused:
            got = ("refused", refused.reason, refused.retry_after)
            assert want.permit is None, self.explain(f"refused ({got}) but the model admits")
            assert got == ("refused", want.reason, want.retry_after), self.explain(f"refusal {got}")
            return False
        assert want.permit is not None, self.explain(f"admitted but the model refuses: {want}")
        got_permit = (permit.epoch, permit.probe)
        assert got_permit == (want.permit.epoch, want.permit.lease is not None), self.explain(
            f"permit (epoch, probe) {got_permit} vs model {want.permit}"
        )
        self.outstanding.append((permit, want.permit))
        return True

    def record(self, index: int, outcome: str, wait: tuple[Any, ...]) -> None:
        impl, model = self.outstanding.pop(index)
        if wait[0] == "age":
            age = (self.model.slow_ms or 1) if wait[1] == "slow" else self.model.probe_ms
            self.clock.now = max(self.clock.now, model.started + age + wait[2])
        else:
            self.advance(wait)
        impl.record(outcome)
        self.model.record(model, outcome, self.clock.now)

    def compare(self) -> None:
        snap = self.breaker.snapshot()
        got = {key: snap[key] for key in COMPARED}
        want = self.model.snapshot(self.clock.now)
        diff = {key: (got[key], want[key]) for key in COMPARED if got[key] != want[key]}
        assert not diff, self.explain(f"snapshot differs (impl, model): {diff}")

    def explain(self, what: str) -> str:
        steps = "\n  ".join(self.log)
        return (
            f"{what}\nconfig: {self.breaker.config}, batch_successes={self.batching}\n"
            f"steps (ms since start: before -> after):\n  {steps}"
        )


@pytest.fixture
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.node.callspec.params["store"])


def test_implementation_matches_the_model(make_breakers, clock, store_kind):
    # With a test clock a worker sends every outcome at once unless told to
    # batch plain successes; a batch reaches Redis at the latest with the
    # snapshot that follows each step, before the clock moves, so both agree.
    by_batching = {False: make_breakers(), True: make_breakers(batch_successes=True)}

    @settings(
        max_examples=60 if store_kind == "fake" else 25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        config = data.draw(configs(), label="config")
        breakers = by_batching[data.draw(st.booleans(), label="batch_successes")]
        clock.now = START_MS + data.draw(st.integers(0, 9_999), label="start offset ms")
        run = Run(breakers, clock, config)
        run.compare()
        count = data.draw(st.integers(30, 80), label="steps")  # a failure stops the run early
        for i in range(count):
            run.step(data.draw(steps(), label=f"step {i}"))

    check()


# -- what the property test found (fixed since; kept as regressions) ------------------------


def test_a_probe_that_overran_its_lease_failed_even_if_ignored_late(make_breakers, clock):
    """docs/design.md section 2: 'an expired probe lease counts as a failure of that probe'.
    record.lua used to delete the expired lease of a late 'ignored' result and
    count nothing, leaving the breaker half_open with a fresh probe to hand out
    (had any acquire come between expiry and result, it would have reopened)."""
    cfg = BreakerConfig(
        trip="consecutive",
        failure_threshold=1,
        open_seconds=0.5,
        probe_timeout_seconds=0.3,
        half_open_max_calls=1,
    )
    b = make_breakers().get("late-ignored", cfg)
    model = BreakerModel(cfg)
    b.acquire().failure()
    model.record(model.acquire(clock.now).permit, "failure", clock.now)
    clock.advance(500)
    probe, model_probe = b.acquire(), model.acquire(clock.now).permit
    assert probe.probe and model_probe.lease
    clock.advance(300)  # the lease expires: the probe hung past probe_timeout_seconds
    probe.ignore()
    model.record(model_probe, "ignored", clock.now)
    want = model.acquire(clock.now)
    assert (want.permit, want.reason) == (None, "open")  # probe_timeout: reopened with backoff
    with pytest.raises(BreakerOpen) as refused:
        b.acquire()
    assert (refused.value.reason, refused.value.retry_after) == ("open", want.retry_after)
    assert b.snapshot()["trips"] == 2


def test_an_admin_reply_does_not_make_an_observe_breaker_deny(make_breakers, clock):
    """docs/design.md section 2: observe mode 'never denies'. admin.lua replies carry no config
    (mode ''); the worker used to store that, so after a clear_force with no
    force (state still open) it denied from memory as if enforcing."""
    cfg = BreakerConfig(trip="consecutive", failure_threshold=1, open_seconds=0.5, mode="observe")
    b = make_breakers().get("observe-admin", cfg)
    b.acquire().failure()
    assert b.snapshot()["state"] == "open"
    b.clear_force()  # nothing to clear
    b.acquire()  # observe: admitted, counted as would_reject
    snap = b.snapshot()
    assert (snap["would_reject"], snap["rejected"]) == (1, 0)
