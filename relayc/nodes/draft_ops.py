"""Implementations of the prefill and drafting ops of EAGLE, multi-layer EAGLE and n-gram.

Thin wrappers over the engine's drafters (:mod:`relayc.engine.draft`) and the
target model; `ctx.drafter` is the algorithm's drafter and `ctx.extras["draft_kv"]`
its KV cache (addressed through the target's `req_to_token`, same slot ids).
Decode steps get a window of KV slots per request from the scheduler,
`ctx.out_cache_loc` viewed `[B, W]`: the first `num_draft_tokens` hold the verify
tree, the rest are scratch for tree drafting (discarded after the step).
"""

from __future__ import annotations

import threading

import torch

from relayc.engine.draft.ngram import splice_proposals
from relayc.engine.draft.tree import mtp_select, tree_from_parents
from relayc.engine.sampling import sample
from relayc.nodes.context import StepContext
from relayc.nodes.verify_ops import implements


def _prompt_rows(ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather indices `[B, W]` of each request's prompt tokens in the flat batch, and a mask."""
    forward = ctx.prefill
    width = forward.max_extend_len
    starts = torch.cumsum(forward.extend_lens, 0) - forward.extend_lens
    cols = torch.arange(width, device=starts.device)[None, :]
    valid = cols < forward.extend_lens[:, None]
    index = torch.where(valid, starts[:, None] + cols, 0)
    return index, valid


def _target_prefill(ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Target forward over the prompts; (first tokens [B], hidden [T, H], committed lens [B])."""
    forward = ctx.prefill
    out = ctx.model(forward)
    next_tokens = sample(out.logits, ctx.sampling, ctx.extras["sample_positions"])
    return next_tokens, out.hidden_states, forward.prefix_lens + forward.extend_lens


def _draft_extend_prompts(ctx: StepContext, next_tokens: torch.Tensor, hidden: torch.Tensor):  # type: ignore[no-untyped-def]
    """The drafter over whole prompts: draft position t pairs token t+1 with the target's
    hidden state at t, the last one with the first sampled token."""
    forward = ctx.prefill
    index, valid = _prompt_rows(ctx)
    tokens = forward.input_ids[index]
    shifted = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)
    last = (forward.extend_lens - 1)[:, None]
    cols = torch.arange(index.shape[1], device=index.device)[None, :]
    shifted = torch.where(cols == last, next_tokens[:, None], shifted)
    states = torch.where(valid[:, :, None], hidden[index], 0)
    return ctx.drafter.extend(
        torch.where(valid, shifted, 0),
        states,
        forward.extend_lens,
        forward.prefix_lens,
        forward.req_pool_indices,
        ctx.req_to_token,
        ctx.extras["draft_kv"],
        topk=ctx.dims["topk"],
        max_prefix_len=forward.max_prefix_len,
    )


@implements("eagle_prefill")
@implements("mtp_prefill")
def impl_eagle_prefill(
    ctx: StepContext, *, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
) -> dict[str, torch.Tensor]:
    next_tokens, hidden, committed = _target_prefill(ctx)
    draft = _draft_extend_prompts(ctx, next_tokens, hidden)
    outputs = {
        "next_tokens": next_tokens,
        "seq_lens": committed,
        "topk_p": draft.topk_p,
        "topk_index": draft.topk_index,
    }
    if hasattr(draft, "hidden_states"):
        outputs["hidden_states"] = draft.hidden_states
    return outputs


def _verify_states(hidden_states: torch.Tensor, accept_index: torch.Tensor) -> torch.Tensor:
    """The accepted nodes' target hidden states `[B, N, H]`, zero where padded (never NaN)."""
    batch, n, width = hidden_states.shape
    valid = accept_index >= 0
    flat = hidden_states.reshape(batch * n, width)
    return torch.where(valid[:, :, None], flat[accept_index.clamp(min=0)], 0)


def _draft_extend_accepted(
    ctx: StepContext,
    *,
    hidden_states: torch.Tensor,
    accept_index: torch.Tensor,
    accept_lens: torch.Tensor,
    accept_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
):  # type: ignore[no-untyped-def]
    lens = accept_lens.to(torch.int64)
    return ctx.drafter.extend(
        accept_tokens,
        _verify_states(hidden_states, accept_index),
        lens,
        seq_lens - lens,
        req_pool_indices,
        ctx.req_to_token,
        ctx.extras["draft_kv"],
        topk=ctx.dims["topk"],
        max_prefix_len=ctx.max_prefix_len,
    )


@implements("eagle_draft_extend")
def impl_eagle_draft_extend(ctx: StepContext, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    draft = _draft_extend_accepted(ctx, **inputs)
    return {
        "topk_p": draft.topk_p,
        "topk_index": draft.topk_index,
        "hidden_states": draft.hidden_states,
        "draft_probs": draft.draft_probs,
    }


@implements("mtp_draft_extend")
def impl_mtp_draft_extend(ctx: StepContext, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    draft = _draft_extend_accepted(ctx, **inputs)
    return {"topk_p": draft.topk_p, "topk_index": draft.topk_index}


@implements("eagle_draft")
def impl_eagle_draft(
    ctx: StepContext,
    *,
    topk_p: torch.Tensor,
    topk_index: torch.Tensor,
    hidden_states: torch.Tensor,
    seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    batch = topk_p.shape[0]
    n, topk, num_steps = (ctx.dims[k] for k in ("num_draft_tokens", "topk", "num_steps"))
    window = ctx.out_cache_loc.view(batch, -1)
    scratch = window[:, n : n + topk * (num_steps - 1)]
    tree = ctx.drafter.draft_tree(
        topk_p,
        topk_index,
        hidden_states,
        seq_lens,
        req_pool_indices,
        ctx.req_to_token,
        ctx.extras["draft_kv"],
        scratch,
        num_steps=num_steps,
        num_draft_tokens=n,
        max_prefix_len=ctx.max_prefix_len,
    )
    return {
        "parent_list": tree.parent_list,
        "top_scores_index": tree.top_scores_index,
        "draft_tokens": tree.draft_tokens,
    }


@implements("mtp_select")
def impl_mtp_select(
    ctx: StepContext, *, topk_p: torch.Tensor, topk_index: torch.Tensor
) -> dict[str, torch.Tensor]:
    tree = mtp_select(topk_p, topk_index, ctx.dims["num_draft_tokens"])
    return {
        "parent_list": tree.parent_list,
        "top_scores_index": tree.top_scores_index,
        "draft_tokens": tree.draft_tokens,
    }


@implements("ngram_prefill")
def impl_ngram_prefill(
    ctx: StepContext, *, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
) -> dict[str, torch.Tensor]:
    next_tokens, _, committed = _target_prefill(ctx)
    n = ctx.dims["num_draft_tokens"]
    accept_tokens = torch.zeros(
        next_tokens.shape[0], n, dtype=torch.int64, device=next_tokens.device
    )
    accept_tokens[:, 0] = next_tokens
    return {
        "accept_tokens": accept_tokens,
        "accept_lens": torch.ones_like(next_tokens, dtype=torch.int32),
        "seq_lens": committed,
    }


_PROPOSER_LOCK = threading.Lock()  # the host thread updates histories while a job proposes


@implements("ngram_propose")
def impl_ngram_propose(
    ctx: StepContext, *, req_pool_indices: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Host step: proposals from each request's (lagging) host history, keyed by the token
    each proposal follows; the device picks the row for the relayed last accepted token."""
    with _PROPOSER_LOCK:
        rows = [ctx.drafter.propose_for_suffixes(int(r)) for r in req_pool_indices.tolist()]
    device = req_pool_indices.device
    return {
        "proposals": torch.stack([r.proposals for r in rows]).to(device),
        "proposal_keys": torch.stack([r.proposal_keys for r in rows]).to(device),
    }


@implements("ngram_splice")
def impl_ngram_splice(
    ctx: StepContext,
    *,
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    proposals: torch.Tensor,
    proposal_keys: torch.Tensor,
    seq_lens: torch.Tensor,
) -> dict[str, torch.Tensor]:
    tokens, parents, valid = splice_proposals(accept_tokens, accept_lens, proposals, proposal_keys)
    layout = tree_from_parents(parents, valid, seq_lens, ctx.drafter.max_depth)
    batch, n = tokens.shape
    return {
        "candidates": tokens,
        "tree_mask": layout.tree_mask,
        "positions": layout.positions.view(batch, n),
        "retrive_index": layout.retrive_index,
        "retrive_next_token": layout.retrive_next_token,
        "retrive_next_sibling": layout.retrive_next_sibling,
    }


def proposer_lock() -> threading.Lock:
    """Held by the engine while it updates n-gram histories on the host thread."""
    return _PROPOSER_LOCK
