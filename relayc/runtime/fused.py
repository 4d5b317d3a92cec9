"""Argument checks and launch of the fused relay kernel, the same for every field set.

:func:`launch_args` serves the engine runtime's kernel (:mod:`relayc.runtime.relay_kernel`)
and, pasted without this docstring, the SGLang drop-in's kernel module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def launch_args(
    fields: Sequence[tuple[str, torch.dtype | None]],
    indices: torch.Tensor,
    bufs: Sequence[torch.Tensor | None],
    rows: Sequence[torch.Tensor | None],
) -> list[object]:
    """Kernel arguments for ``fields``, after checking what the kernel assumes (host metadata only).

    Raises ValueError naming the field for anything the kernel cannot copy. Indices may be
    int32 or int64 and strided (the kernel reads ``indices[i * stride]``); their values are
    the kernel's to bound (it masks slots outside ``[0, pool)``), so nothing here syncs.
    """
    if not isinstance(indices, torch.Tensor) or indices.dim() != 1:
        raise ValueError("`indices` must be a 1-D int32/int64 tensor")
    if indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"`indices` must be 1-D int32/int64; got {indices.dtype} {tuple(indices.shape)}"
        )
    if len(bufs) != len(fields) or len(rows) != len(fields):
        raise ValueError(
            f"expected {len(fields)} buffers and row tensors "
            f"({', '.join(name for name, _ in fields)}); got {len(bufs)} and {len(rows)}"
        )
    n = indices.shape[0]
    pool: int | None = None
    args: list[object] = [indices, indices.stride(0), 0]
    for (name, dtype), buf, field_rows in zip(fields, bufs, rows, strict=True):
        if field_rows is None:
            # Absent: two None pointers and width 0, so the copy compiles out and the
            # launch specialises on which fields are present, not on unused buffers.
            args += (None, None, 0)
            continue
        if buf is None:
            raise ValueError(f"relay field `{name}` has rows but no buffer; allocate it first")
        if not isinstance(field_rows, torch.Tensor):
            raise ValueError(
                f"relay field `{name}` rows must be a tensor; got {type(field_rows).__name__}"
            )
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
        if field_rows.device != buf.device or indices.device != buf.device:
            raise ValueError(
                f"relay field `{name}`: buffer on {buf.device}, rows on {field_rows.device}, "
                f"indices on {indices.device}; all must be on one device"
            )
        if pool is None:
            pool = buf.shape[0]
        elif buf.shape[0] != pool:
            raise ValueError(
                f"relay field `{name}` buffer has {buf.shape[0]} slots, another one {pool}; "
                "all buffers of a relay have req_pool_size slots"
            )
        if dtype == torch.bool:
            # Same bytes, but a plain byte pointer: Triton's handling of bool pointers
            # (int1 loaded as int8) has varied across versions.
            buf, field_rows = buf.view(torch.uint8), field_rows.view(torch.uint8)
        args += (buf, field_rows, buf.numel() // buf.shape[0])
    args[2] = pool or 0
    return args


def fused_copy(
    kernel: Any,
    fields: Sequence[tuple[str, torch.dtype | None]],
    indices: torch.Tensor,
    bufs: Sequence[torch.Tensor | None],
    rows: Sequence[torch.Tensor | None],
    *,
    to_buffers: bool,
) -> None:
    """Launch ``kernel`` once over ``indices`` (no launch for an empty batch or no field)."""
    args = launch_args(fields, indices, bufs, rows)
    if indices.shape[0] == 0 or not args[2]:
        return
    kernel[(indices.shape[0],)](*args, TO_BUFFERS=to_buffers)
