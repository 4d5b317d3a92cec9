"""User ops: a module registering ops with `relayc.nodes.register`, named by a spec's `ops:`
or the CLI's `--ops`, imported before the op checks, and visible to that spec only."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from relayc.cli import EXIT_OK, EXIT_SPEC_ERRORS, main
from relayc.nodes import Op, OpRegistrationError, TensorType, get_op, register
from relayc.specs.loader import BUNDLED_DIR

OPS_MODULE = """\
from relayc.nodes import Op, TensorType, register

SCALE = register(
    Op(
        "scale_logits",
        {"logits": TensorType("float32", ("vocab",))},
        {"scaled": TensorType("float32", ("vocab",))},
        doc="divide the logits by a temperature",
    )
)
"""

# The bundled `none` spec with a user op between the target forward and the sampler.
SCALE_STEP = """\
  - name: scale
    op: scale_logits
    reads: {logits: decode.logits}
    writes: [scaled]
  - name: sample
    op: sample
    doc: Greedy or sampled next token per request.
    reads: {logits: scale.scaled}
"""


def _spec_text(ops_key: str | None = "ops: [ops]\n") -> str:
    text = (BUNDLED_DIR / "none.yaml").read_text()
    text = text.replace(
        "  - name: sample\n    op: sample\n    doc: Greedy or sampled next token per request.\n"
        "    reads: {logits: decode.logits}\n",
        SCALE_STEP,
    )
    assert "scale_logits" in text
    if ops_key:
        text = text.replace("imports:\n", ops_key + "\nimports:\n", 1)
    return text


def _folder(tmp_path: Path, *, ops: str = OPS_MODULE, ops_key: str | None = "ops: [ops]\n") -> Path:
    shutil.copy(BUNDLED_DIR / "common.yaml", tmp_path / "common.yaml")
    (tmp_path / "spec.yaml").write_text(_spec_text(ops_key))
    (tmp_path / "ops.py").write_text(ops)
    return tmp_path / "spec.yaml"


def _errors(capsys: pytest.CaptureFixture[str]) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line]


@pytest.mark.parametrize("command", ["validate", "explain", "compile", "graph"])
def test_ops_module_beside_the_spec(
    tmp_path: Path, command: str, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    spec = _folder(tmp_path)
    monkeypatch.chdir(tmp_path.parent)  # the spec's folder is importable, not only the cwd
    args = [command, str(spec)] + (["-o", str(tmp_path / "out")] if command == "compile" else [])
    assert main(args) == EXIT_OK, capsys.readouterr().err
    if command == "compile":
        generated = (tmp_path / "out" / "none.py").read_text()
        assert "scale_logits" in generated
    if command == "explain":
        assert "user ops from: ops\n" in capsys.readouterr().out


def test_ops_option_names_the_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    spec = _folder(tmp_path, ops_key=None)
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "spec.yaml"]) == EXIT_SPEC_ERRORS
    assert "unknown op `scale_logits`" in "\n".join(_errors(capsys))
    assert main(["validate", "--ops", "ops", str(spec)]) == EXIT_OK


def test_user_ops_do_not_leak_into_other_specs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with_ops = _folder(tmp_path / "a")
    without = _folder(tmp_path / "b", ops_key=None)
    monkeypatch.chdir(tmp_path)
    # In one process, after the first spec imported its ops, the second still may not name them.
    assert main(["validate", str(with_ops), str(without)]) == EXIT_SPEC_ERRORS
    errors = _errors(capsys)
    assert len(errors) == 1 and "b/spec.yaml" in errors[0] and "unknown op" in errors[0]


def test_each_folder_gets_its_own_ops_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Two specs in two folders, each with its own `ops.py`: the second is not handed the
    first one's module (cached in sys.modules under the same name)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    good = _folder(tmp_path / "a")
    broken = _folder(
        tmp_path / "b",
        ops=OPS_MODULE.replace('{"logits": TensorType("float32", ("vocab",))}', "{}", 1),
    )
    monkeypatch.chdir(tmp_path)
    assert main(["validate", str(good)]) == EXIT_OK
    assert main(["validate", "-q", str(broken)]) == EXIT_SPEC_ERRORS
    assert "op `scale_logits` has no parameter `logits`" in "\n".join(_errors(capsys))
    assert main(["validate", str(good)]) == EXIT_OK
    # A third folder with no ops.py is not handed the module of the first.
    (tmp_path / "c").mkdir()
    lonely = _folder(tmp_path / "c")
    (tmp_path / "c" / "ops.py").unlink()
    assert main(["validate", str(lonely)]) == EXIT_SPEC_ERRORS
    assert "no module named `ops`" in "\n".join(_errors(capsys))


def test_import_failure_is_located_at_the_ops_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    _folder(tmp_path, ops="import does_not_exist_anywhere\n")
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "spec.yaml"]) == EXIT_SPEC_ERRORS
    (error,) = _errors(capsys)
    line = _spec_text().splitlines().index("ops: [ops]") + 1
    assert error.startswith(f"spec.yaml:{line}:7: error: cannot import ops module `ops`: ")
    assert "does_not_exist_anywhere" in error


def test_syntax_error_names_the_line(tmp_path: Path, monkeypatch, capsys) -> None:
    _folder(tmp_path, ops=OPS_MODULE + "def broken(:\n")
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "spec.yaml"]) == EXIT_SPEC_ERRORS
    (error,) = _errors(capsys)
    assert "cannot import ops module `ops`: SyntaxError: " in error
    assert f"ops.py:{OPS_MODULE.count(chr(10)) + 1})" in error


def test_missing_module_and_raising_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    _folder(tmp_path, ops="raise RuntimeError('half-written module')\n", ops_key="ops: [ops, nope]")
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "spec.yaml"]) == EXIT_SPEC_ERRORS
    first, second = _errors(capsys)
    assert ":7: error: cannot import ops module `ops`: RuntimeError: half-written module" in first
    assert "ops.py:1)" in first  # the line of the user's module that raised
    assert ":12: error: cannot import ops module `nope`: no module named `nope`" in second


def test_module_beside_the_spec_cannot_shadow_a_loaded_one(tmp_path: Path, monkeypatch, capsys):
    _folder(tmp_path, ops_key="ops: [json]")
    (tmp_path / "json.py").write_text(OPS_MODULE)
    monkeypatch.chdir(tmp_path)
    import json

    assert main(["validate", "spec.yaml"]) == EXIT_SPEC_ERRORS
    (error,) = _errors(capsys)
    assert "cannot import ops module `json`: `json` is already imported from " in error
    assert "rename json.py" in error
    import sys

    assert sys.modules["json"] is json


def test_module_calling_exit_is_reported(tmp_path: Path, monkeypatch, capsys) -> None:
    _folder(tmp_path, ops="import sys\nsys.exit(3)\n")
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "spec.yaml"]) == EXIT_SPEC_ERRORS
    (error,) = _errors(capsys)
    assert "cannot import ops module `ops`: SystemExit: 3 (at " in error


def test_clash_with_a_builtin_op_is_located(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    clash = OPS_MODULE + "register(Op('sample', {}, {}))\n"
    _folder(tmp_path, ops=clash)
    monkeypatch.chdir(tmp_path)
    assert main(["compile", "spec.yaml", "-o", "out"]) == EXIT_SPEC_ERRORS
    (error,) = _errors(capsys)
    assert ":7: error: cannot import ops module `ops`: op `sample` clashes with the built-in" in (
        error
    )
    assert not (tmp_path / "out").exists()


def test_two_modules_registering_one_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    _folder(tmp_path, ops_key="ops: [ops, ops_twin]")
    (tmp_path / "ops_twin.py").write_text(OPS_MODULE)
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "spec.yaml"]) == EXIT_SPEC_ERRORS
    (error,) = _errors(capsys)
    assert "`ops_twin` registers op `scale_logits`, which `ops` registers too" in error


def test_two_modules_registering_one_op_object(tmp_path: Path, monkeypatch, capsys) -> None:
    """A module re-registering another's op (the same object) is not a clash."""
    _folder(tmp_path, ops_key="ops: [ops, ops_again]")
    (tmp_path / "ops_again.py").write_text(
        "import ops\nfrom relayc.nodes import register\nregister(ops.SCALE)\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "spec.yaml"]) == EXIT_OK, capsys.readouterr().err


def test_op_needing_an_undeclared_dim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Was `KeyError: 'mystery'` from compile; validate said ok."""
    ops = OPS_MODULE.replace(
        '{"scaled": TensorType("float32", ("vocab",))}',
        (
            '{"scaled": TensorType("float32", ("vocab",)), '
            '"extra": TensorType("int64", ("mystery*2",))}'
        ),
    )
    _folder(tmp_path, ops=ops)
    monkeypatch.chdir(tmp_path)
    for command in (["validate"], ["compile", "-o", "out"], ["graph"]):
        assert main([*command, "spec.yaml"]) == EXIT_SPEC_ERRORS
        (error,) = _errors(capsys)
        assert "op `scale_logits` of step `scale` sizes its tensors with dim `mystery` " in error
        assert "declare `mystery` under `dims:`" in error


def test_register_is_idempotent_and_refuses_builtin_names() -> None:
    op = Op("speccli_test_op", {}, {"x": TensorType("int64")})
    assert register(op, module="tests.fake_ops") is op
    assert register(op, module="tests.fake_ops") is op
    assert get_op("speccli_test_op") is None  # visible only to specs naming the module
    assert get_op("speccli_test_op", ["tests.fake_ops"]) is op
    with pytest.raises(OpRegistrationError, match="clashes with the built-in op"):
        register(Op("sample", {}, {}))
    builtin = get_op("sample")
    assert builtin is not None and register(builtin) is builtin


@pytest.mark.parametrize(
    "shape, message",
    [
        (("vocab**2",), "only dim names, whole numbers"),
        (("vocab +",), "not a dim expression"),
        ((0,), "not a positive size"),
        ((1.5,), "neither a size"),
    ],
)
def test_tensor_type_rejects_bad_shapes(shape: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TensorType("float32", shape)


def test_ops_entry_must_be_a_module_name(tmp_path: Path, monkeypatch, capsys) -> None:
    _folder(tmp_path, ops_key="ops: [my-ops, ops]")
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "spec.yaml"]) == EXIT_SPEC_ERRORS
    (error,) = _errors(capsys)
    assert "`my-ops` is not a Python module name" in error


def test_public_api_documented() -> None:
    import relayc.nodes

    assert {"Op", "TensorType", "register"} <= set(relayc.nodes.__all__)
    assert "register(Op(" in (relayc.nodes.__doc__ or "")
