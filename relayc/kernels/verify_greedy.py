"""Greedy tree verification: accept the longest root path the target's argmax agrees with.

Drop-in for SGLang's ``sgl_kernel.verify_tree_greedy`` (same arguments, order,
dtypes and in-place outputs; layout in ``_tree_layout``). Per request, starting
at the root: try the current node's children in sibling order and accept the
first whose token equals ``target_predict`` of the last accepted node; stop when
no child matches, the node has no children, or ``S`` drafts are accepted. Then

- ``accept_index[b, :k + 1]`` = global ids of the root and the ``k`` accepted
  nodes, the rest -1 (SGLang leaves the tail as the caller filled it, which is
  -1 there, so writing -1 changes nothing for SGLang's callers);
- ``accept_token_num[b]`` = ``k``;
- ``predicts[g]`` = ``target_predict[g]`` for every ``g`` on that path (the last
  one is the bonus token); entries off the path are left untouched, like SGLang.

``target_predict`` is the target's argmax per node, computed by the caller; ties
must go to the lowest token id (``torch.argmax`` does this) so that every backend
and the engine agree on one token.

Each node is visited at most once, so every implementation bounds its walk by
``N - 1`` steps: a malformed tree with a cycle ends instead of hanging.
"""

from __future__ import annotations

import torch

from relayc.kernels._backend import host_loops, resolve_backend
from relayc.kernels._tree_layout import TREE_INDEX_DTYPES, check_tree_args, expect_tensor, widen
from relayc.kernels._triton import jit, next_power_of_2, tl


def verify_tree_greedy_reference(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Plain loops, one request at a time; the definition the other paths are tested against.

    Each loop visits one node per turn, at most ``N - 1`` turns, as the other paths do.
    Outputs are written once at the end (on the CPU this is also ``backend="auto"``'s path
    for small batches, see ``relayc.kernels._backend``).
    """
    batch, num_draft = candidates.shape
    if batch == 0:
        return
    max_accept = accept_index.shape[1] - 1
    target_flat = target_predict.reshape(-1).tolist()
    paths: list[list[int]] = []
    for tokens, global_ids, first_child, next_sibling in zip(
        candidates.tolist(),
        retrive_index.tolist(),
        retrive_next_token.tolist(),
        retrive_next_sibling.tolist(),
        strict=True,
    ):
        path = [global_ids[0]]
        child = first_child[0] if max_accept > 0 else -1
        for _ in range(num_draft - 1):
            if child == -1:
                break
            if tokens[child] == target_flat[path[-1]]:
                path.append(global_ids[child])
                if len(path) - 1 == max_accept:
                    break
                child = first_child[child]
            else:
                child = next_sibling[child]
        paths.append(path)

    device = accept_index.device
    rows = [path + [-1] * (max_accept + 1 - len(path)) for path in paths]
    accept_index.copy_(torch.tensor(rows, dtype=accept_index.dtype, device=device))
    counts = [len(path) - 1 for path in paths]
    accept_token_num.copy_(torch.tensor(counts, dtype=accept_token_num.dtype, device=device))
    on_path = [g for path in paths for g in path]
    predicts[torch.tensor(on_path, dtype=torch.int64, device=device)] = torch.tensor(
        [target_flat[g] for g in on_path], dtype=predicts.dtype, device=device
    )


def _verify_tree_greedy_torch(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """All requests in lockstep; each step tries one node per request."""
    batch, num_draft = candidates.shape
    num_spec_step = accept_index.shape[1]
    device = candidates.device
    rows = torch.arange(batch, device=device)
    slots = torch.arange(num_spec_step, device=device)
    target_flat = target_predict.reshape(-1)

    path = torch.full((batch, num_spec_step), -1, dtype=torch.int64, device=device)
    path[:, 0] = retrive_index[:, 0]
    last_global = retrive_index[:, 0].clone()
    num_accepted = torch.zeros(batch, dtype=torch.int64, device=device)
    cur = retrive_next_token[:, 0].clone()
    if num_spec_step == 1:
        cur.fill_(-1)

    for _ in range(num_draft - 1):
        active = cur >= 0
        node = cur.clamp(min=0)
        node_global = retrive_index[rows, node]
        accept = active & (candidates[rows, node] == target_flat[last_global])
        num_accepted += accept
        path = torch.where(
            accept[:, None] & (slots == num_accepted[:, None]), node_global[:, None], path
        )
        last_global = torch.where(accept, node_global, last_global)
        following = torch.where(
            accept, retrive_next_token[rows, node], retrive_next_sibling[rows, node]
        )
        following = torch.where(accept & (num_accepted == num_spec_step - 1), -1, following)
        cur = torch.where(active, following, cur)

    accept_index.copy_(path)
    accept_token_num.copy_(num_accepted)
    # Mark the path's nodes by counting hits (order-independent, no boolean-mask indexing,
    # so the torch path stays capturable in a CUDA graph).
    hits = torch.zeros(predicts.shape[0], dtype=torch.int32, device=predicts.device)
    hits.index_add_(0, path.clamp(min=0).flatten(), (path >= 0).to(torch.int32).flatten())
    predicts.copy_(torch.where(hits > 0, target_flat.to(predicts.dtype), predicts))


@jit
def _verify_tree_greedy_kernel(
    predicts_ptr,
    accept_index_ptr,
    accept_token_num_ptr,
    candidates_ptr,
    retrive_index_ptr,
    retrive_next_token_ptr,
    retrive_next_sibling_ptr,
    target_predict_ptr,
    num_draft,
    num_spec_step,
    BLOCK_S: tl.constexpr,
):
    # One program per request. The accepted path is kept in registers and stored
    # once at the end, so no element is written twice by different threads.
    b = tl.program_id(0).to(tl.int64)
    row = b * num_draft
    slots = tl.arange(0, BLOCK_S)

    root_global = tl.load(retrive_index_ptr + row)
    path = tl.where(slots == 0, root_global, -1)
    last_global = root_global
    num_accepted = tl.full((), 0, tl.int32)
    cur = tl.load(retrive_next_token_ptr + row)
    cur = tl.where(num_spec_step > 1, cur, -1)

    for _ in range(num_draft - 1):
        active = cur >= 0
        node = tl.where(active, cur, 0)
        node_global = tl.load(retrive_index_ptr + row + node)
        token = tl.load(candidates_ptr + row + node)
        want = tl.load(target_predict_ptr + last_global)
        accept = active & (token == want)
        num_accepted += accept.to(tl.int32)
        path = tl.where(accept & (slots == num_accepted), node_global, path)
        last_global = tl.where(accept, node_global, last_global)
        following = tl.where(
            accept,
            tl.load(retrive_next_token_ptr + row + node),
            tl.load(retrive_next_sibling_ptr + row + node),
        )
        following = tl.where(accept & (num_accepted == num_spec_step - 1), -1, following)
        cur = tl.where(active, following, cur)

    in_row = slots < num_spec_step
    tl.store(accept_index_ptr + b * num_spec_step + slots, path.to(tl.int32), mask=in_row)
    tl.store(accept_token_num_ptr + b, num_accepted)
    on_path = in_row & (slots <= num_accepted)
    bonus_and_accepted = tl.load(target_predict_ptr + path, mask=on_path, other=0)
    tl.store(predicts_ptr + path, bonus_and_accepted.to(tl.int32), mask=on_path)


def verify_tree_greedy(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
    backend: str = "auto",
) -> None:
    """Greedy tree verification in place; see the module docstring for the contract.

    Signature of SGLang 0.5.23's ``verify_tree_greedy``
    (``sglang/kernels/ops/speculative/tree.py``).

    Shapes: candidates / retrive_* / target_predict ``[B, N]`` int64 (int32 accepted);
    predicts ``[B * N]``, accept_index ``[B, S + 1]``, accept_token_num ``[B]`` int32.
    """
    shape = check_tree_args(
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
    )
    expect_tensor(
        target_predict,
        "target_predict",
        (shape.batch, shape.num_draft_tokens),
        TREE_INDEX_DTYPES,
    )
    candidates, retrive_index, retrive_next_token, retrive_next_sibling, target_predict = widen(
        candidates, retrive_index, retrive_next_token, retrive_next_sibling, target_predict
    )
    args = (
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        target_predict,
    )
    resolved = resolve_backend(backend, candidates.device)
    if host_loops(backend, candidates.device, shape.batch):
        verify_tree_greedy_reference(*args)
        return
    if resolved == "torch":
        _verify_tree_greedy_torch(*args)
        return
    if shape.batch == 0:
        return
    _verify_tree_greedy_kernel[(shape.batch,)](
        *args,
        shape.num_draft_tokens,
        shape.num_spec_step,
        BLOCK_S=next_power_of_2(shape.num_spec_step),
    )
