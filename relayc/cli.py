"""The `relayc` command line.

Exit codes: 0 success, 1 spec errors (printed as ``path:line:col: error: ...``),
2 usage errors (bad arguments, unreadable files, checkpoints that cannot be loaded),
130 interrupted (Ctrl-C). Each is reported in one line, never a traceback: every expected
error is a typed one (``SpecErrors``, ``UsageError``, ``CheckpointError``) raised where the
bad value is read. Anything else is a bug in relayc: its traceback is shown, then one line
saying so and how to report it, exit 70 (``EX_SOFTWARE``).

Text from a spec, a checkpoint or a model (descriptions, names, messages quoting them)
reaches the terminal through ``relayc.tools.terminal.printable``: control characters escaped.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from relayc.compiler.picture import add_graph_command
from relayc.specs.errors import (
    EXIT_BUG,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SPEC_ERRORS,
    EXIT_USAGE,
    OneLineParser,
    SpecErrors,
    UsageError,
    add_ops_option,
    one_line,
    report_bug,
)
from relayc.tools.demo import add_demo_command
from relayc.tools.generate import add_generate_command
from relayc.tools.terminal import printable

if TYPE_CHECKING:
    from relayc.compiler.writer import Output
    from relayc.specs.loader import Library, Spec

__all__ = [
    "EXIT_BUG",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_SPEC_ERRORS",
    "EXIT_USAGE",
    "UsageError",
    "build_parser",
    "main",
]


def _existing_files(paths: Sequence[str]) -> list[Path]:
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise UsageError(f"no such spec file: {', '.join(missing)}")
    return [Path(p) for p in paths]


def _check_document(path: Path, ops: Sequence[str]) -> Spec | Library:
    """Load a spec file and, for an algorithm, run every check ``compile`` runs (op
    signatures, dims, dtypes and shapes through the graph passes); raises SpecErrors."""
    from relayc.graph.passes import analyse
    from relayc.specs.loader import Spec, load_document

    document = load_document(path, ops=ops)
    if isinstance(document, Spec):
        analyse(document)
    return document


def cmd_validate(args: argparse.Namespace) -> int:
    from relayc.specs.loader import Library, display_path

    failed = False
    for path in _existing_files(args.specs):
        try:
            document = _check_document(path, args.ops)
        except SpecErrors as exc:
            print(printable(exc.render()), file=sys.stderr)
            failed = True
            continue
        if not args.quiet:
            what = (
                f"library `{document.name}`"
                if isinstance(document, Library)
                else f"algorithm `{document.algorithm}`, {len(document.steps)} steps"
            )
            print(printable(f"{display_path(path)}: ok ({what}, {len(document.fields)} fields)"))
    return EXIT_SPEC_ERRORS if failed else EXIT_OK


def cmd_explain(args: argparse.Namespace) -> int:
    from relayc.plan.explain import explain

    failed = False
    for i, path in enumerate(_existing_files(args.specs)):
        try:
            document = _check_document(path, args.ops)
        except SpecErrors as exc:
            print(printable(exc.render()), file=sys.stderr)
            failed = True
            continue
        if i:
            print()
        print(printable(explain(document)))  # a description is the spec author's text
    return EXIT_SPEC_ERRORS if failed else EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    from relayc.specs.jsonschema import spec_json_schema

    text = json.dumps(spec_json_schema(), indent=2, sort_keys=True) + "\n"
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write {args.output}: {_why(exc)}") from None
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _output_dir(path: str) -> Path:
    """``-o DIR`` checked before any work: a folder, or a path one can be made at."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {path}: not a folder (compile writes one module per algorithm in it)")
    existing = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise UsageError(f"-o {path}: {existing} is not a folder")
    return out


def _algorithms(specs: Sequence[Path], ops: Sequence[str]) -> tuple[list[Path], bool]:
    """The spec files to compile, libraries validated and skipped with a note; and whether
    any file had errors (reported)."""
    from relayc.specs.loader import Library, display_path, load_document

    paths: list[Path] = []
    failed = False
    for path in specs:
        try:
            document = load_document(path, ops=ops)
        except SpecErrors as exc:
            print(printable(exc.render()), file=sys.stderr)
            failed = True
            continue
        if isinstance(document, Library):
            print(printable(f"{display_path(path)}: library `{document.name}` is valid; skipped"))
            continue
        paths.append(path)
    return paths, failed


def cmd_compile(args: argparse.Namespace) -> int:
    from relayc.compiler.writer import compile_specs, engine_specs, vllm_specs, write
    from relayc.specs.loader import bundled_spec_paths

    if args.bundled and args.specs:
        raise UsageError(
            "give spec files or --bundled, not both (--bundled compiles the bundled specs)"
        )
    if args.bundled and args.output is None:
        return _regenerate_bundled()
    if not args.specs and not args.bundled:
        raise UsageError("give spec files to compile, or --bundled")
    out_dir = _output_dir(args.output or ".")
    # --bundled -o DIR: the bundled specs compiled into DIR like any others, e.g. to vendor
    # them; relayc's own checked-in copies are left alone.
    specs = bundled_spec_paths() if args.bundled else _existing_files(args.specs)
    if args.bundled and args.target == "relayc":
        specs = engine_specs()  # dspark and uno use what only the SGLang target implements
    if args.bundled and args.target == "vllm":
        specs = vllm_specs()  # n-gram and UNO: vLLM's Model Runner V2 runs neither
    paths, failed = _algorithms(specs, args.ops)
    if args.target in ("sglang", "vllm"):
        return _compile_dropin(args.target, paths, out_dir, args.ops, failed)
    try:
        outputs = compile_specs(paths, out_dir, ops=args.ops)
    except SpecErrors as exc:
        print(printable(exc.render()), file=sys.stderr)
        return EXIT_SPEC_ERRORS
    for output in outputs:
        print(f"{'wrote' if _write(output, write) else 'unchanged'} {output.path}")
    return EXIT_SPEC_ERRORS if failed else EXIT_OK


def _regenerate_bundled() -> int:
    """``--bundled`` without ``-o``: rewrite relayc's checked-in generated modules."""
    from relayc.compiler.writer import GENERATED_DIR, regenerate_bundled

    try:
        changes = regenerate_bundled()
    except OSError as exc:  # an installed, read-only relayc
        raise UsageError(
            f"cannot write the bundled modules: {_why(exc)} (give -o DIR to compile the "
            "bundled specs elsewhere)"
        ) from None
    for change in changes:
        print(f"{change.action} {change.path.relative_to(GENERATED_DIR.parent.parent)}")
    return EXIT_OK


def _write(output: Output, write: Callable[[Output], bool]) -> bool:
    try:
        return write(output)
    except OSError as exc:
        raise UsageError(f"cannot write {output.path}: {_why(exc)}") from None


def _compile_dropin(
    target: str, paths: list[Path], out_dir: Path, ops: Sequence[str], failed: bool
) -> int:
    """All specs into one module for an engine: SGLang's (DIR/overlap_utils.py and the
    runtime it imports, DIR/relayc_relay_runtime.py) or vLLM's (DIR/vllm_relay.py and
    DIR/relayc_vllm_runtime.py)."""
    from relayc.compiler.targets.sglang import compile_sglang
    from relayc.compiler.targets.vllm import compile_vllm
    from relayc.compiler.writer import write

    if failed:
        return EXIT_SPEC_ERRORS
    if not paths:
        print("no algorithm specs among the files: nothing to compile", file=sys.stderr)
        return EXIT_OK
    compile_dropin = compile_vllm if target == "vllm" else compile_sglang
    try:
        outputs = compile_dropin(paths, out_dir, ops=ops)
    except SpecErrors as exc:
        print(printable(exc.render()), file=sys.stderr)
        return EXIT_SPEC_ERRORS
    for output in outputs:
        print(f"{'wrote' if _write(output, write) else 'unchanged'} {output.path}")
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    from relayc.compiler.writer import RuffMissing, stale_bundled, style_of_bundled

    try:
        diffs = stale_bundled()
    except SpecErrors as exc:
        print(printable(exc.render()), file=sys.stderr)
        return EXIT_SPEC_ERRORS
    if diffs:
        sys.stdout.write("".join(diffs))
        print(
            f"relayc check: {len(diffs)} generated module(s) are stale; run "
            "`relayc compile --bundled`",
            file=sys.stderr,
        )
        return EXIT_SPEC_ERRORS
    # Fresh output fails ruff only through a relayc bug; checked so one never ships.
    try:
        problems = style_of_bundled()
    except RuffMissing as exc:
        print(f"relayc check: cannot check the generated modules' style: {exc}", file=sys.stderr)
        return EXIT_SPEC_ERRORS
    if problems:
        sys.stdout.write("\n".join(problems) + "\n")
        print("relayc check: generated modules fail ruff (a relayc bug)", file=sys.stderr)
        return EXIT_SPEC_ERRORS
    print("relayc check: generated modules are up to date")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="relayc",
        description="Compile relay-state specs for overlapped speculative decoding.",
        epilog="Exit codes: 0 ok, 1 spec errors, 2 usage errors, 70 a bug in relayc (reported "
        "with its traceback), 130 interrupted (Ctrl-C).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser(
        "validate",
        help="check spec files and report every error",
        description="Validate spec files; every error is printed as "
        "path:line:col: error: message (hint).",
    )
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec YAML files")
    p.add_argument("-q", "--quiet", action="store_true", help="print errors only")
    add_ops_option(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "explain",
        help="print a readable table of a spec",
        description="Print the dims, engine inputs, relay fields and steps of each spec.",
    )
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec YAML files")
    add_ops_option(p)
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser(
        "compile",
        help="generate one Python module per algorithm spec",
        description="Validate and analyse each spec, then write "
        "<DIR>/<algorithm>.py (only when its bytes change); with --target sglang, one "
        "<DIR>/overlap_utils.py with SGLang 0.5.23's relay surface for all of them (and the "
        "runtime it imports, relayc_relay_runtime.py); with --target vllm, one "
        "<DIR>/vllm_relay.py with vLLM 0.33.0's Model Runner V2 relay (and "
        "relayc_vllm_runtime.py).",
    )
    p.add_argument("specs", nargs="*", metavar="SPEC", help="algorithm spec YAML files")
    p.add_argument(
        "-o", "--output", metavar="DIR", help="output folder (default: the current folder)"
    )
    p.add_argument(
        "--bundled",
        action="store_true",
        help="compile the bundled specs instead of SPEC files: into -o DIR when given, else "
        "regenerate relayc/generated/, relayc/sglang_generated/ and relayc/vllm_generated/",
    )
    p.add_argument(
        "--target",
        choices=("relayc", "sglang", "vllm"),
        default="relayc",
        help="relayc: one module per algorithm (default); sglang: one drop-in module for "
        "SGLang's overlap_utils relay; vllm: one module of vLLM Model Runner V2's relay",
    )
    add_ops_option(p)
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser(
        "check",
        help="fail if relayc/generated/ is stale",
        description="Regenerate the bundled specs in memory and exit 1, "
        "printing a diff, if a checked-in generated module differs.",
    )
    p.set_defaults(func=cmd_check)

    p = sub.add_parser(
        "schema",
        help="print the JSON Schema of the spec format",
        description="Print the JSON Schema of spec files, for YAML editors "
        "(see the README: 'Editor support').",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.set_defaults(func=cmd_schema)
    add_graph_command(sub)
    add_generate_command(sub)
    add_demo_command(sub)
    return parser


def _is_checkpoint_error(exc: Exception) -> bool:
    """Whether ``exc`` is a ``CheckpointError``, which every checkpoint reader (safetensors,
    config.json, and any format added later) raises or subclasses. Looked up among the
    loaded modules: a command that never imported the loaders cannot have raised one, and
    `relayc validate` should not import torch to find that out."""
    weights = sys.modules.get("relayc.engine.model.weights")
    return weights is not None and isinstance(exc, weights.CheckpointError)


def main(argv: Sequence[str] | None = None) -> int:
    command = ""
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
            return int(exc.code or 0)
        command = f" {args.command}"
        func: Callable[[argparse.Namespace], int] = args.func
        return func(args)
    except UsageError as exc:
        print(one_line(f"relayc{command}: error: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        # Ctrl-C is how one stops a long generate or demo, not a crash. The newline ends
        # the line the terminal echoed ^C on (or the streamed text, or a progress bar).
        print(f"\nrelayc{command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:
        if _is_checkpoint_error(exc):
            # The one place a checkpoint error becomes a usage error, wherever it was raised
            # (the engine's loaders, a tokenizer's, a flag that reads a file).
            print(one_line(f"relayc{command}: error: {exc}"), file=sys.stderr)
            return EXIT_USAGE
        report_bug(f"relayc{command}")
        return EXIT_BUG


if __name__ == "__main__":
    sys.exit(main())
