"""One way to write sync and async (docs/design.md, "Sync and async: one mechanism").

A sequence that talks to Redis or to an upstream is written once, as an
``async def`` whose I/O goes through a method or function each side provides;
the asyncio side awaits it, the sync side runs it with
``breaker_redis.base.blocking.run_sync``. So a module never holds a sync
function and an async one of the same job written out twice, differing by
``await``: that is where the two sides drift apart (a fix made on one side
only).

What a module may hold is a pair of *entry points*: ``refresh`` and
``arefresh``, each one statement that runs or awaits the shared sequence.
This test finds every such pair by name (``x`` beside ``ax``, ``x_async``,
``async_x``, ``__x__`` beside ``__ax__``) in a module or a class, and fails
on a pair whose two bodies are more than entry points, unless ``WRITTEN_TWICE``
names it with the reason its two sides cannot be one sequence. A new twin
therefore fails here, naming itself, as a hand-edited generated file fails
the check of projects that generate their sync code.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "breaker_redis"

# Statements an entry point may have besides its docstring: it runs or awaits the
# sequence written once, and may guard it (a try or with of one statement counts once).
ENTRY_STATEMENTS = 2

# (module, scope, sync name): why the two sides are written out.
WRITTEN_TWICE = {
    ("storage/cluster.py", "Slots", "call"): (
        "after an ASK the sync side sends ASKING and the command on one connection of its "
        "own; an asyncio node keeps no such connection, so the cluster client follows it"
    ),
    ("web/pipeline.py", "<module>", "admit"): (
        "runs on every protected request: the sync side writes admitted() inline, one call "
        "less per request (a coroutine per step would cost about half a breaker call: "
        "bench/integrations.py --instructions)"
    ),
}

_TWIN_FORMS = (
    lambda name: re.sub(r"^a(?=[a-z_])", "", name),
    lambda name: re.sub(r"_async$", "", name),
    lambda name: re.sub(r"^async_", "", name),
    lambda name: name.replace("__a", "__", 1) if name.startswith("__a") else name,
)

Function = ast.FunctionDef | ast.AsyncFunctionDef


def _body(function: Function) -> list[ast.stmt]:
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return body


def _statements(function: Function) -> int:
    """Statements, a try or with around one statement counting as that one."""
    count = 0
    for statement in _body(function):
        if isinstance(statement, ast.Try | ast.With | ast.AsyncWith) and len(statement.body) == 1:
            count += 1
        else:
            count += sum(isinstance(node, ast.stmt) for node in ast.walk(statement))
    return count


def twins(source: str) -> Iterator[tuple[str, str, str, int]]:
    """(scope, sync name, async name, statements of the larger body) of each pair."""
    tree = ast.parse(source)
    scopes: list[ast.Module | ast.ClassDef] = [tree]
    scopes += [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    for scope in scopes:
        functions = {node.name: node for node in scope.body if isinstance(node, Function)}
        for name, function in functions.items():
            if not isinstance(function, ast.AsyncFunctionDef):
                continue
            for form in _TWIN_FORMS:
                base = form(name)
                other = functions.get(base)
                if base != name and isinstance(other, ast.FunctionDef):
                    where = scope.name if isinstance(scope, ast.ClassDef) else "<module>"
                    yield where, base, name, max(_statements(function), _statements(other))


def written_twice(package: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        for scope, sync, asynchronous, size in twins(path.read_text("utf-8")):
            if size > ENTRY_STATEMENTS and (module, scope, sync) not in WRITTEN_TWICE:
                found.append(f"{module} {scope}: {sync} / {asynchronous} ({size} statements)")
    return found


def test_no_sequence_is_written_twice() -> None:
    found = written_twice()
    assert found == [], (
        "a sync and an async function of the same job, written out twice: write the "
        "sequence once as an async def and run it with run_sync on the sync side "
        "(engine/steps.py, docs/design.md), or name the pair in WRITTEN_TWICE with the "
        "reason:\n" + "\n".join(found)
    )


def test_every_declared_pair_still_exists() -> None:
    """An entry of WRITTEN_TWICE whose pair was written once since is removed, so the
    list says only what is true."""
    present = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        for scope, sync, _, _ in twins(path.read_text("utf-8")):
            present.add((module, scope, sync))
    assert sorted(set(WRITTEN_TWICE) - present) == []


def test_a_twin_and_an_entry_point_pair_are_told_apart() -> None:
    source = (
        "class Gate:\n"
        "    def refresh(self):\n"
        "        run_sync(self._rereading())\n"
        "    async def arefresh(self):\n"
        "        await self._rereading()\n"
        "def send(client, key):\n"
        "    value = client.get(key)\n"
        "    client.set(key, value + 1)\n"
        "    return value\n"
        "async def send_async(client, key):\n"
        "    value = await client.get(key)\n"
        "    await client.set(key, value + 1)\n"
        "    return value\n"
    )
    assert [(scope, sync, size > ENTRY_STATEMENTS) for scope, sync, _, size in twins(source)] == [
        ("<module>", "send", True),
        ("Gate", "refresh", False),
    ]
