"""Command-line behaviour: exit codes, help on every command, no tracebacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from relayc.cli import EXIT_USAGE, build_parser, main

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
