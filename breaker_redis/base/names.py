"""What a breaker may be called, checked once where a name comes in.

A name is the one thing every layer handles: the stores put it in keys, the
engine in its caches, the web integrations derive it from a route or a host,
the CLI reads it from the command line. The rule lives here, in the base
layer, so that each of them checks it the same way without importing the
scripts' runner (docs/design.md, section 1).
"""

from __future__ import annotations

import re
import unicodedata

# A name becomes part of a key (prefix:{NAME}:suffix), of the names SET and of
# the JSON messages the scripts publish (encoded there with cjson), so it may
# hold anything a key can, URL paths such as "api/v1/pay" and non-ASCII text
# included, except: braces, which would break the hash tag that keeps a
# breaker's keys in one Redis Cluster slot; whitespace (str.isspace, Unicode
# spaces included) and control, format and surrogate characters (Unicode
# categories Cc, Cf, Cs), which make names that look alike in logs and
# dashboards or cannot be encoded. At most MAX_NAME_LENGTH characters: a name
# is repeated in six keys and in every message about the breaker.
MAX_NAME_LENGTH = 200
_NAME_RULE = "names may hold anything but {, }, whitespace and control characters (Unicode Cc, Cf, Cs)"
_REFUSED_CATEGORIES = {"Cc": "control character", "Cf": "format character", "Cs": "surrogate"}
_PREFIX = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")


def _refused_kind(char: str) -> str | None:
    if char in "{}":
        return "brace"
    if char.isspace():
        return "whitespace"
    return _REFUSED_CATEGORIES.get(unicodedata.category(char))


def validate_name(name: object) -> str:
    """The name, if it can name a breaker; else an error saying what is wrong with it."""
    if not isinstance(name, str):
        raise TypeError(f"invalid breaker name {name!r}: must be a str (got {type(name).__name__})")
    if not name:
        raise ValueError(f"invalid breaker name '': names must not be empty; {_NAME_RULE}")
    if len(name) > MAX_NAME_LENGTH:
        too_long = f"{len(name)} characters, at most {MAX_NAME_LENGTH} allowed"
        raise ValueError(f"invalid breaker name {name[:40]!r}...: {too_long}")
    for position, char in enumerate(name):
        kind = _refused_kind(char)
        if kind is not None:
            raise ValueError(
                f"invalid breaker name {name!r}: character {char!r} (U+{ord(char):04X}, {kind}) "
                f"at position {position} is not allowed; {_NAME_RULE}"
            )
    return name


def validate_prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise ValueError(f"invalid key prefix {prefix!r}: use 1-64 characters from A-Z a-z 0-9 _ . : -")
    return prefix
