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
:data:`AVAILABLE` says whether the kernel exists. :func:`launch_args` checks a call on the
host before any launch; :func:`count_triton_launches` counts launches for the tests and
``bench/relay.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

try:  # optional: only the fused path (CUDA, or backend='triton') launches it
    import triton
    import triton.language as tl
except ImportError:
    AVAILABLE = False
else:
    AVAILABLE = True

KERNEL = "_relay_copy_kernel"  # the name count_triton_launches counts
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


@dataclass
class RelayLaunches:
    """Relay kernel launches seen by :func:`count_triton_launches`: ("stash" or "resolve", grid)."""

    launches: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)

    @property
    def stash(self) -> int:
        return sum(name == "stash" for name, _ in self.launches)

    @property
    def resolve(self) -> int:
        return sum(name == "resolve" for name, _ in self.launches)


@contextlib.contextmanager
def count_triton_launches() -> Iterator[RelayLaunches]:
    """Record every launch of the relay kernel (compiled or interpreted) inside the block.

    For tests and ``bench/relay.py``. Patches ``run`` on Triton's kernel classes, because a
    launch ``kernel[grid](...)`` always ends there; warm-up compiles are not counted.
    """
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    seen = RelayLaunches()
    originals = {cls: cls.run for cls in (JITFunction, InterpretedFunction)}

    def patched(original: Callable[..., Any]) -> Callable[..., Any]:
        # One closure per class: each keeps its own `run`.
        def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            if not warmup and self.__name__ == KERNEL:
                direction = "stash" if kwargs["TO_BUFFERS"] else "resolve"
                seen.launches.append((direction, tuple(grid)))
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)

        return run

    for cls, original in originals.items():
        cls.run = patched(original)
    try:
        yield seen
    finally:
        for cls, original in originals.items():
            cls.run = original
