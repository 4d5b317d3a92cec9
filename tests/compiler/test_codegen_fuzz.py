"""Random valid specs compile to modules that import cleanly and relay every field exactly.

Hypothesis builds specs with random names (fields, dims, steps, the algorithm, an engine
input), docs and descriptions full of quotes, backslashes, newlines, `\"\"\"`, `\\N{` and
unicode, random dims, dtypes, row shapes, fills and allocation policies. Each one is
compiled like `relayc compile` does; a fresh interpreter imports the module (which must
print nothing: spec text is data), round-trips every field through the FutureMap on the
torch and the fused Triton path (under the interpreter), with int32 and strided indices,
and runs the generated PrefillStep / DecodeStep with fake op implementations.
"""

from __future__ import annotations

import itertools
import json
import keyword
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relayc.compiler.writer import compile_spec
from relayc.nodes.registry import Op, TensorType, register
from relayc.specs.loader import load_spec
from relayc.specs.reserved import GENERATED_NAMES

pytest.importorskip("triton", reason="the fused path runs under Triton's interpreter")

DTYPES = ["int32", "int64", "float32", "bfloat16", "float16", "bool", "model"]
HOSTILE = [
    'a "quoted" doc',
    "it's",
    "back\\slash \\n not a newline",
    "two\nlines\nimport os; print('ran at import')",
    '"""',
    "'''",
    "\\N{",
    "{braces} and f-string {ALGORITHM!r}",
    "ünïcödé – 漢字 😀",
    "line\u2028separator\x85next\x0cform",
    "# not a comment\r\nreturn None",
]


def _name_ok(name: str) -> bool:
    return not keyword.iskeyword(name) and not name.startswith("__")


names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True).filter(_name_ok)
local_names = names.filter(lambda n: n not in GENERATED_NAMES)
texts = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=24),
)


@st.composite
def fills(draw: st.DrawFn, dtype: str) -> Any:
    if dtype == "bool":
        return draw(st.booleans())
    if dtype in ("int32", "int64"):
        return draw(st.integers(-(2**31), 2**31 - 1))
    return draw(
        st.one_of(
            st.sampled_from([float("inf"), float("-inf"), float("nan")]),
            st.floats(-1e4, 1e4, allow_nan=False),
        )
    )


@st.composite
def specs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, int]]:
    dims = draw(st.dictionaries(names, st.integers(1, 3), min_size=1, max_size=3))
    supplied = draw(st.lists(st.sampled_from(sorted(dims)), unique=True, max_size=1))
    field_names = draw(st.lists(names, min_size=1, max_size=4, unique=True))
    fields = {}
    for name in field_names:
        dtype = draw(st.sampled_from(DTYPES))
        field: dict[str, Any] = {
            "dtype": dtype,
            "shape": draw(
                st.lists(st.one_of(st.sampled_from(sorted(dims)), st.integers(1, 3)), max_size=2)
            ),
            "doc": draw(texts),
        }
        init = draw(st.one_of(st.sampled_from(["empty", "zeros"]), fills(dtype)))
        if init != "empty":
            field["init"] = init
        if draw(st.booleans()):
            field["poison"] = draw(fills(dtype))
        if "init" not in field and draw(st.booleans()):  # a lazy field has no init
            field["alloc"] = "lazy"
        fields[name] = field
    step_names = draw(st.lists(local_names, min_size=2, max_size=2, unique=True))
    extra_input = draw(local_names.filter(lambda n: n not in (*step_names, "req_pool_indices")))
    spec = {
        "algorithm": draw(names),
        "description": draw(texts),
        "dims": {
            name: (
                {"supplied_by": draw(texts), "doc": draw(texts)}
                if name in supplied
                else {"default": size, "doc": draw(texts)}
            )
            for name, size in dims.items()
        },
        "inputs": {
            "req_pool_indices": {"dtype": "int64", "doc": draw(texts)},
            extra_input: {"dtype": "int64", "doc": draw(texts)},
        },
        "fields": fields,
        "prefill": {"name": step_names[0], "doc": draw(texts)},
        "steps": [{"name": step_names[1], "doc": draw(texts)}],
        "capture": {"batch_sizes": [1, 2], "max_batch_size": 4},
    }
    return spec, dims


_op_ids = itertools.count()


def _with_ops(spec: dict[str, Any]) -> dict[str, Any]:
    """Register the two ops the spec's steps run: prefill writes every field, the decode
    step reads every field and the extra input and writes every field again."""
    fields = spec["fields"]
    extra = next(n for n in spec["inputs"] if n != "req_pool_indices")
    outputs = {
        f"out{i}": TensorType(f["dtype"], tuple(f["shape"])) for i, f in enumerate(fields.values())
    }
    # What the engine reads back (the spec's `outputs:`): one int64 token per request.
    op_outputs = {**outputs, "next_tokens": TensorType("int64")}
    n = next(_op_ids)
    prefill = register(
        Op(f"fuzz_prefill_{n}", {"slots": TensorType("int64")}, op_outputs), module=__name__
    )
    inputs = {f"in{i}": t for i, t in enumerate(outputs.values())}
    step = register(
        Op(
            f"fuzz_step_{n}",
            {**inputs, "slots": TensorType("int64"), "aux": TensorType("int64")},
            op_outputs,
        ),
        module=__name__,
    )
    stash = {name: f"out{i}" for i, name in enumerate(fields)}
    spec["ops"] = [__name__]  # the ops above belong to this module
    spec["outputs"] = {
        "prefill": {"next_tokens": f"{spec['prefill']['name']}.next_tokens"},
        "decode": {"next_tokens": f"{spec['steps'][0]['name']}.next_tokens"},
    }
    spec["prefill"] |= {
        "op": prefill.name,
        "reads": {"slots": "input.req_pool_indices"},
        "writes": list(op_outputs),
        "stash": stash,
    }
    spec["steps"][0] |= {
        "op": step.name,
        "reads": {
            **{f"in{i}": f"relay.{name}" for i, name in enumerate(fields)},
            "slots": "input.req_pool_indices",
            "aux": f"input.{extra}",
        },
        "writes": list(op_outputs),
        "stash": stash,
    }
    return spec


# Runs in a fresh interpreter: argv = module path, JSON of dims / ops / input names.
CHECK = r"""
import importlib.util, json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
path, info = sys.argv[1], json.loads(sys.argv[2])
spec = importlib.util.spec_from_file_location("fuzzed", path)
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
assert m.DESCRIPTION == info["description"], (m.DESCRIPTION, info["description"])
gen = torch.Generator().manual_seed(0)

def rows(fmap, n):
    out = []
    for f in m.FIELDS:
        dtype, shape = fmap.dtypes[f.name], (n, *fmap.rows[f.name])
        if dtype == torch.bool:
            out.append(torch.randint(0, 2, shape, generator=gen).bool())
        elif dtype.is_floating_point:
            out.append(torch.randn(shape, generator=gen).to(dtype))
        else:
            out.append(torch.randint(-1000, 1000, shape, generator=gen).to(dtype))
    return out

slots = torch.tensor([5, 0, 2, 0, 7, 0], dtype=torch.int32)[::2]
for backend in ("torch", "triton"):
    fmap = m.FutureMap(9, "cpu", dims=info["dims"], backend=backend)
    values = rows(fmap, 3)
    fmap.stash(slots, m.RelayPayload(*values))
    got = fmap.resolve(slots.long())
    for f, want in zip(m.FIELDS, values):
        assert torch.equal(getattr(got, f.name), want), (backend, f.name)

fmap = m.FutureMap(9, "cpu", dims=info["dims"])
written = {}
def fake(ctx, **kw):
    out = dict(zip(info["outputs"], rows(fmap, kw["slots"].shape[0])))
    out["next_tokens"] = torch.zeros(kw["slots"].shape[0], dtype=torch.int64)
    written.clear(); written.update(out)
    return out
impls = {info["prefill_op"]: fake, info["step_op"]: fake}
inputs = {"req_pool_indices": torch.tensor([3, 4]), info["extra"]: torch.tensor([1, 1])}
m.PrefillStep(fmap, impls)(None, **inputs)
seeded = dict(written)
seen = {}
def step(ctx, **kw):
    seen.update(kw)
    return fake(ctx, **kw)
m.DecodeStep(fmap, {**impls, info["step_op"]: step})(None, **inputs)
for i in range(len(m.FIELDS)):
    assert torch.equal(seen[f"in{i}"], seeded[f"out{i}"]), i
print("ok")
"""


@settings(
    max_examples=int(os.environ.get("RELAYC_FUZZ_EXAMPLES", "6")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(specs())
def test_random_specs_compile_import_and_round_trip(drawn: tuple[dict[str, Any], dict]) -> None:
    spec_dict, dims = drawn
    spec_dict = _with_ops(spec_dict)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzzed.yaml"
        path.write_text(yaml.safe_dump(spec_dict, allow_unicode=True, sort_keys=False))
        spec = load_spec(path)  # valid by construction: any error here is a finding
        output = compile_spec(path, Path(tmp) / "out")
        compile(output.text, str(output.path), "exec")
        module_path = Path(tmp) / "fuzzed_module.py"
        module_path.write_text(output.text, encoding="utf-8")
        info = {
            "description": spec.description,
            "dims": dims,
            "outputs": [f"out{i}" for i in range(len(spec_dict["fields"]))],
            "prefill_op": spec_dict["prefill"]["op"],
            "step_op": spec_dict["steps"][0]["op"],
            "extra": next(n for n in spec_dict["inputs"] if n != "req_pool_indices"),
        }
        result = subprocess.run(
            [sys.executable, "-c", CHECK, str(module_path), json.dumps(info)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout == "ok\n", result.stdout  # nothing from the spec ran
