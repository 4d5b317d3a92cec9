"""Chain (topk = 1) speculative sampling with real draft probabilities (Leviathan et al.).

Each request drafted ``S`` tokens one after another, draft ``i`` sampled from the
draft model's ``q_i = draft_probs[b, i]``; the target scored every prefix, giving
``p_i = target_probs[b, i]`` for ``i = 0..S`` (``p_S`` follows the last draft).
With ``x_i = draft_token_ids[b, i]`` and ``u_i = uniform_samples[b, i]``:

- accept drafts while ``p_i(x_i) > 0`` and ``u_i * q_i(x_i) < p_i(x_i)`` (accept
  with probability ``min(1, p/q)``; the ``p > 0`` test is redundant in exact
  arithmetic but makes "never emit a zero-probability draft" explicit);
- at the first rejection ``i``, draw the replacement from
  ``normalize(relu(p_i - q_i))`` with ``uniform_samples_for_final_sampling[b]``
  (falling back to ``p_i`` if that residual is all zero); if all ``S`` drafts
  are accepted, draw the bonus token from ``p_S``. The draw is ``_inverse_cdf``'s.

The emitted tokens are distributed exactly as ``S + 1`` (at most) tokens sampled
from the target alone. Outputs use the tree kernels' convention, the chain being
a tree with ``N = S + 1`` nodes (node 0 is the root, i.e. the previous bonus
token; node ``k`` is draft ``k - 1``) and global node id ``b * (S + 1) + k``:
``accept_index[b, :n + 1]`` = those ids for the root and the ``n`` accepted
drafts (-1 after), ``accept_token_num[b] = n``, and ``predicts[b * (S + 1) + k]``
= the token emitted after node ``k`` for ``k <= n`` (other entries untouched).
"""

from __future__ import annotations

import torch

from relayc.kernels._backend import resolve_backend
from relayc.kernels._inverse_cdf import (
    sample_residual_reference,
    sample_residual_torch,
    sample_residual_triton,
)
from relayc.kernels._tree_layout import expect_tensor
from relayc.kernels._triton import jit, next_power_of_2, tl


def chain_speculative_sampling_reference(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    draft_token_ids: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
) -> None:
    """Plain loops, one request at a time; the definition the other paths are tested against."""
    batch, num_drafts = draft_token_ids.shape
    nodes = num_drafts + 1
    for b in range(batch):
        emitted: list[int] = []
        for i in range(num_drafts):
            token = int(draft_token_ids[b, i])
            p = float(target_probs[b, i, token])
            q = float(draft_probs[b, i, token])
            if not (p > 0 and float(uniform_samples[b, i]) * q < p):
                break
            emitted.append(token)
        n = len(emitted)
        target = target_probs[b, n].tolist()
        if n < num_drafts:
            draft = draft_probs[b, n].tolist()
            residual = [max(t - d, 0.0) for t, d in zip(target, draft, strict=True)]
        else:
            residual = list(target)
        coin = float(uniform_samples_for_final_sampling[b])
        emitted.append(sample_residual_reference(target, residual, coin))

        for k in range(nodes):
            accept_index[b, k] = b * nodes + k if k <= n else -1
        accept_token_num[b] = n
        for k, token in enumerate(emitted):
            predicts[b * nodes + k] = token


def _chain_sampling_torch(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    draft_token_ids: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
) -> None:
    """Every draft of every request at once: the accept tests do not depend on each other."""
    batch, num_drafts = draft_token_ids.shape
    nodes = num_drafts + 1
    device = draft_token_ids.device
    rows = torch.arange(batch, device=device)
    slots = torch.arange(nodes, device=device)

    p = target_probs[:, :num_drafts].gather(2, draft_token_ids[..., None])[..., 0]
    q = draft_probs.gather(2, draft_token_ids[..., None])[..., 0]
    accepted = (p > 0) & (uniform_samples * q < p)
    # The length of the leading run of accepts.
    num_accepted = accepted.to(torch.int64).cumprod(1).sum(1)

    target = target_probs[rows, num_accepted]
    if num_drafts > 0:
        draft = draft_probs[rows, num_accepted.clamp(max=num_drafts - 1)]  # a copy
        draft.masked_fill_((num_accepted == num_drafts)[:, None], 0.0)
        residual = (target - draft).clamp_(min=0)
    else:
        residual = target
    sampled = sample_residual_torch(target, residual, uniform_samples_for_final_sampling)

    drafts_then_pad = torch.cat([draft_token_ids, draft_token_ids.new_full((batch, 1), -1)], 1)
    emitted = torch.where(slots == num_accepted[:, None], sampled[:, None], drafts_then_pad)
    on_path = slots <= num_accepted[:, None]
    path = rows[:, None] * nodes + slots
    accept_index.copy_(torch.where(on_path, path, -1))
    accept_token_num.copy_(num_accepted)
    # Entries off the path write to a spare element past the end: no boolean-mask
    # indexing, so the torch path stays capturable in a CUDA graph.
    spare = predicts.shape[0]
    target_rows = torch.where(on_path, path.to(torch.int64), spare).flatten()
    padded = torch.cat([predicts, predicts.new_zeros(1)])
    padded.index_copy_(0, target_rows, emitted.flatten().to(predicts.dtype))
    predicts.copy_(padded[:spare])


@jit
def _chain_sampling_kernel(
    predicts_ptr,
    accept_index_ptr,
    accept_token_num_ptr,
    draft_token_ids_ptr,
    uniform_ptr,
    uniform_final_ptr,
    target_probs_ptr,
    draft_probs_ptr,
    num_drafts,
    vocab,
    BLOCK_S: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    # One program per request; BLOCK_S >= S + 1, so slot S (the bonus) exists.
    b = tl.program_id(0).to(tl.int64)
    nodes = num_drafts + 1
    slots = tl.arange(0, BLOCK_S)
    is_draft = slots < num_drafts

    token = tl.load(draft_token_ids_ptr + b * num_drafts + slots, mask=is_draft, other=0)
    p = tl.load(target_probs_ptr + (b * nodes + slots) * vocab + token, mask=is_draft, other=0.0)
    q = tl.load(
        draft_probs_ptr + (b * num_drafts + slots) * vocab + token, mask=is_draft, other=0.0
    )
    u = tl.load(uniform_ptr + b * num_drafts + slots, mask=is_draft, other=1.0)
    accepted = is_draft & (p > 0) & (u * q < p)
    # The first slot that is not an accepted draft; slot S never is, so this is <= S.
    num_accepted = tl.min(tl.where(accepted, BLOCK_S, slots), axis=0)

    draft_row = tl.maximum(tl.minimum(num_accepted, num_drafts - 1), 0)
    no_exclusions = tl.arange(0, 2) < 0
    sampled = sample_residual_triton(
        target_probs_ptr + (b * nodes + num_accepted) * vocab,
        draft_probs_ptr + (b * num_drafts + draft_row) * vocab,
        num_accepted < num_drafts,
        tl.full([2], -1, tl.int64),
        no_exclusions,
        vocab,
        tl.load(uniform_final_ptr + b),
        BLOCK_V,
    )
    emitted = tl.where(slots == num_accepted, sampled.to(tl.int64), token)

    on_path = slots <= num_accepted
    in_row = slots < nodes
    path = b * nodes + slots
    tl.store(accept_index_ptr + path, tl.where(on_path, path, -1).to(tl.int32), mask=in_row)
    tl.store(accept_token_num_ptr + b, num_accepted.to(tl.int32))
    tl.store(predicts_ptr + path, emitted.to(tl.int32), mask=on_path)


def chain_speculative_sampling(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    draft_token_ids: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    backend: str = "auto",
) -> None:
    """Chain speculative sampling in place; see the module docstring for the rule.

    Shapes (``S`` drafts per request, ``S >= 0``):

    - predicts ``[B * (S + 1)]``, accept_index ``[B, S + 1]``, accept_token_num
      ``[B]``, all int32 (outputs);
    - draft_token_ids ``[B, S]`` int64;
    - uniform_samples ``[B, S]`` and uniform_samples_for_final_sampling ``[B]``
      float32 in [0, 1) (``relayc.kernels.rng`` makes them from a seed);
    - target_probs ``[B, S + 1, V]``, draft_probs ``[B, S, V]`` float32.
    """
    if draft_token_ids.dim() != 2:
        raise ValueError(f"`draft_token_ids` must be [B, S]; got {list(draft_token_ids.shape)}")
    if target_probs.dim() != 3:
        raise ValueError(f"`target_probs` must be [B, S + 1, V]; got {list(target_probs.shape)}")
    batch, num_drafts = draft_token_ids.shape
    nodes, vocab = num_drafts + 1, target_probs.shape[2]
    expect_tensor(predicts, "predicts", (batch * nodes,), torch.int32)
    expect_tensor(accept_index, "accept_index", (batch, nodes), torch.int32)
    expect_tensor(accept_token_num, "accept_token_num", (batch,), torch.int32)
    expect_tensor(draft_token_ids, "draft_token_ids", (batch, num_drafts), torch.int64)
    expect_tensor(uniform_samples, "uniform_samples", (batch, num_drafts), torch.float32)
    expect_tensor(
        uniform_samples_for_final_sampling,
        "uniform_samples_for_final_sampling",
        (batch,),
        torch.float32,
    )
    expect_tensor(target_probs, "target_probs", (batch, nodes, vocab), torch.float32)
    expect_tensor(draft_probs, "draft_probs", (batch, num_drafts, vocab), torch.float32)
    args = (
        predicts,
        accept_index,
        accept_token_num,
        draft_token_ids,
        uniform_samples,
        uniform_samples_for_final_sampling,
        target_probs,
        draft_probs,
    )
    if resolve_backend(backend, draft_token_ids.device) == "torch":
        _chain_sampling_torch(*args)
        return
    if batch == 0:
        return
    if num_drafts == 0:
        # Triton's launcher rejects the null data pointer of an empty tensor; with no
        # drafts the kernel never reads these, so one-element stand-ins will do.
        placeholder_ids = draft_token_ids.new_zeros(1)
        placeholder_floats = uniform_samples.new_zeros(1)
        args = (*args[:3], placeholder_ids, placeholder_floats, *args[5:7], placeholder_floats)
    _chain_sampling_kernel[(batch,)](
        *args,
        num_drafts,
        vocab,
        BLOCK_S=next_power_of_2(nodes),
        BLOCK_V=min(1024, next_power_of_2(vocab)),
    )
