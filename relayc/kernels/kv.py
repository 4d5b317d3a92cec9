"""KV-slot bookkeeping around a verify forward.

``req_to_token[r, p]`` is the KV slot of token position ``p`` of the request living in
row ``r`` of the request pool. A verify window is the ``N`` slots a request's draft tree
was written to, ``out_cache_loc[b*N : (b+1)*N]`` in node order.

- :func:`assign_req_to_token_pool` records a window's slots in ``req_to_token``
  (SGLang's ``assign_req_to_token_pool``); :func:`read_req_to_token_pool` reads them back
  (SGLang's ``assign_extend_cache_locs``).
- :func:`fill_accept_out_cache_loc` packs the slots of the accepted nodes to the front
  (SGLang's ``fill_accept_out_cache_loc``), so their KV can be moved to the contiguous
  positions after each request's prefix.

Nothing here reads a tensor back to the host or makes a shape depend on tensor values,
so every entry point can be captured in a CUDA graph.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from relayc.kernels._backend import resolve_backend
from relayc.kernels._triton import jit, next_power_of_2, tl


def assign_req_to_token_pool(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    backend: str = "auto",
) -> None:
    """``req_to_token[req_pool_indices[b], start_offset[b]:end_offset[b]] = `` request b's slots.

    Arguments of SGLang 0.5.23's ``assign_req_to_token_pool``
    (``srt/mem_cache/allocation.py``) without its launch-size constexprs, plus ``backend``.

    Args:
        req_pool_indices: ``[B]`` int, the pool row of each request.
        req_to_token: ``[pool_size, max_context_len]`` int32/int64, written in place.
        start_offset: ``[B]`` int, first token position of each window.
        end_offset: ``[B]`` int, one past the last position (``start_offset + N`` for a
            verify window).
        out_cache_loc: ``[sum(end_offset - start_offset)]`` int, the windows' slots
            back to back in request order.
        backend: ``"auto"``, ``"torch"`` or ``"triton"``.

    Rows and positions outside the windows are left untouched; windows must not overlap.
    """
    _check_windows(req_pool_indices, req_to_token, start_offset, end_offset)
    if req_pool_indices.numel() == 0:
        return
    if resolve_backend(backend, req_to_token.device) == "triton":
        _copy_windows_triton(
            req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, to_pool=True
        )
        return
    rows, cols = _window_coordinates(
        req_pool_indices, start_offset, end_offset, out_cache_loc.numel()
    )
    req_to_token[rows, cols] = out_cache_loc.to(req_to_token.dtype)


def read_req_to_token_pool(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    num_tokens: int,
    out: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """The inverse of :func:`assign_req_to_token_pool`: the windows' slots, back to back.

    The job of SGLang 0.5.23's ``assign_extend_cache_locs``; the argument list is relayc's
    (it mirrors :func:`assign_req_to_token_pool`'s).

    ``num_tokens`` is ``sum(end_offset - start_offset)`` as a Python int (``B*N`` for
    verify windows), so the output is sized without reading the device. ``out``, when
    given, is a ``[num_tokens]`` int64 buffer that is filled and returned.
    """
    _check_windows(req_pool_indices, req_to_token, start_offset, end_offset)
    if out is None:
        out = torch.empty(num_tokens, dtype=torch.int64, device=req_to_token.device)
    else:
        out = _int64_output(out, "out", num_tokens)
    if req_pool_indices.numel() == 0:
        return out
    if resolve_backend(backend, req_to_token.device) == "triton":
        _copy_windows_triton(
            req_pool_indices, req_to_token, start_offset, end_offset, out, to_pool=False
        )
        return out
    rows, cols = _window_coordinates(req_pool_indices, start_offset, end_offset, num_tokens)
    out.copy_(req_to_token[rows, cols])
    return out


class AcceptedCacheLocs(NamedTuple):
    """What :func:`fill_accept_out_cache_loc` returns."""

    accept_out_cache_loc: torch.Tensor  # [B*(S+1)] int64: accepted slots first, then pad_slot
    accept_lens: torch.Tensor  # [B] int64: accepted entries per request (bonus included)
    accept_offsets: torch.Tensor  # [B] int64: exclusive prefix sum of accept_lens


def fill_accept_out_cache_loc(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    out: AcceptedCacheLocs | None = None,
    pad_slot: int = 0,
    backend: str = "auto",
) -> AcceptedCacheLocs:
    """Pack the KV slots of the accepted nodes to the front, in ``accept_index`` order.

    SGLang 0.5.23's ``fill_accept_out_cache_loc`` (``kernels/ops/speculative/eagle.py``)
    with its first two arguments; relayc returns the packed slots (and their count) instead
    of writing a caller's ``accept_out_cache_loc``.

    Args:
        accept_index: ``[B, S+1]`` int, row b lists the accepted nodes of request b as
            indices into the flattened verify batch (``b*N + node``, as
            ``verify_tree_greedy`` writes them); -1 entries are skipped wherever they are.
        out_cache_loc: ``[B*N]`` int, the verify windows' slots.
        out: optional preallocated int64 buffers (CUDA-graph replay), filled and returned.
        pad_slot: written after the last accepted slot. SGLang leaves that tail as
            allocated (zeros); 0 is its reserved padding slot, so the default keeps a
            fixed-size ``move_kv_cache`` over the whole buffer harmless.
        backend: ``"auto"``, ``"torch"`` or ``"triton"``.

    Request b's accepted slots land at ``accept_offsets[b] : accept_offsets[b] +
    accept_lens[b]`` - SGLang's destination is the count of non -1 entries before the
    source entry in the flattened ``accept_index``, which is the same thing.
    """
    if accept_index.dim() != 2:
        raise ValueError(f"`accept_index` must be [B, S+1]; got shape {list(accept_index.shape)}")
    batch_size, width = accept_index.shape
    device = accept_index.device
    if out is None:
        packed = torch.empty(batch_size * width, dtype=torch.int64, device=device)
        accept_lens = torch.empty(batch_size, dtype=torch.int64, device=device)
        accept_offsets = torch.empty(batch_size, dtype=torch.int64, device=device)
    else:
        packed = _int64_output(
            out.accept_out_cache_loc, "out.accept_out_cache_loc", batch_size * width
        )
        accept_lens = _int64_output(out.accept_lens, "out.accept_lens", batch_size)
        accept_offsets = _int64_output(out.accept_offsets, "out.accept_offsets", batch_size)
    if batch_size == 0 or width == 0:
        packed.fill_(pad_slot)
        accept_lens.zero_()
        accept_offsets.zero_()
        return AcceptedCacheLocs(packed, accept_lens, accept_offsets)
    if resolve_backend(backend, device) == "triton":
        _fill_accept_triton(
            accept_index, out_cache_loc, packed, accept_lens, accept_offsets, pad_slot
        )
        return AcceptedCacheLocs(packed, accept_lens, accept_offsets)

    accepted = accept_index != -1
    lens = accepted.sum(dim=1)
    accept_lens.copy_(lens)
    accept_offsets.copy_(torch.cumsum(lens, 0) - lens)
    # A stable partition of the flattened entries: accepted ones to the front, the rest
    # to the back, so every output element is written exactly once.
    flat = accepted.flatten()
    accepted_before = torch.cumsum(flat, 0) - flat.long()
    rejected_before = torch.arange(flat.numel(), device=device) - accepted_before
    dst = torch.where(flat, accepted_before, flat.sum() + rejected_before)
    slots = out_cache_loc.to(torch.int64)[accept_index.flatten().clamp(min=0)]
    packed[dst] = torch.where(flat, slots, pad_slot)
    return AcceptedCacheLocs(packed, accept_lens, accept_offsets)


def _check_windows(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
) -> None:
    if req_to_token.dim() != 2:
        raise ValueError(
            f"`req_to_token` must be [pool_size, max_context_len]; got {list(req_to_token.shape)}"
        )
    batch = req_pool_indices.shape
    for name, tensor in (("start_offset", start_offset), ("end_offset", end_offset)):
        if tensor.shape != batch:
            raise ValueError(
                f"`{name}` must have the shape of `req_pool_indices` {list(batch)}; got {list(tensor.shape)}"
            )


def _int64_output(buf: torch.Tensor, name: str, numel: int) -> torch.Tensor:
    if buf.shape != (numel,) or buf.dtype != torch.int64 or not buf.is_contiguous():
        raise ValueError(
            f"`{name}` must be a contiguous int64 tensor of shape [{numel}]; "
            f"got {buf.dtype} {list(buf.shape)}"
        )
    return buf


def _window_coordinates(
    req_pool_indices: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    num_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(pool row, token position) of every slot of the back-to-back windows."""
    lens = (end_offset - start_offset).to(torch.int64)
    ends = torch.cumsum(lens, 0)
    flat = torch.arange(num_tokens, device=req_pool_indices.device)
    req = torch.searchsorted(ends, flat, right=True)
    cols = start_offset.to(torch.int64)[req] + flat - (ends - lens)[req]
    return req_pool_indices.to(torch.int64)[req], cols


def _copy_windows_triton(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    flat_slots: torch.Tensor,
    to_pool: bool,
) -> None:
    lens = (end_offset - start_offset).to(torch.int64)
    window_offsets = torch.cumsum(lens, 0) - lens
    _copy_windows_kernel[(req_pool_indices.numel(),)](
        req_pool_indices,
        req_to_token,
        req_to_token.stride(0),
        start_offset,
        end_offset,
        window_offsets,
        flat_slots,
        TO_POOL=to_pool,
        BLOCK=64,
    )


def _fill_accept_triton(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    packed: torch.Tensor,
    accept_lens: torch.Tensor,
    accept_offsets: torch.Tensor,
    pad_slot: int,
) -> None:
    batch_size, width = accept_index.shape
    accept_index = accept_index.contiguous()
    _fill_accept_kernel[(batch_size,)](
        accept_index,
        out_cache_loc,
        packed,
        accept_lens,
        accept_offsets,
        batch_size,
        width,
        pad_slot,
        BLOCK_ROWS=16,
        BLOCK_WIDTH=max(next_power_of_2(width), 2),
    )


@jit
def _copy_windows_kernel(
    req_pool_indices_ptr,
    req_to_token_ptr,
    pool_stride,
    start_ptr,
    end_ptr,
    window_offsets_ptr,
    flat_slots_ptr,
    TO_POOL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    row = tl.load(req_pool_indices_ptr + b).to(tl.int64)
    start = tl.load(start_ptr + b).to(tl.int64)
    length = tl.load(end_ptr + b).to(tl.int64) - start
    pool = req_to_token_ptr + row * pool_stride + start
    flat = flat_slots_ptr + tl.load(window_offsets_ptr + b)
    cols = tl.arange(0, BLOCK)
    for first in range(0, length, BLOCK):
        c = first + cols
        inside = c < length
        if TO_POOL:
            tl.store(pool + c, tl.load(flat + c, mask=inside), mask=inside)
        else:
            tl.store(flat + c, tl.load(pool + c, mask=inside), mask=inside)


@jit
def _fill_accept_kernel(
    accept_index_ptr,
    out_cache_loc_ptr,
    packed_ptr,
    accept_lens_ptr,
    accept_offsets_ptr,
    batch_size,
    width,
    pad_slot,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_WIDTH: tl.constexpr,
):
    # One program per request. Each counts the accepted entries of the rows before it
    # and of the whole batch itself, so the launch needs no separate prefix-sum pass.
    b = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_WIDTH)
    in_row = cols < width
    accepted_before_row = tl.zeros([], dtype=tl.int64)
    total_accepted = tl.zeros([], dtype=tl.int64)
    for first in range(0, batch_size, BLOCK_ROWS):
        rows = first + tl.arange(0, BLOCK_ROWS)
        tile = tl.load(
            accept_index_ptr + rows[:, None] * width + cols[None, :],
            mask=(rows[:, None] < batch_size) & in_row[None, :],
            other=-1,
        )
        per_row = tl.sum((tile != -1).to(tl.int64), axis=1)
        total_accepted += tl.sum(per_row, axis=0)
        accepted_before_row += tl.sum(tl.where(rows < b, per_row, 0), axis=0)

    src = tl.load(accept_index_ptr + b * width + cols, mask=in_row, other=-1)
    accepted = (src != -1) & in_row
    accepted_i64 = accepted.to(tl.int64)
    rank = tl.cumsum(accepted_i64, axis=0) - accepted_i64
    rejected_rank = cols - rank
    rejected_before_row = b * width - accepted_before_row
    dst = tl.where(
        accepted,
        accepted_before_row + rank,
        total_accepted + rejected_before_row + rejected_rank,
    )
    slot = tl.load(out_cache_loc_ptr + src, mask=accepted, other=0).to(tl.int64)
    tl.store(packed_ptr + dst, tl.where(accepted, slot, pad_slot), mask=in_row)
    tl.store(accept_lens_ptr + b, tl.sum(accepted_i64, axis=0))
    tl.store(accept_offsets_ptr + b, accepted_before_row)


def assign_req_to_token_pool_reference(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> None:
    """Plain loops; the spec :func:`assign_req_to_token_pool` is tested against."""
    flat = 0
    for b in range(req_pool_indices.numel()):
        row = int(req_pool_indices[b])
        for col in range(int(start_offset[b]), int(end_offset[b])):
            req_to_token[row, col] = out_cache_loc[flat]
            flat += 1
    if flat != out_cache_loc.numel():
        raise ValueError(
            f"`out_cache_loc` holds {out_cache_loc.numel()} slots; the windows need {flat}"
        )


def read_req_to_token_pool_reference(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
) -> torch.Tensor:
    """Plain loops; the spec :func:`read_req_to_token_pool` is tested against."""
    slots = []
    for b in range(req_pool_indices.numel()):
        row = int(req_pool_indices[b])
        for col in range(int(start_offset[b]), int(end_offset[b])):
            slots.append(int(req_to_token[row, col]))
    return torch.tensor(slots, dtype=torch.int64, device=req_to_token.device)


def fill_accept_out_cache_loc_reference(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pad_slot: int = 0,
) -> AcceptedCacheLocs:
    """Plain loops; the spec :func:`fill_accept_out_cache_loc` is tested against."""
    packed = []
    lens = []
    offsets = []
    for row in accept_index.tolist():
        offsets.append(len(packed))
        for src in row:
            if src != -1:
                packed.append(int(out_cache_loc[src]))
        lens.append(len(packed) - offsets[-1])
    packed += [pad_slot] * (accept_index.numel() - len(packed))
    device = accept_index.device
    return AcceptedCacheLocs(
        torch.tensor(packed, dtype=torch.int64, device=device),
        torch.tensor(lens, dtype=torch.int64, device=device),
        torch.tensor(offsets, dtype=torch.int64, device=device),
    )
