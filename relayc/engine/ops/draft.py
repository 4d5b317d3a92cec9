"""Implementations of the prefill and drafting ops of EAGLE, EAGLE-3, multi-layer EAGLE,
n-gram and the standalone draft model.

Thin wrappers over the engine's drafters (:mod:`relayc.engine.draft`) and the
target model; `ctx.drafter` is the algorithm's drafter and `ctx.extras["draft_kv"]`
its KV cache (addressed through the target's `req_to_token`, same slot ids).
Decode steps get a window of KV slots per request from the scheduler,
`ctx.out_cache_loc` viewed `[B, W]`: the first `num_draft_tokens` hold the verify
tree, the rest are scratch for tree drafting (discarded after the step).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from relayc.engine.draft.ngram import NgramProposer, splice_proposals
from relayc.engine.draft.paged import gather_rows
from relayc.engine.draft.standalone import DraftConfidence
from relayc.engine.draft.tree import mtp_select, tree_from_parents
from relayc.engine.ops.context import StepContext
from relayc.engine.ops.registry import implements
from relayc.engine.ops.target import target_prefill
from relayc.kernels import keyed_uniforms
from relayc.kernels._backend import graph_safe


def _prompt_rows(ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather indices `[B, W]` of each request's prompt tokens in the flat batch, and a mask."""
    forward = ctx.prefill
    width = forward.max_extend_len
    starts = torch.cumsum(forward.extend_lens, 0) - forward.extend_lens
    cols = torch.arange(width, device=starts.device)[None, :]
    valid = cols < forward.extend_lens[:, None]
    index = torch.where(valid, starts[:, None] + cols, 0)
    return index, valid


def _prompt_slots(ctx: StepContext, index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The prompt tokens' KV slots `[B, W]` (0 where padded). The scheduler records them in
    `req_to_token` only after the prefill step, so draft extends over prompts must not read
    them from there."""
    return torch.where(valid, ctx.prefill.out_cache_loc[index], 0)


def _coins_kwarg(ctx: StepContext, positions: torch.Tensor) -> dict[str, torch.Tensor]:
    """Chain rejection sampling needs the first draft drawn from its distribution: coins
    keyed by (seed, position) when sampling with a relayed `draft_probs`."""
    if not ctx.extras.get("chain_drafts"):
        return {}
    coins = _draft_coins(ctx, positions, 1, DRAFT_STREAM + 1)
    return {} if coins is None else {"coins": coins[:, 0]}


def _draft_coins(
    ctx: StepContext, positions: torch.Tensor, n: int, stream: int
) -> torch.Tensor | None:
    """`[B, n]` uniforms keyed by (seed, position) for sampled drafts; -1 (argmax) on the rows
    of greedy requests, whose drafts gain nothing from being random; None (every draft the
    argmax) when no request samples."""
    if ctx.sampling is None:
        return None
    coins = keyed_uniforms(ctx.sampling.seeds, positions.to(torch.int64), n, stream)
    return torch.where((ctx.sampling.temperatures > 0)[:, None], coins, -1.0)


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
        out_cache_loc=_prompt_slots(ctx, index, valid),
        **_coins_kwarg(ctx, forward.prefix_lens + forward.extend_lens),
    )


def impl_eagle_prefill(
    ctx: StepContext, *, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
) -> dict[str, torch.Tensor]:
    next_tokens, hidden, committed = target_prefill(ctx)
    draft = _draft_extend_prompts(ctx, next_tokens, hidden)
    outputs = {
        "next_tokens": next_tokens,
        "seq_lens": committed,
        "topk_p": draft.topk_p,
        "topk_index": draft.topk_index,
    }
    if hasattr(draft, "hidden_states"):  # EAGLE; the MTP drafter relays no hidden states
        outputs["hidden_states"] = draft.hidden_states
        outputs["draft_probs"] = draft.draft_probs
    return outputs


def impl_eagle3_prefill(
    ctx: StepContext, *, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Target prefill capturing the head's three layers, then the head over the prompt."""
    next_tokens, features, committed = target_prefill(ctx, capture=ctx.drafter.capture)
    draft = _draft_extend_prompts(ctx, next_tokens, features)
    return {
        "next_tokens": next_tokens,
        "seq_lens": committed,
        "topk_p": draft.topk_p,
        "topk_index": draft.topk_index,
        "hidden_states": draft.hidden_states,
    }


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
    """Draft extend over the accepted nodes: their target hidden states `[B, N, H]` (zero
    where padded), or -- a drafter whose extend takes `feature_rows` (its
    `extend_gathers_rows`) -- the verify's states and each row's node, gathered there."""
    lens = accept_lens.to(torch.int64)
    if getattr(ctx.drafter, "extend_gathers_rows", False):
        states, rows = hidden_states, {"feature_rows": accept_index}
    else:
        states, rows = gather_rows(hidden_states, accept_index), {}
    return ctx.drafter.extend(
        accept_tokens,
        states,
        lens,
        seq_lens - lens,
        req_pool_indices,
        ctx.req_to_token,
        ctx.extras["draft_kv"],
        topk=ctx.dims["topk"],
        max_prefix_len=ctx.max_prefix_len,
        **rows,
        **_coins_kwarg(ctx, seq_lens),
    )


def impl_eagle_draft_extend(ctx: StepContext, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    draft = _draft_extend_accepted(ctx, **inputs)
    return {
        "topk_p": draft.topk_p,
        "topk_index": draft.topk_index,
        "hidden_states": draft.hidden_states,
        "draft_probs": draft.draft_probs,
    }


def impl_eagle3_draft_extend(
    ctx: StepContext, *, aux_hidden_states: torch.Tensor, **inputs: torch.Tensor
) -> dict[str, torch.Tensor]:
    draft = _draft_extend_accepted(ctx, hidden_states=aux_hidden_states, **inputs)
    return {
        "topk_p": draft.topk_p,
        "topk_index": draft.topk_index,
        "hidden_states": draft.hidden_states,
    }


def impl_draft_to_target(
    ctx: StepContext, *, draft_tokens: torch.Tensor
) -> dict[str, torch.Tensor]:
    """EAGLE-3: the drafted tokens as target ids (the head's d2t map)."""
    return {"draft_tokens": ctx.drafter.to_target_ids(draft_tokens)}


def impl_mtp_draft_extend(ctx: StepContext, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    draft = _draft_extend_accepted(ctx, **inputs)
    return {"topk_p": draft.topk_p, "topk_index": draft.topk_index}


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
    """EAGLE-2 tree drafting; with a relayed `draft_probs` (topk 1), a chain that keeps every
    draft's distribution, drawn from it when sampling, for chain rejection sampling. EAGLE-3's
    head drafts the same way, in its own vocabulary's ids (`draft_to_target` maps them)."""
    batch = topk_p.shape[0]
    n, topk, num_steps = (ctx.dims[k] for k in ("num_draft_tokens", "topk", "num_steps"))
    window = ctx.out_cache_loc.view(batch, -1)
    scratch = window[:, n : n + topk * (num_steps - 1)]
    common = (seq_lens, req_pool_indices, ctx.req_to_token, ctx.extras["draft_kv"], scratch)
    if draft_probs is not None:
        coins = _draft_coins(ctx, seq_lens, num_steps - 1, DRAFT_STREAM)
        chain = ctx.drafter.draft_chain(
            topk_index,
            draft_probs,
            hidden_states,
            *common,
            num_steps=num_steps,
            max_prefix_len=ctx.max_prefix_len,
            coins=coins,
        )
        tree = chain.tree
        extra = {"chain_draft_probs": chain.draft_probs}
    else:
        tree = ctx.drafter.draft_tree(
            topk_p,
            topk_index,
            hidden_states,
            *common,
            num_steps=num_steps,
            num_draft_tokens=n,
            max_prefix_len=ctx.max_prefix_len,
        )
        extra = {}
    return {
        "parent_list": tree.parent_list,
        "top_scores_index": tree.top_scores_index,
        "draft_tokens": tree.draft_tokens,
        **extra,
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


def _draft_confidence(ctx: StepContext) -> DraftConfidence | None:
    """The dynamic draft length state (``Engine(draft_confidence=...)``), or None when off."""
    return None if ctx.extras is None else ctx.extras.get("draft_confidence")


def _bonus_slots(ctx: StepContext, req_pool_indices: torch.Tensor) -> torch.Tensor:
    """Each request slot's private draft KV slot for its bonus position (standalone)."""
    return ctx.extras["bonus_slot_base"] + req_pool_indices.long()


def impl_standalone_prefill(
    ctx: StepContext, *, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Target prefill, then the draft model over the prompt and the first token: prompt
    positions into the prompt's slots, the first token's into the request's bonus slot."""
    next_tokens, _, committed = target_prefill(ctx)
    forward = ctx.prefill
    if (confidence := _draft_confidence(ctx)) is not None:
        confidence.reset(forward.req_pool_indices)
    index, valid = _prompt_rows(ctx)
    batch, width = index.shape
    cols = torch.arange(width + 1, device=index.device)[None, :]
    at_bonus = cols == forward.extend_lens[:, None]
    pad = torch.zeros(batch, 1, dtype=torch.int64, device=index.device)
    tokens = torch.cat([torch.where(valid, forward.input_ids[index], 0), pad], dim=1)
    tokens = torch.where(at_bonus, next_tokens[:, None], tokens)
    slots = torch.cat([_prompt_slots(ctx, index, valid), pad], dim=1)
    slots = torch.where(at_bonus, _bonus_slots(ctx, forward.req_pool_indices)[:, None], slots)
    draft = ctx.drafter.extend(
        tokens,
        forward.extend_lens + 1,
        forward.prefix_lens,
        forward.req_pool_indices,
        ctx.req_to_token,
        ctx.extras["draft_kv"],
        topk=ctx.dims["topk"],
        max_prefix_len=forward.max_prefix_len,
        out_cache_loc=slots,
        **_coins_kwarg(ctx, committed),
    )
    return {
        "next_tokens": next_tokens,
        "seq_lens": committed,
        "topk_p": draft.topk_p,
        "topk_index": draft.topk_index,
        "draft_probs": draft.draft_probs,
    }


def impl_standalone_draft(
    ctx: StepContext,
    *,
    topk_p: torch.Tensor,
    topk_index: torch.Tensor,
    draft_probs: torch.Tensor,
    seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """A chain from the relayed first draft: the draft cache covers the bonus (in its bonus
    slot); drafts 1..num_steps-1 go to the window's slots 1.. of the draft cache (the
    target's K/V for those positions live in the other cache). With a draft confidence
    (dynamic draft length) the drafts past each request's stop get all-zero probabilities,
    which `accept_chain` never accepts."""
    batch = topk_index.shape[0]
    num_steps = ctx.dims["num_steps"]
    window = ctx.out_cache_loc.view(batch, -1)
    coins = _draft_coins(ctx, seq_lens, num_steps - 1, DRAFT_STREAM)
    confidence = _draft_confidence(ctx)
    chain = ctx.drafter.draft_chain(
        topk_index,
        draft_probs,
        seq_lens + 1,
        req_pool_indices,
        ctx.req_to_token,
        ctx.extras["draft_kv"],
        window[:, 1:num_steps],
        num_steps=num_steps,
        max_prefix_len=ctx.max_prefix_len + 1,
        coins=coins,
        bonus_cache_loc=_bonus_slots(ctx, req_pool_indices),
        thresholds=None if confidence is None else confidence.thresholds[req_pool_indices.long()],
    )
    tree = chain.tree
    if confidence is not None:
        confidence.record(req_pool_indices, chain.draft_probs, tree.draft_tokens)
        # Where the host may read the device, verify only up to the longest kept chain.
        host = topk_index.device.type == "cpu" and not graph_safe()
        longest = confidence.draft_lens[req_pool_indices.long()].max() if host else None
        ctx.extras["verify_len"] = None if longest is None else int(longest) + 1
    return {
        "parent_list": tree.parent_list,
        "top_scores_index": tree.top_scores_index,
        "draft_tokens": tree.draft_tokens,
        "chain_draft_probs": chain.draft_probs,
    }


def impl_standalone_draft_extend(
    ctx: StepContext,
    *,
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Commit the old bonus's draft K/V (now at position `seq_lens - m`, verified), then
    the draft model over the emitted tokens: the accepted drafts into their committed
    slots, the new bonus into the bonus slot. Its last position gives the next top-k."""
    lens = accept_lens.to(torch.int64)
    if (confidence := _draft_confidence(ctx)) is not None:
        confidence.update(req_pool_indices, lens - 1)
    width = accept_tokens.shape[1]
    root = seq_lens - lens  # the old bonus's position, committed by this step's verify
    bonus = _bonus_slots(ctx, req_pool_indices)
    kv = ctx.extras["draft_kv"]
    rows = req_pool_indices.long()
    kv.copy_slots(ctx.req_to_token[rows, root], bonus)
    cols = torch.arange(width, device=lens.device)[None, :]
    positions = (root + 1)[:, None] + cols
    committed = ctx.req_to_token[rows[:, None], positions.clamp(max=ctx.req_to_token.shape[1] - 1)]
    slots = torch.where(cols < (lens - 1)[:, None], committed.long(), 0)
    slots = torch.where(cols == (lens - 1)[:, None], bonus[:, None], slots)
    draft = ctx.drafter.extend(
        accept_tokens,
        lens,
        root + 1,
        req_pool_indices,
        ctx.req_to_token,
        kv,
        topk=ctx.dims["topk"],
        max_prefix_len=ctx.max_prefix_len + 1,
        out_cache_loc=slots,
        **_coins_kwarg(ctx, seq_lens),
    )
    return {
        "topk_p": draft.topk_p,
        "topk_index": draft.topk_index,
        "draft_probs": draft.draft_probs,
    }


@implements("ngram_prefill")
def impl_ngram_prefill(
    ctx: StepContext, *, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
) -> dict[str, torch.Tensor]:
    next_tokens, _, committed = target_prefill(ctx)
    n = ctx.dims["num_draft_tokens"]
    accept_tokens = torch.zeros(
        next_tokens.shape[0], n, dtype=torch.int64, device=next_tokens.device
    )
    accept_tokens[:, 0] = next_tokens
    return {
        "next_tokens": next_tokens,
        "accept_tokens": accept_tokens,
        "accept_lens": torch.ones_like(next_tokens, dtype=torch.int32),
        "seq_lens": committed,
    }


DRAFT_STREAM = 2  # keyed_uniforms stream of sampled drafts (0, 1: acceptance, final draw)
_PROPOSER_LOCK = threading.Lock()  # the host thread updates histories while a job proposes


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


def impl_ngram_splice(
    ctx: StepContext,
    *,
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    proposals: torch.Tensor,
    proposal_keys: torch.Tensor,
    seq_lens: torch.Tensor,
) -> dict[str, torch.Tensor]:
    tree, _ = splice_tree(ctx, accept_tokens, accept_lens, proposals, proposal_keys, seq_lens)
    return tree


def splice_tree(
    ctx: StepContext,
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    proposals: torch.Tensor,
    proposal_keys: torch.Tensor,
    seq_lens: torch.Tensor,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A host drafter's proposals spliced onto the accepted tokens as a verify tree (the
    splice step's outputs), and which of each row's nodes are valid (leading each row)."""
    tokens, parents, valid = splice_proposals(accept_tokens, accept_lens, proposals, proposal_keys)
    layout = tree_from_parents(parents, valid, seq_lens, ctx.drafter.max_depth)
    batch, n = tokens.shape
    tree = {
        "candidates": tokens,
        "tree_mask": layout.tree_mask,
        "positions": layout.positions.view(batch, n),
        "retrive_index": layout.retrive_index,
        "retrive_next_token": layout.retrive_next_token,
        "retrive_next_sibling": layout.retrive_next_sibling,
    }
    return tree, valid


def proposer_lock() -> threading.Lock:
    """Held by the engine while it updates n-gram histories on the host thread."""
    return _PROPOSER_LOCK


def proposes_nothing(drafter: object, req_pool_indices: Sequence[int]) -> bool:
    """Whether a lag-keyed host drafter (an ``NgramProposer``: n-gram, suffix) whose history
    of each request is current would have the decode step verify the root alone for every
    one of ``req_pool_indices``.

    With the history current, the relayed last accepted token is the host's last token,
    so the splice takes the row keyed by it, row 0 of ``propose_for_suffixes``: the tree
    ``propose`` grows (one lookup, where the rows cost one per guess). Any other drafter:
    False (the caller runs the decode step).
    """
    if not isinstance(drafter, NgramProposer):
        return False
    with _PROPOSER_LOCK:
        return all(len(drafter.propose(req).tokens) == 1 for req in req_pool_indices)
