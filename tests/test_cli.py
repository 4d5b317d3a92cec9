"""Command-line behaviour: exit codes, help on every command, no tracebacks."""

from __future__ import annotations

import shutil
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayc.cli import EXIT_BUG, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, build_parser, main

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
    # transformers' rows have their own tests (tests/tools/test_demo.py)
    argv = ["demo", "--toy", "--prompts", "2", "--max-new-tokens", "6", "--no-peers"]
    argv += ["--chart", str(chart)]
    assert main(argv) == 0
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
    from relayc.compiler.writer import engine_specs
    from relayc.specs.loader import BUNDLED_DIR

    # dspark and uno use what only the SGLang target implements (tests/plan says so)
    runs = {p.name for p in engine_specs()} if target == "relayc" else None
    specs = sorted(
        str(p)
        for p in BUNDLED_DIR.glob("*.yaml")
        if runs is None or p.name in runs or p.name == "common.yaml"
    )
    assert main(["compile", *specs, "-o", str(tmp_path), "--target", target]) == EXIT_OK
    out = capsys.readouterr().out
    assert "relayc/specs/common.yaml: library `common` is valid; skipped" in out.splitlines()
    assert list(tmp_path.glob("*.py"))


def test_compile_of_a_broken_library_fails(tmp_path: Path, capsys) -> None:
    lib = tmp_path / "lib.yaml"
    lib.write_text("library: lib\ndims: {topk: {default: 0}}\n")
    assert main(["compile", str(lib), "-o", str(tmp_path / "out")]) == 1
    assert "lib.yaml:2:" in capsys.readouterr().err


# -- no traceback: every user error is one line and exit 2 ------------------------------


def _one_line(capsys: pytest.CaptureFixture[str], command: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"relayc {command}: error: ")
    return lines[0]


@pytest.fixture
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Argument errors must be reported before any model is loaded."""
    from relayc.engine.serving import engine

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(engine.Engine, "__init__", refuse)


def test_compile_output_is_a_file(tmp_path: Path, capsys) -> None:
    from relayc.specs.loader import BUNDLED_DIR

    target = tmp_path / "a_file"
    target.write_text("")
    assert main(["compile", str(BUNDLED_DIR / "none.yaml"), "-o", str(target)]) == EXIT_USAGE
    assert "not a folder" in _one_line(capsys, "compile")
    nested = target / "below"
    assert main(["compile", str(BUNDLED_DIR / "none.yaml"), "-o", str(nested)]) == EXIT_USAGE
    assert "is not a folder" in _one_line(capsys, "compile")


@pytest.mark.parametrize("target", ["relayc", "sglang"])
def test_compile_into_a_folder_it_cannot_write(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, target: str
) -> None:
    """A read-only folder (simulated: the tests may run as root, who writes anyway)."""
    from relayc.specs.loader import BUNDLED_DIR

    def read_only(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "write_text", read_only)
    spec = str(BUNDLED_DIR / "none.yaml")
    assert main(["compile", spec, "-o", str(tmp_path), "--target", target]) == EXIT_USAGE
    assert "cannot write" in _one_line(capsys, "compile")


@pytest.mark.parametrize("where", [".", "missing/schema.json"])
def test_schema_output_errors(tmp_path: Path, monkeypatch, capsys, where: str) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["schema", "-o", where]) == EXIT_USAGE
    assert f"cannot write {where}" in _one_line(capsys, "schema")


GENERATE_ERRORS = [
    (["--top-k", "1e23"], "expected a whole number"),
    (["--top-k", str(10**23)], f"is too large: must be at most {2**31 - 1}, got {10**23}"),
    (["--max-new-tokens", str(10**26)], f"is too large: must be at most {2**31 - 1}"),
    (["--top-k", "-1"], "must be at least 0"),
    (["--max-new-tokens", "0"], "must be at least 1"),
    (["--temperature", "nan"], "finite number"),
    (["--temperature", "-1"], "finite number"),
    (["--top-p", "0"], "(0, 1]"),
    (["--seed", "-1"], "between 0 and"),
    (["--num-draft-tokens", "0"], "must be at least 1"),
    (["--model", "/nonexistent"], "no model '/nonexistent'"),
    (["--draft-model", "/nonexistent"], "no checkpoint folder"),
    (["--device", "nonsense"], "unknown device"),
    (["--draft-quantization", "q4"], "invalid choice: 'q4'"),
    (["--prompt", "a\udcffb"], "is not valid UTF-8 (byte 0xff at character 1)"),
    (["--algorithm", "egale"], "unknown algorithm `egale` (did you mean `eagle`?)"),
    (["--algorithm", "eagle_multi"], "(did you mean `eagle_multilayer`?)"),
    (["--algorithm", "dspark"], "the reference engine cannot run `dspark`"),
    # smollm2, the default model, ships no EAGLE head: refused before it loads (4-6 s)
    (["--algorithm", "eagle"], "no `eagle` drafter ships for 'smollm2'"),
    (["--toy", "--algorithm", "eagle_multilayer", "--num-steps", "2"], "--num-steps N"),
    (
        ["--toy", "--algorithm", "eagle3", "--draft-quantization", "q8_0", "--dtype", "bfloat16"],
        "drop --dtype bfloat16",
    ),
]


@pytest.mark.parametrize("extra, message", GENERATE_ERRORS, ids=[a[0] for a, _ in GENERATE_ERRORS])
def test_generate_argument_errors(
    capsys, no_model_loads: None, extra: list[str], message: str
) -> None:
    assert main(["generate", "--prompt", "hi", *extra]) == EXIT_USAGE
    assert message in _one_line(capsys, "generate")


def test_generate_on_a_device_that_is_not_there(capsys, no_model_loads: None) -> None:
    import torch

    device = "cuda:64" if torch.cuda.is_available() else "cuda"
    assert main(["generate", "--prompt", "hi", "--device", device]) == EXIT_USAGE
    assert "--device" in _one_line(capsys, "generate")


DEMO_ERRORS = [
    (["--prompts", "0"], "must be at least 1"),
    (["--max-new-tokens", "0"], "must be at least 1"),
    (["--batch-size", "-1"], "must be at least 0"),
    (["--repeats", "0"], "must be at least 1"),
    (["--model", "/nonexistent"], "no model '/nonexistent'"),
    (["--chart", "/nonexistent/chart.png"], "does not exist"),
    (["--chart", "."], "is a folder"),
]


@pytest.mark.parametrize("extra, message", DEMO_ERRORS, ids=[" ".join(a) for a, _ in DEMO_ERRORS])
def test_demo_argument_errors(capsys, no_model_loads: None, extra: list[str], message: str) -> None:
    assert main(["demo", *extra]) == EXIT_USAGE
    assert message in _one_line(capsys, "demo")


@pytest.mark.parametrize(
    "option", ["--top-k", "--max-new-tokens", "--seed", "--num-steps", "--temperature", "--top-p"]
)
@given(value=st.one_of(st.integers(-(2**80), 2**80).map(str), st.text(max_size=12)))
@settings(max_examples=60, deadline=None)
def test_generate_numbers_parse_or_fail_in_one_line(option: str, value: str) -> None:
    """Whatever is typed after a numeric option: a value the sampler accepts, or exit 2 with
    one line -- never an exception from the engine later."""
    import contextlib
    import io

    from relayc.engine.core.sampling import SamplingParams

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = build_parser().parse_args(["generate", "--prompt", "x", option, value])
        except SystemExit as exc:
            assert exc.code == EXIT_USAGE
            assert len(err.getvalue().splitlines()) == 1
            return
    SamplingParams(  # raises on any value the engine would refuse
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )


def test_train_argument_errors(tmp_path: Path, capsys) -> None:
    from relayc.tools.train.cli import parse_args

    for argv, message in [
        (["--out", str(tmp_path), "--threads", "0"], "must be between 1 and 4096"),
        (["--out", str(tmp_path), "--measure-only"], "needs"),
        (["--out", str(tmp_path), "--steps-target", "0"], "must be at least 1"),
    ]:
        with pytest.raises(SystemExit) as info:
            parse_args(argv)
        assert info.value.code == EXIT_USAGE
        (line,) = capsys.readouterr().err.splitlines()
        assert message in line


TERMINAL_ESCAPES = "\x1b]0;owned\x07 \x1b[2J \r \x9b31m \u202eevil"


def test_explain_prints_spec_text_escaped(tmp_path: Path, capsys) -> None:
    """A spec's description (and a step's doc) must not retitle or clear the terminal."""
    from relayc.specs.loader import BUNDLED_DIR

    text = (BUNDLED_DIR / "none.yaml").read_text()
    escaped = '"\\e]0;owned\\a \\e[2J \\r \\x9b31m \\u202eevil"'  # YAML's own escapes
    text = text.replace("description: Plain autoregressive", f"description: {escaped}\n# ")
    text = text.replace("  doc: Target forward", f"  doc: {escaped}\n  # ")
    shutil.copy(BUNDLED_DIR / "common.yaml", tmp_path / "common.yaml")
    (tmp_path / "spec.yaml").write_text(text)
    assert main(["explain", str(tmp_path / "spec.yaml")]) == EXIT_OK
    out = capsys.readouterr().out
    for raw in ("\x1b", "\x07", "\r", "\x9b", "\u202e"):
        assert raw not in out
    shown = "\\x1b]0;owned\\x07 \\x1b[2J \\r \\x9b31m \\u202eevil"
    assert out.count(shown) == 2, out  # the description and the step's doc


def test_printable_keeps_text_and_layout() -> None:
    from relayc.tools.terminal import printable

    text = "déjà vu\tdef f():\n    return '中文 🙂 ∑'\u00a0 \u200d"
    assert printable(text) == text
    assert printable(TERMINAL_ESCAPES) == "\\x1b]0;owned\\x07 \\x1b[2J \\r \\x9b31m \\u202eevil"
    assert printable("\x00\x7f\ud800\u2066") == "\\x00\\x7f\\ud800\\u2066"


def test_an_algorithm_without_a_drafter_names_what_runs(capsys, no_model_loads: None) -> None:
    from relayc.engine.algorithms.registry import drafter_free, shipping_for

    for algorithm in ("eagle", "eagle_multilayer", "standalone"):
        assert main(["generate", "--chat", "hi", "--algorithm", algorithm]) == EXIT_USAGE
        line = _one_line(capsys, "generate")
        runs = ", ".join(f"`{a}`" for a in (*drafter_free(), *shipping_for("smollm2")))
        assert f"with it run {runs}, or bring a trained `{algorithm}` drafter" in line
        assert line.endswith("with --draft-model DIR")


def test_help_lists_per_model_what_runs(capsys) -> None:
    assert main(["generate", "--help"]) == EXIT_OK
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert "with smollm2 (the default): none, ngram, suffix, eagle3, dflash;" in text
    assert (
        "with --toy: none, ngram, suffix, eagle, eagle3, eagle_multilayer, standalone, dflash;"
        in text
    )


def test_the_command_line_offers_what_the_registry_lists(capsys) -> None:
    from relayc.engine.algorithms import algorithms

    assert main(["generate", "--help"]) == EXIT_OK
    text = " ".join(capsys.readouterr().out.split())
    for algorithm in algorithms():
        assert (algorithm.name in text) == algorithm.runs_in_engine, algorithm.name


def test_an_engine_argument_error_is_one_line_and_any_other_a_bug(
    monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """`relayc generate` used to turn every ValueError, RuntimeError and OSError out of the
    engine into a usage line: a bug in relayc read as the user's mistake, with no traceback."""
    from relayc.engine.serving import engine
    from relayc.engine.serving.engine_args import EngineArgumentError

    raised: list[Exception] = []

    def fail(*args: object, **kwargs: object) -> None:
        raise raised[-1]

    monkeypatch.setattr(engine.Engine, "__init__", fail)
    argv = ["generate", "--model", "random", "--prompt", "hi"]
    raised.append(EngineArgumentError("`kv_pool_tokens` must be a positive integer; got 0"))
    assert main(argv) == EXIT_USAGE
    assert _one_line(capsys, "generate").endswith("must be a positive integer; got 0")
    for bug in (ValueError("shape mismatch"), RuntimeError("CUDA error"), OSError(5, "EIO")):
        raised.append(bug)
        assert main(argv) == EXIT_BUG
        err = capsys.readouterr().err
        assert err.startswith("Traceback (most recent call last):")
        assert str(bug) in err
        last = err.splitlines()[-1]
        assert last.startswith("relayc generate: internal error: this is a bug in relayc ")
        assert "please report it" in last


def test_control_characters_in_messages_are_escaped(tmp_path: Path, capsys) -> None:
    assert main(["validate", str(tmp_path / "a\x1eb\nc.yaml")]) == EXIT_USAGE
    assert "a\\x1eb\\nc.yaml" in _one_line(capsys, "validate")
    (tmp_path / "spec.yaml").write_text('algorithm: x\n"a\\x1eb": 1\n')
    assert main(["validate", str(tmp_path / "spec.yaml")]) == 1
    err = capsys.readouterr().err
    assert "unknown key `a\\x1eb`" in err and len(err.splitlines()) == err.count("\n")


def test_ops_option_takes_module_names_only(capsys) -> None:
    assert main(["validate", "--ops", "my-ops.py", "spec.yaml"]) == EXIT_USAGE
    assert "is not a Python module name" in _one_line(capsys, "validate")


_ARG_POOL = [
    "spec.yaml",
    "common.yaml",
    "lib.yaml",
    "broken.yaml",
    "missing.yaml",
    "a_file",
    "folder",
    "-o",
    "--output",
    "out",
    "folder/out.txt",
    "missing/out",
    "--ops=nope_mod",
    "--ops=ops",
    "--target",
    "sglang",
    "relayc",
    "--format",
    "svg",
    "dot",
    "-q",
    "--quiet",
    "",
    "-",
    "--",
]


@given(
    command=st.sampled_from(["validate", "explain", "compile", "schema", "graph"]),
    rest=st.lists(
        st.one_of(st.sampled_from(_ARG_POOL), st.text(max_size=6).map(lambda t: "x/" + t)),
        max_size=6,
    ),
)
@settings(max_examples=80, deadline=None)
def test_spec_commands_never_raise(command: str, rest: list[str]) -> None:
    """Any argument list: an exit code, never an exception out of `main`."""
    import contextlib
    import io
    import os
    import tempfile

    from relayc.specs.loader import BUNDLED_DIR

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shutil.copy(BUNDLED_DIR / "none.yaml", folder / "spec.yaml")
        shutil.copy(BUNDLED_DIR / "common.yaml", folder / "common.yaml")
        (folder / "lib.yaml").write_text("library: lib\n")
        (folder / "broken.yaml").write_text("algorithm: [\n")
        (folder / "a_file").write_text("")
        (folder / "folder").mkdir()
        (folder / "ops.py").write_text("")
        cwd = os.getcwd()
        os.chdir(folder)
        try:
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main([command, *rest])
        finally:
            os.chdir(cwd)
    assert code in (0, 1, 2)
    assert "Traceback" not in err.getvalue()
    if code == EXIT_USAGE:
        assert len(err.getvalue().splitlines()) == 1, err.getvalue()


# -- Ctrl-C: one line, exit 130 ----------------------------------------------------------


def _main_under_ctrl_c(argv: list[str]) -> int:
    try:
        return main(argv)
    except KeyboardInterrupt:  # would end the test session rather than fail one test
        pytest.fail("KeyboardInterrupt escaped main: the user sees a traceback")


def _interrupted(capsys: pytest.CaptureFixture[str], command: str) -> str:
    """The command's stdout, after checking stderr ends in the one-line interrupt notice."""
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert err.splitlines()[-2:] == ["", f"relayc {command}: interrupted"], err
    return out


def test_ctrl_c_in_generate_ends_the_line_and_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from relayc.engine.serving.engine import Engine

    real_stream, real_close = Engine.stream, Engine.close
    closed: list[Engine] = []

    def stream(self: Engine, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        with closing(real_stream(self, *args, **kwargs)) as deltas:  # type: ignore[arg-type]
            yield next(deltas)
            raise KeyboardInterrupt  # Ctrl-C while the next tokens are computed

    def close(self: Engine) -> None:
        real_close(self)
        closed.append(self)

    monkeypatch.setattr(Engine, "stream", stream)
    monkeypatch.setattr(Engine, "close", close)
    argv = ["generate", "--model", "random", "--prompt", "def", "--max-new-tokens", "20"]
    assert _main_under_ctrl_c(argv) == EXIT_INTERRUPTED
    out = _interrupted(capsys, "generate")
    assert out.endswith("\n") and out.count("\n") == 1  # the streamed text's line is ended
    assert len(closed) == 1  # the engine was shut down, its worker thread with it


def test_ctrl_c_in_demo_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from relayc.compiler import writer
    from relayc.tools import demo

    def measure(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(writer, "regenerate_bundled", list)  # leave relayc/generated alone
    monkeypatch.setattr(demo, "measure", measure)
    argv = ["demo", "--no-peers", "--chart", str(tmp_path / "chart.png")]
    assert _main_under_ctrl_c(argv) == EXIT_INTERRUPTED
    _interrupted(capsys, "demo")


def test_an_ops_module_interrupted_while_importing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _none_spec(tmp_path, "algorithm: none", "algorithm: none")
    (tmp_path / "slow_ops_h4.py").write_text("raise KeyboardInterrupt  # Ctrl-C mid-import\n")
    assert _main_under_ctrl_c(["validate", "--ops", "slow_ops_h4", str(spec)]) == EXIT_INTERRUPTED
    _interrupted(capsys, "validate")


_SLOW_GENERATE = """
import signal, sys, time
# A shell's background job inherits SIGINT ignored; a terminal's Ctrl-C is what is tested.
signal.signal(signal.SIGINT, signal.default_int_handler)
from relayc.engine.serving.engine import Engine
real = Engine.stream
def stream(self, *args, **kwargs):
    for delta in real(self, *args, **kwargs):
        yield delta
        print("streaming", file=sys.stderr, flush=True)
        time.sleep(60)
Engine.stream = stream
from relayc.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigint_during_generate_prints_no_traceback() -> None:
    import signal

    argv = ["generate", "--model", "random", "--prompt", "hi", "--max-new-tokens", "8"]
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_GENERATE, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline() == "streaming\n"  # the engine is up and streaming
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert err.splitlines() == ["", "relayc generate: interrupted"]
    assert out.endswith("\n")


# -- compile --bundled -o DIR ------------------------------------------------------------


@pytest.mark.parametrize("target", ["relayc", "sglang"])
def test_compile_bundled_honours_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, target: str
) -> None:
    from relayc.compiler import writer
    from relayc.compiler.writer import engine_specs

    def refuse() -> None:
        raise AssertionError("--bundled -o DIR rewrote relayc's own generated modules")

    monkeypatch.setattr(writer, "regenerate_bundled", refuse)
    out = tmp_path / "vendored"
    assert main(["compile", "--bundled", "-o", str(out), "--target", target]) == EXIT_OK
    expected = (
        {"overlap_utils.py", "relayc_relay_runtime.py"}
        if target == "sglang"
        else {f"{p.stem}.py" for p in engine_specs()}  # one per algorithm the engine runs
    )
    assert {p.name for p in out.iterdir()} == expected
    assert capsys.readouterr().out.count(f"wrote {out}/") == len(expected)


def test_compile_bundled_with_spec_files_is_refused(tmp_path: Path, capsys) -> None:
    spec = _none_spec(tmp_path, "algorithm: none", "algorithm: none")
    assert main(["compile", "--bundled", str(spec), "-o", str(tmp_path / "out")]) == EXIT_USAGE
    assert "not both" in _one_line(capsys, "compile")
    assert not (tmp_path / "out").exists()
