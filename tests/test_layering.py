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


def imported_names(tree: ast.Module, module: str, is_package: bool) -> list[tuple[str, int]]:
    """(module, line) of every import: module level and function-local alike (a cycle hidden
    behind a local import is still a cycle), except those under `if TYPE_CHECKING:`."""
    found: list[tuple[str, int]] = []
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
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


def import_graph() -> dict[str, dict[str, int]]:
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
        for target, line in imported_names(tree, name, path.name == "__init__.py"):
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
