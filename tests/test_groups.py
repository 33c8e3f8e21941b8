"""Breaker groups (breaker_redis/groups.py, lua/group.lua, lua/member.lua) across deploys,
operators and workers that come and go: no grant blocks the cap for good, and the cap is
never exceeded (docs/http-clients.md, "Pools of replicas").

Each worker is its own Breakers with its own BreakerGroup, as a gunicorn worker process of
one version of an app has; a deploy is a worker built with another member list. Members are
breaker names and the protected calls are plain functions that fail or succeed, so what is
counted is exactly the upstream calls made. Time is the test clock (``Breakers(clock=...)``:
the scripts' now_ms, and the group's reclaim period), never a sleep. The stores: fakeredis,
the session's redis-server and, for the deploy, a three-master Redis Cluster with the group's
hash in another slot than every member's.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from breaker_redis import BreakerConfig, BreakerOpen, Breakers
from breaker_redis.groups import BreakerGroup, release_grant
from breaker_redis.ops import cli
from breaker_redis.ops.reader import parse_event
from breaker_redis.storage.scripts import text
from breaker_redis.web.group_config import cap_of
from tests.support.clock import Clock
from tests.support.replay import replayed
from tests.support.stores import STORES, make_store

CONFIG = BreakerConfig(trip="consecutive", failure_threshold=5, open_seconds=30)
_prefixes = itertools.count()


@pytest.fixture(params=[*STORES, "cluster"])
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    client = make_store(request)
    yield client
    client.close()


@pytest.fixture
def prefix() -> str:
    return f"grp{next(_prefixes)}"


@pytest.fixture
def worker(store: Any, clock: Clock, prefix: str) -> Iterator[Callable[..., BreakerGroup]]:
    """worker(members, fraction=0.5, config=CONFIG): a worker process of one version of the
    app: its own Breakers (the test clock, no subscription) and its BreakerGroup 'pool'. Each
    starts a millisecond after the one made before (a later deploy is seen later)."""
    made: list[Breakers] = []

    def make(members: list[str], fraction: float = 0.5, config: BreakerConfig = CONFIG) -> BreakerGroup:
        clock.advance(1)
        breakers = Breakers(store, prefix, clock=clock, listen=False)
        made.append(breakers)
        return BreakerGroup(breakers, "pool", members, max_open_fraction=fraction, config=config)

    yield make
    for breakers in made:
        breakers.close()


class Upstream:
    """The replicas' service: counts the calls each one gets, and fails or answers."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.down: set[str] = set()

    def __call__(self, member: str) -> str:
        self.calls[member] = self.calls.get(member, 0) + 1
        if member in self.down:
            raise ConnectionError(f"{member} is down")
        return "ok"


def call(group: BreakerGroup, member: str, upstream: Upstream) -> str:
    """One request to a member through its breaker, then settle() (as the HTTP adapters do):
    'ok', 'failed', or 'refused'."""
    try:
        return group.breaker(member).call(upstream, member)
    except BreakerOpen:
        return "refused"
    except ConnectionError:
        return "failed"
    finally:
        group.settle()


def raw_state(store: Any, prefix: str, name: str) -> dict[str, str]:
    return {text(k): text(v) for k, v in store.hgetall(f"{prefix}:{{{name}}}:state").items()}


def holders(store: Any, prefix: str) -> dict[str, int]:
    """The grants the group's hash lists: {member: token}."""
    found = store.hgetall(f"{prefix}:group:{{pool}}")
    return {text(k)[2:]: int(v) for k, v in found.items() if text(k).startswith("h:")}


def last_cause(store: Any, prefix: str, name: str) -> str:
    event = parse_event(store.lindex(f"{prefix}:{{{name}}}:events", 0))
    assert event is not None
    return f"{event['from']}>{event['to']}:{event['cause']}"


def open_one(group: BreakerGroup, member: str, upstream: Upstream) -> None:
    """Five failures of ``member`` through ``group``: it opens, holding the group's grant."""
    upstream.down.add(member)
    assert [call(group, member, upstream) for _ in range(5)] == ["failed"] * 5
    assert group.breaker(member).snapshot()["state"] == "open"


# -- a deploy that changes the member list ---------------------------------------------------


def test_a_deploy_that_changes_the_member_list_frees_the_grant_of_a_member_it_dropped(store, prefix, worker):
    """Version 1 lists A and B, and A opens and holds the one grant (cap 1 of 2). Version 2
    lists B and C, both failing on every call. B's fifth failure finds the cap full; the
    worker joins again, learns that the newest config lists B and C, closes A (cause
    not_listed) and takes its grant back, and B opens: from then on B is refused and C, held
    back at the cap, keeps being called and counted. (Before: A's grant, which no worker of
    version 2 would take back, held the cap for good: B and C were called 40 times each,
    none refused, 72 trips held back.)"""
    upstream = Upstream()
    v1 = worker(["A", "B"])
    open_one(v1, "A", upstream)
    assert holders(store, prefix).keys() == {"A"}

    v2 = worker(["B", "C"])
    upstream.down |= {"B", "C"}
    answers = [(call(v2, "B", upstream), call(v2, "C", upstream)) for _ in range(40)]
    assert answers == [("failed", "failed")] * 5 + [("refused", "failed")] * 35
    assert (upstream.calls["B"], upstream.calls["C"]) == (5, 40)
    status = v2.status()
    shown = (status["members"], status["cap"], status["open"], status["holders"])
    assert shown == (["B", "C"], 1, ["B"], ["B"])
    assert status["held"] == 1 + 36  # B's fifth failure, then C's from its fifth on
    assert raw_state(store, prefix, "A")["state"] == "closed"
    assert last_cause(store, prefix, "A") == "open>closed:not_listed"
    assert "grant" not in raw_state(store, prefix, "A")


def test_the_newest_config_keeps_the_membership_when_an_older_worker_starts_later(
    store, prefix, worker, clock
):
    """A worker of version 1 that starts after version 2 was deployed (its master replaced a
    worker that died) joins too, but the group keeps version 2's members and cap; its
    member A, which version 2 dropped, gets no grant (its trip is held back) while version 2
    lists B and C. A rollback (version 1 again, once no worker of version 2 has joined for
    10 minutes) takes the membership back."""
    upstream = Upstream()
    worker(["A", "B", "C", "D"]).settle()  # version 1 joins: cap 2 of 4
    v2 = worker(["B", "C"])
    v2.settle()
    late_v1 = worker(["A", "B", "C", "D"])
    late_v1.settle()
    status = late_v1.status()
    assert (status["members"], status["cap"]) == (["A", "B", "C", "D"], 2)  # its own view
    shown = {text(k): text(v) for k, v in store.hgetall(f"{prefix}:group:{{pool}}").items()}
    assert (shown["members"], shown["cap"], shown["fraction"]) == ("B C", "1", "0.5")
    upstream.down.add("A")
    assert [call(late_v1, "A", upstream) for _ in range(8)] == ["failed"] * 8
    assert late_v1.breaker("A").snapshot()["state"] == "closed"  # held back: not listed
    assert holders(store, prefix) == {}

    clock.advance(600_001)  # version 2's workers are gone: its config is forgotten
    # held back and refused (not listed), the worker joins again: its config is the newest
    # left, and the next failure is granted and opens A
    assert [call(late_v1, "A", upstream) for _ in range(3)] == ["failed", "failed", "refused"]
    shown = {text(k): text(v) for k, v in store.hgetall(f"{prefix}:group:{{pool}}").items()}
    assert (shown["members"], shown["cap"]) == ("A B C D", "2")
    assert holders(store, prefix).keys() == {"A"}


# -- a grant given back as its member closes -------------------------------------------------


@pytest.mark.parametrize("action", ["reset", "force_closed", "clear_force"])
def test_an_operator_closing_a_member_releases_its_grant_at_once(store, prefix, worker, clock, action):
    """reset(), force_closed() and clear_force() of an open member, from a process with no
    group (an operator's, as the CLI and the dashboard are), give the grant back in the
    member's slot and have the group forget it: the other member opens at its next trip."""
    upstream = Upstream()
    pool = worker(["A", "B"])
    open_one(pool, "A", upstream)
    operator = Breakers(store, prefix, clock=clock, listen=False)
    try:
        if action == "clear_force":
            operator.get("A").force_open()
            assert holders(store, prefix).keys() == {"A"}  # forced open keeps it
        getattr(operator.get("A"), action)()
    finally:
        operator.close()
    assert holders(store, prefix) == {}
    assert "grant" not in raw_state(store, prefix, "A")
    upstream.down.add("B")
    assert [call(pool, "B", upstream) for _ in range(6)] == ["failed"] * 5 + ["refused"]
    assert holders(store, prefix).keys() == {"B"}


def test_the_cli_reset_of_a_member_releases_its_grant(redis_server, worker_on_server):
    """`breaker-redis reset A`: A closes, and the group no longer lists its grant (before: it
    did, and nothing would ever take it back if no worker listed A)."""
    pool, prefix = worker_on_server(["A", "B"])
    upstream = Upstream()
    open_one(pool, "A", upstream)
    client = redis_server.client()
    assert holders(client, prefix).keys() == {"A"}
    done = CliRunner().invoke(cli.main, ["--url", redis_server.url, "--prefix", prefix, "reset", "A"])
    assert (done.exit_code, done.output) == (0, "A: closed\n")
    assert holders(client, prefix) == {}
    assert last_cause(client, prefix, "A") == "open>closed:reset"


def test_a_member_closed_by_its_probe_gives_its_grant_back_in_its_own_slot(store, prefix, worker, clock):
    """The close and the revocation are one script: the reply says 'released', and settle()
    has the group forget the grant. A grant that arrives when its trip is no longer called
    for (a success came first) is not kept either."""
    upstream = Upstream()
    pool = worker(["A", "B"])
    open_one(pool, "A", upstream)
    token = holders(store, prefix)["A"]
    clock.advance(30_000)
    upstream.down.discard("A")
    assert call(pool, "A", upstream) == "ok"  # the probe: closed
    state = raw_state(store, prefix, "A")
    assert (state["state"], state.get("grant"), int(state["revoked"])) == ("closed", None, token)
    assert holders(store, prefix) == {}
    # a grant for B now, while no rule calls for a trip: revoked at once, and forgotten
    granted = pool.breakers.gate.run("group", "pool", clock(), ["", "", "ask", "B", "1"])[0]
    late = pool.breaker("B").run_script("member", ["grant", text(granted[1]), ""])
    assert (late.allowed, late.reason, late.lease) == (0, "unneeded", text(granted[1]))
    assert pool.breakers.gate.run("group", "pool", clock(), ["", "", "release", "B", late.lease])[0] == 1
    assert holders(store, prefix) == {}


def test_an_open_member_nobody_calls_any_more_is_closed_when_the_cap_is_needed(store, prefix, worker, clock):
    """A member every config still lists, open, whose open period ended a minute ago without
    a call since (no worker calls it any more): a worker refused at the cap closes it (cause
    idle) and takes its grant; one whose open period ended less than a minute ago keeps it."""
    upstream = Upstream()
    pool = worker(["A", "B"])
    open_one(pool, "A", upstream)
    upstream.down.add("B")
    clock.advance(30_000 + 59_999)
    assert [call(pool, "B", upstream) for _ in range(5)] == ["failed"] * 5
    assert holders(store, prefix).keys() == {"A"}  # not idle yet: kept
    clock.advance(1_001)  # a minute since A could have been probed; the reclaim is due again
    assert [call(pool, "B", upstream) for _ in range(2)] == ["failed", "refused"]
    assert holders(store, prefix).keys() == {"B"}
    assert last_cause(store, prefix, "A") == "open>closed:idle"


# -- by hand ---------------------------------------------------------------------------------


def test_a_grant_is_released_by_hand_from_python(store, prefix, worker, clock):
    """pool.release(member): the member is closed (cause released) and its grant forgotten;
    True once, then False (nothing listed). release_grant does the same without a group."""
    upstream = Upstream()
    pool = worker(["A", "B"])
    open_one(pool, "A", upstream)
    assert pool.release("A") is True
    assert (raw_state(store, prefix, "A")["state"], holders(store, prefix)) == ("closed", {})
    assert last_cause(store, prefix, "A") == "open>closed:released"
    assert pool.release("A") is False
    open_one(pool, "B", upstream)
    other = Breakers(store, prefix, clock=clock, listen=False)
    try:
        assert release_grant(other, "pool", "B") is True
    finally:
        other.close()
    assert holders(store, prefix) == {}
    with pytest.raises(ValueError, match=r"breaker group 'pool': member 'a\{b\}'"):
        pool.release("a{b}")


def test_a_grant_is_released_by_hand_with_the_cli(redis_server, worker_on_server):
    pool, prefix = worker_on_server(["A", "B"])
    open_one(pool, "A", Upstream())
    options = ["--url", redis_server.url, "--prefix", prefix]
    done = CliRunner().invoke(cli.main, [*options, "release", "pool", "A"])
    assert (done.exit_code, done.output) == (0, "A: closed; its grant in group pool released\n")
    again = CliRunner().invoke(cli.main, [*options, "release", "pool", "A"])
    assert (again.exit_code, again.output) == (0, "A: closed; group pool listed no grant for it\n")
    bad = CliRunner().invoke(cli.main, [*options, "release", "p{x}", "A"])
    assert bad.exit_code == 2 and "invalid breaker name 'p{x}'" in bad.output
    unknown = CliRunner().invoke(cli.main, [*options, "release", "other", "A"])
    assert unknown.exit_code == 1 and "unknown breaker group 'other'" in unknown.output
    unknown = CliRunner().invoke(cli.main, [*options, "release", "pool", "Z"])
    assert unknown.exit_code == 1 and "unknown breaker 'Z'" in unknown.output


def test_an_async_group_releases_by_hand_and_frees_a_dropped_members_grant(redis_server, clock):
    """The asyncio group: the deploy that drops a member, and release() awaited."""
    from breaker_redis.asyncio import Breakers as AsyncBreakers
    from breaker_redis.groups import AsyncBreakerGroup

    prefix = f"grp{next(_prefixes)}"
    upstream = Upstream()

    async def calls(group: AsyncBreakerGroup, member: str, n: int) -> list[str]:
        answers = []
        for _ in range(n):
            try:
                answers.append(await group.breaker(member).call(upstream, member))
            except BreakerOpen:
                answers.append("refused")
            except ConnectionError:
                answers.append("failed")
            await group.settle()
        return answers

    async def main() -> None:
        made = [AsyncBreakers.from_url(redis_server.url, prefix, clock=clock, listen=False) for _ in range(2)]
        try:
            v1 = AsyncBreakerGroup(made[0], "pool", ["A", "B"], config=CONFIG)
            v2 = AsyncBreakerGroup(made[1], "pool", ["B", "C"], config=CONFIG)
            upstream.down |= {"A", "B"}
            assert await calls(v1, "A", 5) == ["failed"] * 5
            clock.advance(1)  # version 2 starts (and joins) after version 1
            assert await calls(v2, "B", 6) == ["failed"] * 5 + ["refused"]
            status = await v2.status()
            assert (status["open"], status["holders"]) == (["B"], ["B"])
            assert await v2.release("B") is True
            assert (await v2.status())["holders"] == []
        finally:
            for breakers in made:
                await breakers.aclose()

    asyncio.run(main())
    assert last_cause(redis_server.client(), prefix, "A") == "open>closed:not_listed"


@pytest.fixture
def worker_on_server(redis_server) -> Iterator[Callable[..., tuple[BreakerGroup, str]]]:
    """A worker on the session's redis-server, under a prefix of its own, on Redis's clock as
    the CLI is (a test clock's times would read as long idle there, and be swept)."""
    made: list[Breakers] = []

    def make(members: list[str]) -> tuple[BreakerGroup, str]:
        prefix = f"grp{next(_prefixes)}"
        breakers = Breakers.from_url(redis_server.url, prefix, listen=False)
        made.append(breakers)
        return BreakerGroup(breakers, "pool", members, config=CONFIG), prefix

    yield make
    for breakers in made:
        breakers.close()


# -- values edited by hand -------------------------------------------------------------------


def test_grant_values_edited_by_hand_are_repaired_and_the_cap_holds(store, prefix, worker):
    """The scripts check every grant value they read: a member's grant that is not a token is
    dropped (its trip is held back until the group grants one), a group's grant that is not
    a token counts as held (the highest token handed out), and a config record that does not
    parse is forgotten."""
    upstream = Upstream()
    pool = worker(["A", "B"])
    open_one(pool, "A", upstream)
    key = f"{prefix}:group:{{pool}}"
    store.hset(key, mapping={"h:A": "Infinity", "v:beef": "garbage", "seq": "1e999"})
    upstream.down.add("B")
    assert [call(pool, "B", upstream) for _ in range(7)] == ["failed"] * 7  # A still holds: B held back
    assert holders(store, prefix).keys() == {"A"}
    assert store.hget(key, "v:beef") is None  # forgotten when the worker joined again
    store.hset(f"{prefix}:{{B}}:state", "grant", "not a token")
    assert call(pool, "B", upstream) == "failed"
    assert "grant" not in raw_state(store, prefix, "B")
    assert raw_state(store, prefix, "B")["state"] == "closed"


# -- any deploys, any failures: the cap holds and nothing deadlocks -------------------------

NAMES = ["A", "B", "C", "D", "E"]
FRACTIONS = [0.2, 0.34, 0.5, 0.75, 1.0]
PROPERTY_CONFIG = BreakerConfig(trip="consecutive", failure_threshold=2, open_seconds=5)


@dataclass
class Version:
    """A config of the app (its members and fraction), when it was first deployed, and the
    worker processes of it that run."""

    members: tuple[str, ...]
    fraction: float
    first: int
    workers: list[BreakerGroup] = field(default_factory=list)

    @property
    def cap(self) -> int:
        return cap_of(self.fraction, len(self.members))


DEPLOY = st.tuples(
    st.just("deploy"),
    st.lists(st.sampled_from(NAMES), min_size=1, max_size=5, unique=True),
    st.sampled_from(FRACTIONS),
)
STEPS = st.lists(
    st.one_of(
        DEPLOY,
        st.tuples(st.just("retire"), st.integers(0, 20)),
        st.tuples(st.just("call"), st.integers(0, 20), st.integers(0, 4), st.booleans()),
        st.tuples(st.just("down"), st.sampled_from(NAMES), st.booleans()),
        st.tuples(st.just("advance"), st.integers(0, 10_000)),
        st.tuples(st.just("reset"), st.sampled_from(NAMES)),
        st.tuples(st.just("release"), st.integers(0, 20), st.sampled_from(NAMES)),
    ),
    min_size=5,
    max_size=30,
)


def check_the_cap(store: Any, prefix: str, cap: int, before: dict[str, int]) -> dict[str, int]:
    """What must hold after every step: each open member (not forced) holds a grant the group
    lists, and the group never hands out a grant beyond the cap of its newest config (a deploy
    that lowers the cap leaves grants already held until their members close)."""
    listed = holders(store, prefix)
    for name in NAMES:
        state = raw_state(store, prefix, name)
        if state.get("state", "closed") != "closed" and not state.get("forced"):
            assert "grant" in state and listed.get(name) == int(state["grant"]), (name, state, listed)
    if len(listed) > len(before) or set(listed) - set(before):
        assert len(listed) <= cap, (listed, before, cap)
    return listed


@pytest.mark.parametrize("store", ["fake", "real"], indirect=True)
@replayed(100)
@given(first=DEPLOY, steps=STEPS)
def test_any_deploys_and_failures_never_exceed_the_cap_and_never_deadlock(store, first, steps):
    """Random member lists deployed one after another (workers of older versions running on
    or retiring), random failures and recoveries, time passing, operators resetting members
    and releasing grants by hand. After every step every open member holds a grant the group
    lists and no grant was handed out beyond the newest config's cap. Then, the newest
    version's members all failing: every grant left by a member it no longer lists, or by a
    closed one, is taken back, and exactly min(cap, members) of its members are open."""
    clock = Clock()
    prefix = f"grp{next(_prefixes)}"
    made: list[Breakers] = []
    versions: dict[tuple[tuple[str, ...], float], Version] = {}
    upstream = Upstream()
    operator = Breakers(store, prefix, clock=clock, listen=False)
    made.append(operator)

    def deploy(members: tuple[str, ...], fraction: float) -> BreakerGroup:
        clock.advance(1)  # a config first seen later is newer (no two in the same ms)
        version = versions.setdefault((members, fraction), Version(members, fraction, clock()))
        breakers = Breakers(store, prefix, clock=clock, listen=False)
        made.append(breakers)
        group = BreakerGroup(
            breakers, "pool", list(members), max_open_fraction=fraction, config=PROPERTY_CONFIG
        )
        group.settle()  # the worker starts: it joins
        version.workers.append(group)
        return group

    def newest() -> Version:
        return max(versions.values(), key=lambda v: v.first)

    def running() -> list[BreakerGroup]:
        return [w for v in versions.values() for w in v.workers]

    try:
        listed: dict[str, int] = {}
        for step in [first, *steps]:
            kind = step[0]
            if kind == "deploy":
                deploy(tuple(step[1]), step[2])
            elif kind == "retire" and running():
                group = running()[step[1] % len(running())]
                next(v for v in versions.values() if group in v.workers).workers.remove(group)
                group.breakers.close()
            elif kind == "call" and running():
                group = running()[step[1] % len(running())]
                member = group.members[step[2] % len(group.members)]
                if step[3]:
                    upstream.down.add(member)
                call(group, member, upstream)
            elif kind == "down":
                (upstream.down.add if step[2] else upstream.down.discard)(step[1])
            elif kind == "advance":
                clock.advance(step[1])
            elif kind == "reset":
                operator.get(step[1]).reset()
            elif kind == "release" and running():
                running()[step[1] % len(running())].release(step[2])
            if versions:
                listed = check_the_cap(store, prefix, newest().cap, listed)

        # the newest version alone, every member of it failing: no deadlock
        last = newest()
        group = last.workers[0] if last.workers else deploy(last.members, last.fraction)
        upstream.down |= set(NAMES)
        for _ in range(12):
            clock.advance(1_100)  # each round a reclaim is due; open periods (5 s) end
            for member in last.members:
                call(group, member, upstream)
                listed = check_the_cap(store, prefix, last.cap, listed)
        open_now = sorted(
            n
            for n in NAMES
            if raw_state(store, prefix, n).get("state", "closed") != "closed"
            and not raw_state(store, prefix, n).get("forced")
        )
        assert set(open_now) <= set(last.members), (open_now, last.members)
        assert len(open_now) == min(last.cap, len(last.members)), (open_now, last)
        assert sorted(holders(store, prefix)) == open_now
    finally:
        for breakers in made:
            breakers.close()
