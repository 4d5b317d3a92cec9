"""Drafting results in the layout ``relayc.kernels.build_tree`` consumes (SGLang's).

EAGLE drafts ``num_steps`` levels. Level 0 offers the ``topk`` relayed candidates
under the root; every later level offers ``topk * topk`` (``topk`` children of each
of the ``topk`` beams kept at the previous level). Per request, candidate ``x`` of
the flattened score list is

    level 0:  x in [0, topk)                           parent: the root
    level s:  x = topk + (s-1)*topk*topk + j*topk + c   parent: parent_list[b, x // topk]

``parent_list [B, topk*(num_steps-1)+1]`` holds -1 then the flat index of every
beam kept at levels 0 .. num_steps-2. :func:`organize_draft_results` keeps the
best ``N - 1`` candidates, sorted ascending (``top_scores_index``), and their
tokens (``draft_tokens``).

Ties: candidates are ranked by score, then by *lower flat index first* (a stable
descending sort, where SGLang uses ``torch.topk`` whose tie order is
unspecified). A child's flat index always exceeds its parent's and its score
never exceeds it, so the selection is closed under parents even on ties.

Everything here is fixed-shape torch with no host reads, safe inside a CUDA graph,
except the small-batch CPU host loop of :func:`tree_from_parents`, which
``relayc.kernels._backend.graph_safe_paths`` (and so ``capture_check``) turns off.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import NamedTuple

import torch

from relayc.kernels._backend import host_loops


class DraftTree(NamedTuple):
    """What ``build_tree`` takes besides the root token and the sequence lengths."""

    parent_list: torch.Tensor  # [B, topk*(num_steps-1)+1] int64 (one step: the root's -1)
    top_scores_index: torch.Tensor  # [B, N-1] int64, ascending
    draft_tokens: torch.Tensor  # [B, N-1] int64


class ChainDraft(NamedTuple):
    """A drafted chain (topk 1) and the distribution each draft was drawn from."""

    tree: DraftTree  # build_tree inputs for topk 1, N = num_steps + 1
    draft_probs: torch.Tensor  # [B, num_steps, vocab] float32, row s: draft s+1's distribution


class BeamLevel(NamedTuple):
    """One level of the draft loop (SGLang's ``select_top_k_tokens`` outputs)."""

    input_ids: torch.Tensor  # [B*topk] int64, the kept beams' tokens (next forward's input)
    parent_beam: torch.Tensor  # [B, topk] int64, the previous level's beam each kept beam extends
    scores: torch.Tensor  # [B, topk] float32, cumulative score of each kept beam
    level_scores: torch.Tensor  # [B, 1 or topk, topk] every candidate's cumulative score
    level_tokens: torch.Tensor  # [B, topk or topk*topk] every candidate's token
    level_parents: torch.Tensor  # [B, topk+1 (level 0) or topk] flat index of the kept beams


def best_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` highest ``scores`` along the last dim; ties to the lower index."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]


def max_candidates(topk: int, num_steps: int) -> int:
    """Candidates one drafting run produces (the root excluded)."""
    return topk + (num_steps - 1) * topk * topk


def select_level(
    level: int,
    topk_p: torch.Tensor,
    topk_index: torch.Tensor,
    scores: torch.Tensor | None,
    topk: int,
) -> BeamLevel:
    """Rank one level's candidates and keep ``topk`` beams.

    ``topk_p`` / ``topk_index`` are ``[B, topk]`` at level 0 (the relayed top-k) and
    ``[B*topk, topk]`` later (the top-k of every beam's draft forward); ``scores``
    ``[B, topk]`` are the previous level's beam scores (None at level 0).
    """
    batch = topk_p.shape[0] if level == 0 else topk_p.shape[0] // topk
    device = topk_p.device
    if level == 0:
        parents = torch.arange(-1, topk, dtype=torch.int64, device=device).expand(batch, -1)
        return BeamLevel(
            input_ids=topk_index.flatten(),
            parent_beam=torch.arange(topk, device=device).expand(batch, -1),
            scores=topk_p,
            level_scores=topk_p.unsqueeze(1),
            level_tokens=topk_index,
            level_parents=parents,
        )
    if scores is None:
        raise ValueError("levels after 0 need the previous level's beam scores")
    expand_scores = scores.unsqueeze(2) * topk_p.view(batch, topk, topk)  # [B, topk, topk]
    flat_scores = expand_scores.flatten(1)
    kept = best_indices(flat_scores, topk)  # [B, topk] in [0, topk*topk)
    tokens = topk_index.reshape(batch, topk * topk)
    return BeamLevel(
        input_ids=torch.gather(tokens, 1, kept).flatten(),
        parent_beam=kept // topk,
        scores=torch.gather(flat_scores, 1, kept),
        level_scores=expand_scores,
        level_tokens=tokens,
        level_parents=kept + topk * topk * (level - 1) + topk,
    )


def organize_draft_results(levels: list[BeamLevel], num_draft_tokens: int) -> DraftTree:
    """Keep the best ``num_draft_tokens - 1`` candidates of all levels (SGLang's function)."""
    all_scores = torch.cat([lv.level_scores.flatten(1) for lv in levels], dim=1)
    all_tokens = torch.cat([lv.level_tokens for lv in levels], dim=1)
    if not 1 <= num_draft_tokens <= all_scores.shape[1] + 1:
        raise ValueError(
            f"`num_draft_tokens` must lie in 1..{all_scores.shape[1] + 1} "
            f"(the root plus every drafted candidate); got {num_draft_tokens}"
        )
    top_scores_index = best_indices(all_scores, num_draft_tokens - 1).sort(dim=-1).values
    if len(levels) > 1:
        parent_list = torch.cat([lv.level_parents for lv in levels[:-1]], dim=1)
    else:
        # One step: only the root's -1, what the declared [B, topk*(num_steps-1)+1] holds
        # (SGLang passes [B, 0], which build_tree reads as this; the relay wants the shape).
        parent_list = levels[0].level_parents[:, :1]
    return DraftTree(
        parent_list=parent_list.contiguous(),
        top_scores_index=top_scores_index,
        draft_tokens=torch.gather(all_tokens, 1, top_scores_index),
    )


def mtp_select(topk_p: torch.Tensor, topk_index: torch.Tensor, num_draft_tokens: int) -> DraftTree:
    """Drafting results from per-step top-k ``[B, num_steps, topk]`` (multi-layer EAGLE).

    Step ``s``'s top-k are the children of step ``s-1``'s top-1 candidate, so the
    tree is a spine of top-1 tokens with every step's other ``topk - 1``
    candidates hanging off it as leaves; ``topk == 1`` gives a chain. In the EAGLE
    layout, the beams kept at level ``s`` are the ``topk`` candidates under beam 0
    (the top-1), and the slots under beams ``1..topk-1`` (which the drafter never
    expanded) score -1 so they are never picked: hence ``num_draft_tokens - 1``
    must not exceed ``topk * num_steps``. Each candidate scores the product of the
    top-1 probabilities above it times its own probability, as in EAGLE.
    """
    batch, num_steps, topk = topk_p.shape
    if not 1 <= num_draft_tokens <= topk * num_steps + 1:
        raise ValueError(
            f"`num_draft_tokens` must lie in 1..{topk * num_steps + 1} for multi-layer "
            f"drafting (root + topk*num_steps = {topk}*{num_steps} candidates); "
            f"got {num_draft_tokens}"
        )
    device = topk_p.device
    spine = torch.cumprod(topk_p[:, :, 0], dim=1)  # [B, S] score of each step's top-1
    levels: list[BeamLevel] = []
    for step in range(num_steps):
        if step == 0:
            levels.append(select_level(0, topk_p[:, 0], topk_index[:, 0], None, topk))
            continue
        scores = torch.full((batch, topk, topk), -1.0, dtype=topk_p.dtype, device=device)
        scores[:, 0] = spine[:, step - 1 : step] * topk_p[:, step]
        beams = torch.arange(topk, dtype=torch.int64, device=device).expand(batch, -1)
        levels.append(
            BeamLevel(
                input_ids=topk_index[:, step].flatten(),
                parent_beam=torch.zeros(batch, topk, dtype=torch.int64, device=device),
                scores=scores[:, 0],
                level_scores=scores,
                level_tokens=topk_index[:, step].repeat(1, topk),
                level_parents=beams + topk * topk * (step - 1) + topk,
            )
        )
    return organize_draft_results(levels, num_draft_tokens)


# Constant layout tensors of the CPU path, by (what, shape..., device); see layout_constant.
_CONSTANTS: dict[tuple[Hashable, ...], torch.Tensor] = {}
_MAX_CONSTANTS = 256


def layout_constant(
    key: tuple[Hashable, ...],
    device: torch.device,
    make: Callable[[], torch.Tensor],
    *,
    shared: bool = False,
) -> torch.Tensor:
    """``make()``'s value -- a layout that depends only on ``key`` (shapes, never data).

    On the CPU it is made once per ``(key, device)`` and kept; each call returns a fresh
    copy, so a step that writes an output in place changes only its own (one copy in place
    of the several small ops that make it: each costs tens of microseconds right after a
    forward has streamed the weights through the caches); ``shared``: the kept tensor
    itself, for a caller that only reads it. Elsewhere ``make()`` runs each time, so a
    CUDA graph captures the making and owns what it made.
    """
    if device.type != "cpu":
        return make()
    full = (*key, str(device))
    kept = _CONSTANTS.get(full)
    if kept is None:
        if len(_CONSTANTS) >= _MAX_CONSTANTS:
            _CONSTANTS.clear()
        kept = _CONSTANTS[full] = make()
    return kept if shared else kept.clone()


def keeps_every_draft(topk: int, num_steps: int, num_draft_tokens: int) -> bool:
    """A chain whose every draft is verified (topk 1, ``num_draft_tokens = num_steps + 1``):
    one candidate a level, all of them kept in order, so its tree is :func:`chain_tree`'s."""
    return topk == 1 and num_draft_tokens == num_steps + 1


def chain_tree(draft_tokens: torch.Tensor) -> DraftTree:
    """A chain of ``S`` drafts ``[B, S]`` as topk-1 drafting results (N = S + 1)."""
    batch, steps = draft_tokens.shape
    device = draft_tokens.device

    def ramp(start: int) -> torch.Tensor:
        row = torch.arange(start, start + steps, dtype=torch.int64, device=device)
        return row.expand(batch, -1).contiguous()

    return DraftTree(
        parent_list=layout_constant(("chain parents", batch, steps), device, lambda: ramp(-1)),
        top_scores_index=layout_constant(("chain order", batch, steps), device, lambda: ramp(0)),
        draft_tokens=draft_tokens.to(torch.int64),
    )


class TreeLayout(NamedTuple):
    """A verify tree given by parent pointers, laid out like ``build_tree``'s QLEN_ONLY output."""

    tree_mask: torch.Tensor  # [B, N, N] bool, node i sees node j (ancestors, itself, the root)
    positions: torch.Tensor  # [B*N] int64, seq_lens + depth
    retrive_index: torch.Tensor  # [B, N] int64, b*N + i
    retrive_next_token: torch.Tensor  # [B, N] int64, first child (lowest index), -1 none
    retrive_next_sibling: torch.Tensor  # [B, N] int64, next sibling (ascending), -1 none


def tree_from_parents(
    parents: torch.Tensor, valid: torch.Tensor, seq_lens: torch.Tensor, max_depth: int
) -> TreeLayout:
    """Layout of trees ``parents [B, N]`` (node 0 the root, parent index < node index).

    Nodes with ``valid`` False are left unlinked (no parent, no sibling; they see
    the root and themselves at depth 1), as ``build_tree`` treats a node whose
    parent was not selected. ``max_depth`` bounds the ancestor walk.
    """
    batch, n = parents.shape
    device = parents.device
    if host_loops("auto", device, batch):
        return _tree_from_parents_host(parents, valid, seq_lens, max_depth)
    nodes = torch.arange(n, device=device)
    linked = valid & (nodes >= 1) & (parents >= 0)
    parent = torch.where(linked, parents, -1)
    cur = torch.where(nodes >= 1, nodes, -1).expand(batch, n)
    depth = torch.zeros(batch, n, dtype=torch.int64, device=device)
    on_path = (nodes == 0).expand(batch, n, n).clone()
    for _ in range(max_depth):
        active = cur >= 1
        on_path |= active[:, :, None] & (nodes == cur[:, :, None])
        depth += active
        cur = torch.where(active, torch.gather(parent, 1, cur.clamp(min=0)), -1)
    child_of = (parent[:, None, :] == nodes[None, :, None]) & linked[:, None, :]  # [b, p, i]
    first_child = torch.where(child_of, nodes, n).amin(dim=2)
    later_sibling = (
        (parent[:, :, None] == parent[:, None, :])
        & (linked[:, :, None] & linked[:, None, :])
        & (nodes[None, None, :] > nodes[None, :, None])
    )
    next_sibling = torch.where(later_sibling, nodes, n).amin(dim=2)
    return TreeLayout(
        tree_mask=on_path,
        positions=(seq_lens[:, None].long() + depth).flatten(),
        retrive_index=torch.arange(batch * n, device=device).view(batch, n),
        retrive_next_token=torch.where(first_child < n, first_child, -1),
        retrive_next_sibling=torch.where(next_sibling < n, next_sibling, -1),
    )


def _tree_from_parents_host(
    parents: torch.Tensor, valid: torch.Tensor, seq_lens: torch.Tensor, max_depth: int
) -> TreeLayout:
    """:func:`tree_from_parents` one request at a time over host lists (same outputs)."""
    batch, n = parents.shape
    device = parents.device
    masks: list[list[list[bool]]] = []
    positions: list[int] = []
    first_child: list[list[int]] = []
    next_sibling: list[list[int]] = []
    for row, row_valid, seq_len in zip(
        parents.tolist(), valid.tolist(), seq_lens.tolist(), strict=True
    ):
        parent = [
            p if i >= 1 and ok and p >= 0 else -1
            for i, (p, ok) in enumerate(zip(row, row_valid, strict=True))
        ]
        firsts, siblings = [-1] * n, [-1] * n
        youngest: dict[int, int] = {}  # parent -> its highest-index child so far
        for i in range(1, n):
            p = parent[i]
            if p < 0:
                continue
            if p in youngest:
                siblings[youngest[p]] = i
            elif p < n:
                firsts[p] = i
            youngest[p] = i
        mask = []
        for i in range(n):
            sees = [False] * n
            sees[0] = True
            depth, cur = 0, i
            for _ in range(max_depth):
                if not 1 <= cur < n:
                    break
                sees[cur] = True
                depth += 1
                cur = parent[cur]
            mask.append(sees)
            positions.append(seq_len + depth)
        masks.append(mask)
        first_child.append(firsts)
        next_sibling.append(siblings)
    return TreeLayout(
        tree_mask=torch.tensor(masks, dtype=torch.bool, device=device).view(batch, n, n),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        retrive_index=torch.arange(batch * n, device=device).view(batch, n),
        retrive_next_token=torch.tensor(first_child, dtype=torch.int64, device=device).view(
            batch, n
        ),
        retrive_next_sibling=torch.tensor(next_sibling, dtype=torch.int64, device=device).view(
            batch, n
        ),
    )
