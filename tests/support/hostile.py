"""Hostile messages for the events channel (hypothesis strategies), each with what a worker
must do about it: a plain hint (one round trip for the breaker named, nothing refused) or
nothing at all (dropped).

Anyone who may PUBLISH can write anything on ``<prefix>:events`` (and SPUBLISH on a
breaker's notices channel on Redis Cluster). The messages are written as JSON text, so
they can hold what Python's json module reads but no script writes: ``Infinity``,
``-Infinity``, ``NaN``, ``1e999``, integers of thousands of digits, and nesting deep enough
to exhaust the decoder's recursion.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

# Values no script writes where a count, an epoch or a time is due (storage/notices.py).
INVALID_NUMBERS = [
    "Infinity",
    "-Infinity",
    "NaN",
    "1e999",
    "-1e999",
    "1e308",
    "2.5",
    "-1",
    "-0.5",
    str(2**53),
    str(2**63),
    "9" * 25,
    "1" * 5000,
    "true",
    "false",
    "null",
    '"12"',
    '""',
    "[]",
    "{}",
    "[1,2]",
    '{"epoch":1}',
    '"Infinity"',
]
# Values a script may write there (the first: a worker's epochs are far below).
VALID_NUMBERS = ["0", "1", "17", str(10**15), str(2**53 - 1), "1700000000000.0"]
# A `db` that is not this worker's database 0: dropped, as a message about another database is.
FOREIGN_DATABASES = [
    "1",
    "7",
    "1.0",
    "-1",
    "Infinity",
    "NaN",
    "1e999",
    '"0"',
    "true",
    "false",
    "2.5",
    str(2**64),
    "[0]",
    '{"db":0}',
    "1" * 5000,
]
WORDS = ["transition", "armed", "isolation", "config", "closed", "open", "half_open", "", "-", "forced_open"]


def _quoted(text: str) -> str:
    return json.dumps(text)


def _object(fields: dict[str, str]) -> str:
    return "{" + ",".join(f"{_quoted(key)}:{value}" for key, value in fields.items()) + "}"


ATOMS = st.one_of(
    st.sampled_from(INVALID_NUMBERS + VALID_NUMBERS),
    st.integers().map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.text(max_size=12).map(_quoted),
    st.sampled_from(WORDS).map(_quoted),
)
# Any JSON value, arrays and objects of any of them included (nested a few levels).
VALUES = st.recursive(
    ATOMS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda items: "[" + ",".join(items) + "]"),
        st.dictionaries(st.text(max_size=6), inner, max_size=4).map(_object),
    ),
    max_leaves=12,
)
# Nesting past the decoder's recursion limit: json.loads raises RecursionError.
DEEP = st.integers(min_value=2_000, max_value=50_000).flatmap(
    lambda depth: st.sampled_from(["[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth])
)
OPTIONAL_FIELDS = ("epoch", "arms", "open_until", "to", "forced", "reporter", "from", "cause", "at")


@st.composite
def plain_hints(draw: st.DrawFn, name: str) -> str:
    """A message naming breaker ``name`` and no other database, whose ``born`` is nothing a
    script writes, so it announces nothing: a plain hint. (Not an isolation, which a worker
    drops unless it names its own reporter.)"""
    fields = {"name": _quoted(name)}
    kind = draw(st.one_of(st.sampled_from(["transition", "armed", "config", "other"]).map(_quoted), VALUES))
    if kind != _quoted("isolation"):
        fields["kind"] = kind
    database = draw(st.sampled_from([None, "0", "null", "0.0", "-0.0"]))
    if database is not None:
        fields["db"] = database
    fields["born"] = draw(st.sampled_from(INVALID_NUMBERS))
    for field in draw(st.lists(st.sampled_from(OPTIONAL_FIELDS), unique=True, max_size=len(OPTIONAL_FIELDS))):
        fields[field] = draw(st.one_of(st.sampled_from(INVALID_NUMBERS + VALID_NUMBERS), VALUES))
    order = draw(st.permutations(list(fields)))
    return _object({key: fields[key] for key in order})


@st.composite
def dropped(draw: st.DrawFn, name: str) -> str:
    """A message a worker drops: not a JSON object, an object naming no breaker by a string,
    one naming a breaker it does not have, or one whose ``db`` is not its database."""
    how = draw(st.sampled_from(["garbage", "not an object", "deep", "bad name", "other name", "foreign db"]))
    if how == "garbage":
        return draw(st.text(max_size=40).filter(lambda text: not text.lstrip().startswith("{")))
    if how == "not an object":
        return draw(VALUES.filter(lambda text: not text.startswith("{")))
    if how == "deep":
        return draw(DEEP)
    fields = {
        "kind": _quoted("transition"),
        "born": draw(st.sampled_from(INVALID_NUMBERS + VALID_NUMBERS)),
        "epoch": draw(st.sampled_from(INVALID_NUMBERS + VALID_NUMBERS)),
    }
    if how == "bad name":
        not_a_string = VALUES.filter(lambda value: value[:1] != '"')
        fields["name"] = draw(st.one_of(st.sampled_from(INVALID_NUMBERS), not_a_string))
    elif how == "other name":
        fields["name"] = _quoted(draw(st.sampled_from(["nobody", name + "-x", name.upper() + "!", ""])))
    else:
        fields["name"] = _quoted(name)
        fields["db"] = draw(st.sampled_from(FOREIGN_DATABASES))
    return _object(fields)


def hostile(name: str) -> st.SearchStrategy[tuple[str, int]]:
    """(message text, round trips it costs a worker that knows breaker ``name``): 1 for a
    plain hint, 0 for a message dropped."""
    return st.one_of(plain_hints(name).map(lambda text: (text, 1)), dropped(name).map(lambda text: (text, 0)))
