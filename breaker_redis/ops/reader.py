"""Reading every breaker under one key prefix without knowing the apps' configs
(the CLI, the Prometheus collector, the Flask dashboard).

The window is read with the bucket width and count the workers last wrote
(``bms`` and ``nb`` in the window hash): a window read with another bucket
width reads as empty. Reads never listen and never fall back to a store of
their own: with Redis down a read fails rather than showing a fresh breaker.

Many breakers are read in one round trip per CHUNK of them, not a few per
breaker: one pipeline of lua/read.lua (what snapshot.lua tells, in one
string), each call reading with the config its workers stored; redis-py's
cluster pipeline sends one per node. A breaker whose stored config is not the
one the rules above pick (none stored yet, or edited by hand) is read again
with the one they pick, which costs two more round trips for those. A read
builds no ``Breakers``: only the switches (``breakers()``) need one, and a
Reader makes one at most. What each reply means is replies.py's; this module
is which round trips ask for them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import redis

from breaker_redis.base.config import BreakerConfig
from breaker_redis.engine.breakers import DEFAULT_TTL_SECONDS, Breakers
from breaker_redis.engine.snapshot import Snapshot, snapshot_of
from breaker_redis.ops.replies import (
    Parts,
    fields_of,
    parse_event,
    parts_of,
    stored_config_of,
    window_config_of,
    window_shape_of,
)
from breaker_redis.storage.args import GroupReadArgs, ReadArgs
from breaker_redis.storage.keys import KEY_SUFFIXES, breaker_keys
from breaker_redis.storage.scripts import ScriptRunner, text
from breaker_redis.web.group_config import group_status

__all__ = ["CHUNK", "EVENTS_KEPT", "Reader", "parse_event", "stored_config_of"]

EVENTS_KEPT = 10  # transitions kept per breaker (lua/includes/events.lua EVENTS_KEPT)
# Breakers per pipeline: 2,000 snapshot replies take about 1 MB; a chunk keeps
# what one round trip holds (and how long Redis works on it) bounded.
CHUNK = 500
PLAIN_KEPT = 256  # config texts whose config in force a Reader keeps
_ANY_NAME = "-"  # lua/read.lua's 'encode' reads no key; its keys only route the call on a cluster
_LEAN = ReadArgs("1").argv()  # the config in force left out where no override changes it
_ENCODE = ReadArgs("encode").argv()  # only the config in force of ARGV 5, nothing read


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    return (items[i : i + CHUNK] for i in range(0, len(items), CHUNK))


@dataclass(eq=False)
class Reader:
    """Every breaker under one key prefix, read without knowing the apps' configs.

    ``clock``: the now_ms given to the snapshot script (tests), as
    ``Breakers(clock=...)``; None: Redis time.
    """

    client: Any
    prefix: str
    _: KW_ONLY
    owns_client: bool = True  # close() closes the client
    clock: Callable[[], int] | None = None
    _runner: ScriptRunner = field(init=False, repr=False)
    _breakers: Breakers | None = field(default=None, init=False, repr=False)
    # config text -> its config in force, no override
    _plain: dict[bytes, Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._runner = ScriptRunner(self.client, self.prefix, int(DEFAULT_TTL_SECONDS * 1000))

    def breakers(self) -> Breakers:
        """Breakers for the switches (force_open ..., configure), made at first use.

        Never listening (no subscription), and never falling back to a store
        of its own: with Redis down, a switch must fail, not land in memory.
        """
        if self._breakers is None:
            self._breakers = Breakers(self.client, self.prefix, listen=False, on_store_error="deny")
        return self._breakers

    def keys(self, name: str) -> dict[str, str]:
        return dict(zip(KEY_SUFFIXES, breaker_keys(self.prefix, name), strict=True))

    def names(self) -> list[str]:
        """Every breaker name listed under the prefix (by any worker)."""
        return sorted(text(n) for n in self.client.smembers(self._runner.names_key))

    def known(self, name: str) -> bool:
        """In the names set, or with a state hash (the set is best effort)."""
        if name in self.names():
            return True
        return bool(self.client.exists(self.keys(name)["state"]))

    def window_shape(self, name: str) -> tuple[int, int] | None:
        """(bucket ms, bucket count), or (0, N) for a count window of N calls, as the workers
        last wrote the window; None: no window."""
        return window_shape_of(*self.client.hmget(self.keys(name)["window"], "bms", "nb", "rn"))

    def window_config(self, name: str) -> BreakerConfig:
        return window_config_of(self.window_shape(name))

    def stored_config(self, name: str) -> BreakerConfig | None:
        """The config of the last worker that wrote the state (the ``cfg`` key)."""
        return stored_config_of(self.client.get(self.keys(name)["cfg"]))

    def snapshot(self, name: str, stored: BreakerConfig | None = None) -> Snapshot:
        """Read with the workers' own config when one is written (so its "config"
        is the one in force; ``stored``: already read), else with their window shape."""
        if stored is None:
            return self.snapshots([name])[0]
        (parts,) = self._read_with([name], [stored.to_lua()])
        self._learn([parts])
        return self._snapshot(name, parts)

    def check_readable(self) -> None:
        """Raise what a read of a breaker would meet (a permission Redis refuses:
        the script, TIME, a breaker's keys), reading nothing: for a reader that
        found no breaker listed, which would otherwise say all is well while
        workers refused the same permission have listed none (lua/read.lua's
        'encode' call of an unused name, one round trip)."""
        self._runner.run("read", "-", self._now_ms(), [BreakerConfig().to_lua(), 0, *_ENCODE])

    def snapshots(self, names: Iterable[str] | None = None) -> list[Snapshot]:
        """The snapshots of ``names`` (every listed breaker by default), in their
        order, each as ``snapshot(name)`` reads it.

        Each breaker is read with the config its workers stored (lua/read.lua),
        CHUNK to a round trip, the next chunk on its way while this one is
        decoded. Where that is not the config the rules pick (none stored, or one
        BreakerConfig refuses or would not write as it is: edited by hand), the
        breaker is read again with the one they pick, two more round trips for
        all those. Config texts this Reader has not seen yet: one more."""
        names = self.names() if names is None else list(names)
        now_ms = self._now_ms()
        accepted: dict[bytes, bool] = {}
        found: list[Parts | None] = []
        out: list[Snapshot | None] = []
        chunks = ([(name, now_ms, [b"", 0, *_LEAN]) for name in chunk] for chunk in _chunks(names))
        with contextlib.closing(self._runner.run_chunks("read", chunks)) as replies:
            for chunk in replies:  # decoded while Redis runs the next chunk
                for reply in chunk:
                    parts = None if isinstance(reply, Exception) else parts_of(reply)
                    if parts is not None and not self._as_written(parts.text, accepted):
                        parts = None
                    found.append(parts)
                    out.append(self._snapshot(names[len(out)], parts) if self._known(parts) else None)
        again = [i for i, parts in enumerate(found) if parts is None]
        if again:
            unread = [names[i] for i in again]
            for i, parts in zip(again, self._read_with(unread, self._config_texts(unread)), strict=True):
                found[i] = parts
        self._learn([parts for parts, snapshot in zip(found, out, strict=True) if snapshot is None])
        return [
            snapshot if snapshot is not None else self._snapshot(name, found[i])
            for i, (name, snapshot) in enumerate(zip(names, out, strict=True))
        ]

    @staticmethod
    def _as_written(stored: bytes, accepted: dict[bytes, bool]) -> bool:
        """Whether a stored config text is the one a read picks: a valid config that
        BreakerConfig writes back as the same text (a worker's always is)."""
        verdict = accepted.get(stored)
        if verdict is None:
            config = stored_config_of(stored)
            verdict = accepted[stored] = config is not None and config.to_lua() == stored
        return verdict

    def _config_texts(self, names: Sequence[str]) -> list[bytes]:
        """The config text each breaker is read with: its stored config's, else one of
        its window's shape (one pipeline). An error reading a key raises, as a lone read's."""
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            keys = self.keys(name)
            pipe.get(keys["cfg"])
            pipe.hmget(keys["window"], "bms", "nb", "rn")
        replies = pipe.execute(raise_on_error=False)
        encoded: dict[Any, bytes] = {}  # made so far, by what they were made from
        texts = []
        for raw, window in zip(replies[::2], replies[1::2], strict=True):
            if isinstance(raw, Exception):
                raise raw
            stored = stored_config_of(raw)
            if stored is not None:
                texts.append(stored.to_lua())
                continue
            if isinstance(window, Exception):
                raise window
            shape = window_shape_of(*window)
            if shape not in encoded:
                encoded[shape] = window_config_of(shape).to_lua()
            texts.append(encoded[shape])
        return texts

    def _now_ms(self) -> int | None:
        return None if self.clock is None else int(self.clock())

    def now_ms(self) -> int:
        """The time the snapshots are read at: the clock's, else Redis's TIME."""
        now_ms = self._now_ms()
        if now_ms is None:
            seconds, micros = self.client.time()
            now_ms = int(seconds) * 1000 + int(micros) // 1000
        return now_ms

    def _read_with(self, names: Sequence[str], configs: Sequence[bytes]) -> list[Parts]:
        """Each name read with its config text, in one pipeline; an error raises,
        except a key of the wrong type, repaired as a worker's call would."""
        now_ms = self._now_ms()
        calls = [(name, now_ms, [config, 0, *_LEAN]) for name, config in zip(names, configs, strict=True)]
        out = []
        replies = self._runner.run_many("read", calls)
        for call, config, reply in zip(calls, configs, replies, strict=True):
            if isinstance(reply, Exception):
                if not (isinstance(reply, redis.exceptions.ResponseError) and "WRONGTYPE" in str(reply)):
                    raise reply
                reply = self._runner.run_repairing("read", *call)
            parts = parts_of(reply, config)
            if parts is None:  # only a read with the stored config may read nothing
                raise redis.exceptions.ResponseError(f"lua/read.lua read nothing of {call[0]!r}")
            out.append(parts)
        return out

    def _known(self, parts: Parts | None) -> bool:
        """Whether a snapshot can be made of it now (its config in force is known)."""
        return parts is not None and (parts.config != b"=" or parts.text in self._plain)

    def _learn(self, found: Sequence[Parts | None]) -> None:
        """The config in force of each config text read.lua left it out for (no live
        override applied) that this Reader does not know yet, as Redis encodes it:
        one round trip for all of them."""
        unknown = sorted({p.text for p in found if p is not None and not self._known(p)})
        if not unknown:
            return
        if len(self._plain) + len(unknown) > PLAIN_KEPT:
            self._plain.clear()
        now_ms = self._now_ms()
        calls = [(_ANY_NAME, now_ms, [config_text, 0, *_ENCODE]) for config_text in unknown]
        for config_text, reply in zip(unknown, self._runner.run_many("read", calls), strict=True):
            if isinstance(reply, Exception):
                raise reply
            self._plain[config_text] = reply

    def _snapshot(self, name: str, parts: Parts | None) -> Snapshot:
        assert parts is not None
        config = self._plain[parts.text] if parts.config == b"=" else parts.config
        return snapshot_of(name, fields_of(parts, config), "redis")

    def group_names(self) -> list[str]:
        """Every breaker group listed under the prefix (breaker_redis/groups.py)."""
        return sorted(text(n) for n in self.client.smembers(self._runner.groups_key))

    def groups(self, snapshots: Iterable[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
        """Every breaker group: its members as the last worker joining described
        them, their states (from ``snapshots`` where given, else the state hashes),
        which are open, which hold the group's grants, its cap and counters
        (groups.group_status). One round trip, and one more for states not given."""
        names = self.group_names()
        if not names:
            return []
        now_ms = self._now_ms()
        reads = [(name, now_ms, ["", "", *GroupReadArgs().argv()]) for name in names]
        raws = self._runner.run_many("group", reads)
        for raw in raws:
            if isinstance(raw, Exception):
                raise raw
        states = {str(s["name"]): str(s["state"]) for s in snapshots}
        described = [group_status(name, raw, {}) for name, raw in zip(names, raws, strict=True)]
        missing = sorted({m for group in described for m in group["members"]} - set(states))
        if missing:
            pipe = self.client.pipeline(transaction=False)
            for member in missing:
                pipe.hmget(self.keys(member)["state"], "state")
            for member, (state,) in zip(missing, pipe.execute(), strict=True):
                states[member] = text(state) or "closed"
        return [group_status(name, raw, states) for name, raw in zip(names, raws, strict=True)]

    def overrides(self, name: str) -> dict[str, str]:
        raw = self.client.hgetall(self.keys(name)["config"])
        return {text(key): text(value) for key, value in sorted(raw.items())}

    def transitions(self, name: str, count: int) -> list[dict[str, str]]:
        """The last ``count`` transitions of one breaker (at most EVENTS_KEPT), oldest first."""
        return self.histories([name], count)[name]

    def histories(self, names: Iterable[str], count: int) -> dict[str, list[dict[str, str]]]:
        """transitions(name, count) of each name, one round trip per CHUNK names."""
        names = list(names)
        if count <= 0:
            return {name: [] for name in names}
        found: dict[str, list[dict[str, str]]] = {}
        for chunk in _chunks(names):
            pipe = self.client.pipeline(transaction=False)
            for name in chunk:
                pipe.lrange(self.keys(name)["events"], 0, min(count, EVENTS_KEPT) - 1)
            for name, lines in zip(chunk, pipe.execute(), strict=True):
                history = [event for event in map(parse_event, lines) if event is not None]
                history.reverse()
                for event in history:
                    event.update(name=name, id=f"{event['at']}-{event['epoch']}", kind="transition")
                found[name] = history
        return found

    def close(self) -> None:
        if self._breakers is not None:
            self._breakers.close()
        if self.owns_client:
            self.client.close()
