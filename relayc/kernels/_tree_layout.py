"""Argument checks shared by the tree verify kernels (SGLang's layout and dtypes).

The layout every tree kernel reads, per request ``b`` of ``B`` with ``N`` draft
nodes (node 0 is the root, i.e. the previous step's bonus token):

- ``candidates[b, i]``           int64 (or int32), token id of node ``i``
- ``retrive_index[b, i]``        int64, global node id (``b * N + i`` as SGLang's
  ``build_tree`` writes it); indexes ``predicts`` and the flattened
  ``target_predict``
- ``retrive_next_token[b, i]``   int64, first child of node ``i`` (local id, -1 none)
- ``retrive_next_sibling[b, i]`` int64, next sibling of node ``i`` (local id, -1 none)

The four tree tensors may be int32, as some SGLang callers pass them; the kernels
widen them to int64 on entry (no copy for int64). Any other dtype is rejected with
the dtype named.

Outputs, written in place: ``predicts [B * N]`` int32, ``accept_index [B, S + 1]``
int32 and ``accept_token_num [B]`` int32, where ``S + 1`` (SGLang's
``num_spec_step``) is read off ``accept_index.shape[1]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TreeShape:
    batch: int
    num_draft_tokens: int
    num_spec_step: int


# Index dtypes the tree tensors may come in (widened to int64 by the kernels).
TREE_INDEX_DTYPES = (torch.int64, torch.int32)


def expect_tensor(
    tensor: torch.Tensor,
    name: str,
    shape: tuple[int, ...],
    dtype: torch.dtype | tuple[torch.dtype, ...],
) -> None:
    """Shape/dtype/contiguity check with a message that names the argument."""
    if tuple(tensor.shape) != shape:
        raise ValueError(f"`{name}` must have shape {list(shape)}; got {list(tensor.shape)}")
    allowed = dtype if isinstance(dtype, tuple) else (dtype,)
    if tensor.dtype not in allowed:
        raise TypeError(f"`{name}` must be {' or '.join(map(str, allowed))}; got {tensor.dtype}")
    if not tensor.is_contiguous():
        raise ValueError(f"`{name}` must be contiguous (call .contiguous() first)")


def check_tree_args(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
) -> TreeShape:
    """Validate the tree layout and the three outputs; return the sizes they agree on."""
    if candidates.dim() != 2:
        raise ValueError(f"`candidates` must be [B, N]; got shape {list(candidates.shape)}")
    if accept_index.dim() != 2:
        raise ValueError(f"`accept_index` must be [B, S + 1]; got shape {list(accept_index.shape)}")
    batch, num_draft = candidates.shape
    num_spec_step = accept_index.shape[1]
    if num_draft < 1 or num_spec_step < 1:
        raise ValueError(
            f"need at least the root node and one accept slot; got N={num_draft}, "
            f"S + 1={num_spec_step}"
        )
    for name, tensor in (
        ("candidates", candidates),
        ("retrive_index", retrive_index),
        ("retrive_next_token", retrive_next_token),
        ("retrive_next_sibling", retrive_next_sibling),
    ):
        expect_tensor(tensor, name, (batch, num_draft), TREE_INDEX_DTYPES)
    expect_tensor(predicts, "predicts", (batch * num_draft,), torch.int32)
    expect_tensor(accept_index, "accept_index", (batch, num_spec_step), torch.int32)
    expect_tensor(accept_token_num, "accept_token_num", (batch,), torch.int32)
    tensors = (predicts, accept_index, accept_token_num, candidates, retrive_index)
    devices = {t.device for t in (*tensors, retrive_next_token, retrive_next_sibling)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device; got {sorted(map(str, devices))}")
    return TreeShape(batch, num_draft, num_spec_step)


def widen(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """int32 index tensors as int64 (int64 ones unchanged, no copy)."""
    return tuple(t.to(torch.int64) for t in tensors)
