"""The scripts' arguments are named once: each script's table and storage/args.py agree.

Each script (lua/<script>.lua) reads its own ARGV positions once, into a table
(``local a = {epoch = ARGV[7], ...}``; group.lua one per op); each dataclass
names the same positions by its field order. Read from both files, so a name or
a position changed on one side only fails here. Also: no script reads ARGV 7 on
elsewhere, the prelude's includes are small and say their job, the config keys
are said once, and every ``lua/...``, ``breaker_redis/...`` or ``docs/...`` path
named in the code and the docs exists (comments pointing at moved files).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from breaker_redis import BreakerConfig
from breaker_redis.engine.knowledge import Reply
from breaker_redis.storage import args as py_args
from breaker_redis.storage.lua_source import OPERATIONS, assembled, prelude
from breaker_redis.web.group_config import member_config

ROOT = Path(__file__).resolve().parents[2]
LUA = ROOT / "lua"
_TABLE = re.compile(r"a = \{(.*?)\}[ \t]*\n", re.DOTALL)  # a script's own arguments: local a = {...}
_FIELD = re.compile(r"(\w+) = (?:ARGV\[(\d+)\]|\{unpack\(ARGV, (\d+)\)\})")


def _code(text: str) -> str:
    return "\n".join(line.split("--")[0] for line in text.split("\n"))  # comments dropped


def lua_tables(script: str) -> list[list[tuple[str, int]]]:
    """The tables a script reads its arguments into, each [(name, ARGV position), ...] in order."""
    code = _code((LUA / f"{script}.lua").read_text("utf-8"))
    return [[(m[0], int(m[1] or m[2])) for m in _FIELD.findall(table)] for table in _TABLE.findall(code)]


def python_fields(cls: type[py_args.ScriptArgs]) -> list[str]:
    """The names the dataclass sends, in ARGV order (its counts field as the six counts)."""
    return list(py_args.argv_names(cls))


def _script_of(cls: type) -> str:
    """RecordArgs -> record; GroupJoinArgs -> group."""
    name = cls.__name__.removesuffix("Args")
    return "group" if name.startswith("Group") else name.lower()


SCRIPTS_WITH_ARGS = [op for op in OPERATIONS if op not in ("health", "sweep")]


def test_each_script_names_the_dataclass_fields_in_argv_order() -> None:
    by_script: dict[str, list[list[str]]] = {}
    for cls in py_args.ALL:
        by_script.setdefault(_script_of(cls), []).append(python_fields(cls))
    assert sorted(by_script) == sorted(SCRIPTS_WITH_ARGS)
    for script in SCRIPTS_WITH_ARGS:
        tables = lua_tables(script)
        assert tables, script
        for table in tables:
            positions = [position for _, position in table]
            assert positions == list(range(7, 7 + len(table))), (script, table)  # ARGV 7 on, no gap
        assert sorted([name for name, _ in t] for t in tables) == sorted(by_script[script]), script


def test_argv_lists_the_fields_in_their_order() -> None:
    """argv() (written out where a worker sends it for most calls) is the fields' order,
    the counts field spread in place as the six counts."""
    counts = [f"<{n}>" for n in py_args.COUNTS]
    for cls in py_args.ALL:
        given = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
        instance = cls(*(counts if f.name == "counts" else f"<{f.name}>" for f in given))
        values = instance.argv()
        if cls is py_args.ConfigureArgs:
            assert values == list(instance.changes)  # type: ignore[attr-defined]
            continue
        fixed = {f.name: getattr(instance, f.name) for f in dataclasses.fields(cls) if not f.init}  # type: ignore[arg-type]
        assert values == [fixed.get(n, f"<{n}>") for n in python_fields(cls)], cls.__name__


def test_the_check_fails_when_a_name_or_a_position_differs() -> None:
    code = _code((LUA / "record.lua").read_text("utf-8"))
    good = [[(m[0], int(m[1] or m[2])) for m in _FIELD.findall(t)] for t in _TABLE.findall(code)]
    swapped = code.replace("outcome = ARGV[8]", "outcome = ARGV[9]")
    renamed = code.replace("duration_ms = ARGV[9]", "duration = ARGV[9]")
    assert [n for n, _ in good[0]] == python_fields(py_args.RecordArgs)
    assert [int(m[1]) for m in _FIELD.findall(_TABLE.findall(swapped)[0])][:3] == [7, 9, 9]
    assert "duration" in [m[0] for m in _FIELD.findall(_TABLE.findall(renamed)[0])]


@pytest.mark.parametrize("script", SCRIPTS_WITH_ARGS)
def test_a_script_reads_its_own_arguments_once(script: str) -> None:
    code = _code((LUA / f"{script}.lua").read_text("utf-8"))
    outside = _TABLE.sub("", code)
    if script == "group":  # its tables are chosen by op
        outside = outside.replace("if ARGV[7] == ", "").replace("elseif ARGV[7] == ", "")
    assert not re.search(r"ARGV\[(?:[7-9]|\d\d)\]|ARGV\[i|unpack\(ARGV", outside), script


def test_the_prelude_is_its_includes_each_small_and_saying_its_job() -> None:
    lib = (LUA / "_lib.lua").read_text("utf-8")
    named = re.findall(r"^-- @include (\w+)$", lib, re.MULTILINE)
    files = sorted(p.stem for p in (LUA / "includes").glob("*.lua"))
    assert sorted(named) == files and len(named) == len(set(named))
    for name in named:
        text = (LUA / "includes" / f"{name}.lua").read_text("utf-8")
        assert text.startswith(f"-- {name}.lua: "), name  # its one job, first
        assert len(text.splitlines()) <= 300, name
    assert not re.search(r"^-- @include", assembled(), re.MULTILINE) and "--@LIVE_RULES@" not in prelude()


_PATH = re.compile(r"(?<![\w/.-])((?:breaker_redis|lua|docs)/[\w./-]*\w)")


def _named_paths() -> list[tuple[str, str]]:
    sources = [
        *ROOT.glob("lua/**/*.lua"),
        *ROOT.glob("breaker_redis/**/*.py"),
        *ROOT.glob("docs/**/*.md"),
        *ROOT.glob("*.md"),  # README.md, CONTRIBUTING.md, CHANGELOG.md
    ]
    found = []
    for source in sources:
        for path in _PATH.findall(source.read_text("utf-8")):
            found.append((str(source.relative_to(ROOT)), path))
    return found


def _exists(path: str) -> bool:
    target = ROOT / path
    if target.exists() or any(ROOT.glob(path)):
        return True
    return path.startswith("breaker_redis/lua/")  # where a wheel ships lua/


def test_every_path_named_in_the_code_and_the_docs_exists() -> None:
    found = _named_paths()
    assert len(found) > 100
    missing = sorted({f"{source}: {path}" for source, path in found if not _exists(path)})
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_the_path_check_finds_a_stale_path() -> None:
    assert not _exists("breaker_redis/scripts.py") and _exists("breaker_redis/storage/scripts.py")
    assert _PATH.findall("see breaker_redis/config.py (to_lua_json), lua/_lib.lua.") == [
        "breaker_redis/config.py",
        "lua/_lib.lua",
    ]


def test_the_config_keys_are_said_once_and_are_those_a_worker_sends() -> None:
    config_lua = (LUA / "includes" / "config.lua").read_text("utf-8")
    said = re.findall(r"^--   @config (\w+) +\S", config_lua, re.MULTILINE)
    assert len(said) == len(set(said))
    config = BreakerConfig(min_reporters=2, window_calls=100, ramp_seconds=5, ramp_from=0.2)  # none left out
    sent = set(json.loads(member_config(config, "g").to_lua()))
    assert set(said) == sent


def test_the_reply_described_in_wire_md_is_the_one_reply_decode_reads() -> None:
    wire = (ROOT / "docs" / "wire.md").read_text("utf-8")
    section = wire[wire.index("## The common reply") :]
    described = section[section.index("```\n") + 4 : section.index("\n```", section.index("```\n"))].split()
    assert described == [f.name for f in dataclasses.fields(Reply)]
