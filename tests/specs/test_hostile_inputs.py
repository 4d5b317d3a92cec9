"""Hostile spec inputs (issue 45): imports and spec files read only from regular files of
bounded size (a FIFO must not hang, /dev/zero must not be read forever), YAML indentation
mistakes name the line that is likely wrong, and an algorithm named like an importable
module (whose generated file would shadow it) is refused -- each a located SpecError."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from relayc.cli import EXIT_SPEC_ERRORS, main
from relayc.specs.errors import SpecErrors
from relayc.specs.loader import MAX_SPEC_BYTES, load_spec, load_spec_text

TINY = (Path(__file__).parent / "data" / "tiny.yaml").read_text(encoding="utf-8")


def _errors(text: str, base_dir: Path | None = None) -> list[str]:
    with pytest.raises(SpecErrors) as info:
        load_spec_text(text, "spec.yaml", base_dir=base_dir)
    return [e.render() for e in info.value.errors]


def _importing(target: str) -> str:
    return TINY.replace(
        "algorithm: tiny", f"algorithm: tiny\nimports: [{{file: {target}, fields: [x]}}]"
    )


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_importing_a_device_is_refused_without_reading_it() -> None:
    (error,) = _errors(_importing("/dev/zero"))
    assert error.startswith("spec.yaml:2:18: error: cannot import `/dev/zero`: not a regular")


def test_importing_a_fifo_does_not_wait_for_a_writer(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "lib.yaml")
    (tmp_path / "spec.yaml").write_text(_importing("lib.yaml"), encoding="utf-8")
    # in a subprocess: a loader that opens the FIFO blocking would hang this test run
    script = textwrap.dedent(
        f"""
        from relayc.specs.errors import SpecErrors
        from relayc.specs.loader import load_spec
        try:
            load_spec({str(tmp_path / "spec.yaml")!r})
        except SpecErrors as exc:
            print(exc.render())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "cannot import `lib.yaml`: not a regular file" in done.stdout


def test_a_spec_file_past_the_size_limit_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "lib.yaml"
    big.write_text("library: big\n" + "#" * MAX_SPEC_BYTES + "\n", encoding="utf-8")
    (error,) = _errors(_importing("lib.yaml"), base_dir=tmp_path)
    assert f"cannot import `lib.yaml`: larger than {MAX_SPEC_BYTES} bytes" in error
    with pytest.raises(SpecErrors, match=f"larger than {MAX_SPEC_BYTES} bytes"):
        load_spec(big)


def test_a_spec_path_that_is_a_directory_or_device(tmp_path: Path) -> None:
    with pytest.raises(SpecErrors, match="not a regular file"):
        load_spec(tmp_path)  # one message for each kind: not "Is a directory" from open
    if Path("/dev/zero").exists():
        with pytest.raises(SpecErrors, match="not a regular file"):
            load_spec("/dev/zero")


@pytest.mark.parametrize(
    ("text", "where", "hint"),
    [
        (  # a key without its colon: PyYAML stops on the next line
            "algorithm: x\ndims\n  a: 1\n",
            "spec.yaml:2:1:",
            "line 2 is likely wrong: add the `:` after its key, or check its indentation",
        ),
        (
            "algorithm: x\nfields:\n  foo:\n    dtype: f32\n     shape: [a]\n",
            "spec.yaml:5:11:",
            "line 5 is likely wrong: it is indented deeper than line 4",
        ),
        (
            "algorithm: x\nsteps:\n  - name: a\n  op: b\n",
            "spec.yaml:4:3:",
            "line 4 is likely wrong: its indentation does not line up with the entries of "
            "the block that starts at line 3",
        ),
        (  # comments and blank lines between: the line above is the last with content
            "algorithm: x\nfields:\n  foo:\n    dtype: f32\n\n    # note\n      shape: [a]\n",
            "spec.yaml:7:7:",
            "line 7 is likely wrong: its indentation does not line up",
        ),
        ("algorithm: x\ndescription: a: b\n", "spec.yaml:2:15:", "must be quoted"),
    ],
)
def test_indentation_mistakes_name_the_likely_line(text: str, where: str, hint: str) -> None:
    (error,) = _errors(text)
    assert error.startswith(where), error
    assert hint in error


@pytest.mark.parametrize("name", ["torch", "json", "numpy", "relayc", "yaml"])
def test_an_algorithm_named_like_a_module_is_refused(name: str) -> None:
    errors = _errors(TINY.replace("algorithm: tiny", f"algorithm: {name}"))
    assert (
        f"spec.yaml:1:12: error: algorithm `{name}` is named like an importable module"
        in (errors[0])
    )
    assert f"`{name}.py` would shadow" in errors[0]


def test_the_command_line_refuses_it_with_the_spec_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "torch.yaml"
    spec.write_text(TINY.replace("algorithm: tiny", "algorithm: torch"), encoding="utf-8")
    assert main(["compile", str(spec), "-o", str(tmp_path / "out")]) == EXIT_SPEC_ERRORS
    assert "algorithm `torch` is named like an importable module" in capsys.readouterr().err
    assert not (tmp_path / "out" / "torch.py").exists()


@pytest.mark.parametrize(
    ("rule", "col", "says"),
    [
        # `rules: [` then the quote: the rule's text starts at column 10
        ("\"__import__('os').system('touch pwned') == 0\"", 20, "unexpected `(`"),
        ("'topk.__class__ == 1'", 14, "unexpected `.`"),
        ("'(' * 5000", 210, "too long"),  # pointed at where the 200 characters end
        ("\"topk == 1 or __import__('os')\"", 20, "only `and`"),
    ],
)
def test_hostile_rules_are_located_errors_and_never_run(
    rule: str, col: int, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rule is parsed by relayc's own tiny grammar: text Python would run is a located
    error, and nothing of it runs (no file appears)."""
    monkeypatch.chdir(tmp_path)
    text = rule if not rule.startswith("'(' *") else "'" + "(" * 5000 + "topk" + "'"
    (error,) = _errors(TINY + f"rules: [{text}]\n")
    line = len(TINY.splitlines()) + 1
    assert error.startswith(f"spec.yaml:{line}:{col}: error: rule `"), error
    assert says in error
    assert not (tmp_path / "pwned").exists()


def test_too_many_rules_are_refused() -> None:
    rules = "".join(f"  - topk >= {i % 2}\n" for i in range(200))
    (error,) = _errors(TINY + "rules:\n" + rules)
    assert "200 rules; a spec holds at most 64" in error
