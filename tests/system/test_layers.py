"""The layers of breaker_redis hold (docs/design.md, section 1).

Every module of the package belongs to one layer of ``LAYERS``, imports only
from its own layer and those below it, and no import cycle joins any two
modules. docs/design.md draws the same layers, and is checked against
``LAYERS`` here, so the page and the code cannot drift apart.

The imports are read from the source (ast), not from a running interpreter,
so every import counts wherever it is written: at the top of a module, inside
a function (a lazy import is a dependency all the same, only paid later) and
under ``if TYPE_CHECKING:``. Type-only imports count because two modules that
name each other's types are one unit in two files: neither can be read,
changed or tested without the other, and the cycle is back at run time as
soon as one of those names is needed there (an isinstance, a default value, a
base class). A module that needs a higher one's type names what it uses of it
(a Protocol) or is handed the object at run time.

``from package import name`` counts as importing the package (its
``__init__`` runs first, and ``name`` may be one of its own) and, when
``name`` is a submodule, that submodule; ``import package.module`` counts
the module alone.
"""

from __future__ import annotations

import ast
import functools
import itertools
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "breaker_redis"
DESIGN = ROOT / "docs" / "design.md"

# Bottom to top: a module imports from its own layer and those below, never above.
# Each entry is a package (with every module under it) or a module, relative to
# breaker_redis; "__init__" is the package's own module (the public names).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("base", "urls", "url_parsing")),
    ("storage", ("storage", "embedded")),
    ("engine", ("engine", "__init__")),
    ("asyncio", ("asyncio", "fallbacks")),
    ("web", ("web", "groups")),
    ("ops", ("ops", "metrics", "opentelemetry")),
    ("integrations", ("flask", "wsgi", "asgi", "fastapi", "requests", "httpx")),
    ("compat", ("compat",)),
    ("testing", ("testing",)),
)

Graph = Mapping[str, Mapping[str, int]]  # module -> {imported module: line of the first such import}


# -- reading the imports --------------------------------------------------------------------


def modules(package: Path) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(package: Path) -> dict[str, dict[str, int]]:
    """Each module's imports of the package's own modules, wherever they are written."""
    known = modules(package)
    graph: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join([*parent, *([node.module] if node.module else [])])
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            for target in targets:
                if target in known and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


# -- the checks -----------------------------------------------------------------------------


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, {}):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def loop(graph: Graph, component: Iterable[str]) -> list[str]:
    """One shortest way round a cycle, from the component's first module back to it."""
    members = set(component)
    start = min(members)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for other in sorted(graph[node]):
            if other == start:
                return [*paths[node], start]
            if other in members and other not in paths:
                paths[other] = [*paths[node], other]
                queue.append(other)
    raise AssertionError(f"no way round {sorted(members)}")


def describe(graph: Graph, modules_by_name: Mapping[str, Path], path: list[str]) -> str:
    steps = []
    for here, there in itertools.pairwise(path):
        where = modules_by_name[here].relative_to(ROOT)
        steps.append(f"  {here} -> {there} ({where}:{graph[here][there]})")
    return "\n".join(steps)


def layer_of(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> list[str]:
    """The layers whose entries hold the module (one, when the layers are right)."""
    relative = module.partition(".")[2] or "__init__"
    return [
        layer
        for layer, entries in layers
        for entry in entries
        if relative == entry or relative.startswith(f"{entry}.")
    ]


def upward(graph: Graph, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> list[tuple[str, str]]:
    """The imports of a module from a higher layer than its own."""
    rank = {layer: position for position, (layer, _) in enumerate(layers)}
    found = []
    for module, edges in sorted(graph.items()):
        for other in sorted(edges):
            mine, theirs = layer_of(module, layers), layer_of(other, layers)
            if len(mine) == 1 and len(theirs) == 1 and rank[theirs[0]] > rank[mine[0]]:
                found.append((module, other))
    return found


def drawn_layers(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """The layer diagram of docs/design.md, bottom to top as LAYERS: the fenced
    block whose first line starts with ``layer``, one layer a line, top first,
    each a name then its packages (``name/``) and modules (``name.py``)."""
    blocks = re.findall(r"^```text\n(layer .*?)^```", text, re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, "docs/design.md must hold one ```text block starting with 'layer' (the layers)"
    drawn = []
    for line in blocks[0].splitlines()[1:]:
        if not line.strip() or line.lstrip().startswith(("^", "|")):
            continue
        name, *entries = line.split()
        drawn.append((name, tuple(entry.removesuffix("/").removesuffix(".py") for entry in entries)))
    return drawn[::-1]


# -- the package ----------------------------------------------------------------------------


@functools.cache
def package_imports() -> tuple[Graph, Mapping[str, Path]]:
    return imports(PACKAGE), modules(PACKAGE)


def report(problem: str, lines: Iterable[str]) -> str:
    return f"{problem}:\n" + "\n".join(lines)


def test_no_import_cycle() -> None:
    graph, known = package_imports()
    found = [
        f"{len(component)} modules, for one:\n{describe(graph, known, loop(graph, component))}"
        for component in cycles(graph)
    ]
    assert not found, report("import cycles (docs/design.md, section 1: dependencies point one way)", found)


def test_every_module_is_in_one_layer() -> None:
    _, known = package_imports()
    found = [
        f"  {module}: {'in no layer' if not layers else 'in ' + ', '.join(layers)}"
        for module, layers in ((module, layer_of(module)) for module in sorted(known))
        if len(layers) != 1
    ]
    assert not found, report("each module must be in exactly one layer of LAYERS (this file)", found)


def test_no_module_imports_a_higher_layer() -> None:
    graph, known = package_imports()
    found = [
        f"  {module} ({layer_of(module)[0]}) imports {other} ({layer_of(other)[0]}) "
        f"at {known[module].relative_to(ROOT)}:{graph[module][other]}"
        for module, other in upward(graph)
    ]
    assert not found, report("imports from a higher layer (LAYERS, docs/design.md section 1)", found)


def test_every_layer_entry_exists() -> None:
    _, known = package_imports()
    missing = [
        entry
        for _, entries in LAYERS
        for entry in entries
        if entry != "__init__" and f"breaker_redis.{entry}" not in known
    ]
    assert not missing, f"LAYERS names what breaker_redis does not hold: {missing}"


def test_the_design_draws_these_layers() -> None:
    drawn = drawn_layers(DESIGN.read_text("utf-8"))
    assert drawn == list(LAYERS), (
        "docs/design.md's layer diagram (section 1) differs from LAYERS in tests/system/test_layers.py:\n"
        f"  drawn (bottom to top): {drawn}\n  LAYERS: {list(LAYERS)}"
    )


# -- each check can fail --------------------------------------------------------------------


def _package(tmp_path: Path, files: Mapping[str, str]) -> Path:
    package = tmp_path / "breaker_redis"
    for name, text in {"__init__.py": "", **files}.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


def test_a_cycle_through_a_function_or_type_checking_import_is_found(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "low.py": "def f():\n    from breaker_redis.high import g\n",
            "high.py": "from breaker_redis.low import f\n",
            "a.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from breaker_redis.b import B\n"
            ),
            "b.py": "import breaker_redis.a\n",
            "pkg/__init__.py": "from breaker_redis.pkg.sub import x\n",
            "pkg/sub.py": "from breaker_redis.pkg import other\n",
            "pkg/other.py": "",
        },
    )
    graph = imports(package)
    assert cycles(graph) == [
        ["breaker_redis.a", "breaker_redis.b"],
        ["breaker_redis.high", "breaker_redis.low"],
        ["breaker_redis.pkg", "breaker_redis.pkg.sub"],
    ]
    assert loop(graph, ["breaker_redis.low", "breaker_redis.high"]) == [
        "breaker_redis.high",
        "breaker_redis.low",
        "breaker_redis.high",
    ]


def test_an_import_from_above_and_a_module_in_no_layer_are_found(tmp_path: Path) -> None:
    low, high = "def f():\n    import breaker_redis.engine.core\n", "from breaker_redis.base.names import f\n"
    graph = imports(_package(tmp_path, {"base/names.py": low, "engine/core.py": high, "stray.py": ""}))
    layers = (("base", ("base",)), ("engine", ("engine", "__init__")))
    assert upward(graph, layers) == [("breaker_redis.base.names", "breaker_redis.engine.core")]
    assert layer_of("breaker_redis.stray", layers) == []
    assert layer_of("breaker_redis", layers) == ["engine"]


def test_a_diagram_that_drifted_is_found() -> None:
    text = "```text\nlayer    modules\nengine   engine/ __init__.py\nbase     base/ urls.py\n```\n"
    assert drawn_layers(text) == [("base", ("base", "urls")), ("engine", ("engine", "__init__"))]
    assert drawn_layers(text) != list(LAYERS)


MAX_LINES = 400  # docs/design.md, section 12


def test_no_module_is_over_max_lines() -> None:
    """A module past MAX_LINES holds two jobs a reader would rather find apart: split it
    along that seam (docs/design.md, section 12), never cut it to fit."""
    sizes = {path: len(path.read_text("utf-8").splitlines()) for path in PACKAGE.rglob("*.py")}
    assert {str(path.relative_to(ROOT)): n for path, n in sizes.items() if n > MAX_LINES} == {}
    assert max(sizes.values()) > MAX_LINES / 2  # (the package's modules were all read)
