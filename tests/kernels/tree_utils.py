"""Test helpers: EAGLE drafting results that a real draft loop could produce, and an
independent check that build_tree's outputs describe the tree those results select."""

from __future__ import annotations

from dataclasses import dataclass

import torch

VOCAB = 48


@dataclass(frozen=True)
class DraftResult:
    """What SGLang's ``organize_draft_results`` hands to ``build_tree_kernel_efficient``."""

    verified_id: torch.Tensor  # [B] int64
    parent_list: torch.Tensor  # [B, topk*(spec_steps-1)+1] int64 ([B, 0] when spec_steps == 1)
    top_scores_index: torch.Tensor  # [B, N-1] int64, sorted
    draft_tokens: torch.Tensor  # [B, N-1] int64
    seq_lens: torch.Tensor  # [B] int64
    topk: int
    spec_steps: int
    num_verify_tokens: int

    @property
    def seq_lens_sum(self) -> int:
        return int(self.seq_lens.sum())


def _draft_probs(rows: int, generator: torch.Generator) -> torch.Tensor:
    # A random temperature per row mixes peaked rows (deep chains win the top-k) with flat
    # rows (bushy trees win it).
    temperature = torch.rand(rows, 1, generator=generator) * 4 + 0.3
    return torch.softmax(torch.randn(rows, VOCAB, generator=generator) * temperature, dim=-1)


def draft_eagle_tree(
    batch_size: int,
    topk: int,
    spec_steps: int,
    num_verify_tokens: int,
    generator: torch.Generator,
    max_seq_len: int = 40,
) -> DraftResult:
    """Run EAGLE's top-k draft loop on random draft distributions and select N-1 nodes.

    Follows SGLang's ``select_top_k_tokens`` (level 0 keeps the top-k under the root, each
    later level re-ranks ``topk*topk`` children by cumulative score and keeps ``topk``
    beams) and ``organize_draft_results`` (top N-1 of all cumulative scores, sorted).
    """
    b = batch_size
    probs, tokens = _draft_probs(b, generator).topk(topk, dim=-1)
    scores = probs  # [b, topk] cumulative score of each kept beam
    score_list = [probs.unsqueeze(1)]
    token_list = [tokens]
    parents_list = [torch.arange(-1, topk).expand(b, -1)]
    for level in range(1, spec_steps):
        probs, tokens = _draft_probs(b * topk, generator).topk(topk, dim=-1)
        expand_scores = scores.unsqueeze(2) * probs.view(b, topk, topk)
        scores, kept = expand_scores.flatten(1).topk(topk, dim=-1)
        score_list.append(expand_scores)
        token_list.append(tokens.view(b, topk * topk))
        parents_list.append(kept + topk * topk * (level - 1) + topk)
    all_scores = torch.cat(score_list, dim=1).flatten(1)
    all_tokens = torch.cat(token_list, dim=1)
    top_scores_index = all_scores.topk(num_verify_tokens - 1, dim=-1).indices.sort(dim=-1).values
    if len(parents_list) > 1:
        parent_list = torch.cat(parents_list[:-1], dim=1)
    else:
        parent_list = torch.empty(b, 0, dtype=torch.int64)
    return DraftResult(
        verified_id=torch.randint(0, VOCAB, (b,), generator=generator),
        parent_list=parent_list.contiguous(),
        top_scores_index=top_scores_index,
        draft_tokens=torch.gather(all_tokens, 1, top_scores_index),
        seq_lens=torch.randint(1, max_seq_len + 1, (b,), generator=generator),
        topk=topk,
        spec_steps=spec_steps,
        num_verify_tokens=num_verify_tokens,
    )


def expected_tree(draft: DraftResult, b: int) -> tuple[list[int], list[int]]:
    """Parent node and depth of every node of request ``b``, decoded from the candidate
    layout (level from the flat index, parent through ``parent_list``)."""
    topk = draft.topk
    selected = draft.top_scores_index[b].tolist()
    node_of = {flat: i + 1 for i, flat in enumerate(selected)}
    parent = [-1]
    depth = [0]
    for flat in selected:
        if flat < topk:
            parent.append(0)
            depth.append(1)
        else:
            parent.append(node_of[int(draft.parent_list[b, flat // topk])])
            depth.append(2 + (flat - topk) // (topk * topk))
    return parent, depth


def check_describes_tree(draft: DraftResult, built: tuple, full_mask: bool) -> None:
    """Assert that build_tree's outputs encode exactly the tree ``draft`` selects."""
    tree_mask, positions, retrive_index, next_token, next_sibling, tokens = built
    n = draft.num_verify_tokens
    lens = draft.seq_lens.tolist()
    block_start = 0
    for b in range(draft.seq_lens.shape[0]):
        parent, depth = expected_tree(draft, b)
        seq_len = lens[b]
        assert retrive_index[b].tolist() == [b * n + i for i in range(n)]
        assert tokens[b * n] == draft.verified_id[b]
        assert tokens[b * n + 1 : (b + 1) * n].tolist() == draft.draft_tokens[b].tolist()

        # Walk the retrive links from the root; every node must be met exactly once,
        # under its own parent, at its own depth, siblings in ascending node order.
        seen = [0] * n
        stack = [(0, 0)]
        while stack:
            node, node_depth = stack.pop()
            seen[node] += 1
            assert node_depth == depth[node]
            assert positions[b * n + node] == seq_len + node_depth
            children = []
            child = int(next_token[b, node])
            while child != -1:
                children.append(child)
                child = int(next_sibling[b, child])
            assert children == [i for i in range(n) if parent[i] == node]
            stack.extend((c, node_depth + 1) for c in children)
        assert seen == [1] * n

        for i in range(n):
            ancestors = {0}
            node = i
            while node > 0:
                ancestors.add(node)
                node = parent[node]
            if full_mask:
                row = tree_mask[block_start + (seq_len + n) * i :][: seq_len + n]
                assert row[:seq_len].all()
                window = row[seq_len:]
            else:
                window = tree_mask[b * n * n + n * i :][:n]
            assert window.tolist() == [j in ancestors for j in range(n)]
        block_start += n * (seq_len + n)
    batch_size = draft.seq_lens.shape[0]
    assert tree_mask.numel() == (block_start if full_mask else batch_size * n * n)
