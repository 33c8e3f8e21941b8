"""The scripts' arguments are named once: lua/includes/args.lua and storage/args.py agree.

Each Lua parser (``function args.<script>(argv)``) names ARGV positions; each
dataclass names the same positions by its field order. Read from both files, so
a name or a position changed on one side only fails here. Also: no script reads
ARGV 7 on by position any more, and every ``lua/...`` or ``breaker_redis/...``
path named in the code and the docs exists (comments pointing at moved files).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from breaker_redis import BreakerConfig
from breaker_redis.groups import member_config
from breaker_redis.storage import args as py_args
from breaker_redis.storage.scripts import OPERATIONS, assembled, prelude

ROOT = Path(__file__).resolve().parent.parent
LUA = ROOT / "lua"
_FUNCTION = re.compile(r"^function args\.(\w+)\(argv\)\n(.*?)^end$", re.MULTILINE | re.DOTALL)
_RETURN = re.compile(r"return \{(.*?)\}", re.DOTALL)
_FIELD = re.compile(r"(\w+) = (?:argv\[(\d+)\]|rest\(argv, (\d+)\))")


def lua_parsers(text: str) -> dict[str, list[list[tuple[str, int]]]]:
    """script -> the tables its parser returns, each [(name, ARGV position), ...] in order."""
    parsers: dict[str, list[list[tuple[str, int]]]] = {}
    for script, body in _FUNCTION.findall(text):
        tables = []
        for table in _RETURN.findall(body):
            code = "\n".join(line.split("--")[0] for line in table.split("\n"))  # comments dropped
            tables.append([(m[0], int(m[1] or m[2])) for m in _FIELD.findall(code)])
        parsers[script] = tables
    return parsers


def python_fields(cls: type[py_args.ScriptArgs]) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]


def test_each_lua_parser_names_the_dataclass_fields_in_argv_order() -> None:
    parsers = lua_parsers((LUA / "includes" / "args.lua").read_text("utf-8"))
    by_script: dict[str, list[list[str]]] = {}
    for cls in py_args.ALL:
        script = (
            re.sub(r"(Join|Ask|Release|Read)?Args$", "", cls.__name__)
            if cls.__name__.startswith("Group")
            else cls.__name__[: -len("Args")]
        )
        by_script.setdefault(script.lower(), []).append(python_fields(cls))
    assert sorted(parsers) == sorted(by_script)
    for script, tables in parsers.items():
        for table in tables:
            positions = [position for _, position in table]
            assert positions == list(range(7, 7 + len(table))), (script, table)  # ARGV 7 on, no gap
        assert sorted([name for name, _ in t] for t in tables) == sorted(by_script[script]), script


def test_argv_lists_the_fields_in_their_order() -> None:
    """argv() (written out where a worker sends it for most calls) is the fields' order."""
    for cls in py_args.ALL:
        names = python_fields(cls)
        init = [n for n in names if cls.__dataclass_fields__[n].init]  # type: ignore[attr-defined]
        instance = cls(*(f"<{n}>" for n in init))
        values = instance.argv()
        if cls is py_args.ConfigureArgs:
            assert values == list(instance.changes)  # type: ignore[attr-defined]
            continue
        assert values == [getattr(instance, n) for n in names], cls.__name__


def test_the_check_fails_when_a_name_or_a_position_differs() -> None:
    text = (LUA / "includes" / "args.lua").read_text("utf-8")
    good = lua_parsers(text)
    swapped = lua_parsers(text.replace("outcome = argv[8]", "outcome = argv[9]"))
    renamed = lua_parsers(text.replace("duration_ms = argv[9]", "duration = argv[9]"))
    assert swapped["record"] != good["record"]
    assert [p for _, p in swapped["record"][0]][:3] == [7, 9, 9]
    assert "duration" in [n for n, _ in renamed["record"][0]]
    assert [n for n, _ in good["record"][0]] == python_fields(py_args.RecordArgs)


@pytest.mark.parametrize("script", [op for op in OPERATIONS if op not in ("health", "sweep")])
def test_no_script_reads_its_own_arguments_by_position(script: str) -> None:
    code = "\n".join(line.split("--")[0] for line in (LUA / f"{script}.lua").read_text("utf-8").split("\n"))
    assert not re.search(r"ARGV\[(?:[7-9]|\d\d)\]|ARGV\[i", code), script
    assert f"args.{script}(ARGV)" in code


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
    sources = [*ROOT.glob("lua/**/*.lua"), *ROOT.glob("breaker_redis/**/*.py"), *ROOT.glob("docs/**/*.md")]
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
    sent = set(json.loads(member_config(BreakerConfig(min_reporters=2), "g").to_lua()))
    assert set(said) == sent
