"""Resource limits and strict values in the loader: alias bombs, huge sizes, bad bytes and
values YAML types one way that must not be coerced into another. Each gives located
errors, never a traceback (or minutes and gigabytes)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayc.cli import EXIT_SPEC_ERRORS, main
from relayc.compiler.writer import compile_spec
from relayc.specs.errors import SpecErrors
from relayc.specs.loader import load_spec_text
from relayc.specs.yamlsrc import MAX_EXPANDED_VALUES

DATA = Path(__file__).parent / "data"


def _laughs(levels: int, fanout: int = 10) -> str:
    lines = [f"a0: &a0 [{', '.join(['lol'] * fanout)}]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fanout)}]")
    return "\n".join(lines) + "\n"


def _located(text: str) -> list[str]:
    with pytest.raises(SpecErrors) as info:
        load_spec_text(text, "spec.yaml")
    return [e.render() for e in info.value.errors]


def test_billion_laughs_is_refused_in_a_subprocess_with_a_memory_cap() -> None:
    """The issue's 363-byte file (a0..a6) took 46 s and 3.6 GB; one level more exhausted
    memory. Under a 1 GB address-space cap the loader must answer with a located error."""
    text = _laughs(8)
    assert len(text) < 600
    script = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from relayc.specs.errors import SpecErrors\n"
        "from relayc.specs.loader import load_spec_text\n"
        "try:\n"
        "    load_spec_text(sys.stdin.read(), 'laughs.yaml')\n"
        "except SpecErrors as exc:\n"
        "    print(exc.render())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], input=text, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = done.stdout.splitlines()
    # The smallest anchor that is too large on its own: a4 has 11111 * 10 + 1 values.
    assert line.startswith("laughs.yaml:5:5: error: this value expands to more than")


@given(levels=st.integers(0, 12), fanout=st.integers(1, 12))
@settings(max_examples=40, deadline=None)
def test_alias_expansion_bounded(levels: int, fanout: int) -> None:
    text = _laughs(levels, fanout)
    anchor = 1 + fanout  # a0: the list and its scalars
    expanded = 1 + 1 + anchor  # the document mapping, key `a0`, its value
    for _ in range(levels):
        anchor = 1 + fanout * anchor
        expanded += 1 + anchor
    errors = _located(text)  # never a valid spec: it has no `algorithm:`
    too_large = [e for e in errors if "expands to more than" in e]
    assert bool(too_large) == (expanded > MAX_EXPANDED_VALUES)
    for error in errors:
        assert error.startswith("spec.yaml:")


def test_merge_key_bomb_is_refused() -> None:
    lines = ["m0: &m0 {a: 1, b: 2, c: 3, d: 4, e: 5, f: 6, g: 7, h: 8, i: 9, j: 10}"]
    for i in range(1, 9):
        lines.append(f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 10)}]}}")
    errors = _located("\n".join(lines) + "\n")
    assert any("expands to more than" in e for e in errors)


@pytest.mark.parametrize(
    "data, where, message",
    [
        (b"algorithm: x\ndescription: caf\xe9\n", "spec.yaml:2:17:", "byte 0xe9 is not UTF-8"),
        (b"algorithm: x\n\xff\n", "spec.yaml:2:1:", "byte 0xff is not UTF-8"),
        (b"algorithm: x\ndescription: a\x00b\n", "spec.yaml:2:15:", "character U+0000"),
        (b"algorithm: x\n  \x07", "spec.yaml:2:3:", "character U+0007"),
    ],
)
def test_bad_bytes_are_located(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, data: bytes, where: str, message: str
) -> None:
    (tmp_path / "spec.yaml").write_bytes(data)
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "spec.yaml"]) == EXIT_SPEC_ERRORS
    (error,) = capsys.readouterr().err.splitlines()
    assert error.startswith(where) and message in error


@given(
    prefix=st.text(
        st.characters(codec="utf-8", exclude_characters="\r\x85\u2028\u2029"), max_size=30
    ),
    bad=st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80"]),
)
@settings(max_examples=60, deadline=None)
def test_undecodable_byte_located_anywhere(prefix: str, bad: bytes) -> None:
    from relayc.specs.yamlsrc import decode_spec_bytes

    data = prefix.encode("utf-8") + bad + b"\n"
    with pytest.raises(SpecErrors) as info:
        decode_spec_bytes(data, "spec.yaml")
    (error,) = info.value.errors
    assert error.loc.line == prefix.count("\n") + 1
    assert error.loc.col == len(prefix.rpartition("\n")[2].encode("utf-8")) + 1


# -- values: strict types and bounds on the tiny spec ------------------------------------

TINY = (DATA / "tiny.yaml").read_text()


def _tiny_errors(tmp_path: Path, old: str, new: str, capsys) -> list[str]:
    assert old in TINY
    for name in ("shared.yaml", "tiny_ops.py"):
        shutil.copy(DATA / name, tmp_path / name)
    (tmp_path / "spec.yaml").write_text(TINY.replace(old, new, 1))
    assert main(["compile", str(tmp_path / "spec.yaml"), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line]


@pytest.mark.parametrize(
    "old, new, message",
    [
        (
            "{default: 2}",
            "{default: true}",
            "`default` of dim `topk` must be an integer, got `true`",
        ),
        ("{default: 2}", '{default: "16"}', "must be an integer, got the string `16`"),
        ("{default: 2}", "{default: 2.0}", "must be an integer"),
        ("{default: 2}", "{default: 10000000000000000000000000000000}", "must be at most"),
        ("shape: [topk]", "shape: [1000000000000000000000000000000]", "too large"),
        ("max_batch_size: 4", 'max_batch_size: "4"', "must be an integer"),
        ("batch_sizes: [1, 2]", "batch_sizes: [true, 2]", "must be an integer"),
        (
            "{dtype: int64, doc: next token}",
            "{dtype: int64, doc: next token, host_mirror: 1}",
            "must be `true` or `false`",
        ),
        ("algorithm: tiny", "algorithm: " + "a" * 300, "a name of 300 characters is too long"),
        ("algorithm: tiny", "version: true\nalgorithm: tiny", "`version`: expected a number"),
        (
            "{dtype: int64, doc: next token}",
            "{dtype: int64, doc: next token, poison: true}",
            "`poison` value true of field `bonus_tokens` does not fit dtype `int64`",
        ),
        (
            "{dtype: float32, shape: [topk], doc: top-k probabilities}",
            "{dtype: float32, shape: [topk], doc: top-k probabilities, init: false}",
            "`init` value false of field `topk_p` does not fit dtype `float32`",
        ),
        (
            "{dtype: float32, shape: [topk], doc: top-k probabilities}",
            "{dtype: float16, shape: [topk], doc: top-k probabilities, init: 1000000}",
            "does not fit dtype `float16`",
        ),
        (
            "{dtype: float32, shape: [topk], doc: top-k probabilities}",
            "{dtype: float32, shape: [topk], doc: top-k probabilities, poison: " + "9" * 400 + "}",
            "does not fit dtype `float32`",
        ),
    ],
)
def test_values_are_not_coerced(tmp_path: Path, capsys, old: str, new: str, message: str) -> None:
    errors = _tiny_errors(tmp_path, old, new, capsys)
    assert any(message in e for e in errors), errors
    for error in errors:  # located in the spec, line and column
        where = error.split(": error: ")[0]
        assert where.startswith(str(tmp_path / "spec.yaml") + ":"), error
        assert where.count(":") == 2, error


def test_row_too_large_for_a_tensor(tmp_path: Path, capsys) -> None:
    big = "2147483647"
    errors = _tiny_errors(
        tmp_path, "shape: [topk], doc: top-k", f"shape: [{big}, {big}, {big}], doc: top-k", capsys
    )
    assert any("has more elements per request than a tensor can index" in e for e in errors)


@given(size=st.integers(min_value=2**31, max_value=2**200))
@settings(max_examples=20, deadline=None)
def test_any_oversized_literal_is_located(size: int) -> None:
    text = TINY.replace("{default: 2}", f"{{default: {size}}}", 1)
    errors = _located(text)
    assert any(e.startswith("spec.yaml:3:") and "must be at most" in e for e in errors)


# -- a relay field's whole buffer: [pool, *row] bounded at compile time and in the relay ----
def _with_field(tmp_path: Path, declaration: str, *, dims: str = "", max_batch: int = 4) -> Path:
    """tiny.yaml with one more (exported) relay field, more dims and its largest batch."""
    text = TINY.replace("  topk: {default: 2}\n", f"  topk: {{default: 2}}\n{dims}", 1)
    text = text.replace("fields:\n", f"fields:\n  big: {declaration}\n", 1)
    text = text.replace("max_batch_size: 4", f"max_batch_size: {max_batch}", 1)
    for name in ("shared.yaml", "tiny_ops.py"):
        shutil.copy(DATA / name, tmp_path / name)
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path


def _big_at(path: Path) -> str:
    """`path:line:3`, where the field `big` is declared."""
    lines = path.read_text().splitlines()
    return f"{path}:{next(i for i, s in enumerate(lines, 1) if s.startswith('  big:'))}:3"


def _compile_errors(path: Path) -> list[str]:
    with pytest.raises(SpecErrors) as info:
        compile_spec(path, path.parent / "out")
    return [e.render() for e in info.value.errors]


def _field(dtype: str, shape: str) -> str:
    return f"{{dtype: {dtype}, shape: {shape}, export: true, doc: a large field}}"


def test_the_issues_field_is_located_at_compile_time(tmp_path: Path) -> None:
    """Each dim within 2**31 - 1, their product not: it compiled, then the relay failed in
    torch ("Storage size calculation overflowed") naming neither field nor spec."""
    path = _with_field(
        tmp_path, _field("float32", "[huge, huge]"), dims="  huge: {default: 2147483647}\n"
    )
    (error,) = _compile_errors(path)
    assert error == (
        f"{_big_at(path)}: error: relay field `big` (float32 [huge, huge]) needs a buffer of "
        "9.22e+19 bytes (2.31e+19 elements) for 5 request slots (capture.max_batch_size + 1), "
        "dims at their defaults (huge=2147483647): more than the 2**40 bytes (1 TiB) a relay "
        "buffer may take (use smaller sizes in its shape or smaller dim defaults)"
    )


@pytest.mark.parametrize(
    ("dtype", "shape", "max_batch", "refused"),
    [
        # 4 slots x 2**36 int32 elements: exactly 2**40 bytes, the limit
        ("int32", "[262144, 262144]", 3, False),
        ("int32", "[262144, 262145]", 3, True),
        ("int64", "[262144, 262144]", 3, True),  # bytes, not elements
        ("bool", "[262144, 262144]", 15, False),  # 16 slots of one byte
        ("int32", "[262144, 262144]", 4, True),  # one slot more
        ("model", "[262144, 262144]", 3, False),  # counted as float32
        ("model", "[262144, 262144, 2]", 3, True),
    ],
)
def test_the_bound_is_on_bytes_of_the_whole_buffer(
    tmp_path: Path, dtype: str, shape: str, max_batch: int, refused: bool
) -> None:
    path = _with_field(tmp_path, _field(dtype, shape), max_batch=max_batch)
    if refused:
        (error,) = _compile_errors(path)
        assert error.startswith(f"{_big_at(path)}: error: relay field `big`"), error
        assert "more than the 2**40 bytes (1 TiB)" in error
    else:
        assert compile_spec(path, tmp_path / "out")


def test_dims_the_engine_supplies_are_checked_when_bound(tmp_path: Path) -> None:
    """A dim with no default (the model's vocabulary) counts as 1 at compile time; the
    relay checks the real size before it allocates anything, naming field and spec."""
    path = _with_field(
        tmp_path,
        _field("float32", "[vocab, vocab]"),
        dims="  vocab: {supplied_by: model config (vocab_size)}\n",
    )
    output = compile_spec(path, tmp_path / "out")
    output.path.parent.mkdir()
    output.path.write_text(output.text)
    module_spec = importlib.util.spec_from_file_location("tiny_big_relay", output.path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    relay = module.FutureMap(9, "cpu", dims={"vocab": 100})
    assert relay.buffers["big"].shape == (9, 100, 100)
    with pytest.raises(ValueError) as info:
        module.FutureMap(9, "cpu", dims={"vocab": 2**31 - 1})
    assert str(info.value) == (
        "relay field `big` of the `tiny` spec would need a buffer of [9, 2147483647, "
        "2147483647] float32: 4.15e+19 elements, 1.66e+20 bytes, more than the 2**40 bytes "
        "(1 TiB) a relay buffer may take (req_pool_size=9, vocab=2147483647); bind smaller "
        "dims or a smaller req_pool_size"
    )
    with pytest.raises(ValueError, match=r"field `big` .* \(req_pool_size=300000, vocab=1000\)"):
        module.FutureMap(300000, "cpu", dims={"vocab": 1000})  # 1.2e12 bytes: the pool counts
