"""No Python module in relayc/ over 700 lines, generated ones included (STYLE.md: small files
with one job each; issue #43): a longer one holds more than one concern, and gets split by
concern."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 700


def long_modules(root: Path, max_lines: int) -> list[str]:
    """Every module in relayc/ over ``max_lines``, the generated ones included (the
    generators split their output: the SGLang drop-in is several modules)."""
    found = []
    for path in sorted((root / "relayc").rglob("*.py")):
        name = path.relative_to(root).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > max_lines:
            found.append(f"  {name}: {lines} lines")
    return found


def test_the_size_check_finds_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "relayc" / "generated").mkdir(parents=True)
    (tmp_path / "relayc" / "long.py").write_text("x = 1\n" * 8)
    (tmp_path / "relayc" / "short.py").write_text("x = 1\n" * 7)
    (tmp_path / "relayc" / "generated" / "made.py").write_text("x = 1\n" * 9)
    assert long_modules(tmp_path, 7) == [
        "  relayc/generated/made.py: 9 lines",
        "  relayc/long.py: 8 lines",
    ]


def test_no_module_is_over_700_lines() -> None:
    found = long_modules(ROOT, MAX_LINES)
    assert not found, (
        f"modules over {MAX_LINES} lines (split each by concern, moving whole functions and "
        "classes):\n" + "\n".join(found)
    )
