"""Spec names and spec text never become generated code: clashes are located errors, text is data."""

from __future__ import annotations

import ast
import builtins
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from relayc.compiler.writer import GENERATED_DIR, compile_spec, compile_specs, engine_specs
from relayc.specs.errors import SpecErrors
from relayc.specs.loader import BUNDLED_DIR, load_spec_text
from relayc.specs.reserved import GENERATED_NAMES

NONE_SPEC = (BUNDLED_DIR / "none.yaml").read_text()


def errors_of(text: str) -> list[str]:
    with pytest.raises(SpecErrors) as info:
        load_spec_text(text, "spec.yaml", base_dir=BUNDLED_DIR)
    return [e.render() for e in info.value.errors]


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "  - name: decode\n",
            "  - name: self\n",
            "spec.yaml:20:11: error: step name `self` is used by the generated module itself",
        ),
        (
            "  - name: decode\n",
            "  - name: RelayPayload\n",
            "spec.yaml:20:11: error: step name `RelayPayload` is used by the generated module",
        ),
        (
            "  - name: decode\n",
            "  - name: req_pool_indices\n",
            "spec.yaml:20:11: error: step `req_pool_indices` has the name of an engine input",
        ),
        (
            "algorithm: none\n",
            "algorithm: __init__\n",
            "spec.yaml:4:12: error: algorithm name `__init__` starts with `__`",
        ),
        (
            "prefill:\n",
            "inputs:\n  host: {dtype: int64}\nprefill:\n",
            "spec.yaml:12:3: error: input name `host` is used by the generated module itself",
        ),
        (
            "prefill:\n",
            "fields:\n  __secret: {dtype: int64, doc: x, export: true}\nprefill:\n",
            "spec.yaml:12:3: error: relay field name `__secret` starts with `__`",
        ),
    ],
)
def test_clashing_names_are_located_errors(old: str, new: str, expected: str) -> None:
    text = NONE_SPEC.replace(old, new, 1)
    assert text != NONE_SPEC
    rendered = errors_of(text)
    assert any(line.startswith(expected) for line in rendered), rendered


def _spec_with(tmp_path: Path, old: str, new: str, name: str = "spec.yaml") -> Path:
    text = NONE_SPEC.replace(old, new, 1)
    assert text != NONE_SPEC
    (tmp_path / "common.yaml").write_text((BUNDLED_DIR / "common.yaml").read_text())
    path = tmp_path / name
    path.write_text(text)
    return path


# The generated code's own names, as relay fields: the torch path's locals and the base
# class's attributes, the kernel's parameters and locals, module-level names.
FIELD_NAMES = [
    *("indices", "device", "self", "payload", "stash", "resolve", "debug", "rows"),
    *("buffers", "buffer", "value", "row", "slot", "valid", "pool_size", "TO_BUFFERS"),
    *("torch", "tl", "triton", "RelayPayload", "FutureMap", "_HAVE_TRITON", "_relay_copy_row"),
]
# YAML double-quoted: newlines, a line that would run at import, quotes, `\N{`, U+2028.
HOSTILE_DOC = 'line one\\nimport os; print(\'ran at import\')\\n\\"\\"\\" \\\\N{ \\u2028 end'
HOSTILE_FIELDS = "".join(
    f'  {name}: {{dtype: float32, init: .inf, poison: -.inf, export: true, doc: "{HOSTILE_DOC}"}}\n'
    for name in FIELD_NAMES
)


def test_hostile_text_and_field_names_compile_to_plain_data(tmp_path: Path) -> None:
    """Docs that would run as code, quotes and `\\N{`, fields named like the generated code's
    own names, non-finite fills: the module imports in a fresh interpreter, prints nothing,
    and every field round-trips on the torch path."""
    path = _spec_with(tmp_path, "prefill:\n", f"fields:\n{HOSTILE_FIELDS}prefill:\n")
    text = path.read_text().replace(
        "description: Plain autoregressive decoding with overlap scheduling.",
        f'description: "{HOSTILE_DOC}"',
    )
    path.write_text(text)
    output = compile_spec(path, tmp_path / "out")
    (tmp_path / "out").mkdir()
    output.path.write_text(output.text)
    script = f"""
import importlib.util, torch
spec = importlib.util.spec_from_file_location("m", {str(output.path)!r})
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
assert m.DESCRIPTION.startswith("line one\\nimport os"), m.DESCRIPTION
for backend in ("torch", "triton"):
    fmap = m.FutureMap(8, "cpu", backend=backend)
    assert fmap.resolve(torch.tensor([5])).self.tolist() == [float("inf")]
    names = {FIELD_NAMES!r}
    values = {{n: torch.randn(2) for n in names}}
    fmap.stash(torch.tensor([3, 6], dtype=torch.int32), m.RelayPayload(**values))
    got = fmap.resolve(torch.tensor([3, 6]))
    assert all(torch.equal(getattr(got, n), v) for n, v in values.items()), backend
print("ok")
"""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == "ok\n"


def test_two_specs_of_one_algorithm_in_one_compile(tmp_path: Path) -> None:
    first = _spec_with(tmp_path, "Plain", "First plain", "a.yaml")
    second = _spec_with(tmp_path, "Plain", "Second plain", "b.yaml")
    with pytest.raises(SpecErrors) as info:
        compile_specs([first, second], tmp_path / "out")
    assert "writes none.py, as" in info.value.render()


def _module_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


@pytest.mark.parametrize("algorithm", [p.stem for p in engine_specs()])
def test_reserved_names_cover_the_generated_namespace(algorithm: str) -> None:
    """Every public module-level name of a generated module, and every global its step
    methods read, is reserved: a step or input named like it would shadow it."""
    tree = ast.parse((GENERATED_DIR / f"{algorithm}.py").read_text())
    public = {n for n in _module_names(tree) if not n.startswith("_")}
    assert public <= GENERATED_NAMES, public - GENERATED_NAMES
    spec = importlib.import_module(f"relayc.generated.{algorithm}")
    user = {*spec.DIM_DEFAULTS, *(f.name for f in spec.FIELDS)}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        if cls.name not in ("PrefillStep", "DecodeStep"):
            continue
        for method in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            bound = {a.arg for a in (*method.args.args, *method.args.kwonlyargs)}
            assigned = {
                t.id
                for node in ast.walk(method)
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
                for t in [node]
            }
            loaded = {
                node.id
                for node in ast.walk(method)
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
            }
            read_globals = loaded - bound - assigned - set(dir(builtins)) - user
            assert read_globals <= GENERATED_NAMES, (method.name, read_globals)
    assert {"self", "ctx", "host", "relay"} <= GENERATED_NAMES


@pytest.mark.parametrize(
    ("edits", "held"),
    [
        # step `decode_logits` after step `decode`, whose output `logits` is `decode_logits`
        (
            [
                ("  - name: sample\n", "  - name: decode_logits\n"),
                ("next_tokens: sample.next_tokens", "next_tokens: decode_logits.next_tokens"),
                (
                    "    next_tokens: decode_logits",
                    "    logits: decode.logits\n    next_tokens: decode_logits",
                ),
            ],
            "decode",
        ),
        # the same with a short step name: `a` + `logits` is step `a_logits`
        (
            [
                ("  - name: decode\n", "  - name: a\n"),
                ("{logits: decode.logits}", "{logits: a.logits}"),
                ("  - name: sample\n", "  - name: a_logits\n"),
                ("next_tokens: sample.next_tokens", "next_tokens: a_logits.next_tokens"),
            ],
            "a",
        ),
    ],
)
def test_step_output_variables_never_spell_another_name(
    tmp_path: Path, edits: list[tuple[str, str]], held: str
) -> None:
    """`<step>_<output>` can spell another step's result variable or another output's: each
    variable of a generated step method is assigned once, and `logits` is read from the step
    that wrote it (before, a step `decode_logits` overwrote `decode.logits` with its own
    results, which DecodeOutputs then returned as the logits)."""
    text = NONE_SPEC
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    shutil.copy(BUNDLED_DIR / "common.yaml", tmp_path / "common.yaml")
    tree = ast.parse(compile_spec(path, tmp_path / "out").text)
    (decode,) = (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DecodeStep")
    (call,) = (n for n in decode.body if isinstance(n, ast.FunctionDef) and n.name == "run_device")
    stores = [
        n.id for n in ast.walk(call) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    ]
    assert len(stores) == len(set(stores)), sorted(stores)
    logits = next(
        t.id
        for node in ast.walk(call)
        if isinstance(node, ast.Assign) and ast.unparse(node.value) == f"{held}['logits']"
        for t in node.targets
        if isinstance(t, ast.Name)
    )
    sample = next(
        node
        for node in ast.walk(call)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "self._sample"
    )
    assert [ast.unparse(k.value) for k in sample.keywords if k.arg == "logits"] == [logits]


def test_every_reserved_name_is_one_the_generated_modules_use() -> None:
    """The reverse of the test above: a reserved name no generated module uses any more
    (the fused kernel's `fused_copy`, `triton_stash`, ... once were) would refuse a spec's
    step or input for nothing, so the list is exactly what the modules use."""
    used: set[str] = set()
    for path in engine_specs():
        tree = ast.parse((GENERATED_DIR / f"{path.stem}.py").read_text())
        used |= _module_names(tree)
        used |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        used |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args}
    assert GENERATED_NAMES - used == set(), "reserved but unused: drop them from reserved.py"
