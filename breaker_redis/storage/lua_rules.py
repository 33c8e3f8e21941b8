"""BreakerConfig's live rules as Lua, for the scripts' prelude.

The scripts hold a live value written to a breaker's config hash to the same
rules as the constructor (lua/includes/config.lua, apply_overrides). Those rules are
declared once, with BreakerConfig's fields (config.LIVE_FIELDS); the body of
lua/includes/config.lua's ``rules()`` is written from them when the scripts' text is
built (lua_source.prelude), in place of its ``--@LIVE_RULES@`` line, so the Lua
file holds no copy of them. The same fields give the same text: the scripts'
SHA1 and the library's name change only when a rule does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from breaker_redis.base.config import LIVE_FIELDS, MAX_OPEN_SECONDS_FLOOR, OFF_VALUES, OPEN_SECONDS

_PLACE = re.compile(r"^[ \t]*--@LIVE_RULES@.*$", re.MULTILINE)
_LUA_WORD = re.compile(r"[A-Za-z0-9_ ]*")  # names and words written as Lua strings: nothing to escape
# lua/includes/config.lua BOUNDS[field]
_BOUND_COLUMNS = ("lua", "unit", "low", "low_open", "high", "integer", "off")


def _lua(value: str | float) -> str:
    """A value of a field's rules as a Lua literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        if not _LUA_WORD.fullmatch(value):
            raise ValueError(f"{value!r} cannot be written into the scripts")
        return f"'{value}'"
    number = float(value)
    return str(int(number)) if number.is_integer() else repr(number)


def _set(words: Iterable[str]) -> str:
    """Words as a Lua set: {['a'] = true, ...}."""
    return "{" + ", ".join(f"[{_lua(word)}] = true" for word in words) + "}"


def live_rules() -> str:
    """The body of lua/includes/config.lua's rules(): BOUNDS, WORDS, OFF, OPEN_MS and
    CAP_FLOOR_MS (described there), from config.LIVE_FIELDS."""
    bounds = [
        f"    {f.name} = {{{', '.join(_lua(getattr(f, column)) for column in _BOUND_COLUMNS)}}},"
        for f in LIVE_FIELDS
        if not f.words
    ]
    words = [f"    {f.name} = {_set(f.words)}," for f in LIVE_FIELDS if f.words]
    return "\n".join(
        [
            "  -- written from BreakerConfig's fields (breaker_redis/base/config.py)",
            "  -- by breaker_redis/storage/lua_rules.py",
            "  BOUNDS = {",
            *bounds,
            "  }",
            "  WORDS = {",
            *words,
            "  }",
            f"  OFF = {_set(OFF_VALUES)}",
            f"  OPEN_MS, CAP_FLOOR_MS = {_lua(OPEN_SECONDS * 1000)}, {_lua(MAX_OPEN_SECONDS_FLOOR * 1000)}",
        ]
    )


def with_live_rules(prelude: str) -> str:
    """The prelude's text (lua/_lib.lua with its includes) with live_rules() in place
    of its one ``--@LIVE_RULES@`` line (in lua/includes/config.lua)."""
    source, found = _PLACE.subn(lambda _: live_rules(), prelude)
    if found != 1:
        raise RuntimeError(f"the prelude (lua/includes/config.lua) has {found} --@LIVE_RULES@ lines, not one")
    return source
