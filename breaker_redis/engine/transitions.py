"""Transition alerts: ``Breakers.on_transition(callback)`` and
``Breakers.on_operator_action(callback)``.

Each transition is made by exactly one script run, in one process, whose
reply lists it (the ``events`` field of the reply: docs/wire.md); that process,
and only it, calls the callbacks. So across every worker of every host a
callback runs once per transition of the shared state, which is what an alert
wants: no duplicates, no listener to elect. Transitions of the in-process
fallback store (Redis down) are per process and are not reported.

Two hooks, because a pager and an audit log want different things. An
operator's word (lua/admin.lua: ``force_open()``, ``reset()``, the CLI's
switches, the dashboard's buttons) always makes a transition in the events
list, even when the state stays what it was: ``reset()`` of a closed breaker
is ``closed -> closed (reset)``, ``force_open()`` of an open one ``open ->
open (forced_open)``. ``on_transition`` hears of state changes only (old !=
new), the rules' and the operators' alike, the latter marked
``operator``; a pager that pages on ``t.new == "open" and not t.operator``
pages on trips only. ``on_operator_action`` hears of every operator action
this process applied, whether it changed the state or not.

With ``min_reporters`` above 1, a reporter's isolation and its end are reported
to ``on_transition`` too, once each, with ``t.reporter`` set: ``closed ->
isolated`` (cause: the rule that held for that reporter alone) and ``isolated ->
closed`` (``probe_succeeded``). The shared state did not change (the epoch is
the breaker's); an isolation renewed after a failed probe is not reported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("breaker_redis")

# The causes lua/admin.lua gives its transitions (a test holds the two equal);
# every other cause is a rule's (lua/_lib.lua, acquire.lua, record.lua).
OPERATOR_CAUSES = frozenset(
    {"forced_open", "forced_closed", "force_cleared", "opened", "half_opened", "reset"}
)


@dataclass(frozen=True)
class Transition:
    name: str
    old: str  # closed | open | half_open
    new: str
    # a rule's: consecutive, count, rate, slow, open_elapsed, probe_failed, probe_timeout,
    # probes_succeeded;
    # an operator's (OPERATOR_CAUSES): forced_open, forced_closed, force_cleared, opened (trip()),
    # half_opened, reset
    cause: str
    epoch: int  # the epoch it started
    at_ms: int  # Redis time of the change, ms since the epoch
    # a reporter's isolation (old or new 'isolated'; min_reporters > 1), else None
    reporter: str | None = None

    @property
    def operator(self) -> bool:
        """Made by an operator's action (force_open(), reset(), trip() ...), not by the rules."""
        return self.cause in OPERATOR_CAUSES

    @property
    def changed(self) -> bool:
        """Whether the state changed (an operator's reset of a closed breaker does not)."""
        return self.old != self.new


TransitionCallback = Callable[[Transition], object]


def parse(name: str, events: str, final_epoch: int, at_ms: int) -> list[Transition]:
    """The transitions of one reply: ``from>to:cause`` entries, comma-separated
    (``armed`` entries are not transitions); each one bumped the epoch by one.
    And a reporter's isolation and its end: ``isolated:cause:reporter``,
    ``recovered:cause:reporter`` (lua/includes/reporters.lua isolation_changed; no epoch bumped)."""
    entries = events.split(",")
    moves = [entry for entry in entries if ">" in entry]
    found = []
    for i, entry in enumerate(moves):
        states, _, cause = entry.partition(":")
        old, _, new = states.partition(">")
        found.append(Transition(name, old, new, cause, final_epoch - (len(moves) - 1 - i), at_ms))
    for entry in entries:
        what, _, rest = entry.partition(":")
        if what in _ISOLATION_MOVES and ":" in rest:
            cause, _, reporter = rest.partition(":")
            old, new = _ISOLATION_MOVES[what]
            found.append(Transition(name, old, new, cause, final_epoch, at_ms, reporter))
    return found


_ISOLATION_MOVES = {"isolated": ("closed", "isolated"), "recovered": ("isolated", "closed")}


def released_upto(events: str) -> int:
    """The highest grant token a reply's events say its breaker, a group member, gave back
    as it closed (``released:<token>``, lua/includes/grants.lua give_back_grant); 0 for none."""
    found = 0
    for entry in events.split(","):
        what, _, token = entry.partition(":")
        if what == "released" and token.isdigit():
            found = max(found, int(token))
    return found


def notify(callbacks: list[TransitionCallback], transitions: list[Transition], hook: str) -> None:
    """Call every callback for every transition; a failing callback is logged,
    never raised into the call that made the transition."""
    for transition in transitions:
        for callback in callbacks:
            try:
                callback(transition)
            except Exception:
                log.exception("%s callback %r failed for %s", hook, callback, transition)


class TransitionHooks:
    """The callbacks of one Breakers (sync or asyncio) and what each is told."""

    def __init__(self) -> None:
        self.changes: list[TransitionCallback] = []
        self.actions: list[TransitionCallback] = []

    @staticmethod
    def add(
        callbacks: list[TransitionCallback], callback: TransitionCallback, hook: str
    ) -> TransitionCallback:
        if not callable(callback):
            raise TypeError(f"{hook} needs a callable (got {callback!r})")
        callbacks.append(callback)
        return callback

    def report(self, name: str, events: str, epoch: int, at_ms: int) -> None:
        """The transitions of one reply: state changes to ``on_transition``, then
        operator actions to ``on_operator_action``."""
        if not (self.changes or self.actions):
            return
        found = parse(name, events, epoch, at_ms)
        if self.changes:
            notify(list(self.changes), [t for t in found if t.changed], "on_transition")
        if self.actions:
            notify(list(self.actions), [t for t in found if t.operator], "on_operator_action")
