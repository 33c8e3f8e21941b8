"""What the readers get back, decoded, with no I/O: lua/read.lua's reply (the
config text read with, the snapshot's fields, the config in force), a config a
worker stored, the window's shape, a line of the events list.

reader.py makes the round trips (which breakers, in which chunks, read again
with which config); this is what their answers mean, as docs/wire.md writes
it, apart from when they are asked for. Reading a value a worker did not write
(a key edited by hand) gives None, never an exception: a reader shows what it
can read.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from breaker_redis.base.config import BreakerConfig
from breaker_redis.storage.scripts import text
from breaker_redis.web.group_config import config_from_lua

__all__ = [
    "EVENT_FIELDS",
    "READ_FIELDS",
    "Parts",
    "fields_of",
    "parse_event",
    "parts_of",
    "stored_config_of",
    "window_config_of",
    "window_shape_of",
]

EVENT_FIELDS = ("at", "from", "to", "cause", "epoch", "open_until", "forced")
# The values lua/read.lua replies with, in order: snapshot.lua's fields of those names.
READ_FIELDS = (
    "state",
    "epoch",
    "open_until",
    "forced",
    "consec",
    "open_ms",
    "ho_ok",
    "window_calls",
    "window_failures",
    "window_slow",
    "probes",
    "slots",
    "now",
    "mode",
    "ramp_until",
    "stats",
    "overrides",
    "reporters",  # with min_reporters > 1 only
)


def parse_event(line: Any) -> dict[str, str] | None:
    """One line of the events list (docs/wire.md, "The events list"); None for one that is
    not (edited by hand): the history shows what it can read."""
    parts = text(line).split(" ")
    if len(parts) != len(EVENT_FIELDS) or not all(p.isdigit() for p in (parts[0], parts[4], parts[5])):
        return None
    event = dict(zip(EVENT_FIELDS, parts, strict=True))
    if event["forced"] == "-":
        event["forced"] = ""
    return event


def stored_config_of(raw: Any) -> BreakerConfig | None:
    """The config a worker wrote with the state (the ``cfg`` key); None when none
    is written or it does not make a valid config."""
    if not raw:
        return None
    try:
        return config_from_lua(raw)  # a breaker group member's names its group
    except (ValueError, TypeError):
        return None


def window_shape_of(bms: Any, nb: Any, rn: Any = None) -> tuple[int, int] | None:
    """(bucket ms, bucket count) from the window hash, or (0, N) for a count window of
    the last N calls (``rn``: lua/includes/ring.lua); None: no window.
    A window hash from before ``nb`` was written: the default bucket count."""
    try:
        if bms is None and rn is not None:
            return 0, int(rn)
        return int(bms), int(nb) if nb is not None else BreakerConfig().window_buckets
    except (TypeError, ValueError):
        return None


def window_config_of(shape: tuple[int, int] | None) -> BreakerConfig:
    """A config whose window has the bucket width and count the workers last wrote.

    With live overrides applied on top (the snapshot script does that) it
    gives the same bucket width again, so the window reads as the workers
    read it.
    """
    if shape is None:
        return BreakerConfig()
    bucket_ms, buckets = shape
    try:
        if bucket_ms == 0:  # a count window: the last `buckets` calls
            return BreakerConfig(window_calls=buckets)
        return BreakerConfig(window_seconds=bucket_ms * buckets / 1000, window_buckets=buckets)
    except ValueError:  # a shape no config could have written (the hash was edited)
        return BreakerConfig()


class Parts(NamedTuple):
    """lua/read.lua's reply: the config text read with, the field values (JSON, or
    a list), and the config in force (b"=": the text's own, no override applied)."""

    text: bytes
    values: Any
    config: bytes


def parts_of(reply: Any, given: bytes = b"") -> Parts | None:
    """The parts of a reply to a read with config text ``given`` (b"": the stored
    one); None for a breaker not read (no stored config)."""
    if isinstance(reply, list):
        stored, values, config = reply
        return Parts(text(stored).encode() or given, values, text(config).encode())
    if not reply:
        return None
    data = reply.encode() if isinstance(reply, str) else reply  # the lengths count bytes
    header, _, rest = data.partition(b"\n")
    stored_length, config_length = (int(n) for n in header.split(b" "))
    end = stored_length + config_length
    return Parts(rest[:stored_length] or given, rest[end:], rest[stored_length:end])


def fields_of(parts: Parts, config: Any) -> dict[str, Any]:
    """snapshot.lua's fields by name, from read.lua's reply and the config in force."""
    values = json.loads(text(parts.values)) if isinstance(parts.values, bytes) else parts.values
    fields = dict(zip(READ_FIELDS, values, strict=False))
    fields["config"] = config
    return fields
