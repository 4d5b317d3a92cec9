"""Command-line behaviour: exit codes, help on every command, no tracebacks."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from relayc.cli import EXIT_OK, EXIT_USAGE, build_parser, main

COMMANDS = sorted(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_on_every_command(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--help"]) == 0
    assert "usage: relayc" in capsys.readouterr().out


def test_top_level_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert command in out


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main([]) == EXIT_USAGE
    assert main(["frobnicate"]) == EXIT_USAGE
    assert main(["validate"]) == EXIT_USAGE
    assert main(["validate", str(tmp_path / "missing.yaml")]) == EXIT_USAGE
    assert "no such spec file" in capsys.readouterr().err


def test_console_script_runs_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm: x\nfields: {a: {dtype: int65, doc: d}}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "relayc.cli", "validate", str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "bad.yaml:2:21: error: unknown dtype `int65` in field `a`" in proc.stderr


def test_demo_compiles_runs_every_algorithm_and_writes_a_chart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chart = tmp_path / "demo.png"
    assert main(["demo", "--prompts", "2", "--max-new-tokens", "6", "--chart", str(chart)]) == 0
    out = capsys.readouterr().out
    assert "compiled the bundled specs into" in out
    labels = ("none", "eagle (topk 1)", "eagle (topk 4)", "eagle_multilayer", "ngram", "standalone")
    for label in labels:
        assert label in out
    assert out.count(" yes") >= len(labels)  # every algorithm's outputs equal greedy none
    if "chart skipped" not in out:
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- validate runs what compile runs; compile skips libraries ----------------------------


def _none_spec(tmp_path: Path, old: str, new: str) -> Path:
    from relayc.specs.loader import BUNDLED_DIR

    shutil.copy(BUNDLED_DIR / "common.yaml", tmp_path / "common.yaml")
    text = (BUNDLED_DIR / "none.yaml").read_text()
    assert old in text
    (tmp_path / "spec.yaml").write_text(text.replace(old, new, 1))
    return tmp_path / "spec.yaml"


@pytest.mark.parametrize(
    "old, new, message",
    [
        # A step writing an output its op does not have: validate used to say ok.
        ("    writes: [logits]\n", "    writes: [logits, hidden]\n", "has no output `hidden`"),
        # An op parameter the step does not bind.
        (
            "      seq_lens: input.seq_lens\n    writes: [logits]",
            "    writes: [logits]",
            "does not bind `seq_lens` of op `target_decode`",
        ),
        # A dtype mismatch between what a step reads and what its op takes.
        (
            "input_ids: relay.bonus_tokens",
            "input_ids: input.seq_lens\n      x: relay.bonus_tokens",
            "has no parameter `x`",
        ),
    ],
)
def test_validate_reports_what_compile_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, old: str, new: str, message: str
) -> None:
    _none_spec(tmp_path, old, new)
    monkeypatch.chdir(tmp_path)
    assert main(["compile", "spec.yaml", "-o", "out"]) == 1
    compile_err = capsys.readouterr().err
    assert main(["validate", "-q", "spec.yaml"]) == 1
    validate_err = capsys.readouterr().err
    assert message in validate_err
    assert validate_err == compile_err
    assert "Traceback" not in validate_err


@pytest.mark.parametrize("target", ["relayc", "sglang"])
def test_compile_skips_library_files(tmp_path: Path, capsys, target: str) -> None:
    from relayc.specs.loader import BUNDLED_DIR

    specs = sorted(str(p) for p in BUNDLED_DIR.glob("*.yaml"))
    assert main(["compile", *specs, "-o", str(tmp_path), "--target", target]) == EXIT_OK
    out = capsys.readouterr().out
    assert "relayc/specs/common.yaml: library `common` is valid; skipped" in out.splitlines()
    assert list(tmp_path.glob("*.py"))


def test_compile_of_a_broken_library_fails(tmp_path: Path, capsys) -> None:
    lib = tmp_path / "lib.yaml"
    lib.write_text("library: lib\ndims: {topk: {default: 0}}\n")
    assert main(["compile", str(lib), "-o", str(tmp_path / "out")]) == 1
    assert "lib.yaml:2:" in capsys.readouterr().err
