"""Transition alerts: ``Breakers.on_transition(callback)``.

Each transition is made by exactly one script run, in one process, whose
reply lists it (the ``events`` field of lua/_lib.lua's reply); that process,
and only it, calls the callbacks. So across every worker of every host a
callback runs once per transition of the shared state, which is what an alert
wants: no duplicates, no listener to elect. Transitions of the in-process
fallback store (Redis down) are per process and are not reported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("breaker_redis")


@dataclass(frozen=True)
class Transition:
    name: str
    old: str  # closed | open | half_open
    new: str
    cause: str  # e.g. consecutive, count, rate, slow, open_elapsed, probe_failed, forced_open, reset
    epoch: int  # the epoch it started
    at_ms: int  # Redis time of the change, ms since the epoch


TransitionCallback = Callable[[Transition], object]


def parse(name: str, events: str, final_epoch: int, at_ms: int) -> list[Transition]:
    """The transitions of one reply: ``from>to:cause`` entries, comma-separated
    (``armed`` entries are not transitions); each one bumped the epoch by one."""
    moves = [entry for entry in events.split(",") if ">" in entry]
    found = []
    for i, entry in enumerate(moves):
        states, _, cause = entry.partition(":")
        old, _, new = states.partition(">")
        found.append(Transition(name, old, new, cause, final_epoch - (len(moves) - 1 - i), at_ms))
    return found


def notify(callbacks: list[TransitionCallback], transitions: list[Transition]) -> None:
    """Call every callback for every transition; a failing callback is logged,
    never raised into the call that made the transition."""
    for transition in transitions:
        for callback in callbacks:
            try:
                callback(transition)
            except Exception:
                log.exception("on_transition callback %r failed for %s", callback, transition)
