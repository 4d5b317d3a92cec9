"""The import cycles issue 13 named stay gone: each pair imports in one direction only,
counting imports inside functions (a function-local import hiding a cycle is still one)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import relayc

ROOT = Path(relayc.__file__).parent


def imported_modules(module: str) -> set[str]:
    """Every relayc module ``module`` imports, at any depth of its code (not TYPE_CHECKING)."""
    parts = module.split(".")[1:]
    path = ROOT.joinpath(*parts)
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for n in ast.walk(node)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("relayc")}


@pytest.mark.parametrize(
    "lower, upper",
    [
        ("relayc.specs.checks", "relayc.specs.loader"),
        ("relayc.specs.document", "relayc.specs.loader"),
        ("relayc.specs.document", "relayc.specs.checks"),
        ("relayc.nodes.registry", "relayc.nodes.ops"),
        ("relayc.compiler.picture", "relayc.cli"),
        ("relayc.tools.generate", "relayc.cli"),
        ("relayc.tools.demo", "relayc.cli"),
        ("relayc.tools.train.cli", "relayc.tools.train"),
        ("relayc.specs.errors", "relayc.cli"),
    ],
)
def test_lower_module_does_not_import_upper(lower: str, upper: str) -> None:
    assert upper not in imported_modules(lower)


def test_the_walk_sees_function_local_imports() -> None:
    # The loader imports the checks at the top, the CLI imports the loader inside commands.
    assert "relayc.specs.checks" in imported_modules("relayc.specs.loader")
    assert "relayc.specs.loader" in imported_modules("relayc.cli")


def test_cli_reexports_exit_codes() -> None:
    from relayc import cli
    from relayc.specs import errors

    assert (cli.EXIT_OK, cli.EXIT_SPEC_ERRORS, cli.EXIT_USAGE) == (0, 1, 2)
    assert cli.UsageError is errors.UsageError
