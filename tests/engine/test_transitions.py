"""on_transition: one call per transition cluster-wide, in the process whose call made it."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from breaker_redis import BreakerConfig, Breakers, Transition
from breaker_redis import asyncio as breaker_asyncio
from breaker_redis.engine.transitions import OPERATOR_CAUSES
from tests.support import mp_workers
from tests.support.workers import TRIP_AT_3, admits, fail, snapshot, subscribed

CYCLE = BreakerConfig(trip="consecutive", failure_threshold=2, open_seconds=10, half_open_successes=1)


def test_every_transition_is_reported_with_its_cause_epoch_and_time(make_breakers, clock):
    breakers = make_breakers()
    seen: list[Transition] = []
    breakers.on_transition(seen.append)
    b = breakers.get("pay", CYCLE)
    fail(b, 2)
    clock.advance(10_000)
    b.acquire().success()  # open -> half_open (the probe) -> closed
    b.force_open()
    b.clear_force()
    assert [(t.old, t.new, t.cause) for t in seen] == [
        ("closed", "open", "consecutive"),
        ("open", "half_open", "open_elapsed"),
        ("half_open", "closed", "probes_succeeded"),
        ("closed", "open", "forced_open"),
        ("open", "closed", "force_cleared"),
    ]
    assert [t.epoch for t in seen] == [seen[0].epoch + i for i in range(5)]
    assert seen[-1].epoch == b.snapshot()["epoch"]
    assert {t.name for t in seen} == {"pay"}
    assert seen[0].at_ms == clock.now - 10_000 and seen[1].at_ms == clock.now


def _moves(seen: list[Transition]) -> list[tuple[str, str, str, bool]]:
    return [(t.old, t.new, t.cause, t.operator) for t in seen]


# Each step, then what on_transition and on_operator_action hear of it.
OPERATOR_STEPS = [
    ("reset", [], [("closed", "closed", "reset", True)]),
    ("force_open", [("closed", "open", "forced_open", True)], [("closed", "open", "forced_open", True)]),
    ("force_open", [], [("open", "open", "forced_open", True)]),
    (
        "force_closed",
        [("open", "closed", "forced_closed", True)],
        [("open", "closed", "forced_closed", True)],
    ),
    ("clear_force", [], [("closed", "closed", "force_cleared", True)]),
    ("clear_force", [], []),  # not forced: no transition at all
    ("fail", [("closed", "open", "consecutive", False)], []),
    ("trip", [], [("open", "open", "opened", True)]),
    ("reset", [("open", "closed", "reset", True)], [("open", "closed", "reset", True)]),
]


def hear_every_step(breakers: Any, do: Callable[[str], object]) -> None:
    """Each of OPERATOR_STEPS done by ``do``, and what each hook of ``breakers`` heard of it."""
    changes: list[Transition] = []
    actions: list[Transition] = []
    breakers.on_transition(changes.append)
    breakers.on_operator_action(actions.append)
    for step, changed, acted in OPERATOR_STEPS:
        changes.clear()
        actions.clear()
        do(step)
        assert (step, _moves(changes), _moves(actions)) == (step, changed, acted)
        assert all(t.changed for t in changes)


def test_on_transition_hears_state_changes_and_on_operator_action_every_operator_action(make_breakers, clock):
    """A pager on on_transition is never paged by a reset of a closed breaker; an
    audit log on on_operator_action hears of every operator action."""
    breakers = make_breakers()
    b = breakers.get("pay", CYCLE)

    def do(step: str) -> None:
        if step == "fail":
            fail(b, 2)
        else:
            getattr(b, step)()

    hear_every_step(breakers, do)


def test_the_readme_pager_pages_on_trips_only(make_breakers, clock):
    breakers = make_breakers()
    pages: list[str] = []

    @breakers.on_transition
    def page(t: Transition) -> None:
        if t.new == "open" and not t.operator:
            pages.append(f"{t.name}: {t.old} -> {t.new} ({t.cause})")

    b = breakers.get("pay", CYCLE)
    b.reset()
    b.force_open()
    b.reset()
    b.trip()
    b.reset()
    fail(b, 2)  # the rules trip it
    clock.advance(10_000)
    fail(b, 1)  # the probe fails: open again, by the rules
    b.reset()
    assert pages == ["pay: closed -> open (consecutive)", "pay: half_open -> open (probe_failed)"]


def test_the_operator_causes_are_those_of_the_admin_script():
    admin = (Path(__file__).resolve().parents[2] / "lua" / "admin.lua").read_text()
    causes = set(re.findall(r"(?:transition\(s, '\w+'|clean\('\w*'), '(\w+)'\)", admin))
    assert causes == OPERATOR_CAUSES


@pytest.mark.parametrize("where", ["fake", "real"])
def test_the_asyncio_breakers_report_alike(where, redis_server, clock):
    import fakeredis

    from breaker_redis.urls import async_client_from_url, client_from_url

    if where == "real":
        client_from_url(redis_server.url).flushall()

    loop = asyncio.new_event_loop()
    client = fakeredis.FakeAsyncRedis() if where == "fake" else async_client_from_url(redis_server.url)
    breakers = breaker_asyncio.Breakers(client, clock=clock, listen=False)
    b = breakers.get("pay", CYCLE)

    async def act(step: str) -> None:
        if step == "fail":
            for _ in range(2):
                await (await b.acquire()).failure()
        else:
            await getattr(b, step)()

    try:
        hear_every_step(breakers, lambda step: loop.run_until_complete(act(step)))
        with pytest.raises(TypeError, match="on_operator_action"):
            breakers.on_operator_action("page me")  # type: ignore[arg-type]
        loop.run_until_complete(breakers.aclose())
    finally:
        loop.close()


def test_a_failing_callback_is_logged_and_never_reaches_the_caller(make_breakers, caplog):
    breakers = make_breakers()

    @breakers.on_transition
    def broken(transition: Transition) -> None:
        raise RuntimeError("the pager is down")

    seen: list[Transition] = []
    breakers.on_transition(seen.append)
    b = breakers.get("pay", TRIP_AT_3)
    with caplog.at_level(logging.ERROR, logger="breaker_redis"):
        fail(b, 3)  # the third failure trips it and returns normally
    assert [t.new for t in seen] == ["open"]  # later callbacks still run
    assert "the pager is down" in caplog.text


def test_only_the_worker_whose_call_made_it_is_called(store):
    workers = [Breakers(store), Breakers(store)]
    reports: list[list[str]] = [[], []]
    try:
        for w, report in zip(workers, reports, strict=True):
            w.on_transition(lambda t, report=report: report.append(t.new))
        a, b = (w.get("pay", TRIP_AT_3) for w in workers)
        subscribed(workers)
        assert admits(b)
        fail(a, 3)
        assert not admits(b)  # b heard of it, and asked Redis: no transition of its own
        assert reports == [["open"], []]
    finally:
        for w in workers:
            w.close()


def test_a_callback_must_be_callable(make_breakers):
    with pytest.raises(TypeError, match="on_transition"):
        make_breakers().on_transition("page me")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="on_operator_action"):
        make_breakers().on_operator_action("audit me")  # type: ignore[arg-type]


@pytest.mark.multiprocess
def test_eight_processes_racing_a_trip_make_one_call_in_total(redis_server):
    redis_server.client().flushall()
    cfg = BreakerConfig(trip="count", failure_threshold=5, window_seconds=60, open_seconds=60)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(8) as pool:
        reports, barrier = manager.list(), manager.Barrier(8)
        args = (redis_server.url, "race", cfg, 20, barrier, reports)
        results = [pool.apply_async(mp_workers.race_to_trip, args) for _ in range(8)]
        admitted = sum(r.get(timeout=120) for r in results)
        calls = list(reports)
    assert admitted >= 5
    assert len(calls) == 1
    name, old, new, cause, epoch = calls[0]
    assert (name, old, new, cause) == ("race", "closed", "open", "count")
    assert epoch == snapshot(redis_server.url, "race", cfg)["epoch"]
