"""Compiling specs to files: one module per algorithm, rewritten only on change."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from relayc.compiler.codegen import generate_relay_module
from relayc.graph.passes import analyse
from relayc.specs.loader import bundled_spec_paths, load_spec

GENERATED_DIR = Path(__file__).resolve().parent.parent / "generated"
SGLANG_GENERATED_DIR = GENERATED_DIR.parent / "sglang_generated"


@dataclass(frozen=True)
class Output:
    path: Path
    text: str


def compile_spec(spec_path: str | Path, out_dir: str | Path, *, ops: Sequence[str] = ()) -> Output:
    """Generate the module of one spec (``ops``: more user-op modules); raises SpecErrors."""
    spec = load_spec(spec_path, ops=ops)
    graphs = analyse(spec)
    shown_dir = Path(out_dir).as_posix()
    return Output(Path(out_dir) / f"{spec.algorithm}.py", generate_relay_module(graphs, shown_dir))


def write(output: Output) -> bool:
    """Write ``output`` unless the file already holds those bytes; True when written."""
    path = output.path
    if path.exists() and path.read_text(encoding="utf-8") == output.text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(output.text, encoding="utf-8")
    return True


def _bundled_outputs() -> list[tuple[Output, Path, str]]:
    """(module, checked-in path, source) of every module generated from the bundled specs:
    one per algorithm, and the SGLang target's one for all of them."""
    from relayc.compiler.targets.sglang import compile_sglang

    outputs = []
    for spec_path in bundled_spec_paths():
        output = compile_spec(spec_path, "relayc/generated")
        outputs.append((output, GENERATED_DIR / output.path.name, spec_path.name))
    output = compile_sglang(bundled_spec_paths(), "relayc/sglang_generated")
    outputs.append((output, SGLANG_GENERATED_DIR / output.path.name, "the bundled specs"))
    return outputs


def stale_bundled() -> list[str]:
    """Unified diffs of every checked-in generated module that differs from its specs."""
    diffs = []
    for output, target, source in _bundled_outputs():
        current = target.read_text(encoding="utf-8") if target.exists() else ""
        if current != output.text:
            shown = f"{output.path.parent.as_posix()}/{output.path.name}"
            diffs.append(
                "".join(
                    difflib.unified_diff(
                        current.splitlines(keepends=True),
                        output.text.splitlines(keepends=True),
                        f"{shown} (checked in)",
                        f"{shown} (from {source})",
                    )
                )
            )
    return diffs


def regenerate_bundled() -> list[Path]:
    written = []
    for output, target, _ in _bundled_outputs():
        if write(Output(target, output.text)):
            written.append(target)
    return written
