"""The small ATen ops of a recorded decode step as native calls (``relayc.runtime.tape``).

A CPU graph replays a step's ATen ops without the Python around them, but each op still
runs ATen's dispatch and kernel code, cold right after a forward has streamed the weights
through the caches: an ``index_copy_`` of one row took 110-150 us there, a native call
about 25 (``bench/engine.py --steps``, SmolLM2). The relay's row moves are such ops:
``resolve`` gathers request rows (``index_select``), ``stash`` scatters them
(``index_copy_``), a captured step zeroes the padding slot (``zero_``), and ops copy and
clone. Each is lowered here when its tensors are plain contiguous CPU memory of one dtype --
the same bytes moved, so the same values -- and recorded as ATen's op otherwise. The
native row moves check every index before they write, and a replay that meets a refused
index stops as ``relayc.runtime.tape`` says.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import torch

from relayc.runtime.tape import register_lowering, register_native_batch

aten = torch.ops.aten

Call = tuple[Any, ...] | None  # (function, arguments[, what they point into])


def _plain(*tensors: Any) -> bool:
    """Contiguous CPU tensors of one dtype (a view's ``data_ptr`` includes its offset)."""
    first = tensors[0]
    return all(
        isinstance(t, torch.Tensor)
        and t.device.type == "cpu"
        and t.is_contiguous()
        and t.dtype == first.dtype
        for t in tensors
    )


def _row_bytes(t: torch.Tensor) -> int:
    return t[0].numel() * t.element_size()


def _index(index: Any, flat: bool = True) -> bool:
    """A contiguous int64 CPU tensor of row indices (one-dimensional where ``flat``)."""
    return (
        isinstance(index, torch.Tensor)
        and index.dtype == torch.int64
        and index.device.type == "cpu"
        and (index.dim() == 1 or not flat)
        and index.is_contiguous()
    )


def install(lib: ctypes.CDLL) -> None:
    """Register the lowerings onto ``lib``'s functions (once the library has loaded)."""
    gather, scatter = lib.relayc_gather_rows, lib.relayc_scatter_rows
    copy, zero = lib.relayc_copy_bytes, lib.relayc_zero_bytes
    cat_bytes, fill, cast = lib.relayc_cat_bytes, lib.relayc_fill_pattern, lib.relayc_cast_int
    add_int = lib.relayc_add_int64

    def take_rows(src: Any, rows: Any, wrap: int, out: Any) -> Call:
        """out = src's rows ``rows`` (dim 0), as one native gather, where it can be."""
        if not _plain(src, out) or src.dim() < 1 or not src.shape[0]:
            return None
        if out.numel() != rows.numel() * src[0].numel():
            return None
        row_bytes, count = _row_bytes(src), rows.numel()
        return gather, (
            src.data_ptr(),
            src.shape[0],
            row_bytes,
            rows.data_ptr(),
            count,
            wrap,
            out.data_ptr(),
        )

    def index_select(args: tuple[Any, ...], kwargs: dict[str, Any], outs: Sequence[Any]) -> Call:
        src, dim, index = (list(args) + [None] * 3)[:3]
        if kwargs or dim != 0 or not _index(index):
            return None
        return take_rows(src, index, 0, outs[0])  # a negative index is refused, as ATen's

    def index(args: tuple[Any, ...], kwargs: dict[str, Any], outs: Sequence[Any]) -> Call:
        src, indices = args[0], args[1]
        rows = indices[0] if len(indices) == 1 else None
        if kwargs or not _index(rows, flat=False):
            return None
        # src[rows]: rows' shape, then src's row shape; negative rows count from the end
        return take_rows(src, rows, 1, outs[0])

    def cat(args: tuple[Any, ...], kwargs: dict[str, Any], outs: Sequence[Any]) -> Call:
        tensors, dim = args[0], args[1] if len(args) > 1 else kwargs.get("dim", 0)
        out = outs[0]
        if not tensors or not _plain(out, *tensors) or out.dim() == 0:
            return None
        dim = dim % out.dim()
        if any(t.dim() != out.dim() for t in tensors):
            return None  # torch.cat's legacy empty [0] inputs: ATen's way
        outer = out.shape[:dim].numel()
        inner = [t.shape[dim:].numel() * t.element_size() for t in tensors]
        pointers = (ctypes.c_void_p * len(tensors))(*(t.data_ptr() for t in tensors))
        sizes = (ctypes.c_int64 * len(tensors))(*inner)
        return cat_bytes, (out.data_ptr(), outer, len(tensors), pointers, sizes)

    def full(args: tuple[Any, ...], kwargs: dict[str, Any], outs: Sequence[Any]) -> Call:
        out = outs[0]
        if not _plain(out) or not out.numel():
            return None
        pattern = out.reshape(-1)[:1].clone()  # the value as the out tensor holds it
        return fill, (out.data_ptr(), out.numel(), out.element_size(), pattern.data_ptr()), pattern

    def to_copy(args: tuple[Any, ...], kwargs: dict[str, Any], outs: Sequence[Any]) -> Call:
        dst, src = args[0], args[1]  # recorded as copy_ into the tensor _to_copy made
        ints = (torch.int64, torch.int32)
        if dst.dtype == src.dtype or dst.dtype not in ints or src.dtype not in ints:
            return copy_(args, kwargs, outs)
        if not (_plain(dst) and _plain(src) and dst.shape == src.shape):
            return None
        return cast, (
            src.data_ptr(),
            src.element_size(),
            dst.data_ptr(),
            dst.element_size(),
            dst.numel(),
        )

    def index_copy_(args: tuple[Any, ...], kwargs: dict[str, Any], outs: Sequence[Any]) -> Call:
        dst, dim, index, src = (list(args) + [None] * 4)[:4]
        if kwargs or dim != 0 or not _index(index) or not _plain(dst, src) or dst.dim() < 1:
            return None
        if dst.shape[1:] != src.shape[1:] or src.shape[0] != index.numel() or not dst.shape[0]:
            return None
        return scatter, (
            dst.data_ptr(),
            dst.shape[0],
            _row_bytes(dst),
            index.data_ptr(),
            index.numel(),
            src.data_ptr(),
        )

    def zero_(args: tuple[Any, ...], kwargs: dict[str, Any], outs: Sequence[Any]) -> Call:
        (dst,) = args
        if kwargs or not _plain(dst):
            return None
        return zero, (dst.data_ptr(), dst.numel() * dst.element_size())

    def copy_(args: tuple[Any, ...], kwargs: dict[str, Any], outs: Sequence[Any]) -> Call:
        dst, src = args[0], args[1]  # non_blocking changes nothing on the CPU
        if not _plain(dst, src) or dst.shape != src.shape:
            return None
        return copy, (dst.data_ptr(), src.data_ptr(), dst.numel() * dst.element_size())

    def clone(args: tuple[Any, ...], kwargs: dict[str, Any], outs: Sequence[Any]) -> Call:
        return copy_((outs[0], args[0]), {}, outs)

    def arithmetic(sign: int) -> Any:
        def lowering(args: tuple[Any, ...], kwargs: dict[str, Any], outs: Sequence[Any]) -> Call:
            a, b, out = args[0], args[1], outs[0]
            if type(b) is int:  # a Python int operand: as the int64 it adds
                b = torch.tensor(b, dtype=torch.int64)
            if kwargs.get("alpha", 1) != 1 or len(args) > 2 or not _plain(a, b, out):
                return None
            if a.dtype != torch.int64 or not b.numel() or not out.numel() or b.dim() > out.dim():
                return None
            shape = tuple(out.shape)
            if tuple(a.shape) == shape:
                # b the same shape, or broadcast along the leading dimensions (its trailing
                # shape out's, or a single element)
                if b.numel() != 1 and tuple(b.shape) != shape[out.dim() - b.dim() :]:
                    return None
                a_rep = 1
            elif (
                out.dim() >= 1  # a column and a row: out[..., j] = a[..., 0] + b[j]
                and tuple(a.shape) == (*shape[:-1], 1)
                and tuple(b.shape) == shape[-1:]
            ):
                a_rep = shape[-1]
            else:
                return None
            n = out.numel()
            pointers = (a.data_ptr(), b.data_ptr(), n, a_rep, b.numel(), sign, out.data_ptr())
            return add_int, pointers, b

        return lowering

    register_lowering(aten.index_select.default, index_select)
    register_lowering(aten.index_copy_.default, index_copy_)
    register_lowering(aten.zero_.default, zero_)
    register_lowering(aten.clone.default, clone)
    register_lowering(aten.add.Tensor, arithmetic(1))
    register_lowering(aten.sub.Tensor, arithmetic(-1))
    register_lowering(aten.index.Tensor, index)
    register_lowering(aten.cat.default, cat)
    for factory in (
        aten.full.default,
        aten.full_like.default,
        aten.zeros.default,
        aten.zeros_like.default,
        aten.ones_like.default,
    ):
        register_lowering(factory, full)
    register_lowering(aten.copy_.default, to_copy)
    # the library's own runner of recorded calls: a tape's runs of them in one call each
    names: list[str] = []
    while (name := lib.relayc_tape_name(len(names))) is not None:
        names.append(name.decode())
    register_native_batch(lib, names)
