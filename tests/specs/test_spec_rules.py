"""Dims rules in the spec (`rules:`): located compile-time errors, the bundled specs' rules,
and the same records in the plan, the generated module and `relayc explain`."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from relayc.cli import main
from relayc.plan import plan_spec_file
from relayc.runtime.rules import DimRule
from relayc.specs.errors import SpecErrors
from relayc.specs.loader import BUNDLED_DIR, load_spec, load_spec_text

TINY = (Path(__file__).parent / "data" / "tiny.yaml").read_text(encoding="utf-8")
LINE = len(TINY.splitlines()) + 2  # the first rule's line, below `rules:`


def _errors(rules: str) -> list[str]:
    with pytest.raises(SpecErrors) as info:
        load_spec_text(TINY + "rules:\n" + rules, "spec.yaml")
    return [e.render() for e in info.value.errors]


@pytest.mark.parametrize(
    ("rules", "expected"),
    [
        (  # plain, quoted and mapping forms: the column is the mistake's, in each
            "  - topk = 1\n",
            f"spec.yaml:{LINE}:10: error: rule `topk = 1`: `=` is not part of the rule "
            "language (compare with `==`)",
        ),
        (
            '  - "topk >= 1 and topk ** 2 <= 9"\n',
            f"spec.yaml:{LINE}:25: error: rule `topk >= 1 and topk ** 2 <= 9`: `**` is not "
            "part of the rule language (there is no power: multiply, `topk * topk`)",
        ),
        (
            "  - {rule: tokp <= 4, message: width}\n",
            f"spec.yaml:{LINE}:12: error: rule `tokp <= 4` names `tokp`, which is not a dim "
            "(did you mean `topk`? the dims are `topk`; declare it under `dims:` (with "
            "`supplied_by:` when the engine or a drafter provides it))",
        ),
        (
            "  - 1 <= 2\n",
            f"spec.yaml:{LINE}:5: error: rule `1 <= 2` names no dim: it is always true or "
            "always false (a rule relates dims, e.g. `topk == 1`)",
        ),
        (
            "  - {rule: topk == 1, message: one candidate}\n",
            f"spec.yaml:{LINE}:12: error: the dims' defaults break it: rule `topk == 1` "
            f"(spec.yaml:{LINE}) does not hold for topk=2: one candidate (set `topk` to 1) "
            "(change the defaults under `dims:` or the rule: as written the algorithm cannot "
            "run with its own defaults)",
        ),
        (
            "  - {rule: topk == 2, mesage: x}\n",
            f"spec.yaml:{LINE}:23: error: unknown key `mesage` in rule #1 (did you mean "
            "`message`? allowed keys: `rule`, `message`)",
        ),
    ],
)
def test_bad_rules_are_located(rules: str, expected: str) -> None:
    assert _errors(rules) == [expected]


def test_a_library_cannot_hold_rules() -> None:
    with pytest.raises(SpecErrors, match="a library cannot have `rules`"):
        load_spec_text("library: lib\ndims: {topk: {default: 1}}\nrules: [topk == 1]\n", "l.yaml")


def test_rules_may_name_imported_and_supplied_dims(tmp_path: Path) -> None:
    """A dim a library declares, or one the engine supplies (no default: not checked at
    compile time), is a dim a rule may name."""
    (tmp_path / "lib.yaml").write_text(
        "library: lib\ndims:\n  vocab: {supplied_by: the model}\n", encoding="utf-8"
    )
    text = TINY.replace("algorithm: tiny", "algorithm: tiny\nimports: [{file: lib.yaml}]")
    spec = load_spec_text(text + "rules: [topk <= vocab]\n", "spec.yaml", base_dir=tmp_path)
    assert [r.rule for r in spec.rules] == ["topk <= vocab"]  # type: ignore[union-attr]


# What each bundled spec asks of its dims: the rules the engine's Python once held.
BUNDLED_RULES = {
    "none": [],
    "eagle": ["num_draft_tokens <= 1 + topk + (num_steps - 1) * topk * topk", "topk <= vocab"],
    "eagle3": [
        "num_draft_tokens <= 1 + topk + (num_steps - 1) * topk * topk",
        "topk <= vocab",
        "topk <= draft_vocab",
    ],
    "eagle_multilayer": ["num_draft_tokens <= 1 + topk * num_steps", "topk <= vocab"],
    "ngram": ["num_draft_tokens >= 2"],
    "standalone": ["topk == 1", "num_draft_tokens == num_steps + 1"],
    "dflash": ["topk == 1", "num_draft_tokens >= 2", "num_steps == num_draft_tokens - 1"],
}


@pytest.mark.parametrize("algorithm", sorted(BUNDLED_RULES))
def test_bundled_rules_reach_the_generated_module(algorithm: str) -> None:
    plan = plan_spec_file(BUNDLED_DIR / f"{algorithm}.yaml")
    assert [r.text for r in plan.rules] == BUNDLED_RULES[algorithm]
    assert all(r.origin.startswith(f"relayc/specs/{algorithm}.yaml:") for r in plan.rules)
    module = importlib.import_module(f"relayc.generated.{algorithm}")
    assert module.DIM_RULES == plan.rules
    assert all(isinstance(r, DimRule) for r in module.DIM_RULES)


def test_dflash_names_the_dim_its_drafter_supplies() -> None:
    block = load_spec(BUNDLED_DIR / "dflash.yaml").dims["block_size"]
    assert block.default is None and block.supplied_by is not None
    assert "drafter" in block.supplied_by


def test_explain_shows_the_rules(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(BUNDLED_DIR / "standalone.yaml")]) == 0
    out = capsys.readouterr().out
    assert "dims rules" in out
    line = next(r.origin for r in plan_spec_file(BUNDLED_DIR / "standalone.yaml").rules)
    row = next(row for row in out.splitlines() if row.startswith("topk == 1 "))
    assert line.rpartition(":")[2] in row and "drafts a chain" in row


def test_the_docs_table_lists_each_bundled_specs_rules() -> None:
    """docs/spec-language.md's `| spec | rules |` table says what the specs do."""
    docs = Path(__file__).resolve().parents[2] / "docs" / "spec-language.md"
    text = docs.read_text(encoding="utf-8")
    rows = text[text.index("| spec | rules |") :].split("\n\n", 1)[0].splitlines()[2:]
    listed: dict[str, list[str]] = {}
    for row in rows:
        specs, rules = row.strip("|").split(" | ")
        for name in specs.strip().split(", "):
            listed[name.strip("`")] = [r.strip().strip("`") for r in rules.split("`, `")]
    assert listed == {name: rules for name, rules in BUNDLED_RULES.items() if rules}
