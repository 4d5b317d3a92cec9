"""Fused relay kernels: emitted source, interpreter runs against plain torch indexing, launches."""

from __future__ import annotations

import os

# The interpreter must be chosen before Triton is first imported; the kernels then run on CPU.
os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path
from types import ModuleType

import pytest
import torch

pytest.importorskip("triton", reason="the fused relay kernels need the `triton` package")

from relayc.compiler.output import format_source, ruff_binary, style_problems
from relayc.compiler.triton_relay import (
    MAX_BLOCK,
    RelayBuffer,
    count_triton_launches,
    emit_triton_relay,
)

# What a generated module has above the pasted block (the contract in emit_triton_relay).
HEADER = """\
from __future__ import annotations

from collections.abc import Sequence

import torch

from relayc.runtime.fused import fused_copy

try:
    import triton
    import triton.language as tl
except ImportError:
    _HAVE_TRITON = False
else:
    _HAVE_TRITON = True


"""

POOL = 48  # req_pool_size; slot 0 is the padding slot

# name -> (dtype, row shape). Row shapes are the engine's business, not the emitter's.
FIELD_SETS: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {
    "one": {"bonus_tokens": ("int64", ())},
    "eagle": {
        "bonus_tokens": ("int64", ()),
        "new_seq_lens": ("int64", ()),
        "topk_p": ("float32", (4,)),
        "topk_index": ("int64", (4,)),
        "hidden_states": ("bfloat16", (64,)),
    },
    "mixed": {
        "accepted": ("bool", (3, 4)),
        "accept_lens": ("int32", ()),
        "draft_probs": ("float16", (3, 4)),
        # Wider than MAX_BLOCK and not a multiple of it: the chunk loop and its masked tail.
        "wide": ("float32", (MAX_BLOCK + 77,)),
    },
}


def _buffers(field_set: str) -> list[RelayBuffer]:
    return [RelayBuffer(name, dtype) for name, (dtype, _) in FIELD_SETS[field_set].items()]


def _import_emitted(path: Path, source: str) -> ModuleType:
    # Triton reads kernel source with inspect, so the module has to live in a real file.
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def relay_modules(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModuleType]:
    root = tmp_path_factory.mktemp("relay")
    return {
        name: _import_emitted(root / f"relay_{name}.py", HEADER + emit_triton_relay(_buffers(name)))
        for name in FIELD_SETS
    }


def _random_rows(dtype: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    torch_dtype = getattr(torch, dtype)
    if dtype == "bool":
        return torch.randint(0, 2, shape, generator=gen).bool()
    if torch_dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(torch_dtype)
    return torch.randint(-(2**30), 2**30, shape, generator=gen, dtype=torch_dtype)


def _poison_like(expected: torch.Tensor) -> torch.Tensor:
    # Every element differs from what the kernel must write, so an unwritten one fails.
    if expected.dtype == torch.bool:
        return ~expected
    if expected.dtype.is_floating_point:
        return torch.full_like(expected, float("nan"))
    return expected - 1


def _fresh_buffers(
    field_set: str, gen: torch.Generator, lazy: set[str]
) -> list[torch.Tensor | None]:
    return [
        None if name in lazy else _random_rows(dtype, (POOL, *shape), gen)
        for name, (dtype, shape) in FIELD_SETS[field_set].items()
    ]


def _present_mask(n_fields: int, gen: torch.Generator) -> list[bool]:
    # At least one field present; with several fields, at least one absent too.
    present = (torch.rand(n_fields, generator=gen) < 0.6).tolist()
    present[int(torch.randint(0, n_fields, (1,), generator=gen))] = True
    if n_fields > 1 and all(present):
        present[int(torch.randint(0, n_fields, (1,), generator=gen))] = False
    return present if any(present) else [True] * n_fields


@pytest.mark.parametrize("field_set", list(FIELD_SETS))
@pytest.mark.parametrize("n", [1, 7, 40])
def test_stash_matches_torch_index_put(
    relay_modules: dict[str, ModuleType], field_set: str, n: int
) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(f"stash-{field_set}-{n}".encode()))
    fields = FIELD_SETS[field_set]
    present = _present_mask(len(fields), gen)
    # The first absent field is allocated (its rows must stay as they are); the others are
    # lazy fields not allocated yet, which travel as buffer None, src None.
    absent = [name for name, p in zip(fields, present, strict=True) if not p]
    lazy = set(absent[1:])
    bufs = _fresh_buffers(field_set, gen, lazy)
    srcs = [
        _random_rows(dtype, (n, *shape), gen) if p else None
        for (dtype, shape), p in zip(fields.values(), present, strict=True)
    ]
    # Distinct slots: duplicate stash slots race on the device and in torch alike.
    indices = torch.randperm(POOL - 1, generator=gen)[:n] + 1
    expected = [None if buf is None else buf.clone() for buf in bufs]
    for want, src in zip(expected, srcs, strict=True):
        if src is not None:
            assert want is not None
            want[indices] = src

    relay_modules[field_set].triton_stash(indices, bufs, srcs)

    for name, got, want in zip(fields, bufs, expected, strict=True):
        assert (got is None) == (want is None), name
        if got is not None:
            assert torch.equal(got, want), name


@pytest.mark.parametrize("field_set", list(FIELD_SETS))
@pytest.mark.parametrize(
    ("n", "index_dtype"), [(1, torch.int64), (13, torch.int32), (40, torch.int64)]
)
def test_resolve_matches_torch_indexing(
    relay_modules: dict[str, ModuleType], field_set: str, n: int, index_dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(f"resolve-{field_set}-{n}".encode()))
    fields = FIELD_SETS[field_set]
    present = _present_mask(len(fields), gen)
    bufs = _fresh_buffers(field_set, gen, lazy=set())
    # Duplicates and the padding slot are fine for a gather, and a padded batch has them.
    indices = torch.randint(0, POOL, (n,), generator=gen).to(index_dtype)
    indices[0] = 0
    before = [buf.clone() for buf in bufs if buf is not None]
    expected = [buf[indices.long()] if p else None for buf, p in zip(bufs, present, strict=True)]
    outs = [None if want is None else _poison_like(want) for want in expected]

    relay_modules[field_set].triton_resolve(indices, bufs, outs)

    for name, got, want in zip(fields, outs, expected, strict=True):
        if want is not None:
            assert torch.equal(got, want), name
    for name, buf, old in zip(fields, bufs, before, strict=True):
        assert torch.equal(buf, old), f"resolve wrote into the `{name}` buffer"


@pytest.mark.parametrize("field_set", ["one", "eagle"])
def test_one_launch_per_stash_and_resolve(
    relay_modules: dict[str, ModuleType], field_set: str
) -> None:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    runs = (JITFunction.run, InterpretedFunction.run)
    module = relay_modules[field_set]
    gen = torch.Generator().manual_seed(0)
    fields = FIELD_SETS[field_set]
    bufs = _fresh_buffers(field_set, gen, lazy=set())
    for n in (0, 5):
        rows = [_random_rows(dtype, (n, *shape), gen) for dtype, shape in fields.values()]
        indices = torch.arange(1, n + 1)
        with count_triton_launches() as launches:
            module.triton_stash(indices, bufs, rows)
            module.triton_resolve(indices, bufs, rows)
        expected = [] if n == 0 else [("stash", (n,)), ("resolve", (n,))]
        assert launches.launches == expected
        assert (launches.stash, launches.resolve) == (len(expected) // 2, len(expected) // 2)
    assert (JITFunction.run, InterpretedFunction.run) == runs, (
        "count_triton_launches leaked a patch"
    )


def test_bad_arguments_name_the_field(relay_modules: dict[str, ModuleType]) -> None:
    module = relay_modules["eagle"]
    gen = torch.Generator().manual_seed(1)
    bufs = _fresh_buffers("eagle", gen, lazy={"hidden_states"})
    indices = torch.tensor([3, 4])
    ok = [_random_rows(d, (2, *s), gen) for d, s in FIELD_SETS["eagle"].values()]

    def srcs_with(name: str, value: torch.Tensor | None) -> list[torch.Tensor | None]:
        chosen = [*ok[:4], None] if name != "hidden_states" else list(ok)
        chosen[list(FIELD_SETS["eagle"]).index(name)] = value
        return chosen

    cases = {
        "`hidden_states` has rows but no buffer": srcs_with("hidden_states", ok[4]),
        "`topk_p` is torch.float32": srcs_with("topk_p", ok[1]),
        r"`topk_index` rows must be \(2, 4\)": srcs_with("topk_index", ok[3][:, :2].contiguous()),
        "`topk_index`: the kernels need contiguous": srcs_with(
            "topk_index", ok[3].T.contiguous().T
        ),
        "`new_seq_lens` rows must be": srcs_with("new_seq_lens", ok[1][:1]),
    }
    for message, srcs in cases.items():
        with pytest.raises(ValueError, match=message):
            module.triton_stash(indices, bufs, srcs)
    with pytest.raises(ValueError, match="expected 5 buffers"):
        module.triton_resolve(indices, bufs[:4], ok[:4])
    with pytest.raises(ValueError, match="`indices` must be 1-D int32/int64"):
        module.triton_resolve(indices.float(), bufs, [None] * 5)


@pytest.mark.parametrize(
    ("buffers", "message"),
    [
        ([], "no relay fields"),
        ([RelayBuffer("__x", "int64")], "must not start with `__`"),
        ([RelayBuffer("a", "int64"), RelayBuffer("a", "int32")], "`a` is listed twice"),
        ([RelayBuffer("class", "int64")], "must be a Python identifier"),
        ([RelayBuffer("topk-p", "int64")], "must be a Python identifier"),
        ([RelayBuffer("topk_p", "float64")], "has dtype 'float64'; expected one of"),
    ],
)
def test_emit_rejects_bad_buffers(buffers: list[RelayBuffer], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        emit_triton_relay(buffers)


def test_emit_is_deterministic_across_processes() -> None:
    # Another hash seed in a fresh interpreter would expose any set/dict-order leak.
    script = textwrap.dedent(
        """
        import sys
        from relayc.compiler.triton_relay import RelayBuffer, emit_triton_relay
        buffers = [RelayBuffer(n, d) for n, d in (("b", "bool"), ("a", "int64"), ("c", "bfloat16"))]
        sys.stdout.write(emit_triton_relay(buffers))
        """
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    other = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout
    buffers = [RelayBuffer("b", "bool"), RelayBuffer("a", "int64"), RelayBuffer("c", "bfloat16")]
    assert emit_triton_relay(buffers) == emit_triton_relay(buffers) == other


def test_emitted_block_imports_without_triton() -> None:
    source = emit_triton_relay(_buffers("eagle"))
    namespace: dict[str, object] = {"_HAVE_TRITON": False}
    exec(compile(source, "<relay-no-triton>", "exec"), namespace)
    assert "triton_stash" not in namespace and "triton_resolve" not in namespace


@pytest.mark.skipif(ruff_binary() is None, reason="ruff is not installed")
def test_emitted_module_is_ruff_clean(tmp_path: Path) -> None:
    # What the writer writes: the emitted block through its formatting pass.
    path = tmp_path / "relay_generated.py"
    source = HEADER + emit_triton_relay(_buffers("mixed") + _buffers("eagle"))
    path.write_text(format_source(source))
    assert style_problems([path]) == []


@pytest.mark.parametrize("to_buffers", [True, False])
def test_out_of_pool_slots_touch_nothing(
    relay_modules: dict[str, ModuleType], to_buffers: bool
) -> None:
    """A bad slot never writes outside (or inside) the buffers; a resolve reads it as zeros."""
    gen = torch.Generator().manual_seed(3)
    fields = FIELD_SETS["eagle"]
    # Guard rows after the pool: a write past the end would land in them.
    backing = [_random_rows(d, (POOL + 4, *s), gen) for d, s in fields.values()]
    bufs = [b[:POOL] for b in backing]
    before = [b.clone() for b in backing]
    indices = torch.tensor([POOL, -1, 5, POOL + 2, -(2**40)])
    rows = [_random_rows(d, (5, *s), gen) for d, s in fields.values()]
    if to_buffers:
        relay_modules["eagle"].triton_stash(indices, bufs, rows)
        for name, got, old, src in zip(fields, backing, before, rows, strict=True):
            old[5] = src[2]  # the one valid slot is written, nothing else
            assert torch.equal(got, old), name
    else:
        relay_modules["eagle"].triton_resolve(indices, bufs, rows)
        for name, got, buf in zip(fields, rows, bufs, strict=True):
            want = torch.zeros_like(got)
            want[2] = buf[5]
            assert torch.equal(got, want), name


def test_strided_and_int32_indices(relay_modules: dict[str, ModuleType]) -> None:
    gen = torch.Generator().manual_seed(4)
    fields = FIELD_SETS["mixed"]
    bufs = _fresh_buffers("mixed", gen, lazy=set())
    expected = [b.clone() for b in bufs]
    spread = torch.tensor([7, 0, 3, 0, 11, 0], dtype=torch.int32)
    indices = spread[::2]  # [7, 3, 11], stride 2
    rows = [_random_rows(d, (3, *s), gen) for d, s in fields.values()]
    for want, src in zip(expected, rows, strict=True):
        want[indices.long()] = src
    relay_modules["mixed"].triton_stash(indices, bufs, rows)
    for name, got, want in zip(fields, bufs, expected, strict=True):
        assert torch.equal(got, want), name
    outs = [_poison_like(r) for r in rows]
    relay_modules["mixed"].triton_resolve(indices, bufs, outs)
    for name, got, want in zip(fields, outs, rows, strict=True):
        assert torch.equal(got, want), name


def test_kernels_compile_for_sm90_without_a_gpu(tmp_path: Path) -> None:
    """The interpreter accepts code the compiler rejects, so lower the emitted kernels for real.

    The arguments go through `relayc.runtime.fused.launch_args` and Triton's own binder, as in a launch, so
    the None pointers of absent fields and the uint8 view of bool rows are what gets compiled.
    Only the device-side launch is missing; Triton's bundled ptxas needs no GPU.
    """
    module_path = tmp_path / "relay_compiled.py"
    module_path.write_text(HEADER + emit_triton_relay(_buffers("mixed")))
    script = textwrap.dedent(
        f"""
        import importlib.util
        import torch
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, make_backend
        from triton.runtime.jit import create_function_from_signature
        from relayc.runtime.fused import launch_args

        spec = importlib.util.spec_from_file_location("relay_compiled", {str(module_path)!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        target = GPUTarget("cuda", 90, 32)
        backend = make_backend(target)
        shapes = {list(FIELD_SETS["mixed"].values())!r}
        bufs = [torch.zeros(8, *shape, dtype=getattr(torch, dtype)) for dtype, shape in shapes]
        rows = [torch.zeros(3, *shape, dtype=getattr(torch, dtype)) for dtype, shape in shapes]
        indices = torch.tensor([5, 1, 2])
        kernel = module._relay_copy_kernel
        for to_buffers in (True, False):
            for present in (rows, [rows[0], None, None, rows[3]]):
                args = launch_args(module._RELAY_FIELDS, indices, bufs, present)
                binder = create_function_from_signature(kernel.signature, kernel.params, backend)
                bound, specialization, options = binder(*args, TO_BUFFERS=to_buffers)
                options, signature, constexprs, attrs = kernel._pack_args(
                    backend, {{}}, bound, specialization, options
                )
                source = ASTSource(kernel, signature, constexprs, attrs)
                compiled = triton.compile(source, target=target, options=options.__dict__)
                assert compiled.asm["cubin"], to_buffers
        print("ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-4000:]


# -- the engine runtime's one kernel (relayc.runtime.relay_kernel) ----------------------


def _runtime_fields() -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """Eleven fields: more than one launch's SLOTS, every dtype, awkward row widths."""
    from relayc.runtime.relay_kernel import MAX_BLOCK as RUNTIME_BLOCK

    dtypes = (torch.int64, torch.int32, torch.float32, torch.bfloat16, torch.float16, torch.bool)
    shapes = ((), (1,), (3,), (2, 5), (RUNTIME_BLOCK + 3,), (7,))
    return {f"f{i}": (dtypes[i % len(dtypes)], shapes[i % len(shapes)]) for i in range(11)}


def _rows_of(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=gen).to(dtype)


def test_runtime_kernel_matches_indexing_across_launches() -> None:
    from relayc.runtime.relay_kernel import SLOTS, relay_copy

    fields = _runtime_fields()
    assert len(fields) > SLOTS  # two launches per direction
    names = list(fields)
    kernel_fields = [(name, dtype) for name, (dtype, _) in fields.items()]
    gen = torch.Generator().manual_seed(7)
    bufs = [_rows_of(dtype, (POOL, *shape), gen) for dtype, shape in fields.values()]
    want = [b.clone() for b in bufs]
    # Odd batch with the padding slot, one slot outside the pool; field f3 absent.
    indices = torch.tensor([5, 0, POOL + 2, 17, 46], dtype=torch.int32)
    rows = [_rows_of(d, (5, *s), gen) for d, s in fields.values()]
    rows[names.index("f3")] = None
    with count_triton_launches() as launches:
        relay_copy(kernel_fields, indices, bufs, rows, to_buffers=True)
    assert [d for d, _ in launches.launches] == ["stash", "stash"]
    inside = torch.tensor([0, 1, 3, 4])
    for name, buf, expected, src in zip(names, bufs, want, rows, strict=True):
        if src is not None:
            expected[indices[inside].long()] = src[inside]
        assert torch.equal(buf, expected), name
    outs = [torch.full_like(r, 1) if r is not None else None for r in rows]  # poisoned
    with count_triton_launches() as launches:
        relay_copy(kernel_fields, indices, bufs, outs, to_buffers=False)
    assert [d for d, _ in launches.launches] == ["resolve", "resolve"]
    for name, buf, out in zip(names, bufs, outs, strict=True):
        if out is None:
            continue
        assert torch.equal(out[inside], buf[indices[inside].long()]), name
        assert not out[2].any(), f"{name}: a slot outside the pool must read as zeros"


def test_runtime_kernel_launches_nothing_for_an_empty_batch() -> None:
    from relayc.runtime.relay_kernel import relay_copy

    buf = torch.zeros(POOL, dtype=torch.int64)
    with count_triton_launches() as launches:
        relay_copy(
            [("x", torch.int64)],
            torch.zeros(0, dtype=torch.int64),
            [buf],
            [buf[:0]],
            to_buffers=True,
        )
        relay_copy([("x", torch.int64)], torch.tensor([1]), [buf], [None], to_buffers=True)
    assert launches.launches == []
