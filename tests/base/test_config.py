"""BreakerConfig's open period and its cap, and which breaker names are allowed
(docs/design.md section 7)."""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
from pathlib import Path

import fakeredis
import pytest

from breaker_redis import BreakerConfig, BreakerOpen, Breakers
from breaker_redis.base.config import config_field_names
from breaker_redis.base.names import MAX_NAME_LENGTH, validate_name


def lua(config: BreakerConfig) -> dict[str, object]:
    return json.loads(config.to_lua())


# -- open_seconds / max_open_seconds: an unset one follows the other -------------------------


def test_defaults_open_30_s_capped_at_300_s():
    cfg = BreakerConfig()
    assert (cfg.open_seconds, cfg.max_open_seconds) == (30, 300)
    assert (lua(cfg)["open_ms"], lua(cfg)["max_open_ms"]) == (30_000, 300_000)


def test_a_long_open_period_raises_the_unset_cap():
    cfg = BreakerConfig(open_seconds=600)
    assert cfg.max_open_seconds == 600
    assert lua(cfg)["max_open_ms"] == 600_000


def test_a_short_open_period_keeps_the_300_s_cap():
    assert BreakerConfig(open_seconds=60).max_open_seconds == 300


def test_a_cap_below_the_default_open_period_shortens_the_unset_open_period():
    cfg = BreakerConfig(max_open_seconds=10)
    assert (cfg.open_seconds, cfg.max_open_seconds) == (10, 10)
    assert (lua(cfg)["open_ms"], lua(cfg)["max_open_ms"]) == (10_000, 10_000)
    assert BreakerConfig(max_open_seconds=60).open_seconds == 30


def test_both_set_and_contradicting_is_an_error_naming_the_cap():
    with pytest.raises(ValueError, match=r"BreakerConfig\.max_open_seconds must be >= open_seconds \(600\)"):
        BreakerConfig(open_seconds=600, max_open_seconds=100)
    assert BreakerConfig(open_seconds=60, max_open_seconds=60).max_open_seconds == 60


@pytest.mark.parametrize(
    ("field", "value"), [("open_seconds", "30"), ("open_seconds", 0), ("max_open_seconds", True)]
)
def test_bad_durations_name_their_field(field, value):
    with pytest.raises(ValueError, match=rf"BreakerConfig\.{field}\b"):
        BreakerConfig(**{field: value})


def test_replace_derives_an_unset_value_again():
    long_open = BreakerConfig(open_seconds=600)
    assert dataclasses.replace(long_open, open_seconds=900).max_open_seconds == 900
    assert dataclasses.replace(long_open, open_seconds=60).max_open_seconds == 300
    short_cap = BreakerConfig(max_open_seconds=10)
    assert dataclasses.replace(short_cap, max_open_seconds=60).open_seconds == 30
    unchanged = dataclasses.replace(BreakerConfig(), failure_threshold=3)
    assert (unchanged.open_seconds, unchanged.max_open_seconds) == (30, 300)


def test_replace_keeps_a_value_the_user_set():
    both = BreakerConfig(open_seconds=600, max_open_seconds=600)
    with pytest.raises(ValueError, match="max_open_seconds"):
        dataclasses.replace(both, open_seconds=900)
    with pytest.raises(ValueError, match="max_open_seconds"):  # the Flask BREAKER_DEFAULTS case
        dataclasses.replace(BreakerConfig(max_open_seconds=60), open_seconds=120)


def test_equal_effective_values_are_equal_configs():
    assert BreakerConfig() == BreakerConfig(open_seconds=30, max_open_seconds=300)
    assert hash(BreakerConfig()) == hash(BreakerConfig(open_seconds=30, max_open_seconds=300))
    assert BreakerConfig(open_seconds=600) == BreakerConfig(open_seconds=600, max_open_seconds=600)
    assert "max_open_seconds=600.0" in repr(BreakerConfig(open_seconds=600))


def test_pickling_keeps_what_was_derived():
    cfg = pickle.loads(pickle.dumps(BreakerConfig(open_seconds=600)))
    assert cfg == BreakerConfig(open_seconds=600)
    assert dataclasses.replace(cfg, open_seconds=900).max_open_seconds == 900


def test_a_misspelt_field_gets_a_did_you_mean():
    with pytest.raises(
        TypeError, match=r"BreakerConfig has no field 'failure_treshold'; did you mean 'failure_threshold'\?$"
    ):
        BreakerConfig(failure_treshold=3)
    with pytest.raises(TypeError, match=r"no field 'colour'; fields: trip, failure_threshold, "):
        BreakerConfig(colour="blue")  # nothing close: the names to pick from
    with pytest.raises(TypeError, match="did you mean 'open_seconds'"):
        dataclasses.replace(BreakerConfig(), open_second=5)


def test_a_subclass_keeps_its_own_fields_and_names_itself():
    @dataclasses.dataclass(frozen=True)
    class Member(BreakerConfig):  # as a breaker group's member config adds its group
        group: str = ""

    assert Member(group="payments", failure_threshold=2).group == "payments"
    with pytest.raises(TypeError, match=r"^Member has no field 'grup'; did you mean 'group'\?$"):
        Member(grup="payments")


def test_a_misspelt_live_field_gets_a_did_you_mean():
    with pytest.raises(
        ValueError, match=r"unknown config field 'open_second'; did you mean 'open_seconds'\?$"
    ):
        BreakerConfig().with_overrides({"open_second": "5"})


def test_live_overrides_follow_the_same_rule():
    assert BreakerConfig().with_overrides({"open_seconds": "600"}).max_open_seconds == 600
    assert BreakerConfig(max_open_seconds=10).with_overrides({"max_open_seconds": "60"}).open_seconds == 30
    with pytest.raises(ValueError, match="max_open_seconds"):
        BreakerConfig().with_overrides({"open_seconds": "600", "max_open_seconds": "100"})


def test_a_live_long_open_period_is_accepted_and_applied(make_breakers):
    breakers = make_breakers()
    b = breakers.get("pay", BreakerConfig(failure_threshold=1))
    assert breakers.configure("pay", open_seconds=600) == {"open_seconds": "600"}
    b.acquire().failure()
    with pytest.raises(BreakerOpen) as info:
        b.acquire()
    assert info.value.retry_after == 600.0


# -- the docs name every field ----------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def test_the_configuration_page_has_a_row_for_every_field():
    """docs/configuration.md: each BreakerConfig field in the first column of a row of its
    table, and no name there that is not a field (a field added or renamed fails here)."""
    page = (ROOT / "docs" / "configuration.md").read_text("utf-8")
    section = page.split("# Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = [name for row in rows for name in re.findall(r"`(\w+)`", row.split(" | ", 1)[0])]
    assert sorted(documented) == sorted(config_field_names())


def test_the_design_doc_names_every_field():
    """docs/design.md lists BreakerConfig's fields in its public API."""
    design = (ROOT / "docs" / "design.md").read_text("utf-8")
    listed = design.split("- `BreakerConfig`: a frozen dataclass", 1)[1].split("\n- ", 1)[0]
    assert set(config_field_names()) <= set(re.findall(r"`(\w+)`", listed))


# -- names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["pay", "api/v1/pay", "päy", 'a"b', "x\\y", "a:b.c-d_e", "支付", "x" * MAX_NAME_LENGTH]
)
def test_names_may_hold_anything_safe_in_a_key(name):
    assert validate_name(name) == name


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("{pay}", r"character '\{' \(U\+007B, brace\) at position 0"),
        ("pay}", r"character '\}' \(U\+007D, brace\) at position 3"),
        ("a b", r"character ' ' \(U\+0020, whitespace\) at position 1"),
        ("a\tb", r"character '\\t' \(U\+0009, whitespace\) at position 1"),
        ("a\nb", r"character '\\n' \(U\+000A, whitespace\) at position 1"),
        ("\u00a0", r"character '\\xa0' \(U\+00A0, whitespace\) at position 0"),
        ("a\u3000b", r"\(U\+3000, whitespace\) at position 1"),
        ("a\x00b", r"character '\\x00' \(U\+0000, control character\) at position 1"),
        ("a\x7f", r"\(U\+007F, control character\) at position 1"),
        ("pay\u200b", r"\(U\+200B, format character\) at position 3"),
        ("pay\ud800", r"\(U\+D800, surrogate\) at position 3"),
    ],
)
def test_a_refused_name_says_which_character(name, shown):
    with pytest.raises(ValueError, match="invalid breaker name") as info:
        validate_name(name)
    message = str(info.value)
    assert re.search(shown, message), message
    assert "names may hold anything but {, }, whitespace and control characters" in message


def test_empty_and_too_long_names_are_refused():
    with pytest.raises(ValueError, match="must not be empty"):
        validate_name("")
    with pytest.raises(ValueError, match=f"{MAX_NAME_LENGTH + 1} characters, at most {MAX_NAME_LENGTH}"):
        validate_name("x" * (MAX_NAME_LENGTH + 1))


@pytest.mark.parametrize("name", [None, 5, b"pay", ["pay"]])
def test_a_name_that_is_not_a_str_is_a_type_error(name):
    with pytest.raises(TypeError, match=f"must be a str \\(got {type(name).__name__}\\)"):
        validate_name(name)


def test_a_url_path_name_round_trips_through_redis():
    breakers = Breakers(fakeredis.FakeRedis(server=fakeredis.FakeServer()), listen=False)
    try:
        breakers.get("api/v1/pay").acquire().failure()
        snap = breakers.get("api/v1/pay").snapshot()
        assert (snap["name"], snap["failures"]) == ("api/v1/pay", 1)
        assert breakers.names() == ["api/v1/pay"]
    finally:
        breakers.close()


@pytest.mark.parametrize("name", ["api/v1/pay", "päy", 'a"b', "x\\y"])
def test_unusual_names_work_end_to_end(make_breakers, name):
    breakers = make_breakers()
    b = breakers.get(name, BreakerConfig(failure_threshold=1, open_seconds=10))
    b.acquire().failure()
    with pytest.raises(BreakerOpen) as info:
        b.acquire()
    assert info.value.breaker == name
    snap = b.snapshot()
    assert (snap["name"], snap["failures"], snap["state"]) == (name, 1, "open")
    assert breakers.names() == [name]


def test_a_live_cap_alone_shortens_the_open_period_as_in_python(make_breakers):
    """configure(max_open_seconds=10) on a config that set neither: the open period follows the cap."""
    breakers = make_breakers()
    b = breakers.get("pay", BreakerConfig(trip="consecutive", failure_threshold=1))
    assert b.config.with_overrides({"max_open_seconds": "10"}).open_seconds == 10
    breakers.configure("pay", max_open_seconds=10)
    b.acquire().failure()
    with pytest.raises(BreakerOpen) as refused:
        b.acquire()
    assert refused.value.retry_after == 10.0


def test_a_live_open_period_alone_rederives_the_cap(make_breakers, clock):
    """open_seconds=600 in code, 60 live: the cap follows (300 s), so backoff reaches 120 s, not 600."""
    breakers = make_breakers()
    cfg = BreakerConfig(trip="consecutive", failure_threshold=1, open_seconds=600, open_backoff=10)
    b = breakers.get("pay", cfg)
    assert cfg.with_overrides({"open_seconds": "60"}).max_open_seconds == 300
    breakers.configure("pay", open_seconds=60)
    b.acquire().failure()  # open for 60 s
    clock.advance(60_000)
    b.acquire().failure()  # the probe fails: 60 x 10 = 600, capped at 300 (+ up to 10 % jitter)
    with pytest.raises(BreakerOpen) as refused:
        b.acquire()
    assert 300.0 <= refused.value.retry_after <= 330.0
