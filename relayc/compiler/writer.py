"""Compiling specs to files: one module per algorithm, formatted, rewritten only on change."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from relayc.compiler.codegen import ENGINE_TARGET, generate_relay_module
from relayc.compiler.output import Output, RuffMissing, format_source, style_problems
from relayc.compiler.targets.sglang import compile_sglang
from relayc.compiler.targets.vllm import compile_vllm
from relayc.plan import build_plan
from relayc.plan.support import unsupported
from relayc.specs.errors import SourceLoc, SpecError, SpecErrors
from relayc.specs.loader import bundled_spec_paths, load_spec

__all__ = [
    "GENERATED_DIR",
    "SGLANG_GENERATED_DIR",
    "VLLM_GENERATED_DIR",
    "BundledChange",
    "Output",
    "RuffMissing",
    "compile_spec",
    "compile_specs",
    "engine_specs",
    "regenerate_bundled",
    "stale_bundled",
    "style_of_bundled",
    "vllm_specs",
    "write",
]

GENERATED_DIR = Path(__file__).resolve().parent.parent / "generated"
SGLANG_GENERATED_DIR = GENERATED_DIR.parent / "sglang_generated"
VLLM_GENERATED_DIR = GENERATED_DIR.parent / "vllm_generated"


def compile_spec(spec_path: str | Path, out_dir: str | Path, *, ops: Sequence[str] = ()) -> Output:
    """Generate the (formatted) module of one spec (``ops``: more user-op modules); raises
    SpecErrors."""
    plan = build_plan(load_spec(spec_path, ops=ops))
    shown_dir = Path(out_dir).as_posix()
    name = f"{plan.algorithm}.py"
    text = format_source(generate_relay_module(plan, shown_dir), name)
    return Output(Path(out_dir) / name, text)


def engine_specs() -> list[Path]:
    """The bundled specs the engine target compiles; the others use a construct or op it
    does not implement (`relayc compile` on them says which, located)."""
    return [
        path
        for path in bundled_spec_paths()
        if not unsupported(build_plan(load_spec(path)), ENGINE_TARGET)
    ]


def vllm_specs() -> list[Path]:
    """The bundled specs with a `vllm:` section: the algorithms vLLM's Model Runner V2 runs."""
    return [path for path in bundled_spec_paths() if load_spec(path).vllm is not None]


def compile_specs(
    spec_paths: Sequence[str | Path], out_dir: str | Path, *, ops: Sequence[str] = ()
) -> list[Output]:
    """The modules of several specs into one folder; raises SpecErrors with every error,
    including two specs of the same algorithm (they would write the same file)."""
    outputs: list[Output] = []
    errors: list[SpecError] = []
    first: dict[Path, str] = {}
    for path in spec_paths:
        try:
            output = compile_spec(path, out_dir, ops=ops)
        except SpecErrors as exc:
            errors.extend(exc.errors)
            continue
        if output.path in first:
            errors.append(
                SpecError(
                    SourceLoc(str(path), 1, 1),
                    f"this spec's algorithm writes {output.path.name}, as {first[output.path]} "
                    "does",
                    "give each algorithm its own name, or compile the two specs into "
                    "different folders",
                )
            )
            continue
        first[output.path] = str(path)
        outputs.append(output)
    if errors:
        raise SpecErrors(errors)
    return outputs


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
    one per algorithm the engine target implements, the SGLang target's drop-in for
    all of them."""
    outputs = []
    for spec_path in engine_specs():
        output = compile_spec(spec_path, "relayc/generated")
        outputs.append((output, GENERATED_DIR / output.path.name, spec_path.name))
    # The SGLang drop-in's files, each checked: a stale or missing one fails `relayc check`.
    for output in compile_sglang(bundled_spec_paths(), "relayc/sglang_generated"):
        outputs.append((output, SGLANG_GENERATED_DIR / output.path.name, "the bundled specs"))
    for output in compile_vllm(vllm_specs(), "relayc/vllm_generated"):
        outputs.append((output, VLLM_GENERATED_DIR / output.path.name, "the bundled specs"))
    return outputs


def _orphans(outputs: list[tuple[Output, Path, str]]) -> list[Path]:
    """Checked-in engine modules that no bundled spec generates any more (a spec the engine
    target now refuses, or one removed)."""
    made = {target for _, target, _ in outputs}
    return sorted(
        path
        for path in GENERATED_DIR.glob("*.py")
        if path.name != "__init__.py" and path not in made
    )


def stale_bundled() -> list[str]:
    """Unified diffs of every checked-in generated module that differs from its specs,
    and of every one that no spec generates (to be removed)."""
    diffs = []
    outputs = _bundled_outputs()
    for path in _orphans(outputs):
        shown = f"relayc/generated/{path.name}"
        diffs.append(
            "".join(
                difflib.unified_diff(
                    path.read_text(encoding="utf-8").splitlines(keepends=True),
                    [],
                    f"{shown} (checked in)",
                    f"{shown} (no bundled spec generates it for the engine)",
                )
            )
        )
    for output, target, source in outputs:
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


@dataclass(frozen=True)
class BundledChange:
    """One checked-in generated module that :func:`regenerate_bundled` changed."""

    path: Path
    action: Literal["wrote", "removed"]


def regenerate_bundled() -> list[BundledChange]:
    """Rewrite the checked-in generated modules that changed, and remove those no bundled
    spec generates; returns what it wrote and what it removed."""
    changes = []
    outputs = _bundled_outputs()
    for path in _orphans(outputs):
        path.unlink()
        changes.append(BundledChange(path, "removed"))
    for output, target, _ in outputs:
        if write(Output(target, output.text)):
            changes.append(BundledChange(target, "wrote"))
    return changes


def style_of_bundled() -> list[str]:
    """Ruff's complaints about the checked-in generated modules (raises RuffMissing)."""
    paths = [target for _, target, _ in _bundled_outputs() if target.exists()]
    return style_problems(paths)
