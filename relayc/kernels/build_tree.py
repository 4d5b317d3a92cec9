"""Build the verify tree from EAGLE drafting results (SGLang's ``build_tree_kernel_efficient``).

The signature is SGLang 0.5.23's ``build_tree_kernel_efficient``
(``sglang/srt/speculative/eagle_utils.py``): ``bonus_tokens`` first, ``parent_list``
a tensor or a list of tensors, ``tree_mask_buf`` and ``fill_prefix_mask``; relayc adds
keyword-only ``positions_buf``, ``retrive_buf`` and ``backend``, and keeps
``verified_id=`` (the pre-0.5.23 name of ``bonus_tokens``) as a deprecated alias.
Index inputs may be int64 or int32 (SGLang's callers pass both); other dtypes are
rejected with the dtype named.

EAGLE drafts ``spec_steps`` levels; level 0 offers ``topk`` candidates under the root and
each later level offers ``topk * topk`` (``topk`` children of each of the ``topk`` beams
kept at the previous level). Flattened per request, candidate ``x`` of the score list is

    level 0:  x in [0, topk)                          parent: the root
    level s:  x = topk + (s-1)*topk*topk + j*topk + k  parent: the flat index
              ``parent_list[b, x // topk]`` of beam j kept at level s-1

so ``x // topk == 0`` means "child of the root", and ``parent_list[b, 0]`` (-1) is never
read. ``top_scores_index[b]`` holds the ``N - 1`` best candidates, sorted ascending;
tree node ``i >= 1`` is candidate ``top_scores_index[b, i - 1]`` and node 0 is the root
(the token verified last round). Scores are products of probabilities, so a child never
outscores its parent and every selected node's parent is selected too.

Outputs, per request ``b`` (N = ``num_verify_tokens``):

- ``positions[b*N + i] = seq_lens[b] + depth(i)`` (root depth 0).
- ``retrive_index[b, i] = b*N + i``: the node's row in the flattened verify batch.
- ``retrive_next_token[b, i]``: the first child of node i, -1 if none.
- ``retrive_next_sibling[b, i]``: the next child of i's parent, -1 if none.
  Sibling order (SGLang's, replicated exactly): the CUDA kernel walks i = N-1 down to 1
  and pushes each node to the front of its parent's child list, so the last-pushed
  child - the one with the SMALLEST node index - is ``retrive_next_token[parent]`` and
  ``retrive_next_sibling`` chains siblings in ASCENDING node index (ascending flat
  candidate index). ``verify_tree_greedy`` tries children in this order, so the first
  matching sibling wins.
- ``tree_mask`` (flattened as SGLang does):
  ``FULL_MASK``: request b owns a block ``[N, seq_lens[b] + N]`` starting at
  ``N*N*b + N*sum(seq_lens[:b])``; row i is True over the whole prefix ``[0, seq_len)``,
  at the root column ``seq_len`` and at ``seq_len + j`` for every node j on the path
  from i up to (not including) the root, i itself included.
  ``QLEN_ONLY``: only the draft window, ``[B, N, N]`` flattened; row i is the same as
  the last N columns of the full row. This is the mask the reference engine's verify
  forward uses (attend the whole prefix plus this window).
  ``QLEN_ONLY_BITPACKING``: the window packed one integer per row, ``[B*N]``: bit ``j``
  of row ``b*N + i`` is window column ``j`` (little-endian bytes, as SGLang's
  ``build_tree_efficient_partial_packed``); uint8 for ``N <= 8``, uint16 for
  ``N <= 16``, uint32 for ``N <= 32``, larger ``N`` rejected.
  ``fill_prefix_mask=False`` (FULL_MASK only) leaves the prefix columns ``[0, seq_len)``
  of each row unwritten, for callers whose attention never reads them (SGLang skips
  the memset the same way); in a fresh allocation they are then undefined.
- ``draft_tokens``: ``cat(bonus_tokens[:, None], draft_tokens)`` flattened to ``[B*N]``.

Malformed trees (a selected node whose parent was not selected, e.g. after NaN logits)
follow SGLang's hardened kernel: the node is left unlinked (no parent link, no sibling),
its ancestor walk stops at the missing parent, and no walk takes more than
``spec_steps`` steps, so nothing loops.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from enum import IntEnum
from typing import NamedTuple, TypeVar

import torch

from relayc.kernels._backend import host_loops, resolve_backend
from relayc.kernels._triton import jit, next_power_of_2, tl

_T = TypeVar("_T")


class TreeMaskMode(IntEnum):
    """Layout of ``tree_mask``; the values are SGLang's."""

    FULL_MASK = 0
    QLEN_ONLY = 1
    QLEN_ONLY_BITPACKING = 2


# The packed row width by N, as SGLang allocates it.
_PACKED_DTYPES = ((8, torch.uint8), (16, torch.uint16), (32, torch.uint32))
MAX_BITPACKED_NODES = 32


def packed_mask_dtype(num_verify_tokens: int) -> torch.dtype:
    """The element type of a QLEN_ONLY_BITPACKING mask for ``num_verify_tokens`` nodes."""
    for width, dtype in _PACKED_DTYPES:
        if num_verify_tokens <= width:
            return dtype
    raise ValueError(
        f"QLEN_ONLY_BITPACKING packs at most {MAX_BITPACKED_NODES} nodes per row; "
        f"got `num_verify_tokens`={num_verify_tokens} (use TreeMaskMode.QLEN_ONLY)"
    )


class BuiltTree(NamedTuple):
    """What :func:`build_tree` returns; unpacks in the order of SGLang's 6-tuple."""

    # FULL_MASK: [seq_lens_sum*N + B*N*N] bool; QLEN_ONLY: [B*N*N] bool;
    # QLEN_ONLY_BITPACKING: [B*N] uint8/uint16/uint32 (packed_mask_dtype)
    tree_mask: torch.Tensor
    positions: torch.Tensor  # [B*N] int64
    retrive_index: torch.Tensor  # [B, N] int64
    retrive_next_token: torch.Tensor  # [B, N] int64, -1 = none
    retrive_next_sibling: torch.Tensor  # [B, N] int64, -1 = none
    draft_tokens: torch.Tensor  # [B*N], the verified token first in each request


def tree_mask_numel(
    batch_size: int, seq_lens_sum: int, num_verify_tokens: int, tree_mask_mode: TreeMaskMode
) -> int:
    """Number of elements of ``tree_mask`` (for callers that preallocate ``tree_mask_buf``)."""
    window = batch_size * num_verify_tokens * num_verify_tokens
    mode = TreeMaskMode(tree_mask_mode)
    if mode == TreeMaskMode.FULL_MASK:
        return seq_lens_sum * num_verify_tokens + window
    if mode == TreeMaskMode.QLEN_ONLY_BITPACKING:
        return batch_size * num_verify_tokens
    return window


def _mask_dtype(tree_mask_mode: TreeMaskMode, num_verify_tokens: int) -> torch.dtype:
    if tree_mask_mode == TreeMaskMode.QLEN_ONLY_BITPACKING:
        return packed_mask_dtype(num_verify_tokens)
    return torch.bool


def pack_tree_mask(window: torch.Tensor) -> torch.Tensor:
    """``[..., N, N]`` bool window -> ``[...*N]`` packed rows (bit ``j`` = column ``j``)."""
    n = window.shape[-1]
    bits = torch.arange(n, device=window.device)
    packed = (window.reshape(-1, n).to(torch.int64) << bits).sum(-1)
    return packed.to(packed_mask_dtype(n))


def unpack_tree_mask(packed: torch.Tensor, num_verify_tokens: int) -> torch.Tensor:
    """The inverse of :func:`pack_tree_mask`: ``[B*N]`` packed -> ``[B*N*N]`` bool."""
    bits = torch.arange(num_verify_tokens, device=packed.device)
    return ((packed.to(torch.int64)[:, None] >> bits) & 1).to(torch.bool).flatten()


def build_tree(
    bonus_tokens: torch.Tensor | None = None,
    parent_list: torch.Tensor | Sequence[torch.Tensor] | None = None,
    top_scores_index: torch.Tensor | None = None,
    draft_tokens: torch.Tensor | None = None,
    seq_lens: torch.Tensor | None = None,
    seq_lens_sum: int = 0,
    topk: int = 1,
    spec_steps: int = 1,
    num_verify_tokens: int = 1,
    tree_mask_mode: TreeMaskMode = TreeMaskMode.FULL_MASK,
    tree_mask_buf: torch.Tensor | None = None,
    fill_prefix_mask: bool = True,
    *,
    positions_buf: torch.Tensor | None = None,
    retrive_buf: torch.Tensor | None = None,
    backend: str = "auto",
    verified_id: torch.Tensor | None = None,
) -> BuiltTree:
    """Tree mask, positions and retrive arrays for one verify forward.

    Follows SGLang 0.5.23's ``build_tree_kernel_efficient`` signature (positional
    arguments in its order; the defaults of the required ones only exist so that the
    deprecated ``verified_id=`` keyword can stand in for ``bonus_tokens``).

    Args:
        bonus_tokens: ``[B]`` the token each request emitted last round (its bonus
            token); it becomes node 0.
        parent_list: ``[B, topk*(spec_steps-1)+1]`` int64/int32, the flat candidate index
            of every beam kept while drafting, or the list of per-step ``[B, w]`` parent
            tensors that concatenate (dim 1) to it (SGLang's ``organize_draft_results``);
            width 0 (or an empty list) is accepted when ``spec_steps == 1``.
        top_scores_index: ``[B, N-1]`` int64/int32, the selected flat candidate indices,
            sorted.
        draft_tokens: ``[B, N-1]`` the token ids of the selected candidates.
        seq_lens: ``[B]`` int64/int32, tokens already in each request's KV cache (the
            root's position).
        seq_lens_sum: ``sum(seq_lens)`` as a Python int, so the FULL_MASK output can be
            allocated without reading the device (ignored by the other modes).
        topk: candidates kept per beam per drafting level.
        spec_steps: drafting depth (the deepest node has depth ``spec_steps``).
        num_verify_tokens: N, tree nodes per request including the root.
        tree_mask_mode: ``FULL_MASK`` (prefix + window rows), ``QLEN_ONLY`` (window) or
            ``QLEN_ONLY_BITPACKING`` (window rows packed into bits).
        tree_mask_buf: optional preallocated output of :func:`tree_mask_numel` elements
            (bool, or :func:`packed_mask_dtype` when bit-packed) for CUDA-graph replay;
            every element is rewritten (but see ``fill_prefix_mask``).
        fill_prefix_mask: FULL_MASK only: ``False`` leaves the prefix columns unwritten.
        positions_buf: optional preallocated ``[B*N]`` int64 output for ``positions``.
        retrive_buf: optional preallocated ``[3, B, N]`` int64 output holding
            ``retrive_index``, ``retrive_next_token``, ``retrive_next_sibling``.
        backend: ``"auto"``, ``"torch"`` or ``"triton"`` (see ``relayc.kernels._backend``).
        verified_id: deprecated name of ``bonus_tokens`` (SGLang before 0.5.23).

    No output shape depends on tensor values and nothing is read back to the host.
    """
    bonus_tokens = _bonus_tokens(bonus_tokens, verified_id)
    parent_list = _required(parent_list, "parent_list")
    top_scores_index = _required(top_scores_index, "top_scores_index")
    draft_tokens = _required(draft_tokens, "draft_tokens")
    seq_lens = _required(seq_lens, "seq_lens")
    tree_mask_mode = TreeMaskMode(tree_mask_mode)
    n = num_verify_tokens
    batch_size = seq_lens.shape[0]
    device = seq_lens.device
    parent_list = _parent_tensor(parent_list, batch_size, device)
    _check_inputs(
        bonus_tokens, parent_list, top_scores_index, draft_tokens, seq_lens, topk, spec_steps, n
    )
    mask_dtype = _mask_dtype(tree_mask_mode, n)
    parent_list = parent_list.to(torch.int64)
    top_scores_index = top_scores_index.to(torch.int64)
    buffers = (tree_mask_buf, positions_buf, retrive_buf)
    if (
        tree_mask_mode != TreeMaskMode.FULL_MASK
        and all(buf is None for buf in buffers)
        and host_loops(backend, device, batch_size)
    ):
        return build_tree_reference(
            bonus_tokens,
            parent_list,
            top_scores_index,
            draft_tokens,
            seq_lens,
            seq_lens_sum,
            topk,
            spec_steps,
            n,
            tree_mask_mode,
        )
    mask_numel = tree_mask_numel(batch_size, seq_lens_sum, n, tree_mask_mode)
    tree_mask = _output(tree_mask_buf, "tree_mask_buf", (mask_numel,), mask_dtype, device)
    positions = _output(positions_buf, "positions_buf", (batch_size * n,), torch.int64, device)
    retrive = _output(retrive_buf, "retrive_buf", (3, batch_size, n), torch.int64, device)
    retrive_index, retrive_next_token, retrive_next_sibling = retrive.unbind(0)
    if parent_list.shape[1] == 0:
        # spec_steps == 1: no index is ever read, but kernels need a valid address.
        parent_list = torch.full((batch_size, 1), -1, dtype=torch.int64, device=device)
    seq_lens = seq_lens.to(torch.int64)
    # The kernels write bool windows; a packed mask is built from one (a [B*N*N] scratch).
    packed = tree_mask_mode == TreeMaskMode.QLEN_ONLY_BITPACKING
    kernel_mode = TreeMaskMode.QLEN_ONLY if packed else tree_mask_mode
    kernel_mask = (
        torch.empty(batch_size * n * n, dtype=torch.bool, device=device) if packed else tree_mask
    )

    if batch_size > 0:
        impl = (
            _build_tree_triton
            if resolve_backend(backend, device) == "triton"
            else _build_tree_torch
        )
        impl(
            parent_list,
            top_scores_index,
            seq_lens,
            kernel_mask,
            positions,
            retrive_index,
            retrive_next_token,
            retrive_next_sibling,
            topk,
            spec_steps,
            n,
            kernel_mode,
            fill_prefix_mask,
        )
    if packed:
        tree_mask.copy_(pack_tree_mask(kernel_mask.view(batch_size, n, n)))
    tokens = torch.cat((bonus_tokens.unsqueeze(1), draft_tokens), dim=1).flatten()
    return BuiltTree(
        tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling, tokens
    )


def _required(value: _T | None, name: str) -> _T:
    if value is None:
        raise TypeError(f"build_tree() missing required argument `{name}`")
    return value


def _bonus_tokens(
    bonus_tokens: torch.Tensor | None, verified_id: torch.Tensor | None
) -> torch.Tensor:
    if verified_id is not None:
        if bonus_tokens is not None:
            raise TypeError(
                "build_tree() got both `bonus_tokens` and its deprecated alias `verified_id`; "
                "pass only `bonus_tokens`"
            )
        warnings.warn(
            "build_tree(verified_id=...) is deprecated: SGLang 0.5.23 renamed it "
            "`bonus_tokens`; pass bonus_tokens=... (or positionally)",
            DeprecationWarning,
            stacklevel=3,
        )
        return verified_id
    if bonus_tokens is None:
        raise TypeError("build_tree() missing required argument `bonus_tokens`")
    return bonus_tokens


def _parent_tensor(
    parent_list: torch.Tensor | Sequence[torch.Tensor], batch_size: int, device: torch.device
) -> torch.Tensor:
    """SGLang 0.5.23 types ``parent_list`` as a list of per-step tensors; one tensor (their
    concatenation, what ``organize_draft_results`` returns) is accepted too."""
    if isinstance(parent_list, torch.Tensor):
        return parent_list
    parts = list(parent_list)
    if not all(isinstance(part, torch.Tensor) for part in parts):
        raise TypeError(
            "`parent_list` must be a tensor or a list of tensors; got "
            f"{[type(part).__name__ for part in parts]}"
        )
    if not parts:
        return torch.empty(batch_size, 0, dtype=torch.int64, device=device)
    return torch.cat(parts, dim=1)


def _output(
    buf: torch.Tensor | None,
    name: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    if buf is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if tuple(buf.shape) != shape or buf.dtype != dtype or not buf.is_contiguous():
        raise ValueError(
            f"`{name}` must be a contiguous {dtype} tensor of shape {list(shape)}; "
            f"got {buf.dtype} {list(buf.shape)}"
        )
    return buf


def _check_inputs(
    bonus_tokens: torch.Tensor,
    parent_list: torch.Tensor,
    top_scores_index: torch.Tensor,
    draft_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    spec_steps: int,
    n: int,
) -> None:
    batch_size = seq_lens.shape[0]
    if topk < 1 or spec_steps < 1 or n < 1:
        raise ValueError(
            f"`topk`, `spec_steps` and `num_verify_tokens` must be >= 1; got {topk}, {spec_steps}, {n}"
        )
    max_nodes = 1 + topk + (spec_steps - 1) * topk * topk
    if n > max_nodes:
        raise ValueError(
            f"`num_verify_tokens`={n} exceeds the {max_nodes} nodes that topk={topk}, "
            f"spec_steps={spec_steps} can draft (root included)"
        )
    parent_width = topk * (spec_steps - 1) + 1
    expected = {
        "bonus_tokens": (bonus_tokens, (batch_size,)),
        "top_scores_index": (top_scores_index, (batch_size, n - 1)),
        "draft_tokens": (draft_tokens, (batch_size, n - 1)),
    }
    for name, (tensor, shape) in expected.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(f"`{name}` must have shape {list(shape)}; got {list(tensor.shape)}")
    if (
        parent_list.dim() != 2
        or parent_list.shape[0] != batch_size
        or parent_list.shape[1]
        not in (
            parent_width,
            0 if spec_steps == 1 else parent_width,
        )
    ):
        raise ValueError(
            f"`parent_list` must have shape [{batch_size}, {parent_width}] "
            f"(topk*(spec_steps-1)+1); got {list(parent_list.shape)}"
        )
    for name, tensor in (
        ("parent_list", parent_list),
        ("top_scores_index", top_scores_index),
        ("seq_lens", seq_lens),
    ):
        if tensor.dtype not in (torch.int64, torch.int32):
            raise TypeError(
                f"`{name}` must be int64 or int32; got {tensor.dtype} (convert with .long())"
            )


def _build_tree_torch(
    parent_list: torch.Tensor,
    top_scores_index: torch.Tensor,
    seq_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    spec_steps: int,
    n: int,
    tree_mask_mode: TreeMaskMode,
    fill_prefix_mask: bool,
) -> None:
    batch_size = seq_lens.shape[0]
    device = seq_lens.device
    nodes = torch.arange(n, device=device)
    none = torch.full((), -1, dtype=torch.int64, device=device)
    # node_sel[b, i]: flat candidate index of node i; the root gets -1, which matches nothing.
    node_sel = torch.cat(
        (torch.full((batch_size, 1), -1, dtype=torch.int64, device=device), top_scores_index), dim=1
    )
    has_sel = (nodes >= 1).expand(batch_size, n)
    parent_tb = torch.where(has_sel, node_sel // topk, 0)
    parent_flat = torch.gather(parent_list, 1, parent_tb)
    # SGLang takes the first selected position holding the parent's flat index.
    match = (parent_flat.unsqueeze(2) == node_sel.unsqueeze(1)) & has_sel.unsqueeze(1)
    found = torch.where(match, nodes, n).amin(dim=2)
    parent_node = torch.where(parent_tb == 0, 0, torch.where(found < n, found, none))
    parent_node = torch.where(has_sel, parent_node, none)

    cur = torch.where(has_sel, nodes, none)
    depth = torch.zeros(batch_size, n, dtype=torch.int64, device=device)
    on_path = (nodes == 0).expand(batch_size, n, n).clone()
    for _ in range(spec_steps):
        active = cur >= 1
        on_path |= active.unsqueeze(2) & (nodes == cur.unsqueeze(2))
        depth += active
        cur = torch.where(active, torch.gather(parent_node, 1, cur.clamp(min=0)), none)

    linked = parent_node >= 0
    child_of = (parent_node.unsqueeze(1) == nodes.unsqueeze(1)) & linked.unsqueeze(1)  # [b, p, i]
    first_child = torch.where(child_of, nodes, n).amin(dim=2)
    later_sibling = (
        (parent_node.unsqueeze(2) == parent_node.unsqueeze(1))
        & (linked.unsqueeze(2) & linked.unsqueeze(1))
        & (nodes > nodes.unsqueeze(1))
    )
    next_sibling = torch.where(later_sibling, nodes, n).amin(dim=2)

    positions.copy_((seq_lens.unsqueeze(1) + depth).flatten())
    retrive_index.copy_(torch.arange(batch_size * n, device=device).view(batch_size, n))
    retrive_next_token.copy_(torch.where(first_child < n, first_child, none))
    retrive_next_sibling.copy_(torch.where(next_sibling < n, next_sibling, none))

    if tree_mask_mode == TreeMaskMode.QLEN_ONLY:
        tree_mask.copy_(on_path.flatten())
        return
    # Locate each flat mask element's (request, row, column) so the whole mask is one
    # elementwise pass whose size is known on the host.
    row_len = seq_lens + n
    block_start = n * (torch.cumsum(row_len, 0) - row_len)
    flat = torch.arange(tree_mask.numel(), device=device)
    req = torch.searchsorted(block_start, flat, right=True) - 1
    local = flat - block_start[req]
    row = local // row_len[req]
    col = local % row_len[req] - seq_lens[req]
    in_window = on_path[req, row, col.clamp(min=0)]
    if fill_prefix_mask:
        tree_mask.copy_((col < 0) | in_window)
    else:
        # Prefix elements keep what the buffer held: they write their own old value.
        tree_mask.copy_(torch.where(col < 0, tree_mask, in_window))


def _build_tree_triton(
    parent_list: torch.Tensor,
    top_scores_index: torch.Tensor,
    seq_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    spec_steps: int,
    n: int,
    tree_mask_mode: TreeMaskMode,
    fill_prefix_mask: bool,
) -> None:
    batch_size = seq_lens.shape[0]
    full = tree_mask_mode == TreeMaskMode.FULL_MASK
    row_len = seq_lens + n
    block_start = n * (torch.cumsum(row_len, 0) - row_len)
    # N == 1 gives an empty [B, 0] top_scores_index; every load from it is masked off.
    sel_stride = top_scores_index.stride(0) if n > 1 else 0
    parent_list = parent_list.contiguous()
    top_scores_index = top_scores_index.contiguous()
    _build_tree_kernel[(batch_size,)](
        parent_list,
        parent_list.stride(0),
        top_scores_index,
        sel_stride,
        seq_lens,
        block_start,
        tree_mask,
        positions,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        topk,
        spec_steps,
        n,
        FULL_MASK=full,
        FILL_PREFIX=bool(fill_prefix_mask),
        BLOCK_N=max(next_power_of_2(n), 2),
        BLOCK_PREFIX=64,
    )


@jit
def _build_tree_kernel(
    parent_list_ptr,
    parent_stride,
    sel_ptr,
    sel_stride,
    seq_lens_ptr,
    block_start_ptr,
    tree_mask_ptr,
    positions_ptr,
    retrive_index_ptr,
    next_token_ptr,
    next_sibling_ptr,
    topk,
    spec_steps,
    n,
    FULL_MASK: tl.constexpr,
    FILL_PREFIX: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_PREFIX: tl.constexpr,
):
    # One program per request; lane i is tree node i, and node-by-node relations are
    # [BLOCK_N, BLOCK_N] tiles (rows: node i, columns: node j).
    b = tl.program_id(0).to(tl.int64)
    nodes = tl.arange(0, BLOCK_N).to(tl.int64)
    in_tree = nodes < n
    has_sel = (nodes >= 1) & in_tree
    seq_len = tl.load(seq_lens_ptr + b)

    node_sel = tl.load(sel_ptr + b * sel_stride + nodes - 1, mask=has_sel, other=-1)
    parent_tb = tl.where(has_sel, node_sel // topk, 0)
    has_parent_node = has_sel & (parent_tb > 0)
    parent_flat = tl.load(
        parent_list_ptr + b * parent_stride + parent_tb, mask=has_parent_node, other=-1
    )
    match = (
        (parent_flat[:, None] == node_sel[None, :]) & has_sel[None, :] & has_parent_node[:, None]
    )
    found = tl.min(tl.where(match, nodes[None, :], BLOCK_N), axis=1)
    parent_node = tl.where(parent_tb == 0, 0, tl.where(found < BLOCK_N, found, -1))
    parent_node = tl.where(has_sel, parent_node, -1)

    cur = tl.where(has_sel, nodes, -1)
    depth = tl.zeros([BLOCK_N], dtype=tl.int64)
    on_path = (nodes[:, None] >= 0) & (nodes[None, :] == 0)
    for _ in range(spec_steps):
        active = cur >= 1
        here = nodes[None, :] == cur[:, None]
        on_path = on_path | (active[:, None] & here)
        depth += active.to(tl.int64)
        # One-hot gather: parent_node[cur] without a round trip through memory.
        up = tl.sum(tl.where(here, parent_node[None, :], 0), axis=1)
        cur = tl.where(active, up, -1)

    linked = parent_node >= 0
    child_of = (parent_node[None, :] == nodes[:, None]) & linked[None, :]
    first_child = tl.min(tl.where(child_of, nodes[None, :], BLOCK_N), axis=1)
    later_sibling = (
        (parent_node[:, None] == parent_node[None, :])
        & (linked[:, None] & linked[None, :])
        & (nodes[None, :] > nodes[:, None])
    )
    next_sibling = tl.min(tl.where(later_sibling, nodes[None, :], BLOCK_N), axis=1)

    out = b * n + nodes
    tl.store(positions_ptr + out, seq_len + depth, mask=in_tree)
    tl.store(retrive_index_ptr + out, out, mask=in_tree)
    tl.store(next_token_ptr + out, tl.where(first_child < BLOCK_N, first_child, -1), mask=in_tree)
    tl.store(
        next_sibling_ptr + out, tl.where(next_sibling < BLOCK_N, next_sibling, -1), mask=in_tree
    )

    window = in_tree[:, None] & in_tree[None, :]
    if FULL_MASK:
        row_start = tl.load(block_start_ptr + b) + (seq_len + n) * nodes
        prefix_cols = tl.arange(0, BLOCK_PREFIX).to(tl.int64)
        if FILL_PREFIX:
            for c in range(0, seq_len, BLOCK_PREFIX):
                cols = c + prefix_cols
                tl.store(
                    tree_mask_ptr + row_start[:, None] + cols[None, :],
                    (cols[None, :] >= 0) & in_tree[:, None],
                    mask=in_tree[:, None] & (cols[None, :] < seq_len),
                )
        window_start = row_start + seq_len
    else:
        window_start = b * n * n + n * nodes
    tl.store(tree_mask_ptr + window_start[:, None] + nodes[None, :], on_path, mask=window)


def build_tree_reference(
    bonus_tokens: torch.Tensor,
    parent_list: torch.Tensor,
    top_scores_index: torch.Tensor,
    draft_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_sum: int,
    topk: int,
    spec_steps: int,
    num_verify_tokens: int,
    tree_mask_mode: TreeMaskMode = TreeMaskMode.FULL_MASK,
) -> BuiltTree:
    """Plain loops in the order SGLang's CUDA kernel runs them; the spec the kernels are tested
    against, and ``backend="auto"``'s path for small QLEN_ONLY(_BITPACKING) batches on the
    CPU (see ``relayc.kernels._backend``). Always fills the prefix (``fill_prefix_mask``)."""
    n = num_verify_tokens
    batch_size = seq_lens.shape[0]
    packed = TreeMaskMode(tree_mask_mode) == TreeMaskMode.QLEN_ONLY_BITPACKING
    if packed:
        tree_mask_mode = TreeMaskMode.QLEN_ONLY
    parents = parent_list.tolist()
    selected = top_scores_index.tolist()
    lens = seq_lens.tolist()
    mask_numel = tree_mask_numel(batch_size, seq_lens_sum, n, TreeMaskMode(tree_mask_mode))
    tree_mask = [False] * mask_numel
    positions = [0] * (batch_size * n)
    retrive_index = [[-1] * n for _ in range(batch_size)]
    next_token = [[-1] * n for _ in range(batch_size)]
    next_sibling = [[-1] * n for _ in range(batch_size)]

    def selected_position(b: int, flat_index: int) -> int:
        for p in range(n - 1):
            if selected[b][p] == flat_index:
                return p
        return -1

    block_start = 0
    for b in range(batch_size):
        seq_len = lens[b]
        # Links: walk the nodes backwards, pushing each to the front of its parent's list.
        for i in range(n - 1, 0, -1):
            retrive_index[b][i] = b * n + i
            parent_tb = selected[b][i - 1] // topk
            parent = 0
            if parent_tb > 0:
                p = selected_position(b, parents[b][parent_tb])
                if p < 0:
                    continue
                parent = p + 1
            if next_token[b][parent] != -1:
                next_sibling[b][i] = next_token[b][parent]
            next_token[b][parent] = i
        retrive_index[b][0] = b * n

        for i in range(n):
            if tree_mask_mode == TreeMaskMode.FULL_MASK:
                row = block_start + (seq_len + n) * i
                for c in range(seq_len):
                    tree_mask[row + c] = True
                window = row + seq_len
            else:
                window = b * n * n + n * i
            tree_mask[window] = True
            depth = 0
            cur = i - 1  # position in top_scores_index of the node being marked
            while i > 0 and depth < spec_steps:
                depth += 1
                tree_mask[window + 1 + cur] = True
                parent_tb = selected[b][cur] // topk
                if parent_tb == 0:
                    break
                cur = selected_position(b, parents[b][parent_tb])
                if cur < 0:
                    break
            positions[b * n + i] = seq_len + depth
        block_start += n * (seq_len + n)

    device = seq_lens.device
    mask = torch.tensor(tree_mask, dtype=torch.bool, device=device)
    return BuiltTree(
        pack_tree_mask(mask.view(batch_size, n, n)) if packed else mask,
        torch.tensor(positions, dtype=torch.int64, device=device),
        torch.tensor(retrive_index, dtype=torch.int64, device=device).view(batch_size, n),
        torch.tensor(next_token, dtype=torch.int64, device=device).view(batch_size, n),
        torch.tensor(next_sibling, dtype=torch.int64, device=device).view(batch_size, n),
        torch.cat((bonus_tokens.unsqueeze(1), draft_tokens), dim=1).flatten(),
    )
