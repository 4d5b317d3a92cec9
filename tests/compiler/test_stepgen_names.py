"""The variable names of the generated step methods read like hand-written code.

An output is held in `<step>_<output>`, but an output already named `<step>_...`
(`accept.accept_index`) is held in its own name, `accept_index`, wherever that is unique
in the method; and no line carries a trailing comment that `ruff format` would have to
break a statement around.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

from relayc.compiler.writer import GENERATED_DIR, compile_spec, engine_specs
from relayc.specs.loader import BUNDLED_DIR, load_spec

ALGORITHMS = [p.stem for p in engine_specs()]  # dspark, uno: SGLang only


def _step_methods(tree: ast.Module) -> list[ast.FunctionDef]:
    return [
        method
        for cls in tree.body
        if isinstance(cls, ast.ClassDef) and cls.name in ("PrefillStep", "DecodeStep")
        for method in cls.body
        if isinstance(method, ast.FunctionDef)
    ]


def _names(method: ast.FunctionDef) -> tuple[set[str], set[str]]:
    """(variables assigned in ``method``, every other name it binds or reads)."""
    assigned = {
        n.id for n in ast.walk(method) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    other = {n.id for n in ast.walk(method) if isinstance(n, ast.Name)} | {
        a.arg for a in (*method.args.args, *method.args.kwonlyargs)
    }
    return assigned, other


def doubled_where_unique(source: str, steps: list[str]) -> list[str]:
    """Variables `<step>_<step>_...` of the step methods whose short form
    `<step>_...` no other name of the method uses."""
    found: list[str] = []
    for method in _step_methods(ast.parse(source)):
        assigned, other = _names(method)
        for var in sorted(assigned):
            for step in steps:
                short = var.removeprefix(f"{step}_")
                if var.startswith(f"{step}_{step}_") and short not in other - {var}:
                    found.append(f"{method.name}: {var}")
    return found


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_no_doubled_step_prefix_where_unique(algorithm: str) -> None:
    spec = load_spec(BUNDLED_DIR / f"{algorithm}.yaml")
    steps = [s.name for s in ([spec.prefill] if spec.prefill else []) + list(spec.steps)]
    source = (GENERATED_DIR / f"{algorithm}.py").read_text()
    assert doubled_where_unique(source, steps) == []
    # The trailing type comments stay on their line: ruff never split a subscript for one.
    assert not re.search(r'\[\n\s*"\w+"\n\s*\]  #', source)


def test_eagle_reads_accept_index_and_draft_tokens() -> None:
    source = (GENERATED_DIR / "eagle.py").read_text()
    assert 'accept_index = accept["accept_index"]' in source
    assert 'draft_tokens = draft["draft_tokens"]' in source
    assert "accept_accept_index" not in source and "draft_draft_tokens" not in source
    # A type comment too long to trail its line sits above it.
    assert (
        "# [bs, num_draft_tokens, num_draft_tokens] bool\n"
        '        build_tree_tree_mask = build_tree["tree_mask"]\n'
    ) in source


def test_a_clashing_short_name_keeps_the_step_prefix(tmp_path: Path) -> None:
    """Step `build_tree` renamed `draft_tokens`: its result variable is `draft_tokens`, so
    `draft.draft_tokens` stays `draft_draft_tokens`; `accept_index` is still short."""
    text = (BUNDLED_DIR / "eagle.yaml").read_text()
    edited = text.replace("- name: build_tree", "- name: draft_tokens").replace(
        "build_tree.", "draft_tokens."
    )
    assert edited.count("draft_tokens.") == text.count("build_tree.") > 0
    shutil.copy(BUNDLED_DIR / "common.yaml", tmp_path / "common.yaml")
    (tmp_path / "eagle.yaml").write_text(edited)
    source = compile_spec(tmp_path / "eagle.yaml", tmp_path / "out").text
    assert 'draft_draft_tokens = draft["draft_tokens"]' in source
    assert "draft_tokens = self._build_tree(" in source
    assert "draft_tokens=draft_draft_tokens," in source
    assert 'accept_index = accept["accept_index"]' in source
    compile(source, "eagle.py", "exec")  # still a valid module
    steps = [s.name for s in load_spec(tmp_path / "eagle.yaml").steps] + ["prefill"]
    assert doubled_where_unique(source, steps) == []
