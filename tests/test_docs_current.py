"""The docs' lists of specs and algorithms match what ships: a spec or an algorithm added
without its row fails here, not in a newcomer's hands (docs/spec-language.md listed 5 of
the 9 bundled specs, and docs/README.md's layout and docs/benchmarks.md's method omitted
DFlash)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from relayc.specs.loader import bundled_spec_paths

ROOT = Path(__file__).resolve().parent.parent
SPEC_TABLES = [ROOT / "README.md", ROOT / "docs" / "spec-language.md"]
# How docs/README.md's layout names each algorithm's drafter; a new algorithm needs a name.
DRAFTER_NAMES = {
    "eagle": "EAGLE",
    "eagle3": "EAGLE-3",
    "eagle_multilayer": "MTP",
    "ngram": "n-gram",
    "suffix": "suffix",
    "standalone": "standalone",
    "dflash": "DFlash",
}


def _bundled_algorithms() -> list[str]:
    return [
        yaml.safe_load(p.read_text(encoding="utf-8"))["algorithm"] for p in bundled_spec_paths()
    ]


def _spec_table(path: Path) -> list[str]:
    """The spec names of the first ``| spec | relays |`` table in ``path``."""
    text = path.read_text(encoding="utf-8")
    start = text.index("| spec | relays |")
    rows = text[start:].split("\n\n", 1)[0].splitlines()[2:]  # past the header and rule
    return [re.fullmatch(r"\| `(\w+)` \|.*", row)[1] for row in rows]  # type: ignore[index]


@pytest.mark.parametrize("path", SPEC_TABLES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_spec_table_lists_every_bundled_spec(path: Path) -> None:
    listed = _spec_table(path)
    assert len(listed) == len(set(listed)), f"{path.name}: a spec listed twice"
    assert sorted(listed) == sorted(_bundled_algorithms()), path


def test_the_benchmark_method_names_every_algorithm() -> None:
    from relayc.engine.algorithms import engine_names

    ALGORITHMS = engine_names()

    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    method = text[text.index("- **What `bench/peers.py` runs.**") :].split("\n- ", 1)[0]
    missing = [a for a in ALGORITHMS if f"`{a}`" not in method]
    assert not missing, f"docs/benchmarks.md's method omits {missing}"


def test_the_layout_names_every_drafter() -> None:
    from relayc.engine.algorithms import engine_names

    ALGORITHMS = engine_names()

    assert set(DRAFTER_NAMES) == set(ALGORITHMS) - {"none"}, "name the new algorithm's drafter"
    text = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    (line,) = [line for line in text.splitlines() if line.strip().startswith("draft/")]
    named = re.findall(r"[\w-]+", line.split("(", 1)[1])
    missing = [name for name in DRAFTER_NAMES.values() if name not in named]
    assert not missing, f"docs/README.md's layout omits {missing} drafters"
