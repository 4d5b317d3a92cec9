"""Host side of the fused relay kernels that relayc emits into generated modules.

A generated module holds the Triton kernels specialised to its fields (one buffer
pointer, rows pointer, row width, chunk size and presence flag per field); the
argument checks and the launch are the same for every algorithm and live here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

# Largest row chunk one loop iteration copies: a power of two (tl.arange needs one) that keeps
# registers bounded while a 4096-wide bf16 hidden row still takes only four iterations.
MAX_BLOCK = 1024


def launch_args(
    fields: Sequence[tuple[str, torch.dtype | None]],
    indices: torch.Tensor,
    bufs: Sequence[torch.Tensor | None],
    rows: Sequence[torch.Tensor | None],
) -> list[object]:
    """Kernel arguments for ``fields``, after checking what the kernels assume (host metadata only)."""
    if indices.dim() != 1 or indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"`indices` must be 1-D int32/int64; got {indices.dtype} {tuple(indices.shape)}"
        )
    if len(bufs) != len(fields) or len(rows) != len(fields):
        raise ValueError(
            f"expected {len(fields)} buffers and row tensors "
            f"({', '.join(name for name, _ in fields)}); got {len(bufs)} and {len(rows)}"
        )
    n = indices.shape[0]
    args: list[object] = [indices]
    for (name, dtype), buf, field_rows in zip(fields, bufs, rows, strict=True):
        if field_rows is None:
            # Fixed width/block for absent fields: one specialisation per presence pattern,
            # not per shape of a buffer the launch never touches.
            args += (None, None, 1, 1, False)
            continue
        if buf is None:
            raise ValueError(f"relay field `{name}` has rows but no buffer; allocate it first")
        if (dtype is not None and buf.dtype != dtype) or field_rows.dtype != buf.dtype:
            raise ValueError(
                f"relay field `{name}` is {dtype}; got buffer {buf.dtype}, rows {field_rows.dtype}"
            )
        if field_rows.shape[:1] != (n,) or field_rows.shape[1:] != buf.shape[1:]:
            raise ValueError(
                f"relay field `{name}` rows must be {(n, *buf.shape[1:])} "
                f"for {n} indices; got {tuple(field_rows.shape)}"
            )
        if not (buf.is_contiguous() and field_rows.is_contiguous()):
            raise ValueError(f"relay field `{name}`: the kernels need contiguous tensors")
        width = buf.numel() // buf.shape[0]
        if dtype == torch.bool:
            # Same bytes, but a plain byte pointer: Triton's handling of bool pointers
            # (int1 loaded as int8) has varied across versions.
            buf, field_rows = buf.view(torch.uint8), field_rows.view(torch.uint8)
        # Next power of two by bit_length: triton.next_power_of_2 costs ~5 us a call.
        block = min(1 << max(width - 1, 0).bit_length(), MAX_BLOCK)
        args += (buf, field_rows, width, block, True)
    return args


def fused_copy(
    kernel: Any,
    fields: Sequence[tuple[str, torch.dtype | None]],
    indices: torch.Tensor,
    bufs: Sequence[torch.Tensor | None],
    rows: Sequence[torch.Tensor | None],
) -> None:
    """Launch ``kernel`` once over ``indices`` (no launch for an empty batch)."""
    if indices.shape[0] == 0:
        return
    kernel[(indices.shape[0],)](*launch_args(fields, indices, bufs, rows))
