"""Implementations of DFlash's ops: a whole draft chain from one block forward.

``ctx.drafter`` is the :class:`~relayc.engine.draft.dflash.DFlashDrafter` and
``ctx.extras["draft_kv"]`` its KV cache (the target's slot ids). The cache holds the
*context* of every committed token: the prefill writes the prompt's, each decode step the
accepted tokens' (``dflash_inject_kv``), from the tapped target layers the verify forward
captured (``dflash_verify``). Drafts are the argmax of the target's LM head over the
block's hidden states; with sampling, ``accept_tree``'s target-only rule keeps the output
distribution the target's (SGLang's DFlash verifies the same way).
"""

from __future__ import annotations

import torch

from relayc.engine.draft.paged import gather_rows
from relayc.engine.draft.tree import chain_tree
from relayc.engine.ops.context import StepContext
from relayc.engine.ops.target import greedy_tokens, target_prefill
from relayc.engine.ops.verify import _verify, verify_slots


def impl_dflash_prefill(
    ctx: StepContext, *, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Target prefill capturing the drafter's layers; the prompt's context into the draft
    cache at the prompt's slots."""
    drafter = ctx.drafter
    next_tokens, features, committed = target_prefill(ctx, capture=drafter.capture)
    forward = ctx.prefill
    assert forward is not None and ctx.extras is not None, "the engine's prefill context"
    drafter.write_context(
        drafter.project(features), forward.positions, forward.out_cache_loc, ctx.extras["draft_kv"]
    )
    return {"next_tokens": next_tokens, "seq_lens": committed}


def impl_dflash_draft(
    ctx: StepContext,
    *,
    bonus_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """One forward over ``[bonus, mask, ...]`` in the verify window's slots; the argmax at
    block positions ``1..`` is the chain."""
    batch, n = bonus_tokens.shape[0], ctx.dims["num_draft_tokens"]
    assert ctx.extras is not None, "the engine's StepContext always carries extras"
    logits = ctx.drafter.draft_logits(
        bonus_tokens,
        seq_lens,
        req_pool_indices,
        ctx.req_to_token,
        ctx.extras["draft_kv"],
        verify_slots(ctx, batch, n),
        ctx.max_prefix_len,
    )
    tree = chain_tree(ctx.drafter.target_ids(greedy_tokens(logits)))
    return {
        "parent_list": tree.parent_list,
        "top_scores_index": tree.top_scores_index,
        "draft_tokens": tree.draft_tokens,
    }


def impl_dflash_verify(
    ctx: StepContext,
    *,
    candidates: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """The target over the chain, capturing the drafter's layers; each node's context."""
    drafter = ctx.drafter
    logits, features = _verify(
        ctx, candidates, tree_mask, positions, seq_lens, req_pool_indices, capture=drafter.capture
    )
    batch, n = candidates.shape
    context = drafter.project(features.reshape(batch * n, -1)).view(batch, n, -1)
    return {"logits": logits, "hidden_states": context}


def impl_dflash_inject_kv(
    ctx: StepContext,
    *,
    hidden_states: torch.Tensor,
    accept_index: torch.Tensor,
    accept_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """The accepted nodes' context (``hidden_states [B, N, hidden]``, dflash_verify's) into
    the draft cache at their committed positions ``seq_lens - accept_lens + j``, at the slots
    ``compact_accepted_kv`` recorded; the rest of each row goes to the padding slot 0."""
    batch, n = accept_index.shape
    assert ctx.extras is not None, "the engine's StepContext always carries extras"
    lens = accept_lens.to(torch.int64)
    cols = torch.arange(n, device=lens.device)[None, :]
    real = cols < lens[:, None]
    context = gather_rows(hidden_states, torch.where(real, accept_index, -1))  # [B, N, H]
    positions = (seq_lens - lens)[:, None] + cols
    table = ctx.req_to_token
    slots = table[req_pool_indices.long()[:, None], positions.clamp(max=table.shape[1] - 1)]
    slots = torch.where(real, slots.long(), 0)
    ctx.drafter.write_context(
        context.reshape(batch * n, -1),
        torch.where(real, positions, 0).reshape(-1),
        slots.reshape(-1),
        ctx.extras["draft_kv"],
    )
    return {"draft_seq_lens": seq_lens}
