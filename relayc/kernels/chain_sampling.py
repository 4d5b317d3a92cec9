"""Chain (topk = 1) speculative sampling with real draft probabilities.

Semantics follow SGLang 0.5.23's chain verify
(``sglang/kernels/ops/speculative/reject_sampling.py``,
``chain_speculative_sampling_triton``), including its ``block_verification`` keyword. The
argument list is relayc's own chain layout: SGLang's takes the tree layout (candidates
with the root, ``retrive_*``, unused thresholds), which a chain does not need.

Each request drafted ``S`` tokens one after another, draft ``i`` sampled from the
draft model's ``q_i = draft_probs[b, i]``; the target scored every prefix, giving
``p_i = target_probs[b, i]`` for ``i = 0..S`` (``p_S`` follows the last draft).
With ``x_i = draft_token_ids[b, i]`` and ``u_i = uniform_samples[b, i]``, and every
probability read through the degenerate-input policy of ``_inverse_cdf`` (NaN, inf
and negative target entries count as 0; a ``q`` in ``(1, 1 + 1e-3]`` counts as 1,
any other ``q`` outside ``(0, 1]`` as 0):

Token-wise verification (Leviathan et al. 2023, the default):

- accept drafts while ``q_i(x_i) > 0``, ``p_i(x_i) > 0`` and ``u_i * q_i(x_i) <
  p_i(x_i)`` (accept with probability ``min(1, p/q)``; a draft whose ``q`` is not a
  probability could not have been drafted and is rejected, and a zero-probability
  draft is never emitted);
- at the first rejection ``i``, draw the replacement from
  ``normalize(relu(p_i - q_i))`` with ``uniform_samples_for_final_sampling[b]``
  (falling back to ``p_i`` if that residual is all zero); if all ``S`` drafts
  are accepted, draw the bonus token from ``p_S``. The draw is ``_inverse_cdf``'s.

Block verification (``block_verification=True``; Sun et al. 2024, "Block
Verification Accelerates Speculative Decoding", Algorithm 2), lossless too and at
least as many accepted tokens in expectation:

- prefix weights ``w_0 = 1``, ``w_i = min(1, w_{i-1} * p_{i-1}(x_i) / q_{i-1}(x_i))``
  (``w_i = 0`` once a ``q`` is not a probability), each op rounded to float32;
- acceptance probabilities ``h_S = w_S`` and, for ``0 < i < S``, ``h_i = r_i /
  (r_i + 1 - w_i)`` with ``r_i = sum_x relu(w_i * p_i(x) - q_i(x))`` (``h_i = 1``
  where ``w_i = 1``, ``0`` where ``w_i = 0``);
- ``n = max{i : u_{i-1} < h_i}`` (0 if none): the first ``n`` drafts are accepted;
- the next token is drawn from ``p_S`` if ``n = S``, else from
  ``normalize(relu(w_n * p_n - q_n))`` (``w_0 = 1``: token-wise's residual).

The emitted tokens are distributed exactly as ``S + 1`` (at most) tokens sampled
from the target alone. Outputs use the tree kernels' convention, the chain being
a tree with ``N = S + 1`` nodes (node 0 is the root, i.e. the previous bonus
token; node ``k`` is draft ``k - 1``) and global node id ``b * (S + 1) + k``:
``accept_index[b, :n + 1]`` = those ids for the root and the ``n`` accepted
drafts (-1 after), ``accept_token_num[b] = n``, and ``predicts[b * (S + 1) + k]``
= the token emitted after node ``k`` for ``k <= n`` (other entries untouched).

Differences from SGLang 0.5.23, deliberate: the ``1 + 1e-3`` slack on ``q`` (SGLang
rejects any ``q > 1``, so a draft both models hold with probability ~1 can be
rejected when the draft softmax rounds up); an all-zero residual falls back to the
target row instead of token ``V - 1``; NaN/inf/negative target entries count as 0.
"""

from __future__ import annotations

import torch

from relayc.kernels._backend import resolve_backend
from relayc.kernels._inverse_cdf import (
    draft_mass_reference,
    draft_mass_torch,
    draft_mass_triton,
    f32,
    sample_residual_reference,
    sample_residual_torch,
    sample_residual_triton,
    target_mass_reference,
    target_mass_torch,
    target_mass_triton,
)
from relayc.kernels._tree_layout import TREE_INDEX_DTYPES, expect_tensor, widen
from relayc.kernels._triton import jit, next_power_of_2, tl


def _block_acceptance_reference(
    p: list[float], q: list[float], target_rows: list[list[float]], draft_rows: list[list[float]]
) -> tuple[list[float], list[float]]:
    """Prefix weights ``w[0..S]`` and acceptance probabilities ``h[1..S]`` (``h[0]`` unused),
    float32 op by op; ``p``/``q`` are the drafts' cleaned target/draft probabilities."""
    num_drafts = len(p)
    w = [1.0]
    for i in range(num_drafts):
        w.append(min(f32(f32(w[-1] * p[i]) / q[i]), 1.0) if q[i] > 0 else 0.0)
    h = [0.0] * (num_drafts + 1)
    for i in range(1, num_drafts + 1):
        if i == num_drafts or w[i] <= 0.0 or w[i] >= 1.0:
            h[i] = w[i]
            continue
        r = 0.0
        for t, d in zip(target_rows[i], draft_rows[i], strict=True):
            r = f32(r + max(f32(f32(w[i] * t) - d), 0.0))
        h[i] = f32(r / f32(f32(r + 1.0) - w[i]))
    return w, h


def chain_speculative_sampling_reference(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    draft_token_ids: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    block_verification: bool = False,
) -> None:
    """Plain loops, one request at a time; the definition the other paths are tested against."""
    batch, num_drafts = draft_token_ids.shape
    nodes = num_drafts + 1
    for b in range(batch):
        tokens = draft_token_ids[b].tolist()
        coins = uniform_samples[b].tolist()
        target_rows = [[target_mass_reference(x) for x in row] for row in target_probs[b].tolist()]
        draft_rows = [[draft_mass_reference(x) for x in row] for row in draft_probs[b].tolist()]
        p = [target_rows[i][t] for i, t in enumerate(tokens)]
        q = [draft_rows[i][t] for i, t in enumerate(tokens)]
        scale = 1.0
        if block_verification:
            w, h = _block_acceptance_reference(p, q, target_rows, draft_rows)
            n = max((i for i in range(1, nodes) if coins[i - 1] < h[i]), default=0)
            scale = w[n]
        else:
            n = 0
            while n < num_drafts and q[n] > 0 and p[n] > 0 and coins[n] * q[n] < p[n]:
                n += 1
        emitted = tokens[:n]
        target = target_rows[n]
        if n < num_drafts:
            residual = [
                max(f32(f32(scale * t) - d), 0.0)
                for t, d in zip(target, draft_rows[n], strict=True)
            ]
        else:
            residual = list(target)
        coin = float(uniform_samples_for_final_sampling[b])
        emitted.append(sample_residual_reference(target, residual, coin))

        for k in range(nodes):
            accept_index[b, k] = b * nodes + k if k <= n else -1
        accept_token_num[b] = n
        for k, token in enumerate(emitted):
            predicts[b * nodes + k] = token


def _block_accept_torch(
    p: torch.Tensor,
    q: torch.Tensor,
    coins: torch.Tensor,
    target: torch.Tensor,
    draft: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification for every request at once: ``(n [B] int64, w_n [B] float32)``.

    ``p``/``q`` ``[B, S]`` the drafts' cleaned probabilities, ``target``/``draft`` the
    cleaned rows ``[B, S + 1, V]`` / ``[B, S, V]``."""
    batch, num_drafts = p.shape
    weights = [torch.ones(batch, dtype=p.dtype, device=p.device)]
    for i in range(num_drafts):
        step = (weights[-1] * p[:, i] / q[:, i]).clamp(max=1.0)
        weights.append(torch.where(q[:, i] > 0, step, 0.0))
    w = torch.stack(weights, 1)  # [B, S + 1]
    # r_i for i < S (r_0 unused); where w_i is 0 or 1 it is not read.
    r = (w[:, :num_drafts, None] * target[:, :num_drafts] - draft).clamp(min=0).sum(-1)
    mixed = r / (r + 1.0 - w[:, :num_drafts])
    h = torch.cat([mixed, w[:, num_drafts:]], 1)
    h = torch.where((w <= 0) | (w >= 1), w, h)[:, 1:]  # h_S = w_S as well
    accepted = coins < h
    slots = torch.arange(1, num_drafts + 1, device=p.device)
    n = torch.where(accepted, slots, 0).amax(1) if num_drafts else w.new_zeros(batch).long()
    return n, w.gather(1, n[:, None])[:, 0]


def _chain_sampling_torch(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    draft_token_ids: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    block_verification: bool,
) -> None:
    """Every draft of every request at once: the accept tests do not depend on each other."""
    batch, num_drafts = draft_token_ids.shape
    nodes = num_drafts + 1
    device = draft_token_ids.device
    rows = torch.arange(batch, device=device)
    slots = torch.arange(nodes, device=device)
    target_all = target_mass_torch(target_probs)
    draft_all = draft_mass_torch(draft_probs)

    p = target_all[:, :num_drafts].gather(2, draft_token_ids[..., None])[..., 0]
    q = draft_all.gather(2, draft_token_ids[..., None])[..., 0]
    if block_verification:
        num_accepted, scale = _block_accept_torch(p, q, uniform_samples, target_all, draft_all)
    else:
        accepted = (q > 0) & (p > 0) & (uniform_samples * q < p)
        # The length of the leading run of accepts.
        num_accepted = accepted.to(torch.int64).cumprod(1).sum(1)
        scale = None

    target = target_all[rows, num_accepted]
    if num_drafts > 0:
        draft = draft_all[rows, num_accepted.clamp(max=num_drafts - 1)]  # a copy
        draft.masked_fill_((num_accepted == num_drafts)[:, None], 0.0)
        scaled = target if scale is None else target * scale[:, None]
        residual = (scaled - draft).clamp_(min=0)
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
def _residual_mass_triton(target_row_ptr, draft_row_ptr, scale, vocab, BLOCK_V: tl.constexpr):
    total = 0.0
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        in_vocab = offs < vocab
        t = target_mass_triton(tl.load(target_row_ptr + offs, mask=in_vocab, other=0.0))
        d = draft_mass_triton(tl.load(draft_row_ptr + offs, mask=in_vocab, other=0.0))
        total += tl.sum(tl.maximum(t * scale - d, 0.0), axis=0)
    return total


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
    BLOCK_VERIFICATION: tl.constexpr,
):
    # One program per request; BLOCK_S >= S + 1, so slot S (the bonus) exists.
    b = tl.program_id(0).to(tl.int64)
    nodes = num_drafts + 1
    slots = tl.arange(0, BLOCK_S)
    is_draft = slots < num_drafts

    token = tl.load(draft_token_ids_ptr + b * num_drafts + slots, mask=is_draft, other=0)
    p = target_mass_triton(
        tl.load(target_probs_ptr + (b * nodes + slots) * vocab + token, mask=is_draft, other=0.0)
    )
    q = draft_mass_triton(
        tl.load(
            draft_probs_ptr + (b * num_drafts + slots) * vocab + token, mask=is_draft, other=0.0
        )
    )
    u = tl.load(uniform_ptr + b * num_drafts + slots, mask=is_draft, other=1.0)
    if BLOCK_VERIFICATION:
        # Forward over positions: w_i from w_{i-1}; the last i with u_{i-1} < h_i wins.
        w = 1.0
        num_accepted = 0
        scale = 1.0
        for i in range(1, num_drafts + 1):
            p_i = tl.sum(tl.where(slots == i - 1, p, 0.0), axis=0)
            q_i = tl.sum(tl.where(slots == i - 1, q, 0.0), axis=0)
            u_i = tl.sum(tl.where(slots == i - 1, u, 0.0), axis=0)
            safe_q = tl.where(q_i > 0.0, q_i, 1.0)
            w = tl.where(q_i > 0.0, tl.minimum(tl.math.div_rn(w * p_i, safe_q), 1.0), 0.0)
            h = w
            if (i < num_drafts) & (w > 0.0) & (w < 1.0):
                r = _residual_mass_triton(
                    target_probs_ptr + (b * nodes + i) * vocab,
                    draft_probs_ptr + (b * num_drafts + i) * vocab,
                    w,
                    vocab,
                    BLOCK_V,
                )
                h = tl.math.div_rn(r, (r + 1.0) - w)
            accept = u_i < h
            num_accepted = tl.where(accept, i, num_accepted)
            scale = tl.where(accept, w, scale)
    else:
        accepted = is_draft & (q > 0) & (p > 0) & (u * q < p)
        # The first slot that is not an accepted draft; slot S never is, so this is <= S.
        num_accepted = tl.min(tl.where(accepted, BLOCK_S, slots), axis=0)
        scale = 1.0

    draft_row = tl.maximum(tl.minimum(num_accepted, num_drafts - 1), 0)
    no_exclusions = tl.arange(0, 2) < 0
    sampled = sample_residual_triton(
        target_probs_ptr + (b * nodes + num_accepted) * vocab,
        draft_probs_ptr + (b * num_drafts + draft_row) * vocab,
        num_accepted < num_drafts,
        scale,
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
    *,
    block_verification: bool = False,
) -> None:
    """Chain speculative sampling in place; see the module docstring for the rules
    (SGLang 0.5.23's chain verify semantics; relayc's chain argument list, with SGLang's
    keyword-only ``block_verification``).

    Shapes (``S`` drafts per request, ``S >= 0``):

    - predicts ``[B * (S + 1)]``, accept_index ``[B, S + 1]``, accept_token_num
      ``[B]``, all int32 (outputs);
    - draft_token_ids ``[B, S]`` int64 (int32 accepted);
    - uniform_samples ``[B, S]`` and uniform_samples_for_final_sampling ``[B]``
      float32 in [0, 1) (``relayc.kernels.rng`` makes them from a seed);
    - target_probs ``[B, S + 1, V]``, draft_probs ``[B, S, V]`` float32.

    ``block_verification=True`` accepts by Sun et al. 2024's block rule instead of
    token by token (same inputs, same outputs, still lossless).
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
    expect_tensor(draft_token_ids, "draft_token_ids", (batch, num_drafts), TREE_INDEX_DTYPES)
    (draft_token_ids,) = widen(draft_token_ids)
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
        _chain_sampling_torch(*args, bool(block_verification))
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
        BLOCK_VERIFICATION=bool(block_verification),
        # No fused multiply-add: block verification's `w * p - q` must round twice, as
        # in the torch path and the reference, for the backends to agree to the bit.
        enable_fp_fusion=False,
    )
