"""`relayc generate` with checkpoints: a broken one is one line and exit 2 (never a
traceback), and a model without a tokenizer is usable through --prompt-ids."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from relayc.cli import EXIT_OK, EXIT_USAGE, main
from relayc.engine.core.config import ModelConfig
from relayc.engine.draft.eagle import EagleHead
from relayc.engine.errors import CheckpointError
from relayc.engine.model.weights import random_model, save_checkpoint
from tests.engine.checkpoint_cases import BAD_CONFIGS, BadConfig, break_checkpoint

NO_TOKENIZER = ModelConfig(vocab_size=300)  # not the byte-level vocabulary: no tokenizer


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    target = random_model(seed=0)  # what `--model random` builds, so heads fit it
    return {
        "target": save_checkpoint(target, root / "target"),
        "eagle": EagleHead.random(target, seed=1).save(root / "eagle"),
        "no-tokenizer": save_checkpoint(random_model(NO_TOKENIZER, seed=0), root / "ids"),
    }


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line]
    assert len(lines) == 1, err
    assert lines[0].startswith("relayc generate: error: ")
    return lines[0].removeprefix("relayc generate: error: ")


@pytest.mark.parametrize("case", BAD_CONFIGS, ids=[c.name for c in BAD_CONFIGS])
@pytest.mark.parametrize("role", ["model", "draft-model"])
def test_a_bad_config_is_one_line_naming_file_and_key(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    checkpoints: dict[str, Path],
    case: BadConfig,
    role: str,
) -> None:
    good = checkpoints["target" if role == "model" else "eagle"]
    config = break_checkpoint(good, tmp_path / "ckpt", case)
    argv = ["generate", "--prompt", "hi", "--max-new-tokens", "1"]
    if role == "model":
        argv += ["--model", str(config.parent)]
    else:
        argv += ["--model", "random", "--algorithm", "eagle", "--draft-model", str(config.parent)]
    assert main(argv) == EXIT_USAGE
    line = _error_line(capsys)
    assert line.startswith(f"{config}: ")
    assert case.message in line


def test_the_console_command_exits_2_without_traceback(
    tmp_path: Path, checkpoints: dict[str, Path]
) -> None:
    config = break_checkpoint(checkpoints["target"], tmp_path / "ckpt", BAD_CONFIGS[0])
    argv = ["generate", "--model", str(config.parent), "--prompt", "hi"]
    proc = subprocess.run(
        [sys.executable, "-m", "relayc.cli", *argv], capture_output=True, text=True, check=False
    )
    assert proc.returncode == EXIT_USAGE, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"relayc generate: error: {config}: ")
    assert BAD_CONFIGS[0].message in line


class TokenizerFileError(CheckpointError):
    """What a loader added later (a tokenizer's, GGUF's) raises: a CheckpointError subclass."""


@pytest.mark.parametrize("where", ["__init__", "stream"])
def test_every_checkpoint_error_is_one_line_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """Wherever a command meets a checkpoint error -- loading the engine, or later (a
    tokenizer file read once the model is up) -- relayc's main reports it."""
    from relayc.engine.serving import engine

    def fail(*args: object, **kwargs: object) -> None:
        raise TokenizerFileError("the vocabulary is not a list", "/ckpt/tokenizer.json")

    monkeypatch.setattr(engine.Engine, where, fail)
    assert main(["generate", "--model", "random", "--prompt", "hi"]) == EXIT_USAGE
    assert _error_line(capsys) == "/ckpt/tokenizer.json: the vocabulary is not a list"


# -- --prompt-ids --------------------------------------------------------------------------


def test_prompt_ids_drive_a_model_without_a_tokenizer(
    capsys: pytest.CaptureFixture[str], checkpoints: dict[str, Path]
) -> None:
    from relayc.engine import Engine

    model = str(checkpoints["no-tokenizer"])
    argv = ["generate", "--model", model, "--prompt-ids", "5, 299,7", "--max-new-tokens", "6"]
    assert main(argv) == EXIT_OK
    out = capsys.readouterr().out
    with Engine(model) as engine:
        (expected,) = engine.generate([[5, 299, 7]])  # greedy, as the command's default
    assert out == " ".join(map(str, expected.token_ids[:6])) + "\n"


def test_text_prompt_on_a_model_without_a_tokenizer_points_to_prompt_ids(
    capsys: pytest.CaptureFixture[str], checkpoints: dict[str, Path]
) -> None:
    argv = ["generate", "--model", str(checkpoints["no-tokenizer"]), "--prompt", "hi"]
    assert main(argv) == EXIT_USAGE
    assert "no tokenizer" in (line := _error_line(capsys)) and "--prompt-ids 1,2,3" in line
    argv = ["generate", "--model", str(checkpoints["no-tokenizer"]), "--prompt-ids", "1,300"]
    assert main(argv) == EXIT_USAGE
    assert "outside the vocabulary [0, 300)" in _error_line(capsys)


def test_prompt_ids_on_a_model_with_a_tokenizer_print_its_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from relayc.engine.text.bytes import ByteTokenizer

    ids = ByteTokenizer().encode("def f(x):", add_bos=True)
    argv = ["generate", "--model", "random", "--max-new-tokens", "5"]
    assert main([*argv, "--prompt-ids", ",".join(map(str, ids))]) == EXIT_OK
    by_ids = capsys.readouterr().out
    assert main([*argv, "--prompt", "def f(x):"]) == EXIT_OK
    assert by_ids == capsys.readouterr().out


def test_a_quantized_drafter_prints_the_same_text(capsys: pytest.CaptureFixture[str]) -> None:
    """`--draft-quantization q8_0` changes the drafts, never the tokens."""
    argv = ["generate", "--toy", "--prompt", "def f(x):", "--max-new-tokens", "12", "--algorithm"]
    assert main([*argv, "eagle3"]) == EXIT_OK
    plain = capsys.readouterr().out
    assert main([*argv, "eagle3", "--draft-quantization", "q8_0"]) == EXIT_OK
    assert capsys.readouterr().out == plain
    assert main([*argv, "ngram", "--draft-quantization", "Q8_0"]) == EXIT_USAGE
    assert "`ngram` drafts without any: drop it" in _error_line(capsys)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--prompt-ids", "1,x,3"], "token id 2 is 'x', not a whole number"),
        (["--prompt-ids", "1,-3"], "token id 2 is -3"),
        (["--prompt-ids", " , "], "give at least one token id"),
        (["--prompt-ids", "1", "--prompt", "hi"], "not allowed with argument"),
        ([], "one of the arguments --prompt --chat --prompt-ids is required"),
    ],
)
def test_prompt_ids_are_checked_before_any_model_loads(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    from relayc.engine.serving import engine

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(engine.Engine, "__init__", refuse)
    assert main(["generate", *argv]) == EXIT_USAGE
    assert message in _error_line(capsys)


def test_model_names_on_the_command_line_are_the_engines() -> None:
    from relayc.engine.checkpoints.named import NAMED_MODELS
    from relayc.tools.args import MODEL_NAMES

    assert set(MODEL_NAMES) == set(NAMED_MODELS)


def test_chat_with_the_real_model_streams_the_answer(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.engine.real_model import smollm2_file

    smollm2_file()
    argv = ["generate", "--chat", "What is the capital of France?"]  # smollm2: the default
    assert main([*argv, "--max-new-tokens", "24", "--dtype", "bfloat16"]) == EXIT_OK
    captured = capsys.readouterr()
    assert "Paris" in captured.out
    assert "loaded smollm2" in captured.err and "bfloat16" in captured.err  # progress line
    assert "finish: stop" in captured.err and "mean accept length 1.00" in captured.err
    assert "decoded with bfloat16 weights (" in captured.err  # which CPU path ran
    assert main([*argv, "--max-new-tokens", "8", "--dtype", "int8"]) == EXIT_OK
    assert "decoded with int8 dot products over the GGUF blocks" in capsys.readouterr().err


def test_a_drafter_that_would_be_random_on_the_real_model_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No EAGLE head ships for SmolLM2: `--algorithm eagle` used to draft with a random one
    (accept length 1.00) without a word, then was refused after the model loaded (4-6 s);
    now before. The toy model keeps its shipped drafters."""
    for algorithm in ("eagle", "standalone", "eagle_multilayer"):
        assert main(["generate", "--chat", "hi", "--algorithm", algorithm]) == EXIT_USAGE
        line = _error_line(capsys)  # the only line: no model was read
        assert f"no `{algorithm}` drafter ships for 'smollm2'" in line
        assert (
            "`none`, `ngram`, `suffix`, `eagle3`, `dflash`" in line and "--draft-model DIR" in line
        )
    argv = ["generate", "--toy", "--prompt", "def f(x):", "--max-new-tokens", "2"]
    assert main([*argv, "--algorithm", "eagle"]) == EXIT_OK
    capsys.readouterr()
    assert main(["generate", "--toy", "--chat", "hi"]) == EXIT_USAGE
    assert "no chat template" in _error_line(capsys)


@pytest.mark.parametrize(
    "prompt, expected",
    [
        (["--chat", "hi"], 512),
        (["--prompt", "hi"], 32),
        (["--chat", "hi", "--max-new-tokens", "7"], 7),
    ],
)
def test_chat_runs_to_the_end_of_the_answer_by_default(
    monkeypatch: pytest.MonkeyPatch, prompt: list[str], expected: int
) -> None:
    """The quick start's answer was cut at 32 tokens mid-line: a --chat answer ends at the
    model's end of turn (the engine stops at its end-of-generation tokens), the cap only
    bounds one that rambles."""
    from relayc.tools import generate

    seen: list[int] = []

    def stream(engine: object, prompt: object, params: object) -> tuple[int, str, None]:
        seen.append(params.max_new_tokens)  # type: ignore[attr-defined]
        return 0, "stop", None

    monkeypatch.setattr(generate, "_stream", stream)
    model = ["--model", "random"] if "--prompt" in prompt else ["--toy"]
    assert main(["generate", *model, *prompt]) == EXIT_OK
    assert seen == [expected]


def test_the_native_build_is_reported_apart_from_the_load(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first run compiles the native decoder (~20 s): a line says so when it starts,
    another how long it took, both before the model is read, so the load's own time is
    reported without it."""
    from relayc.engine.native import library

    real, builds = library.native_decoder, []

    def build() -> object:  # a first run's native_decoder(): one build, told to the listener
        if library._build_listener is not None:
            builds.append(library._build_listener)
            library._build_listener(None)
            library._build_listener(12.34)
        return real()

    monkeypatch.setattr(library, "native_decoder", build)
    argv = ["generate", "--model", "random", "--prompt-ids", "1,2", "--max-new-tokens", "1"]
    assert main(argv) == EXIT_OK
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "building the native decoder for this CPU (once, ~20 s)..."
    assert lines[1].startswith("built the native decoder in 12.3 s (cached in ")
    assert len(builds) == 1, "the build is not reported"
    assert library._build_listener is None  # heard only while generate builds


def test_chat_needs_a_tokenizer(
    checkpoints: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", "--model", str(checkpoints["no-tokenizer"]), "--chat", "hi"]
    assert main(argv) == EXIT_USAGE
    assert "--prompt-ids" in _error_line(capsys)


def test_a_broken_gguf_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from relayc.engine.checkpoints.gguf import save_gguf

    path = save_gguf(random_model(seed=0), tmp_path / "model.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert main(["generate", "--model", str(cut), "--prompt-ids", "1,2"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err
    progress, line = err.strip().splitlines()  # what was being read, then why it failed
    assert progress == "reading cut.gguf ..."
    assert line.startswith("relayc generate: error: ")
    assert str(cut) in line and "copy it again" in line
    assert main(["generate", "--model", str(path), "--prompt-ids", "1,2"]) == EXIT_OK


def test_dflash_num_steps_sets_the_block(capsys: pytest.CaptureFixture[str]) -> None:
    """`--num-steps N` with dflash drafts N tokens a block (as --help says), instead of a
    ValueError from the drafter, once loaded, against its own block of 8."""
    argv = ["generate", "--toy", "--algorithm", "dflash", "--prompt", "def f(x):"]
    assert main([*argv, "--max-new-tokens", "8", "--num-steps", "3"]) == EXIT_OK
    assert "algorithm dflash" in capsys.readouterr().err
    assert main([*argv, "--num-steps", "3", "--num-draft-tokens", "5"]) == EXIT_USAGE
    line = _error_line(capsys)
    assert "rule `num_steps == num_draft_tokens - 1`" in line and "leave `num_steps` out" in line
    assert "num_steps=3, num_draft_tokens=5" in line and "(set `num_steps` to 4)" in line
