"""Implementations of the ops every tree algorithm shares: build the tree, verify it with
one target forward, accept a path, and commit the accepted KV.

Conventions (per request, N = num_draft_tokens, node 0 = the root = the bonus
token of the previous iteration, at position L = the committed KV length):

- ``accept_index [B, N]`` holds accepted nodes as rows of the flattened verify
  batch (``b*N + node``, SGLang's convention), root first, -1 padded;
- ``accept_lens [B]`` = accepted drafts + 1: the tokens emitted this iteration
  (the accepted drafts and the new bonus token) and, equally, the tokens whose
  KV is committed (the root and the accepted drafts);
- ``accept_tokens [B, N]`` = the emitted tokens, left-aligned, 0 padded;
- ``bonus_tokens [B]`` = the target's token after the last accepted node.

Everything here is graph-safe: shapes depend on B and N only, no host reads -- except the
CPU shortcut of ``compact_accepted_kv``, which ``graph_safe_paths`` turns off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.core.sampling import SamplingBatch, filter_logits, sample
from relayc.engine.decoder.fused_forward import index_arrays
from relayc.engine.draft.ngram import NgramProposer
from relayc.engine.draft.tree import keeps_every_draft, layout_constant
from relayc.engine.native import library as native
from relayc.engine.ops.context import StepContext
from relayc.engine.ops.registry import implements
from relayc.engine.ops.target import greedy_tokens
from relayc.kernels import (
    TreeMaskMode,
    build_tree,
    chain_speculative_sampling,
    keyed_uniforms,
    tree_speculative_sampling_target_only,
    verify_tree_greedy,
)
from relayc.kernels._backend import graph_safe, native_paths
from relayc.kernels.rng import FINAL_STREAM

# build_tree lays out a chain that keeps every draft directly (the same outputs); False:
# through the general build (tests compare the two)
CHAIN_SHORTCUT = True


def verify_slots(ctx: StepContext, batch: int, n: int) -> torch.Tensor:
    """`[B, N]` KV slots of the verify trees: the front of each request's window."""
    return ctx.out_cache_loc.view(batch, -1)[:, :n]


@implements("build_tree")
def impl_build_tree(
    ctx: StepContext,
    *,
    bonus_tokens: torch.Tensor,
    parent_list: torch.Tensor,
    top_scores_index: torch.Tensor,
    draft_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
) -> dict[str, torch.Tensor]:
    batch, n = bonus_tokens.shape[0], ctx.dims["num_draft_tokens"]
    if CHAIN_SHORTCUT and keeps_every_draft(ctx.dims["topk"], ctx.dims["num_steps"], n):
        return _chain_layout(bonus_tokens, draft_tokens, seq_lens)
    tree = build_tree(
        bonus_tokens,
        parent_list,
        top_scores_index,
        draft_tokens,
        seq_lens,
        seq_lens_sum=0,  # only the full mask needs it
        topk=ctx.dims["topk"],
        spec_steps=ctx.dims["num_steps"],
        num_verify_tokens=n,
        tree_mask_mode=TreeMaskMode.QLEN_ONLY,
    )
    return {
        "candidates": tree.draft_tokens.view(batch, n),
        "tree_mask": tree.tree_mask.view(batch, n, n),
        "positions": tree.positions.view(batch, n),
        "retrive_index": tree.retrive_index,
        "retrive_next_token": tree.retrive_next_token,
        "retrive_next_sibling": tree.retrive_next_sibling,
    }


def _chain_layout(
    bonus_tokens: torch.Tensor, draft_tokens: torch.Tensor, seq_lens: torch.Tensor
) -> dict[str, torch.Tensor]:
    """``build_tree``'s outputs for a chain that keeps every draft (topk 1, ``N - 1`` =
    ``num_steps`` drafts: one candidate a level, so every one is kept, in order): node ``i``
    the ``i``-th draft, child of node ``i - 1``. With one beam a level the parent list
    holds nothing to read (``[-1, 0, 1, ...]``, the drafting layout's), so the layout is
    made directly: a handful of ops where the general one walks the tree on the host."""
    batch, drafts = draft_tokens.shape
    n = drafts + 1
    device = draft_tokens.device
    nodes = layout_constant(
        ("chain nodes", n), device, lambda: torch.arange(n, device=device), shared=True
    )
    return {
        "candidates": torch.cat([bonus_tokens[:, None], draft_tokens], dim=1).to(torch.int64),
        "tree_mask": layout_constant(
            ("chain mask", batch, n),
            device,
            lambda: torch.ones(batch, n, n, dtype=torch.bool, device=device).tril(),
        ),
        "positions": seq_lens[:, None].to(torch.int64) + nodes,
        "retrive_index": layout_constant(
            ("chain retrive_index", batch, n),
            device,
            lambda: torch.arange(batch, device=device)[:, None] * n + nodes,
        ),
        "retrive_next_token": layout_constant(
            ("chain retrive_next_token", batch, n),
            device,
            lambda: torch.where(nodes + 1 < n, nodes + 1, -1).repeat(batch, 1),
        ),
        "retrive_next_sibling": layout_constant(
            ("chain retrive_next_sibling", batch, n),
            device,
            lambda: torch.full((batch, n), -1, dtype=torch.int64, device=device),
        ),
    }


@implements("target_verify")
def impl_target_verify(
    ctx: StepContext,
    *,
    candidates: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
) -> dict[str, torch.Tensor]:
    logits, hidden = _verify(ctx, candidates, tree_mask, positions, seq_lens, req_pool_indices)
    return {"logits": logits, "hidden_states": hidden}


@implements("target_verify_aux")
def impl_target_verify_aux(
    ctx: StepContext,
    *,
    candidates: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """EAGLE-3's verify: the inputs of the drafter's capture layers instead of the last
    hidden state, ``[B, N, 3 * hidden]``."""
    logits, aux = _verify(
        ctx,
        candidates,
        tree_mask,
        positions,
        seq_lens,
        req_pool_indices,
        capture=ctx.drafter.capture,
    )
    return {"logits": logits, "aux_hidden_states": aux}


def _verify(
    ctx: StepContext,
    candidates: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
    capture: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """One target forward over every tree node: logits ``[B, N, V]`` and the last hidden
    states ``[B, N, H]`` (with ``capture``: the captured layers' inputs)."""
    batch, n = candidates.shape
    # Dynamic draft length on a host-driven path: every chain of the batch stopped before
    # node `k`, so only the first `k` nodes can be accepted or sampled after; the rest of
    # the outputs are zeros nobody reads (``impl_standalone_draft`` sets it every step).
    k = min(n, (ctx.extras or {}).get("verify_len") or n)
    forward = ForwardBatch(
        mode=ForwardMode.VERIFY,
        input_ids=candidates[:, :k].reshape(-1),
        positions=positions[:, :k].reshape(-1),
        out_cache_loc=verify_slots(ctx, batch, k).reshape(-1),
        req_pool_indices=req_pool_indices,
        prefix_lens=seq_lens,
        extend_lens=torch.full_like(seq_lens, k),
        max_prefix_len=ctx.max_prefix_len,
        max_extend_len=k,
        req_to_token=ctx.req_to_token,
        kv_cache=ctx.kv_cache,
        tree_mask=tree_mask if k == n else tree_mask[:, :k, :k].contiguous(),
    )
    out = ctx.model(forward, capture=capture) if capture else ctx.model(forward)
    states = out.hidden_states if out.aux_hidden_states is None else out.aux_hidden_states
    logits, hidden = out.logits.view(batch, k, -1), states.view(batch, k, -1)
    if k < n:
        logits = torch.cat([logits, logits.new_zeros(batch, n - k, logits.shape[2])], dim=1)
        hidden = torch.cat([hidden, hidden.new_zeros(batch, n - k, hidden.shape[2])], dim=1)
    return logits, hidden


def target_probs(logits: torch.Tensor, ctx: StepContext) -> torch.Tensor:
    """Per-node target distributions `[B, N, V]` under each request's sampling params."""
    sampling = ctx.sampling
    batch, n, vocab = logits.shape
    temperatures = torch.where(sampling.temperatures > 0, sampling.temperatures, 1.0)
    flat = (logits.float() / temperatures[:, None, None]).reshape(batch * n, vocab)
    filtered = filter_logits(
        flat,
        sampling.top_ks.repeat_interleave(n, output_size=batch * n),
        sampling.top_ps.repeat_interleave(n, output_size=batch * n),
    )
    return torch.softmax(filtered, dim=-1).view(batch, n, vocab)


def _accept_outputs(
    predicts: torch.Tensor, accept_index: torch.Tensor, accept_num: torch.Tensor
) -> dict[str, torch.Tensor]:
    accept_lens = accept_num + 1
    valid = accept_index >= 0
    tokens = predicts.to(torch.int64)[accept_index.clamp(min=0).to(torch.int64)]
    tokens = torch.where(valid, tokens, 0)
    bonus = tokens.gather(1, (accept_lens.to(torch.int64) - 1)[:, None])[:, 0]
    return {
        "accept_index": accept_index.to(torch.int64),
        "accept_lens": accept_lens,
        "accept_tokens": tokens,
        "bonus_tokens": bonus,
    }


def _native_greedy(
    candidates: torch.Tensor,
    tree: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    target: torch.Tensor,
) -> dict[str, torch.Tensor] | None:
    """The greedy accept's outputs (``verify_tree_greedy`` then :func:`_accept_outputs`,
    every draft acceptable) in one native call (verify.c's ``relayc_accept_greedy``) on
    the CPU: the host loop and some fifteen torch calls ran right after the verify forward,
    each slow there. None: the kernel's way (no library, a graph-safe check, other dtypes,
    an index outside the trees)."""
    lib = native.native_decoder()
    if (
        lib is None
        or not native_paths()
        or candidates.dim() != 2
        or not index_arrays(candidates, *tree, target)
        or target.numel() != candidates.numel()
        or any(t.shape != candidates.shape for t in tree)
    ):
        return None
    batch, n = candidates.shape
    accept_index = torch.empty(batch, n, dtype=torch.int64)
    accept_lens = torch.empty(batch, dtype=torch.int32)
    tokens = torch.empty(batch, n, dtype=torch.int64)
    bonus = torch.empty(batch, dtype=torch.int64)
    pointers = [t.data_ptr() for t in (candidates, *tree, target)]
    outputs = (accept_index, accept_lens, tokens, bonus)
    code = lib.relayc_accept_greedy(batch, n, n - 1, *pointers, *(t.data_ptr() for t in outputs))
    if code != 0:
        return None
    return {
        "accept_index": accept_index,
        "accept_lens": accept_lens,
        "accept_tokens": tokens,
        "bonus_tokens": bonus,
    }


Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # predicts, accept_index, count
SampledAccept = Callable[[Outputs, torch.Tensor, torch.Tensor], None]


def _accept(
    ctx: StepContext,
    logits: torch.Tensor,
    candidates: torch.Tensor,
    positions: torch.Tensor,
    tree: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    sampled_accept: SampledAccept,
    coin_count: int,
) -> dict[str, torch.Tensor]:
    """Greedy acceptance for every row, the sampled rule for rows with a temperature; each
    row keeps the result of its own rule (graph-safe: both always run)."""
    batch, n = candidates.shape
    device = candidates.device

    def fresh() -> Outputs:
        return (
            torch.zeros(batch * n, dtype=torch.int32, device=device),
            torch.full((batch, n), -1, dtype=torch.int32, device=device),
            torch.zeros(batch, dtype=torch.int32, device=device),
        )

    target = greedy_tokens(logits)
    if ctx.sampling is None:
        made = _native_greedy(candidates, tree, target)
        if made is not None:
            return made
    greedy = fresh()
    verify_tree_greedy(*greedy, candidates, *tree, target)
    if ctx.sampling is None:
        return _accept_outputs(*greedy)
    sampled = fresh()
    # Coins keyed by (seed, position of the root), so runs are reproducible.
    root_positions = positions[:, 0].to(torch.int64)
    coins = keyed_uniforms(ctx.sampling.seeds, root_positions, coin_count)
    final = keyed_uniforms(ctx.sampling.seeds, root_positions, 1, FINAL_STREAM)[:, 0]
    sampled_accept(sampled, coins, final)
    rows = ctx.sampling.temperatures > 0
    flat_rows = rows.repeat_interleave(n, output_size=batch * n)
    return _accept_outputs(
        torch.where(flat_rows, sampled[0], greedy[0]),
        torch.where(rows[:, None], sampled[1], greedy[1]),
        torch.where(rows, sampled[2], greedy[2]),
    )


@implements("accept_tree")
def impl_accept_tree(
    ctx: StepContext,
    *,
    logits: torch.Tensor,
    candidates: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Greedy rows: the longest path whose drafts equal the target's argmax; sampled rows:
    target-only tree speculative sampling (lossless), or for n-gram drafts the keyed draw
    of every node (:func:`_accept_keyed_draws`)."""
    tree = (retrive_index, retrive_next_token, retrive_next_sibling)
    if ctx.sampling is not None and isinstance(ctx.drafter, NgramProposer):
        return _accept_keyed_draws(ctx, logits, candidates, positions, tree)

    def sampled_accept(out: Outputs, coins: torch.Tensor, final: torch.Tensor) -> None:
        probs = target_probs(logits, ctx)
        tree_speculative_sampling_target_only(
            *out, candidates, *tree, coins, final, probs, torch.zeros_like(probs)
        )

    return _accept(ctx, logits, candidates, positions, tree, sampled_accept, candidates.shape[1])


def _accept_keyed_draws(
    ctx: StepContext,
    logits: torch.Tensor,
    candidates: torch.Tensor,
    positions: torch.Tensor,
    tree: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Every node's next token drawn as plain sampling draws it (``sample``: the request's
    seed and the position the token takes key the draw), then the longest path of drafts
    equal to those draws, as greedy rows take the argmax's.

    For n-gram drafts, whose tree depends on what the host knew when it proposed (one
    iteration behind when the step is overlapped, which it is only in a batch: see
    ``ThreadRunner``): coins indexed by node would give a request other tokens in other
    trees. This draw depends on the position alone, so a request's tokens are those of
    ``algorithm="none"``, whatever its tree, its batch or overlap. Lossless, and as likely
    to accept as the target-only rule for a draft without probabilities (a child is taken
    with the target's probability of its token)."""
    sampling = ctx.sampling
    assert sampling is not None, "the keyed rule runs for sampled batches"
    batch, n, vocab = logits.shape
    per_node = SamplingBatch(
        *(
            t.repeat_interleave(n, output_size=batch * n)
            for t in (sampling.temperatures, sampling.top_ks, sampling.top_ps, sampling.seeds)
        )
    )
    # A node's logits give the token after it: it sits one position further.
    draws = sample(logits.reshape(batch * n, vocab), per_node, positions.reshape(-1) + 1)
    out = (
        torch.zeros(batch * n, dtype=torch.int32, device=candidates.device),
        torch.full((batch, n), -1, dtype=torch.int32, device=candidates.device),
        torch.zeros(batch, dtype=torch.int32, device=candidates.device),
    )
    verify_tree_greedy(*out, candidates, *tree, draws.view(batch, n))
    return _accept_outputs(*out)


@implements("accept_chain")
def impl_accept_chain(
    ctx: StepContext,
    *,
    logits: torch.Tensor,
    candidates: torch.Tensor,
    positions: torch.Tensor,
    draft_probs: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """A chain (topk 1): greedy rows accept while drafts equal the target's argmax; sampled
    rows use rejection sampling with the drafts' real probabilities (Leviathan et al.; with
    ``Engine(block_verification=True)``, Sun et al. 2024's block verification). With
    ``Engine(draft_confidence=...)`` a chain ends at its first all-zero draft distribution."""
    return _accept_chain(ctx, logits, candidates, positions, draft_probs, ctx.block_verification)


@implements("accept_chain_block")
def impl_accept_chain_block(
    ctx: StepContext,
    *,
    logits: torch.Tensor,
    candidates: torch.Tensor,
    positions: torch.Tensor,
    draft_probs: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """``accept_chain`` with block verification chosen in the spec (`op: accept_chain_block`)."""
    return _accept_chain(ctx, logits, candidates, positions, draft_probs, True)


def _accept_chain(
    ctx: StepContext,
    logits: torch.Tensor,
    candidates: torch.Tensor,
    positions: torch.Tensor,
    draft_probs: torch.Tensor,
    block_verification: bool,
) -> dict[str, torch.Tensor]:
    batch, n = candidates.shape
    device = candidates.device
    nodes = torch.arange(n, device=device)
    next_node = torch.where(nodes + 1 < n, nodes + 1, -1).expand(batch, n)
    if ctx.extras is not None and ctx.extras.get("draft_confidence") is not None:
        # Dynamic draft length: a draft with an all-zero distribution was not drafted (the
        # request stopped before it); greedy rows stop there, and the sampled kernel rejects
        # it (q = 0) and draws from the target row, which is the same as a shorter chain.
        drafted = torch.cat(
            [draft_probs.sum(dim=-1) > 0, torch.zeros(batch, 1, dtype=torch.bool, device=device)],
            dim=1,
        )
        next_node = torch.where(drafted, next_node, -1)
    chain = (
        (torch.arange(batch, device=device)[:, None] * n + nodes).contiguous(),
        next_node.contiguous(),
        torch.full((batch, n), -1, dtype=torch.int64, device=device),
    )

    def sampled_accept(out: Outputs, coins: torch.Tensor, final: torch.Tensor) -> None:
        chain_speculative_sampling(
            *out,
            candidates[:, 1:].contiguous(),
            coins,
            final,
            target_probs(logits, ctx),
            draft_probs.contiguous(),
            block_verification=block_verification,
        )

    return _accept(ctx, logits, candidates, positions, chain, sampled_accept, n - 1)


def _native_compact(
    ctx: StepContext,
    window: torch.Tensor,
    accept_index: torch.Tensor,
    accept_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
) -> torch.Tensor | None:
    """``compact_accepted_kv`` in one native call (verify.c's ``relayc_compact``: the
    moved slots' K/V in every layer, the window's ``req_to_token`` entries, the new
    lengths), where some twelve torch calls ran right after the verify forward; None: the
    torch way (no library, other dtypes or layouts, an index it refuses)."""
    lib = native.native_decoder()
    buffer, table = ctx.kv_cache.buffer, ctx.req_to_token
    batch, n = accept_index.shape
    if (
        lib is None
        or window.dtype != torch.int64
        or window.stride(1) != 1
        or not buffer.is_contiguous()
        or table.dtype != torch.int32
        or table.dim() != 2
        or not table.is_contiguous()
        or accept_lens.dtype != torch.int32
        or not accept_lens.is_contiguous()
        or not index_arrays(accept_index, seq_lens, req_pool_indices)
        or not accept_lens.numel() == seq_lens.numel() == req_pool_indices.numel() == batch
    ):
        return None
    new_seq_lens = torch.empty(batch, dtype=torch.int64)
    planes, size = buffer.shape[0], buffer.shape[1]
    code = lib.relayc_compact(
        batch,
        n,
        window.data_ptr(),
        window.stride(0),
        accept_index.data_ptr(),
        buffer.data_ptr(),
        planes,
        size,
        buffer.stride(1) * buffer.element_size(),  # a slot's bytes in one plane
        table.data_ptr(),
        table.shape[0],
        table.shape[1],
        req_pool_indices.data_ptr(),
        seq_lens.data_ptr(),
        accept_lens.data_ptr(),
        new_seq_lens.data_ptr(),
    )
    if code == -1:
        raise MemoryError("the native KV compaction could not allocate its buffer")
    return new_seq_lens if code == 0 else None


@implements("compact_accepted_kv")
def impl_compact_accepted_kv(
    ctx: StepContext,
    *,
    accept_index: torch.Tensor,
    accept_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Move the accepted nodes' KV to the front of each verify window, in path order, and
    record the window at positions [L, L+N) of `req_to_token`; the first `accept_lens`
    entries are the committed ones (the rest are overwritten by the next window)."""
    batch, n = accept_index.shape
    window = verify_slots(ctx, batch, n)
    if window.device.type == "cpu" and native_paths():
        made = _native_compact(ctx, window, accept_index, accept_lens, seq_lens, req_pool_indices)
        if made is not None:
            return {"new_seq_lens": made}
    offsets = torch.arange(batch, device=window.device)[:, None] * n
    local = torch.where(
        accept_index >= 0, accept_index - offsets, torch.arange(n, device=window.device)[None, :]
    )
    source = window.gather(1, local)
    if window.device.type == "cpu" and not graph_safe():
        # Host shortcut: only the slots whose KV moves are copied (none for a chain accepted
        # in order, n-gram's usual case); the copy reads every source before it writes, so
        # leaving out the slots copied onto themselves changes nothing. A copy gathers and
        # scatters the slots in every layer's K and V (about 170 us on SmolLM2 here).
        moved = source != window
        if bool(moved.any()):
            ctx.kv_cache.copy_slots(window[moved], source[moved])
    else:
        ctx.kv_cache.copy_slots(window.reshape(-1), source.reshape(-1))
    positions = seq_lens[:, None] + torch.arange(n, device=window.device)[None, :]
    ctx.req_to_token[req_pool_indices[:, None], positions] = window.to(ctx.req_to_token.dtype)
    return {"new_seq_lens": seq_lens + accept_lens.to(seq_lens.dtype)}
