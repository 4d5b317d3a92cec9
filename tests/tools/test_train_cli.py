"""The training command lines (``python -m relayc.tools.train [eagle3|dflash]``): a bad flag
or file ends in one line and no traceback, an unexpected exception shows its traceback and
says it is a bug, and ``--help`` lists every command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import relayc
from relayc.engine.checkpoints.shipped import shipped_target
from relayc.engine.core.config import ModelConfig
from relayc.engine.errors import CheckpointError
from relayc.engine.model.weights import random_model
from relayc.specs.errors import UsageError
from relayc.tools.train import cli, dflash_cli, eagle3_cli
from relayc.tools.train.eagle3_chat import compute_features, read_corpus

REPO = Path(relayc.__file__).resolve().parent.parent


def _one_line(err: str, prog: str) -> str:
    assert err.startswith(f"{prog}: error: "), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _refused(
    main: Callable[[list[str]], int], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> str:
    """The one line a refused command wrote; argparse's refusals exit through SystemExit,
    the rest return 2."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code  # type: ignore[assignment]
    assert code == 2
    return capsys.readouterr().err


def _dflash(tmp_path: Path, *extra: str) -> list[str]:
    return ["--smoke", "--steps", "1", "--out", str(tmp_path / "out"),
            "--work", str(tmp_path / "work"), *extra]  # fmt: skip


DFLASH = "python -m relayc.tools.train dflash"
EAGLE3 = "python -m relayc.tools.train eagle3"


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--target-layer-ids", "99", "the target has 6 layers; give ids in 0..4"),
        ("--target-layer-ids", "5", "give ids in 0..4"),  # the last layer: nothing reads it
        ("--target-layer-ids", "0,0", "'0,0' names a layer twice"),
        ("--target-layer-ids", "2,1", "in increasing order"),
        ("--target-layer-ids", "1,x", "item 2 is 'x', not a whole number"),
        ("--target-layer-ids", "-1", "layer ids lie in 0.."),
        ("--target-layer-ids", "9" * 30, "layer ids lie in 0.."),
        ("--init-layers", "1,,2", "item 2 is '', not a whole number"),
        ("--init-fc", "/nonexistent", "'/nonexistent' does not exist"),
        ("--data", "/nonexistent", "'/nonexistent' does not exist"),
    ],
)
def test_a_bad_dflash_flag_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, says: str
) -> None:
    err = _one_line(_refused(dflash_cli.main, _dflash(tmp_path, f"{flag}={value}"), capsys), DFLASH)
    assert flag in err and says in err


def test_an_init_fc_folder_without_a_head_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    err = _refused(dflash_cli.main, _dflash(tmp_path, "--init-fc", str(tmp_path / "empty")), capsys)
    assert "has no config.json" in _one_line(err, DFLASH)


def test_resuming_a_one_layer_dflash_work_with_two_layers_names_the_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert dflash_cli.main(_dflash(tmp_path, "--layers", "1")) == 0
    capsys.readouterr()
    err = _one_line(_refused(dflash_cli.main, _dflash(tmp_path, "--layers", "2"), capsys), DFLASH)
    assert f"{tmp_path / 'work' / 'checkpoint.pt'}: was saved by a run with --layers 1" in err
    assert "this run has 2" in err and "fresh --work" in err
    # settings the weights' shapes do not show: named too
    for flag, value, saved in (("--block-size", "4", "8"), ("--target-layer-ids", "0", "3")):
        argv = _dflash(tmp_path, "--layers", "1", flag, value)
        err = _one_line(_refused(dflash_cli.main, argv, capsys), DFLASH)
        assert f"was saved by a run with {flag} {saved}, this run has {value}" in err
    # the same flags still resume
    assert dflash_cli.main(_dflash(tmp_path, "--layers", "1", "--steps", "2")) == 0
    assert "resumed from" in capsys.readouterr().out


def test_cached_toy_examples_that_do_not_fit_the_target_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "toy-examples-2-0.json"
    good = [{"prompt_ids": [1, 2], "answer_ids": [3]}] * 2
    path.write_text(json.dumps(good))
    assert dflash_cli._cached_examples(path, 2, 300) == good
    for bad in ([good[0]], [good[0], {"prompt_ids": [1, 300], "answer_ids": []}], {"a": 1}):
        path.write_text(json.dumps(bad))
        with pytest.raises(CheckpointError, match=str(path)):
            dflash_cli._cached_examples(path, 2, 300)


def test_bad_eagle3_flags_and_work_files_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--target", "toy", "--smoke", "--out", str(tmp_path / "out")]
    work = ["--work", str(tmp_path / "work")]
    for extra, says in (
        (["--init", "/nonexistent"], "argument --init: '/nonexistent' does not exist"),
        (["--data", str(tmp_path)], "has no examples.jsonl"),
    ):
        assert says in _one_line(_refused(eagle3_cli.main, [*base, *work, *extra], capsys), EAGLE3)
    (tmp_path / "file").write_text("")
    err = _refused(eagle3_cli.main, [*base, "--work", str(tmp_path / "file")], capsys)
    assert "argument --work:" in _one_line(err, EAGLE3) and "is a file" in err
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "invocations.json").write_text("{not json")
    err = _one_line(_refused(eagle3_cli.main, [*base, *work], capsys), EAGLE3)
    assert f"{tmp_path / 'work' / 'invocations.json'}: invalid JSON" in err


def test_bad_demo_training_flags_and_files_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prog = "python -m relayc.tools.train"
    (tmp_path / "file").write_text("")
    err = _refused(cli.main, ["--out", str(tmp_path / "file"), "--smoke"], capsys)
    assert "argument --out:" in _one_line(err, prog)
    (tmp_path / "training_log.json").write_text("[")
    err = _one_line(_refused(cli.main, ["--out", str(tmp_path), "--measure-only"], capsys), prog)
    assert f"{tmp_path / 'training_log.json'}: invalid JSON" in err
    err = _one_line(_refused(cli.main, ["eagle", "--out", str(tmp_path)], capsys), prog)
    assert "no command 'eagle'" in err and "did you mean `eagle3`?" in err


@pytest.mark.parametrize("command", ["base", "eagle3", "dflash"])
def test_an_unexpected_exception_shows_its_traceback_then_says_it_is_a_bug(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    def boom(*args: object) -> None:
        raise RuntimeError("boom")

    module, name, argv = {
        "base": (cli, "run_training", ["--smoke", "--out", str(tmp_path)]),
        "eagle3": (eagle3_cli, "run_toy", ["--target", "toy", "--smoke", "--out",
                                          str(tmp_path / "o"), "--work", str(tmp_path / "w")]),
        "dflash": (dflash_cli, "run", _dflash(tmp_path)),
    }[command]  # fmt: skip
    monkeypatch.setattr(module, name, boom)
    assert module.main(argv) == 70
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "RuntimeError: boom" in err
    last = err.rstrip("\n").splitlines()[-1]
    assert "this is a bug in relayc" in last and "please report it" in last


def test_help_lists_every_command_one_line_each(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for command in ("(none)", "eagle3", "dflash"):
        lines = [line for line in out.splitlines() if line.startswith(f"  {command} ")]
        assert len(lines) == 1, (command, out)
    assert "{eagle3,dflash}" in out.splitlines()[0]
    # each command's own --help is reached through the module's main
    for command, option in (("eagle3", "--revocab"), ("dflash", "--block-size")):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        assert option in capsys.readouterr().out


def test_python_dash_m_help_lists_the_commands() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-m", "relayc.tools.train", "--help"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "  eagle3 " in done.stdout and "  dflash " in done.stdout


def test_a_chat_corpus_line_that_is_not_an_example_names_the_file_and_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "examples.jsonl"
    good = json.dumps({"index": 0, "prompt_ids": [1, 2], "answer_ids": [3]}) + "\n"
    path.write_text(good)
    assert read_corpus(tmp_path, None)[0] == [{"index": 0, "prompt_ids": [1, 2], "answer_ids": [3]}]
    for bad in ("{oops\n", '{"index": 1, "prompt_ids": [1]}\n', '{"index": 1, "prompt_ids": '
                '[-1], "answer_ids": []}\n', "[1]\n"):  # fmt: skip
        path.write_text(good + bad)
        with pytest.raises(CheckpointError, match=f"{path}: line 2 "):
            read_corpus(tmp_path, None)


def test_a_corpus_for_another_vocabulary_is_refused_before_any_forward(tmp_path: Path) -> None:
    config = ModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=4,
                         num_heads=2, num_kv_heads=1, head_dim=16, max_position=64)  # fmt: skip
    examples = [{"index": 7, "prompt_ids": [1, 2], "answer_ids": [300]}]
    with pytest.raises(UsageError, match=r"example 7 .* \(0\.\.299\).*--data"):
        compute_features(random_model(config), examples, (1, 2), tmp_path / "features")
    assert not (tmp_path / "features").exists()


def test_resuming_an_eagle3_work_for_another_target_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--smoke", "--steps", "2", "--out", str(tmp_path / "o"), "--work", str(tmp_path / "w")]
    assert eagle3_cli.main([*argv, "--target", "toy"]) == 0
    capsys.readouterr()
    err = _one_line(_refused(eagle3_cli.main, [*argv, "--target", "smollm2"], capsys), EAGLE3)
    assert "was saved by a run with --target toy, this run has smollm2" in err


@pytest.mark.skipif(shipped_target() is None, reason="an install without the shipped demo target")
def test_a_draft_vocabulary_larger_than_the_target_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--target", "toy", "--draft-vocab", "100000", "--corpus-bytes", str(1 << 20),
            "--out", str(tmp_path / "o"), "--work", str(tmp_path / "w")]  # fmt: skip
    err = _one_line(_refused(eagle3_cli.main, argv, capsys), EAGLE3)
    assert "--draft-vocab 100000: the target has 259 tokens" in err
    # a corpus cap below the first file: no training text, said before any training
    err = _one_line(_refused(eagle3_cli.main, [*argv, "--corpus-bytes", "4096"], capsys), EAGLE3)
    assert "--corpus-bytes 4096: the files that fit give no training text" in err


def test_measure_only_checks_the_log_it_reads_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "training_log.json"
    log.write_text(json.dumps({"corpus": {}, "models": {}}))
    err = _refused(cli.main, ["--out", str(tmp_path), "--measure-only"], capsys)
    assert f"{log}: has no `curves`" in _one_line(err, "python -m relayc.tools.train")


def test_ctrl_c_is_one_line_saying_how_to_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupt(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(dflash_cli, "run", interrupt)
    monkeypatch.setattr(cli, "run_training", interrupt)
    assert dflash_cli.main(_dflash(tmp_path)) == 130
    assert (
        capsys.readouterr().err
        == f"\n{DFLASH}: interrupted (the same command resumes from --work)\n"
    )
    assert cli.main(["--smoke", "--out", str(tmp_path)]) == 130  # no --work to resume from
    assert capsys.readouterr().err == "\npython -m relayc.tools.train: interrupted\n"
