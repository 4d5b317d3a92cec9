"""Layering (STYLE.md "Layers and contracts"): no import cycles in relayc/, and what a
generated module pulls in when imported (only torch, optionally triton, and relayc.runtime)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "relayc"
# Generated code is checked by the second test (what it imports at run time).
SKIP = ("relayc.generated", "relayc.sglang_generated")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(
    tree: ast.Module, module: str, is_package: bool, type_checking: bool = False
) -> list[tuple[str, int]]:
    """(module, line) of every import: module level and function-local alike (a cycle hidden
    behind a local import is still a cycle), except those under `if TYPE_CHECKING:` unless
    ``type_checking`` (a type a module names is still a module a reader must know)."""
    found: list[tuple[str, int]] = []
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            found.append((source, node.lineno))
            # `from pkg import sub` imports the submodule pkg.sub when there is one
            found.extend((f"{source}.{alias.name}", node.lineno) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(type_checking: bool = False) -> dict[str, dict[str, int]]:
    """relayc module -> {relayc module it imports: line}."""
    files = {
        module_name(p): p
        for p in PACKAGE.rglob("*.py")
        if not module_name(p).startswith(SKIP) and ".venv" not in p.parts
    }
    graph: dict[str, dict[str, int]] = {}
    for name, path in sorted(files.items()):
        tree = ast.parse(path.read_text(), filename=str(path))
        edges: dict[str, int] = {}
        imports = imported_names(tree, name, path.name == "__init__.py", type_checking)
        for target, line in imports:
            # importing a.b.c runs a/__init__ and a/b/__init__ too; only the module itself
            # counts here (package inits are modules in the graph with their own edges)
            if target in files and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, {}):
            if succ not in index:
                connect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(components)


def describe(component: list[str], graph: dict[str, dict[str, int]]) -> str:
    members = set(component)
    edges = [
        f"    {a} -> {b} (line {line})"
        for a in component
        for b, line in sorted(graph[a].items())
        if b in members
    ]
    return "  cycle among " + ", ".join(component) + ":\n" + "\n".join(edges)


def test_the_import_walk_sees_local_imports_and_skips_type_checking() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import relayc.a\n"
        "from . import b\n"
        "if TYPE_CHECKING:\n    import relayc.hidden\n"
        "def f():\n    from relayc.c import thing\n"
    )
    names = {name for name, _ in imported_names(tree, "relayc.pkg.mod", is_package=False)}
    assert {"relayc.a", "relayc.pkg.b", "relayc.c", "relayc.c.thing"} <= names
    assert "relayc.hidden" not in names
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert find_cycles(graph) == [["a", "b", "c"]]


def test_relayc_has_no_import_cycles() -> None:
    graph = import_graph()
    assert len(graph) > 50, "the walk found too few modules: is relayc/ where it should be?"
    cycles = find_cycles(graph)
    assert not cycles, (
        "import cycles in relayc/ (move the shared type down a layer; a function-local "
        "import does not break a cycle):\n" + "\n".join(describe(c, graph) for c in cycles)
    )


def modules_loaded_by(imports: list[str]) -> list[str]:
    """``sys.modules`` after importing ``imports`` in a fresh interpreter."""
    code = "".join(f"import {name}\n" for name in imports)
    code = f"import sys\n{code}print('\\n'.join(sorted(sys.modules)))\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split()


def test_the_runtime_imports_neither_pydantic_nor_the_kernels() -> None:
    names = sorted(module_name(p) for p in (PACKAGE / "runtime").glob("*.py"))
    loaded = modules_loaded_by(names)
    assert "relayc.runtime.graph_runner" in loaded and "relayc.runtime.capture" in loaded
    bad = [m for m in loaded if m.split(".")[0] == "pydantic" or m.startswith("relayc.kernels")]
    assert not bad, f"importing {', '.join(names)} loaded {bad}"


def test_a_generated_module_imports_only_torch_triton_and_the_runtime() -> None:
    loaded = modules_loaded_by(["relayc.generated.eagle"])
    assert "relayc.runtime.relay" in loaded  # the import did happen
    forbidden = ("pydantic", "yaml", "relayc.kernels", "relayc.specs", "relayc.graph")
    forbidden += ("relayc.compiler", "relayc.engine", "relayc.nodes", "relayc.tools", "relayc.cli")
    bad = [m for m in loaded if m.split(".")[0] == "pydantic" or m.startswith(forbidden)]
    assert not bad, f"importing relayc.generated.eagle loaded {bad}"
    relayc_modules = {m for m in loaded if m.startswith("relayc")}
    allowed = {"relayc", "relayc.generated", "relayc.generated.eagle"}
    assert {m for m in relayc_modules if not m.startswith("relayc.runtime")} <= allowed


ENGINE = "relayc.engine"
# The engine's rooms, bottom to top (relayc/engine/__init__.py says what lives in each): a
# module imports modules of its own room and of the rooms below it, never of one above.
# The package's own __init__ (the public names, loaded lazily) stands above them all.
ENGINE_ROOMS = (
    "errors",
    "text",
    "native",
    "core",
    "decoder",
    "model",
    "checkpoints",
    "draft",
    "ops",
    "algorithms",
    "serving",
)


def source_path(module: str) -> str:
    base = ROOT.joinpath(*module.split("."))
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    return str(path.relative_to(ROOT))


def upward_imports(
    graph: dict[str, dict[str, int]], package: str, rooms: tuple[str, ...]
) -> list[str]:
    """Each import in ``package`` that runs up the room order, and each module in no room."""

    def room(module: str) -> int | None:
        if module == package:
            return len(rooms)
        first = module.removeprefix(package + ".").split(".")[0]
        return rooms.index(first) if first in rooms else None

    def name(index: int) -> str:
        return rooms[index] if index < len(rooms) else f"{package} itself (its exports)"

    problems: list[str] = []
    for module, edges in sorted(graph.items()):
        if not module.startswith(package + "."):
            continue
        here = room(module)
        if here is None:
            problems.append(
                f"  {source_path(module)}: {module} is in no room of {package}: move it into "
                f"one of {', '.join(rooms)} (or add its room to the order in this test)"
            )
            continue
        for target, line in sorted(edges.items(), key=lambda edge: edge[1]):
            there = room(target) if target.startswith(package) else None
            if there is not None and there > here:
                problems.append(
                    f"  {source_path(module)}:{line}: {module} (room {name(here)}) imports "
                    f"{target} (room {name(there)}, above it): move what both need down"
                )
    return problems


def test_the_room_check_names_the_file_line_and_rooms() -> None:
    graph = {
        "relayc.engine": {"relayc.engine.serving.engine": 9},
        "relayc.engine.core.config": {"relayc.engine.text.bytes": 3},
        "relayc.engine.core.layers": {"relayc.engine.decoder.cpu_decoder": 12},
        "relayc.engine.decoder.cpu_decoder": {"relayc.engine": 7, "relayc.engine.core": 8},
        "relayc.engine.stray": {},
    }
    problems = upward_imports(graph, ENGINE, ENGINE_ROOMS)
    assert len(problems) == 3, problems
    assert "relayc/engine/core/layers.py:12:" in problems[0]
    assert "(room core) imports relayc.engine.decoder.cpu_decoder (room decoder" in problems[0]
    assert "relayc/engine/decoder/cpu_decoder.py:7:" in problems[1]
    assert "(room relayc.engine itself (its exports)" in problems[1]
    assert "relayc.engine.stray is in no room" in problems[2]


def test_the_engine_rooms_import_only_downward() -> None:
    # Imports under `if TYPE_CHECKING:` count here: a type named from a room above is the
    # same tangle for a reader as an import run.
    problems = upward_imports(import_graph(type_checking=True), ENGINE, ENGINE_ROOMS)
    assert not problems, (
        "imports running up the engine's rooms (bottom to top: "
        + ", ".join(ENGINE_ROOMS)
        + "):\n"
        + "\n".join(problems)
    )


def test_the_engine_has_no_import_cycle_even_through_type_checking() -> None:
    graph = import_graph(type_checking=True)
    engine = {
        module: {target: line for target, line in edges.items() if target.startswith(ENGINE)}
        for module, edges in graph.items()
        if module.startswith(ENGINE)
    }
    cycles = find_cycles(engine)
    assert not cycles, (
        "import cycles in relayc/engine/, counting `if TYPE_CHECKING:` imports (move the "
        "shared type down into a third module):\n" + "\n".join(describe(c, engine) for c in cycles)
    )


# The compiler's pipeline, bottom to top: a stage imports its own room and those below it.
# `runtime` is what generated code imports (torch only), `plan` the typed relay plan that
# every target reads (built from the graphs), `compiler` the targets and the writer.
PIPELINE = ("runtime", "specs", "nodes", "graph", "plan", "compiler")


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PIPELINE else None


def test_the_pipeline_imports_only_downwards() -> None:
    graph = import_graph()
    upward = []
    for module, edges in graph.items():
        room = _room(module)
        if room is None:
            continue
        for target, line in edges.items():
            other = _room(target)
            if other is not None and PIPELINE.index(other) > PIPELINE.index(room):
                upward.append(f"  {module} -> {target} (line {line})")
    assert not upward, (
        f"a pipeline stage imports a later one (order: {' < '.join(PIPELINE)}):\n"
        + "\n".join(upward)
    )
