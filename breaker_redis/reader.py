"""Reading every breaker under one key prefix without knowing the apps' configs
(the CLI, the Prometheus collector).

The window is read with the bucket width and count the workers last wrote
(``bms`` and ``nb`` in the window hash): a window read with another bucket
width reads as empty. Reads never listen and never fall back to a store of
their own: with Redis down a read fails rather than showing a fresh breaker.
"""

from __future__ import annotations

from typing import Any

from .breakers import Breakers
from .config import BreakerConfig
from .scripts import KEY_SUFFIXES, breaker_keys, text

EVENTS_KEPT = 10  # transitions kept per breaker (lua/_lib.lua EVENTS_KEPT)
EVENT_FIELDS = ("at", "from", "to", "cause", "epoch", "open_until", "forced")


def parse_event(line: Any) -> dict[str, str] | None:
    """One line of the events list (lua/_lib.lua transition); None for one that is
    not (edited by hand): the history shows what it can read."""
    parts = text(line).split(" ")
    if len(parts) != len(EVENT_FIELDS) or not all(p.isdigit() for p in (parts[0], parts[4], parts[5])):
        return None
    event = dict(zip(EVENT_FIELDS, parts, strict=True))
    if event["forced"] == "-":
        event["forced"] = ""
    return event


class Reader:
    """Every breaker under one key prefix, read without knowing the apps' configs."""

    def __init__(self, client: Any, prefix: str, *, owns_client: bool = True) -> None:
        self.client = client
        self.prefix = prefix
        self._owns_client = owns_client
        self._readers: dict[BreakerConfig, Breakers] = {}

    def breakers(self, config: BreakerConfig | None = None) -> Breakers:
        """Breakers whose default config is ``config``: one per window shape read.

        Never listening (no subscription), and never falling back to a store
        of its own: with Redis down, a read must fail, not show a fresh breaker.
        """
        config = config or BreakerConfig()
        breakers = self._readers.get(config)
        if breakers is None:
            breakers = self._readers[config] = Breakers(
                self.client, self.prefix, listen=False, on_store_error="deny", defaults=config
            )
        return breakers

    def keys(self, name: str) -> dict[str, str]:
        return dict(zip(KEY_SUFFIXES, breaker_keys(self.prefix, name), strict=True))

    def names(self) -> list[str]:
        return self.breakers().names()

    def known(self, name: str) -> bool:
        """In the names set, or with a state hash (the set is best effort)."""
        if name in self.names():
            return True
        return bool(self.client.exists(self.keys(name)["state"]))

    def window_shape(self, name: str) -> tuple[int, int] | None:
        """(bucket ms, bucket count) as the workers last wrote the window; None: no window.

        A window hash from before ``nb`` was written: the default bucket count.
        """
        bms, nb = self.client.hmget(self.keys(name)["window"], "bms", "nb")
        try:
            return int(bms), int(nb) if nb is not None else BreakerConfig().window_buckets
        except (TypeError, ValueError):
            return None

    def window_config(self, name: str) -> BreakerConfig:
        """A config whose window has the bucket width and count the workers last wrote.

        With live overrides applied on top (the snapshot script does that) it
        gives the same bucket width again, so the window reads as the workers
        read it.
        """
        shape = self.window_shape(name)
        if shape is None:
            return BreakerConfig()
        bucket_ms, buckets = shape
        try:
            return BreakerConfig(window_seconds=bucket_ms * buckets / 1000, window_buckets=buckets)
        except ValueError:  # a shape no config could have written (the hash was edited)
            return BreakerConfig()

    def stored_config(self, name: str) -> BreakerConfig | None:
        """The config of the last worker that wrote the state (the ``cfg`` key);
        None when none is written or it does not make a valid config."""
        raw = self.client.get(self.keys(name)["cfg"])
        if not raw:
            return None
        try:
            return BreakerConfig.from_lua(raw)
        except (ValueError, TypeError):
            return None

    def snapshot(self, name: str, stored: BreakerConfig | None = None) -> dict[str, Any]:
        """Read with the workers' own config when one is written (so its "config"
        is the one in force; ``stored``: already read), else with their window shape."""
        config = stored or self.stored_config(name) or self.window_config(name)
        return self.breakers(config).get(name).snapshot()

    def snapshots(self) -> list[dict[str, Any]]:
        return [self.snapshot(name) for name in self.names()]

    def overrides(self, name: str) -> dict[str, str]:
        raw = self.client.hgetall(self.keys(name)["config"])
        return {text(key): text(value) for key, value in sorted(raw.items())}

    def transitions(self, name: str, count: int) -> list[dict[str, str]]:
        """The last ``count`` transitions of one breaker (at most EVENTS_KEPT), oldest first."""
        if count <= 0:
            return []
        lines = self.client.lrange(self.keys(name)["events"], 0, min(count, EVENTS_KEPT) - 1)
        out = [event for event in map(parse_event, lines) if event is not None]
        out.reverse()
        for event in out:
            event.update(name=name, id=f"{event['at']}-{event['epoch']}", kind="transition")
        return out

    def close(self) -> None:
        for breakers in self._readers.values():
            breakers.close()
        if self._owns_client:
            self.client.close()
