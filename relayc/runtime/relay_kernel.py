"""The engine relay's one fused Triton kernel: a stash or a resolve in one launch per 8 fields.

Hand-written, not generated: every generated engine module uses this kernel through
:class:`relayc.runtime.relay.FutureMapBase`, parameterised by its fields as data -- the
buffers and rows as pointers (Triton specialises on their dtypes) and each field's row
width as a constexpr, so a launch compiles once per field set and a width of 0 compiles a
slot out. Program ``i`` reads ``indices[i]`` on the device and copies row ``i`` of every
field in the launch: nothing syncs with the host, nothing is allocated, the grid is
``(n,)``, so stash and resolve can be captured in a CUDA graph.

A relay of more than :data:`SLOTS` fields takes one launch per :data:`SLOTS` fields (the
bundled specs have at most six). Slots outside ``[0, pool)`` are never written by a stash
and read as zeros in a resolve, so a bad index cannot touch memory outside the buffers
(debug mode rejects it on the host first). Importing this module never needs Triton;
:data:`AVAILABLE` says whether the kernel exists.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from relayc.runtime.fused import launch_args

try:  # optional: only the fused path (CUDA, or backend='triton') launches it
    import triton
    import triton.language as tl
except ImportError:
    AVAILABLE = False
else:
    AVAILABLE = True

KERNEL = "_relay_copy_kernel"  # relayc.compiler.triton_relay.count_triton_launches counts it
SLOTS = 8  # fields per launch
# Largest row chunk one loop iteration copies: a power of two (tl.arange needs one) that
# keeps registers bounded while a 4096-wide bf16 hidden row still takes four iterations.
MAX_BLOCK = 1024

if AVAILABLE:
    # Triton reads the annotations itself (tl.constexpr), so these stay untyped for mypy.
    @triton.jit  # type: ignore[untyped-decorator]
    def _relay_copy_row(  # type: ignore[no-untyped-def]
        buf, rows, slot, row, valid, width: tl.constexpr, TO_BUFFERS: tl.constexpr
    ):
        if width > 0:
            # 1024 is MAX_BLOCK, spelled out: a jitted function reads no plain globals.
            block: tl.constexpr = 1024 if width > 512 else triton.next_power_of_2(width)
            for start in tl.static_range(0, width, block):
                cols = start + tl.arange(0, block)
                mask = cols < width
                # valid is 0 or 1: a slot outside the pool has no buffer columns at all.
                buf_mask = cols < width * valid
                buf_at = buf + slot * width + cols
                rows_at = rows + row * width + cols
                if TO_BUFFERS:
                    tl.store(buf_at, tl.load(rows_at, mask=mask), mask=buf_mask)
                else:
                    tl.store(rows_at, tl.load(buf_at, mask=buf_mask, other=0), mask=mask)

    @triton.jit  # type: ignore[untyped-decorator]
    def _relay_copy_kernel(  # type: ignore[no-untyped-def]
        indices,
        index_stride,
        pool_size,
        buf0,
        rows0,
        width0: tl.constexpr,
        buf1,
        rows1,
        width1: tl.constexpr,
        buf2,
        rows2,
        width2: tl.constexpr,
        buf3,
        rows3,
        width3: tl.constexpr,
        buf4,
        rows4,
        width4: tl.constexpr,
        buf5,
        rows5,
        width5: tl.constexpr,
        buf6,
        rows6,
        width6: tl.constexpr,
        buf7,
        rows7,
        width7: tl.constexpr,
        TO_BUFFERS: tl.constexpr,
    ):
        # int64 offsets: slot * width passes 2**31 for vocab-wide rows in a large pool.
        row = tl.program_id(0).to(tl.int64)
        slot = tl.load(indices + row * index_stride).to(tl.int64)
        valid = ((slot >= 0) & (slot < pool_size)).to(tl.int64)
        slot = tl.where(valid != 0, slot, 0)
        _relay_copy_row(buf0, rows0, slot, row, valid, width0, TO_BUFFERS)
        _relay_copy_row(buf1, rows1, slot, row, valid, width1, TO_BUFFERS)
        _relay_copy_row(buf2, rows2, slot, row, valid, width2, TO_BUFFERS)
        _relay_copy_row(buf3, rows3, slot, row, valid, width3, TO_BUFFERS)
        _relay_copy_row(buf4, rows4, slot, row, valid, width4, TO_BUFFERS)
        _relay_copy_row(buf5, rows5, slot, row, valid, width5, TO_BUFFERS)
        _relay_copy_row(buf6, rows6, slot, row, valid, width6, TO_BUFFERS)
        _relay_copy_row(buf7, rows7, slot, row, valid, width7, TO_BUFFERS)


def relay_copy(
    fields: Sequence[tuple[str, torch.dtype | None]],
    indices: torch.Tensor,
    bufs: Sequence[torch.Tensor | None],
    rows: Sequence[torch.Tensor | None],
    *,
    to_buffers: bool,
) -> None:
    """``bufs[f][indices[i]] = rows[f][i]`` (``to_buffers``) or ``rows[f][i] =
    bufs[f][indices[i]]`` for every field whose ``rows`` entry is not None.

    ``fields`` names each buffer and its dtype (None: any), in the order of ``bufs`` and
    ``rows``. Raises ValueError naming the field for anything the kernel cannot copy (host
    metadata only: nothing syncs). No launch for an empty batch or when no field is present.
    """
    if not AVAILABLE:
        raise RuntimeError("the fused relay path needs the `triton` package")
    args = launch_args(fields, indices, bufs, rows)
    head, per_field = args[:3], args[3:]
    if indices.shape[0] == 0 or not head[2]:
        return
    for start in range(0, len(per_field), 3 * SLOTS):
        chunk = per_field[start : start + 3 * SLOTS]
        if not any(chunk[2::3]):  # every field of this chunk absent
            continue
        chunk = chunk + [None, None, 0] * (SLOTS - len(chunk) // 3)
        _relay_copy_kernel[(indices.shape[0],)](*head, *chunk, TO_BUFFERS=to_buffers)
