"""The algorithm registry (issue 53): relayc's own algorithms come through the same entry
point group as a plugin's, and no algorithm's name is switched on outside its own module."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
from pathlib import Path

import pytest

from relayc.engine.algorithms import algorithms, engine_names, lookup
from relayc.engine.algorithms.registry import UnknownAlgorithmError
from relayc.specs import plugins
from relayc.specs.loader import bundled_spec_paths

ROOT = Path(__file__).resolve().parents[2]
# Where a name switch would live: the engine and the tools over it, not the algorithms' own
# modules (relayc/engine/algorithms/), their specs, the tests or the docs.
SEARCHED = ("relayc/engine", "relayc/tools", "bench/peers.py")
SKIPPED = {
    "relayc/engine/algorithms/": "the algorithms' own modules",
    "relayc/tools/train/": "training one algorithm's drafter: that algorithm is its subject",
    "relayc/engine/checkpoints/gguf.py": "`none` as a GGUF rope scaling type, no algorithm",
}


def test_every_bundled_spec_is_a_registered_entry_point_of_relayc() -> None:
    ours = {
        ep.name: ep.value
        for ep in metadata.entry_points(group=plugins.GROUP)
        if ep.dist is not None and ep.dist.metadata["Name"] == plugins.OWN_DISTRIBUTION
    }
    assert sorted(ours) == sorted(p.stem for p in bundled_spec_paths()), (
        "register the algorithm in pyproject.toml's relayc.algorithms entry points (and run "
        "`pip install -e .` again)"
    )
    for name, value in ours.items():
        assert value == f"relayc.engine.algorithms.{name}:ALGORITHM"
        assert lookup(name).spec == ROOT / "relayc" / "specs" / f"{name}.yaml"


def test_the_listing_puts_the_baseline_first() -> None:
    assert engine_names()[0] == "none"
    assert [a.name for a in algorithms()] == [a.name for a in algorithms()]


def test_an_sglang_only_algorithm_is_refused_from_data() -> None:
    sglang_only = [a for a in algorithms() if not a.runs_in_engine]
    assert {a.name for a in sglang_only} == {"dspark", "uno"}
    for algorithm in sglang_only:
        with pytest.raises(UnknownAlgorithmError, match=re.escape(algorithm.no_engine_drafter)):
            lookup(algorithm.name, engine=True)


def _switched_names(path: Path, names: frozenset[str]) -> list[str]:
    """``line: name`` of each algorithm name a comparison or a dict literal in ``path`` holds
    (``name == "dflash"``, ``name in ("eagle", "eagle3")``, ``{"standalone": ...}``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[str] = []

    def strings(node: ast.AST | None) -> list[ast.Constant]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [c for e in node.elts for c in strings(e)]
        return []

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            operands = list(node.keys)
        else:
            continue
        for operand in operands:
            found.extend(f"{c.lineno}: {c.value}" for c in strings(operand) if c.value in names)
    return found


def test_no_algorithm_name_is_switched_on_outside_its_module() -> None:
    names = frozenset(a.name for a in algorithms())
    switches = {}
    for root in SEARCHED:
        paths = [ROOT / root] if root.endswith(".py") else sorted((ROOT / root).rglob("*.py"))
        for path in paths:
            relative = path.relative_to(ROOT).as_posix()
            if any(relative.startswith(skipped) for skipped in SKIPPED):
                continue
            found = _switched_names(path, names)
            if found:
                switches[relative] = found
    assert not switches, (
        "algorithm names switched on outside their module (give the algorithm's module a "
        f"field for what differs): {switches}"
    )


def test_the_switch_finder_finds_switches(tmp_path: Path) -> None:
    path = tmp_path / "switch.py"
    path.write_text(
        'if name == "dflash":\n    pass\nok = name in ("eagle", "x")\nd = {"ngram": 1}\n'
        'label = "eagle"\n'
    )
    assert _switched_names(path, frozenset({"dflash", "eagle", "ngram"})) == [
        "1: dflash",
        "3: eagle",
        "4: ngram",
    ]


def test_a_bundled_spec_without_its_entry_point_says_how_to_register_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a new bundled algorithm's author meets before reinstalling."""
    installed = {k: v for k, v in plugins.installed().items() if k != "ngram"}
    monkeypatch.setattr(plugins, "installed", lambda: installed)
    with pytest.raises(UnknownAlgorithmError, match=r"ngram.yaml exists but no entry point"):
        lookup("ngram")
