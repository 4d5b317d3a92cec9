"""Tree speculative sampling, target-only acceptance: SGLang's rule with real sampling.

Drop-in for SGLang 0.5.23's ``tree_speculative_sampling_target_only``
(``sglang/kernels/ops/speculative/sampling.py``, kernel in
``sgl_kernel/speculative/sampling.cuh``): same arguments, order, dtypes and
in-place outputs; tree layout in ``_tree_layout``. Target probabilities are read
through ``_inverse_cdf``'s degenerate-input policy (NaN, inf and negative entries
count as 0), and so are draft probabilities in the final draw.
Per request, starting at the root with ``coin = uniform_samples[b, 0]``:

- walk the current node's children in sibling order, adding each child's target
  probability ``p = target_probs[b, node, token]`` to ``prob_acc``; accept the
  first child with ``p > 0`` and ``coin < prob_acc / threshold_acc`` (strict: a
  coin exactly on the boundary belongs to the next sibling, SGLang PR #35798) or
  ``p >= threshold_single``. A child with zero target probability is never
  accepted (SGLang's ``has_target_mass`` test, the same PR; sglang issue 35771).
  With both thresholds 1 this draws a token from the target distribution by
  inverse CDF over the children, and with ``draft_probs``
  zero (SGLang's target-only call) the whole step is lossless; smaller
  thresholds trade exactness for acceptance, as in SGLang. A non-zero
  ``draft_probs`` is subtracted in the final draw exactly as SGLang does, which
  is not lossless in general (acceptance ignores it);
- on accepting child ``c``: ``prob_acc = 0``, ``coin = uniform_samples[b, c]``
  and the walk continues at ``c`` (at most ``S`` accepted, ``S + 1`` being
  ``accept_index.shape[1]``);
- the last emitted token is drawn at the last accepted node ``n`` with
  ``uniform_samples_for_final_sampling[b]`` from ``relu(target_probs[b, n] -
  draft_probs[b, n])`` with the children of ``n`` that were tried and rejected
  zeroed; if ``S`` drafts were accepted nothing was tried and the plain target
  row is used (SGLang: "there is no draft_probs for the bonus token"). See
  ``_inverse_cdf`` for the draw and its fallbacks.

Outputs as in ``verify_greedy``: ``predicts[accept_index[b, k]]`` is the token
emitted after the ``k``-th path node (accepted child, or the final draw),
``accept_index`` is -1 past the path, ``accept_token_num[b]`` counts accepted
drafts.

Differences from SGLang's CUDA kernel, all deliberate:

- ``draft_probs`` is read only. SGLang writes the target probability of each
  rejected child into it as scratch so that its residual excludes them; here the
  rejected children are masked instead, which gives the same residual without a
  side effect on a buffer the caller may reuse (e.g. a CUDA-graph static input);
- an all-zero residual falls back to the target row instead of token ``V - 1``;
- NaN, inf and negative probabilities count as 0 (SGLang reads them as they are);
- ``deterministic`` is accepted for compatibility and ignored: every path here
  is deterministic.
"""

from __future__ import annotations

import torch

from relayc.kernels._backend import resolve_backend
from relayc.kernels._inverse_cdf import (
    draft_mass_reference,
    draft_mass_torch,
    sample_residual_reference,
    sample_residual_torch,
    sample_residual_triton,
    target_mass_reference,
    target_mass_torch,
    target_mass_triton,
)
from relayc.kernels._tree_layout import check_tree_args, expect_tensor, widen
from relayc.kernels._triton import jit, next_power_of_2, tl

# SGLang clamps threshold_acc the same way so that 0 does not divide by zero.
_MIN_THRESHOLD_ACC = 1e-9


def tree_speculative_sampling_target_only_reference(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
) -> None:
    """Plain loops, one request at a time; the definition the other paths are tested against."""
    batch = candidates.shape[0]
    max_accept = accept_index.shape[1] - 1
    threshold_acc = max(threshold_acc, _MIN_THRESHOLD_ACC)
    for b in range(batch):
        tokens = candidates[b].tolist()
        global_ids = retrive_index[b].tolist()
        first_child = retrive_next_token[b].tolist()
        next_sibling = retrive_next_sibling[b].tolist()
        coins = uniform_samples[b].tolist()

        path = [global_ids[0]]
        emitted: list[int] = []
        node = 0
        rejected_here: list[int] = []  # tokens of the children of `node` tried and rejected
        coin = coins[0]
        while len(emitted) < max_accept:
            probs = [target_mass_reference(x) for x in target_probs[b, node].tolist()]
            prob_acc = 0.0
            child = first_child[node]
            while child != -1:
                p = probs[tokens[child]]
                prob_acc += p
                if p > 0 and (coin < prob_acc / threshold_acc or p >= threshold_single):
                    break
                rejected_here.append(tokens[child])
                child = next_sibling[child]
            if child == -1:
                break
            emitted.append(tokens[child])
            path.append(global_ids[child])
            node = child
            coin = coins[child]
            rejected_here = []

        target = [target_mass_reference(x) for x in target_probs[b, node].tolist()]
        if len(emitted) < max_accept:
            draft = [draft_mass_reference(x) for x in draft_probs[b, node].tolist()]
            residual = [max(t - d, 0.0) for t, d in zip(target, draft, strict=True)]
            for token in rejected_here:
                residual[token] = 0.0
        else:
            residual = list(target)
        coin = float(uniform_samples_for_final_sampling[b])
        emitted.append(sample_residual_reference(target, residual, coin))

        for slot in range(max_accept + 1):
            accept_index[b, slot] = path[slot] if slot < len(path) else -1
        accept_token_num[b] = len(path) - 1
        for g, token in zip(path, emitted, strict=True):
            predicts[g] = token


def _tree_sampling_torch(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float,
    threshold_acc: float,
) -> None:
    """All requests in lockstep; each step tries one node per request."""
    batch, num_draft, vocab = target_probs.shape
    num_spec_step = accept_index.shape[1]
    device = candidates.device
    rows = torch.arange(batch, device=device)
    slots = torch.arange(num_spec_step, device=device)
    node_ids = torch.arange(num_draft, device=device)
    target_rows = target_mass_torch(target_probs.reshape(batch * num_draft, vocab))

    path = torch.full((batch, num_spec_step), -1, dtype=torch.int64, device=device)
    path[:, 0] = retrive_index[:, 0]
    emitted = torch.full_like(path, -1)
    last = torch.zeros(batch, dtype=torch.int64, device=device)
    num_accepted = torch.zeros(batch, dtype=torch.int64, device=device)
    coin = uniform_samples[:, 0].clone()
    prob_acc = torch.zeros(batch, dtype=target_probs.dtype, device=device)
    rejected = torch.zeros(batch, num_draft, dtype=torch.bool, device=device)
    cur = retrive_next_token[:, 0].clone()
    if num_spec_step == 1:
        cur.fill_(-1)

    for _ in range(num_draft - 1):
        active = cur >= 0
        node = cur.clamp(min=0)
        token = candidates[rows, node]
        p = target_rows[rows * num_draft + last, token]
        prob_acc = torch.where(active, prob_acc + p, prob_acc)
        accept = active & (p > 0) & ((coin < prob_acc / threshold_acc) | (p >= threshold_single))
        emitted = torch.where(
            accept[:, None] & (slots == num_accepted[:, None]), token[:, None], emitted
        )
        num_accepted += accept
        path = torch.where(
            accept[:, None] & (slots == num_accepted[:, None]),
            retrive_index[rows, node][:, None],
            path,
        )
        prob_acc = torch.where(accept, 0.0, prob_acc)
        coin = torch.where(accept, uniform_samples[rows, node], coin)
        last = torch.where(accept, node, last)
        rejected_now = (active & ~accept)[:, None] & (node_ids == node[:, None])
        rejected = (rejected & ~accept[:, None]) | rejected_now
        following = torch.where(
            accept, retrive_next_token[rows, node], retrive_next_sibling[rows, node]
        )
        following = torch.where(accept & (num_accepted == num_spec_step - 1), -1, following)
        cur = torch.where(active, following, cur)

    last_rows = rows * num_draft + last
    target = target_rows[last_rows]
    draft = draft_mass_torch(draft_probs.reshape(batch * num_draft, vocab)[last_rows])
    draft.masked_fill_((num_accepted == num_spec_step - 1)[:, None], 0.0)
    residual = (target - draft).clamp_(min=0)
    # Multiply rejected tokens by 0 and everything else by 1 (non-rejected nodes all
    # point at token 0): unlike a plain scatter this is right when one token sits on
    # both a rejected and an untried child.
    residual.scatter_reduce_(
        1,
        torch.where(rejected, candidates, 0),
        (~rejected).to(residual.dtype),
        reduce="prod",
    )
    sampled = sample_residual_torch(target, residual, uniform_samples_for_final_sampling)
    emitted = torch.where(slots == num_accepted[:, None], sampled[:, None], emitted)

    accept_index.copy_(path)
    accept_token_num.copy_(num_accepted)
    # Padded path entries write to a spare element past the end: no boolean-mask indexing,
    # so the torch path stays capturable in a CUDA graph.
    spare = predicts.shape[0]
    target_rows = torch.where(path >= 0, path.to(torch.int64), spare).flatten()
    padded = torch.cat([predicts, predicts.new_zeros(1)])
    padded.index_copy_(0, target_rows, emitted.flatten().to(predicts.dtype))
    predicts.copy_(padded[:spare])


@jit
def _tree_sampling_kernel(
    predicts_ptr,
    accept_index_ptr,
    accept_token_num_ptr,
    candidates_ptr,
    retrive_index_ptr,
    retrive_next_token_ptr,
    retrive_next_sibling_ptr,
    uniform_ptr,
    uniform_final_ptr,
    target_probs_ptr,
    draft_probs_ptr,
    num_draft,
    num_spec_step,
    vocab,
    threshold_single,
    threshold_acc,
    BLOCK_S: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    # One program per request; path, emitted tokens and the rejected-children set
    # live in registers and are stored once at the end.
    b = tl.program_id(0).to(tl.int64)
    row = b * num_draft
    slots = tl.arange(0, BLOCK_S)
    node_ids = tl.arange(0, BLOCK_N)

    path = tl.where(slots == 0, tl.load(retrive_index_ptr + row), -1)
    emitted = tl.full([BLOCK_S], -1, tl.int64)
    last = tl.full((), 0, tl.int64)
    num_accepted = tl.full((), 0, tl.int32)
    coin = tl.load(uniform_ptr + row)
    prob_acc = tl.full((), 0.0, tl.float32)
    rejected = node_ids < 0
    cur = tl.load(retrive_next_token_ptr + row)
    cur = tl.where(num_spec_step > 1, cur, -1)

    for _ in range(num_draft - 1):
        active = cur >= 0
        node = tl.where(active, cur, 0)
        token = tl.load(candidates_ptr + row + node)
        p = target_mass_triton(tl.load(target_probs_ptr + (row + last) * vocab + token))
        prob_acc = tl.where(active, prob_acc + p, prob_acc)
        accept = active & (p > 0) & ((coin < prob_acc / threshold_acc) | (p >= threshold_single))
        emitted = tl.where(accept & (slots == num_accepted), token, emitted)
        num_accepted += accept.to(tl.int32)
        path = tl.where(
            accept & (slots == num_accepted), tl.load(retrive_index_ptr + row + node), path
        )
        prob_acc = tl.where(accept, 0.0, prob_acc)
        coin = tl.where(accept, tl.load(uniform_ptr + row + node), coin)
        last = tl.where(accept, node, last)
        tried = tl.where(active, node, -1)
        rejected = tl.where(accept, node_ids < 0, rejected | (node_ids == tried))
        following = tl.where(
            accept,
            tl.load(retrive_next_token_ptr + row + node),
            tl.load(retrive_next_sibling_ptr + row + node),
        )
        following = tl.where(accept & (num_accepted == num_spec_step - 1), -1, following)
        cur = tl.where(active, following, cur)

    rejected_tokens = tl.load(candidates_ptr + row + node_ids, mask=rejected, other=-1)
    sampled = sample_residual_triton(
        target_probs_ptr + (row + last) * vocab,
        draft_probs_ptr + (row + last) * vocab,
        num_accepted < num_spec_step - 1,
        1.0,
        rejected_tokens,
        rejected,
        vocab,
        tl.load(uniform_final_ptr + b),
        BLOCK_V,
    )
    emitted = tl.where(slots == num_accepted, sampled.to(tl.int64), emitted)

    in_row = slots < num_spec_step
    tl.store(accept_index_ptr + b * num_spec_step + slots, path.to(tl.int32), mask=in_row)
    tl.store(accept_token_num_ptr + b, num_accepted)
    on_path = in_row & (slots <= num_accepted)
    tl.store(predicts_ptr + path, emitted.to(tl.int32), mask=on_path)


def _vocab_block(vocab: int, num_draft: int) -> int:
    # The final draw compares each vocab tile against every rejected child
    # ([BLOCK_V, BLOCK_N] in registers), so the tile shrinks as the tree grows.
    return min(next_power_of_2(vocab), max(128, 8192 // next_power_of_2(num_draft)))


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
    backend: str = "auto",
) -> None:
    """Tree speculative sampling in place; see the module docstring for the contract.

    Signature of SGLang 0.5.23's ``tree_speculative_sampling_target_only``
    (``sglang/kernels/ops/speculative/sampling.py``) plus ``backend``.

    Shapes: tree tensors ``[B, N]`` int64 (int32 accepted); uniform_samples ``[B, N]`` and
    uniform_samples_for_final_sampling ``[B]`` float32 in [0, 1); target_probs and
    draft_probs ``[B, N, V]`` float32 (``target_probs[b, i]`` is the target's
    distribution after node ``i``); predicts ``[B * N]``, accept_index
    ``[B, S + 1]``, accept_token_num ``[B]`` int32.
    """
    del deterministic  # every path here is deterministic
    shape = check_tree_args(
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
    )
    batch, num_draft = shape.batch, shape.num_draft_tokens
    candidates, retrive_index, retrive_next_token, retrive_next_sibling = widen(
        candidates, retrive_index, retrive_next_token, retrive_next_sibling
    )
    if target_probs.dim() != 3:
        raise ValueError(f"`target_probs` must be [B, N, V]; got {list(target_probs.shape)}")
    vocab = target_probs.shape[2]
    expect_tensor(target_probs, "target_probs", (batch, num_draft, vocab), torch.float32)
    expect_tensor(draft_probs, "draft_probs", (batch, num_draft, vocab), torch.float32)
    expect_tensor(uniform_samples, "uniform_samples", (batch, num_draft), torch.float32)
    expect_tensor(
        uniform_samples_for_final_sampling,
        "uniform_samples_for_final_sampling",
        (batch,),
        torch.float32,
    )
    threshold_acc = max(float(threshold_acc), _MIN_THRESHOLD_ACC)
    args = (
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        uniform_samples,
        uniform_samples_for_final_sampling,
        target_probs,
        draft_probs,
    )
    if resolve_backend(backend, candidates.device) == "torch":
        _tree_sampling_torch(*args, float(threshold_single), threshold_acc)
        return
    if batch == 0:
        return
    _tree_sampling_kernel[(batch,)](
        *args,
        num_draft,
        shape.num_spec_step,
        vocab,
        float(threshold_single),
        threshold_acc,
        BLOCK_S=next_power_of_2(shape.num_spec_step),
        BLOCK_N=next_power_of_2(num_draft),
        BLOCK_V=_vocab_block(vocab, num_draft),
    )
