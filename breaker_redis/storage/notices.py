"""The one place a message of the events channel is read (``parse_notice``).

Every script that changes a breaker publishes a JSON object on
``<prefix>:events`` (on Redis Cluster also on the breaker's sharded notices
channel): its ``name``, ``kind``, the database of the script that sent it
(``db``), and for a transition, an arming or an isolation the incarnation,
epoch and arms it is about (lua/includes/notify.lua ``publish``). Anyone who may PUBLISH
can put anything there, so a message is a hint and never state
(engine/knowledge.py), and reading it must not fail: the listeners read it
inside the subscription's read loop (a thread on the sync side, the event
loop's protocol callback on the asyncio one), where an exception ends the
subscription of every breaker of the process, and every worker asks Redis at
every call until it is back.

So every field is checked here, once, into a ``Notice`` of plain values; this
function never raises. A message that is not a JSON object naming a breaker
(a ``str`` name) is dropped (``None``): it can be about none of this worker's
breakers. A field that does not hold what a script writes (``Infinity``,
``NaN``, ``1e999``, an integer beyond 2^53, a string, a list, an object, a
boolean) reads as absent, so the message is what a forged one already is: a
plain hint that the breaker named may have changed, which costs that breaker
one round trip and refuses nothing. A ``db`` that is not a database number
names no database a worker uses (``FOREIGN_DATABASE``): the message is dropped,
as one naming another database is.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from breaker_redis.storage.scripts import text

__all__ = ["FOREIGN_DATABASE", "Notice", "parse_notice"]

# The largest integer a script writes, and Lua's numbers (doubles) hold exactly.
MAX_INTEGER = 2**53 - 1
# Digits of an integer literal read as a number at all: Python refuses to convert a longer one
# (sys.int_info.default_max_str_digits, 4300) and would fail the whole message; no script
# writes more than 16.
MAX_DIGITS = 20
# What a ``db`` that is not a database number reads as: no worker's database.
FOREIGN_DATABASE = -1
STATES = ("closed", "open", "half_open")
FORCES = ("", "open", "closed")


@dataclass(frozen=True)
class Notice:
    """One message of the events channel, every field as a script writes it or None.

    ``database``: the database named (None: none named, as by an older breaker_redis;
    FOREIGN_DATABASE: something that is not a database number). ``born``, ``epoch``,
    ``arms`` and ``open_until``: integers 0 to 2^53 - 1 (``arms`` 0 when absent, as the
    scripts before arms wrote none). ``to``: a state name; ``forced``: '', 'open' or
    'closed' (absent or null: '')."""

    name: str
    kind: str = ""
    database: int | None = None
    born: int | None = None
    epoch: int | None = None
    arms: int | None = 0
    open_until: int | None = None
    to: str | None = None
    forced: str | None = ""
    reporter: str | None = None
    # for readers that show messages (the CLI's ``events --follow``): when (Redis ms), the
    # state it left, the cause, and the other fields that hold a string or such an integer
    at: int | None = None
    came_from: str | None = None
    cause: str | None = None
    details: tuple[tuple[str, str | int], ...] = ()
    # the token a worker acknowledges once it has applied the message (storage/acks.py):
    # '<ms>-<count>' as lua/includes/notify.lua notify writes it, '' for none (or anything else)
    ack: str = ""


def parse_notice(data: Any) -> Notice | None:
    """A message's data (bytes or str, docs/wire.md "Pub/sub messages") as a Notice, or None
    to drop it. Never raises: it runs inside a subscription's read loop (the module's
    docstring says why)."""
    try:
        payload = json.loads(text(data), parse_constant=_no_constant, parse_int=_bounded_int)
        if not isinstance(payload, dict):
            return None
        name = payload.get("name")
        if not isinstance(name, str):
            return None
        kind = payload.get("kind")
        arms = payload.get("arms", 0)
        forced = payload.get("forced")
        to, came_from = payload.get("to"), payload.get("from")
        reporter, cause = payload.get("reporter"), payload.get("cause")
        return Notice(
            name=name,
            kind=kind if isinstance(kind, str) else "",
            database=_database(payload),
            born=_integer(payload.get("born")),
            epoch=_integer(payload.get("epoch")),
            arms=_integer(arms),
            open_until=_integer(payload.get("open_until")),
            to=to if isinstance(to, str) and to in STATES else None,
            forced="" if forced is None else forced if isinstance(forced, str) and forced in FORCES else None,
            reporter=reporter if isinstance(reporter, str) else None,
            at=_integer(payload.get("at")),
            came_from=came_from if isinstance(came_from, str) and came_from in STATES else None,
            cause=cause if isinstance(cause, str) else None,
            details=_details(payload),
            ack=_token(payload.get("ack")),
        )
    except Exception:  # anything at all (a RecursionError on deep nesting included): dropped
        return None


class _NotANumber:
    """What JSON's non-standard Infinity, -Infinity and NaN read as (Python would read
    floats): a value that is there, and is none a script writes."""


_NOT_A_NUMBER = _NotANumber()


# The fields a Notice holds by name; the others are its details.
KNOWN_FIELDS = frozenset(
    {
        "name",
        "kind",
        "db",
        "born",
        "epoch",
        "arms",
        "open_until",
        "to",
        "forced",
        "reporter",
        "at",
        "from",
        "cause",
        "ack",
    }
)


def _details(payload: dict[str, Any]) -> tuple[tuple[str, str | int], ...]:
    """The other fields (an isolation's ``what`` and ``until``...) that hold a string or an
    integer a script could write, by name."""
    found: list[tuple[str, str | int]] = []
    for key, value in payload.items():
        if key in KNOWN_FIELDS or not isinstance(key, str):
            continue
        if isinstance(value, str):
            found.append((key, value))
        elif (number := _integer(value)) is not None:
            found.append((key, number))
    return tuple(sorted(found))


def _no_constant(constant: str) -> _NotANumber:
    return _NOT_A_NUMBER


def _bounded_int(literal: str) -> int | _NotANumber:
    """An integer literal, or _NOT_A_NUMBER for one too long to be a script's (MAX_DIGITS)."""
    return int(literal) if len(literal.lstrip("-")) <= MAX_DIGITS else _NOT_A_NUMBER


def _integer(value: Any) -> int | None:
    """A count, epoch or time as a script writes it: an integer 0 to MAX_INTEGER (Lua's
    cjson may write a large one as a float with no fraction); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not math.isfinite(value) or value != math.floor(value):
            return None
        value = int(value)
    if isinstance(value, int) and 0 <= value <= MAX_INTEGER:
        return value
    return None


def _token(value: Any) -> str:
    """An acknowledgement token as a script writes it ('<ms>-<count>'), else ''."""
    if isinstance(value, str) and len(value) <= 2 * MAX_DIGITS + 1:
        ms, dash, count = value.partition("-")
        if dash and ms.isdigit() and count.isdigit() and ms.isascii() and count.isascii():
            return value
    return ""


def _database(payload: dict[str, Any]) -> int | None:
    """The database a message names: None when it names none, FOREIGN_DATABASE when its
    ``db`` is not a database number."""
    value = payload.get("db")
    if value is None:  # (null, as absent)
        return None
    db = _integer(value)
    return FOREIGN_DATABASE if db is None else db
