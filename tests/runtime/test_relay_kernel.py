"""The engine relay's fused kernel (relayc.runtime.relay_kernel) against plain torch indexing.

Fresh random inputs at awkward sizes, every relay dtype, absent and unallocated fields,
poisoned outputs, out-of-pool slots, launch counts, and a real sm_90 lowering; the kernel
runs under the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET=1).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="the fused relay kernel needs the `triton` package")

from relayc.runtime.relay_kernel import (
    MAX_BLOCK,
    SLOTS,
    count_triton_launches,
    relay_copy,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
POOL = 48  # req_pool_size; slot 0 is the padding slot

Fields = dict[str, tuple[torch.dtype, tuple[int, ...]]]

# name -> (dtype, row shape).
FIELD_SETS: dict[str, Fields] = {
    "one": {"bonus_tokens": (torch.int64, ())},
    "eagle": {
        "bonus_tokens": (torch.int64, ()),
        "new_seq_lens": (torch.int64, ()),
        "topk_p": (torch.float32, (4,)),
        "topk_index": (torch.int64, (4,)),
        "hidden_states": (torch.bfloat16, (64,)),
    },
    "mixed": {
        "accepted": (torch.bool, (3, 4)),
        "accept_lens": (torch.int32, ()),
        "draft_probs": (torch.float16, (3, 4)),
        # Wider than MAX_BLOCK and not a multiple of it: the chunk loop and its masked tail.
        "wide": (torch.float32, (MAX_BLOCK + 77,)),
    },
}


def _kernel_fields(fields: Fields) -> list[tuple[str, torch.dtype | None]]:
    return [(name, dtype) for name, (dtype, _) in fields.items()]


def _random_rows(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(-(2**30), 2**30, shape, generator=gen, dtype=dtype)


def _poison_like(expected: torch.Tensor) -> torch.Tensor:
    # Every element differs from what the kernel must write, so an unwritten one fails.
    if expected.dtype == torch.bool:
        return ~expected
    if expected.dtype.is_floating_point:
        return torch.full_like(expected, float("nan"))
    return expected - 1


def _fresh_buffers(
    fields: Fields, gen: torch.Generator, lazy: set[str]
) -> list[torch.Tensor | None]:
    return [
        None if name in lazy else _random_rows(dtype, (POOL, *shape), gen)
        for name, (dtype, shape) in fields.items()
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
def test_stash_matches_torch_index_put(field_set: str, n: int) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(f"stash-{field_set}-{n}".encode()))
    fields = FIELD_SETS[field_set]
    present = _present_mask(len(fields), gen)
    # The first absent field is allocated (its rows must stay as they are); the others are
    # lazy fields not allocated yet, which travel as buffer None, rows None.
    absent = [name for name, p in zip(fields, present, strict=True) if not p]
    bufs = _fresh_buffers(fields, gen, lazy=set(absent[1:]))
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

    relay_copy(_kernel_fields(fields), indices, bufs, srcs, to_buffers=True)

    for name, got, want in zip(fields, bufs, expected, strict=True):
        assert (got is None) == (want is None), name
        if got is not None:
            assert torch.equal(got, want), name


@pytest.mark.parametrize("field_set", list(FIELD_SETS))
@pytest.mark.parametrize(
    ("n", "index_dtype"), [(1, torch.int64), (13, torch.int32), (40, torch.int64)]
)
def test_resolve_matches_torch_indexing(field_set: str, n: int, index_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(f"resolve-{field_set}-{n}".encode()))
    fields = FIELD_SETS[field_set]
    present = _present_mask(len(fields), gen)
    bufs = _fresh_buffers(fields, gen, lazy=set())
    # Duplicates and the padding slot are fine for a gather, and a padded batch has them.
    indices = torch.randint(0, POOL, (n,), generator=gen).to(index_dtype)
    indices[0] = 0
    before = [buf.clone() for buf in bufs if buf is not None]
    expected = [
        buf[indices.long()] if p and buf is not None else None
        for buf, p in zip(bufs, present, strict=True)
    ]
    outs = [None if want is None else _poison_like(want) for want in expected]

    relay_copy(_kernel_fields(fields), indices, bufs, outs, to_buffers=False)

    for name, got, want in zip(fields, outs, expected, strict=True):
        if want is not None:
            assert torch.equal(got, want), name
    for name, buf, old in zip(fields, bufs, before, strict=True):
        assert torch.equal(buf, old), f"resolve wrote into the `{name}` buffer"


@pytest.mark.parametrize("field_set", ["one", "eagle"])
def test_one_launch_per_stash_and_resolve(field_set: str) -> None:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    runs = (JITFunction.run, InterpretedFunction.run)
    gen = torch.Generator().manual_seed(0)
    fields = FIELD_SETS[field_set]
    bufs = _fresh_buffers(fields, gen, lazy=set())
    for n in (0, 5):
        rows: list[torch.Tensor | None] = [
            _random_rows(dtype, (n, *shape), gen) for dtype, shape in fields.values()
        ]
        indices = torch.arange(1, n + 1)
        with count_triton_launches() as launches:
            relay_copy(_kernel_fields(fields), indices, bufs, rows, to_buffers=True)
            relay_copy(_kernel_fields(fields), indices, bufs, rows, to_buffers=False)
        expected = [] if n == 0 else [("stash", (n,)), ("resolve", (n,))]
        assert launches.launches == expected
        assert (launches.stash, launches.resolve) == (len(expected) // 2, len(expected) // 2)
    assert (JITFunction.run, InterpretedFunction.run) == runs, (
        "count_triton_launches leaked a patch"
    )


def test_launches_nothing_for_an_empty_batch_or_no_field() -> None:
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


def test_bad_arguments_name_the_field() -> None:
    fields = FIELD_SETS["eagle"]
    kernel_fields = _kernel_fields(fields)
    gen = torch.Generator().manual_seed(1)
    bufs = _fresh_buffers(fields, gen, lazy={"hidden_states"})
    indices = torch.tensor([3, 4])
    ok = [_random_rows(d, (2, *s), gen) for d, s in fields.values()]

    def srcs_with(name: str, value: torch.Tensor | None) -> list[torch.Tensor | None]:
        chosen: list[torch.Tensor | None] = [*ok[:4], None] if name != "hidden_states" else list(ok)
        chosen[list(fields).index(name)] = value
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
            relay_copy(kernel_fields, indices, bufs, srcs, to_buffers=True)
    with pytest.raises(ValueError, match="expected 5 buffers"):
        relay_copy(kernel_fields, indices, bufs[:4], list(ok[:4]), to_buffers=False)
    with pytest.raises(ValueError, match="`indices` must be 1-D int32/int64"):
        relay_copy(kernel_fields, indices.float(), bufs, [None] * 5, to_buffers=False)


@pytest.mark.parametrize("to_buffers", [True, False])
def test_out_of_pool_slots_touch_nothing(to_buffers: bool) -> None:
    """A bad slot never writes outside (or inside) the buffers; a resolve reads it as zeros."""
    gen = torch.Generator().manual_seed(3)
    fields = FIELD_SETS["eagle"]
    # Guard rows after the pool: a write past the end would land in them.
    backing = [_random_rows(d, (POOL + 4, *s), gen) for d, s in fields.values()]
    bufs: list[torch.Tensor | None] = [b[:POOL] for b in backing]
    before = [b.clone() for b in backing]
    indices = torch.tensor([POOL, -1, 5, POOL + 2, -(2**40)])
    rows: list[torch.Tensor | None] = [_random_rows(d, (5, *s), gen) for d, s in fields.values()]
    relay_copy(_kernel_fields(fields), indices, bufs, rows, to_buffers=to_buffers)
    if to_buffers:
        for name, got, old, src in zip(fields, backing, before, rows, strict=True):
            assert src is not None
            old[5] = src[2]  # the one valid slot is written, nothing else
            assert torch.equal(got, old), name
    else:
        for name, out, buf in zip(fields, rows, bufs, strict=True):
            assert out is not None and buf is not None
            want = torch.zeros_like(out)
            want[2] = buf[5]
            assert torch.equal(out, want), name


def test_strided_and_int32_indices() -> None:
    gen = torch.Generator().manual_seed(4)
    fields = FIELD_SETS["mixed"]
    bufs = _fresh_buffers(fields, gen, lazy=set())
    expected = [b.clone() for b in bufs if b is not None]
    spread = torch.tensor([7, 0, 3, 0, 11, 0], dtype=torch.int32)
    indices = spread[::2]  # [7, 3, 11], stride 2
    rows = [_random_rows(d, (3, *s), gen) for d, s in fields.values()]
    for want, src in zip(expected, rows, strict=True):
        want[indices.long()] = src
    relay_copy(_kernel_fields(fields), indices, bufs, list(rows), to_buffers=True)
    for name, got, want in zip(fields, bufs, expected, strict=True):
        assert torch.equal(got, want), name
    outs: list[torch.Tensor | None] = [_poison_like(r) for r in rows]
    relay_copy(_kernel_fields(fields), indices, bufs, outs, to_buffers=False)
    for name, out, want in zip(fields, outs, rows, strict=True):
        assert torch.equal(out, want), name


def _many_fields() -> Fields:
    """Eleven fields: more than one launch's SLOTS, every dtype, awkward row widths."""
    dtypes = (torch.int64, torch.int32, torch.float32, torch.bfloat16, torch.float16, torch.bool)
    shapes = ((), (1,), (3,), (2, 5), (MAX_BLOCK + 3,), (7,))
    return {f"f{i}": (dtypes[i % len(dtypes)], shapes[i % len(shapes)]) for i in range(11)}


def test_more_fields_than_slots_take_one_launch_per_slots() -> None:
    fields = _many_fields()
    assert len(fields) > SLOTS  # two launches per direction
    names = list(fields)
    gen = torch.Generator().manual_seed(7)
    bufs: list[torch.Tensor | None] = [
        _random_rows(dtype, (POOL, *shape), gen) for dtype, shape in fields.values()
    ]
    want = [b.clone() for b in bufs if b is not None]
    # Odd batch with the padding slot, one slot outside the pool; field f3 absent.
    indices = torch.tensor([5, 0, POOL + 2, 17, 46], dtype=torch.int32)
    rows: list[torch.Tensor | None] = [_random_rows(d, (5, *s), gen) for d, s in fields.values()]
    rows[names.index("f3")] = None
    with count_triton_launches() as launches:
        relay_copy(_kernel_fields(fields), indices, bufs, rows, to_buffers=True)
    assert [d for d, _ in launches.launches] == ["stash", "stash"]
    inside = torch.tensor([0, 1, 3, 4])
    for name, buf, expected, src in zip(names, bufs, want, rows, strict=True):
        if src is not None:
            expected[indices[inside].long()] = src[inside]
        assert torch.equal(buf, expected), name
    outs = [torch.full_like(r, 1) if r is not None else None for r in rows]  # poisoned
    with count_triton_launches() as launches:
        relay_copy(_kernel_fields(fields), indices, bufs, outs, to_buffers=False)
    assert [d for d, _ in launches.launches] == ["resolve", "resolve"]
    for name, buf, out in zip(names, bufs, outs, strict=True):
        if out is None:
            continue
        assert buf is not None
        assert torch.equal(out[inside], buf[indices[inside].long()]), name
        assert not out[2].any(), f"{name}: a slot outside the pool must read as zeros"


def test_module_imports_without_triton() -> None:
    script = textwrap.dedent(
        """
        import sys
        import torch
        sys.modules["triton"] = None  # what `import triton` meets where it is not installed
        from relayc.runtime import relay_kernel
        assert not relay_kernel.AVAILABLE
        try:
            relay_kernel.relay_copy([], torch.zeros(0, dtype=torch.int64), [], [], to_buffers=True)
        except RuntimeError as exc:
            assert "needs the `triton` package" in str(exc), exc
        else:
            raise AssertionError("relay_copy ran without Triton")
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-4000:]


def test_kernel_compiles_for_sm90_without_a_gpu() -> None:
    """The interpreter accepts code the compiler rejects, so lower the kernel for real.

    The arguments go through `launch_args` and Triton's own binder, as in a launch, so the
    None pointers of absent fields and the uint8 view of bool rows are what gets compiled.
    Only the device-side launch is missing; Triton's bundled ptxas needs no GPU.
    """
    shapes = [(str(d).removeprefix("torch."), s) for d, s in FIELD_SETS["mixed"].values()]
    script = textwrap.dedent(
        f"""
        import torch
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, make_backend
        from triton.runtime.jit import create_function_from_signature
        from relayc.runtime.relay_kernel import SLOTS, _relay_copy_kernel as kernel, launch_args

        target = GPUTarget("cuda", 90, 32)
        backend = make_backend(target)
        shapes = {shapes!r}
        fields = [(f"f{{i}}", getattr(torch, d)) for i, (d, _) in enumerate(shapes)]
        bufs = [torch.zeros(8, *shape, dtype=getattr(torch, d)) for d, shape in shapes]
        rows = [torch.zeros(3, *shape, dtype=getattr(torch, d)) for d, shape in shapes]
        indices = torch.tensor([5, 1, 2])
        for to_buffers in (True, False):
            for present in (rows, [rows[0], None, None, rows[3]]):
                args = launch_args(fields, indices, bufs, present)
                args += [None, None, 0] * (SLOTS - len(fields))  # relay_copy's padding
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
    # A fresh process: this one imported Triton with TRITON_INTERPRET=1, which swaps the
    # compiler out for the interpreter.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-4000:]
