"""How BreakerConfig declares a field that can be set live, and every rule about one.

BreakerConfig (config.py) writes each such field as one line, ``live(...)``:
its name in the scripts' config and its bounds. ``LiveField`` is that line
read back, and checks, encodes and decodes the field's values. The rules are
kept apart from the config that declares them: config.py holds what a
breaker is configured with and the tables derived from its fields, this
module how any one field is checked (docs/design.md, section 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


def invalid(field: str, why: str, value: object) -> ValueError:
    """The error a value BreakerConfig does not take raises, naming the field."""
    return ValueError(f"BreakerConfig.{field} {why} (got {value!r})")


@dataclass(frozen=True)
class LiveField:
    """One field of BreakerConfig that can be set live, and every rule about it.

    ``lua`` is its key in the scripts' config (``to_lua``); a field named
    ``*_seconds`` is sent in whole milliseconds (``unit`` 1000, else 1). A field of
    ``words`` takes one of them; any other is a number from ``low`` (excluded
    when ``low_open``) to ``high``, an ``integer`` or not. One typed
    ``X | None`` can be ``off``: None in Python, 0 in the scripts, and a live
    value of '', 'none' or 'off'. ``omitted_at_default``: left out of the
    scripts' config at its default, the scripts then doing nothing of it.
    """

    name: str
    lua: str
    default: Any
    words: tuple[str, ...] = ()
    low: float = 0
    low_open: bool = False
    high: float = 0
    integer: bool = False
    off: bool = False
    omitted_at_default: bool = False
    unit: int = 1

    def check(self, value: object) -> None:
        """ValueError naming the field unless ``value`` is one BreakerConfig takes."""
        if value is None and self.off:
            return
        if self.words:
            if value not in self.words:
                raise invalid(self.name, f"must be one of {', '.join(self.words)}", value)
            return
        if self.integer:
            if isinstance(value, bool) or not isinstance(value, int):
                raise invalid(self.name, "must be an integer", value)
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise invalid(self.name, "must be a finite number", value)
        if value < self.low or (self.low_open and value == self.low) or value > self.high:
            bound = f"> {self.low:g}" if self.low_open else f">= {self.low:g}"
            raise invalid(self.name, f"must be {bound} and <= {self.high:g}", value)

    def encode(self, value: Any) -> Any:
        """A value as the scripts take it: off 0, seconds in whole ms."""
        if value is None:
            return 0
        return round(value * 1000) if self.unit == 1000 else value

    def decode(self, value: Any) -> Any:
        """``encode`` undone, no validation."""
        if self.off and not value:
            return None
        return float(value) / 1000 if self.unit == 1000 else value


def live(
    lua: str,
    default: Any,
    *,
    words: tuple[str, ...] = (),
    ge: float | None = None,
    gt: float | None = None,
    le: float = 0,
    omitted_at_default: bool = False,
) -> Any:
    """A BreakerConfig field that can be set live: its default, and its rules
    (LiveField) kept in the dataclass field's metadata."""
    low_open = gt is not None
    low = gt if gt is not None else ge if ge is not None else 0
    if not words and le <= low:
        raise TypeError(f"live({lua!r}): a number needs its bounds")
    rules = {
        "lua": lua,
        "words": words,
        "low": low,
        "low_open": low_open,
        "high": le,
        "omitted_at_default": omitted_at_default,
    }
    return field(default=default, metadata={"live": rules})
