"""Beam selection and the drafting layouts against plain-loop references and build_tree."""

from __future__ import annotations

import pytest
import torch

from relayc.engine.draft.tree import (
    BeamLevel,
    DraftTree,
    chain_tree,
    mtp_select,
    organize_draft_results,
    select_level,
    tree_from_parents,
)
from relayc.kernels import TreeMaskMode, build_tree
from tests.engine.draft.helpers import NoHostSync
from tests.kernels.tree_utils import DraftResult, check_describes_tree, expected_tree

VOCAB = 30


def random_level_probs(
    batch: int, topk: int, num_steps: int, generator: torch.Generator
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per level: the (top-k p, top-k tokens) a draft forward would give, level 0 ``[B, topk]``,
    later ``[B*topk, topk]`` (one row per kept beam slot)."""
    out = []
    for level in range(num_steps):
        rows = batch if level == 0 else batch * topk
        temperature = torch.rand(rows, 1, generator=generator) * 3 + 0.3
        probs = torch.softmax(torch.randn(rows, VOCAB, generator=generator) * temperature, -1)
        out.append(probs.topk(topk, dim=-1))
    return out


def draft_with_levels(
    levels_probs: list[tuple[torch.Tensor, torch.Tensor]], topk: int, num_draft_tokens: int
) -> DraftTree:
    levels: list[BeamLevel] = []
    scores = None
    for level, (p, tokens) in enumerate(levels_probs):
        beam = select_level(level, p, tokens, scores, topk)
        scores = beam.scores
        levels.append(beam)
    return organize_draft_results(levels, num_draft_tokens)


def draft_reference(
    levels_probs: list[tuple[torch.Tensor, torch.Tensor]], topk: int, num_draft_tokens: int
) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """Plain loops: candidates as (flat index, score, token); beams ranked by (-score, index)."""
    batch = levels_probs[0][0].shape[0]
    parent_lists, selections, token_lists = [], [], []
    for b in range(batch):
        p0, t0 = levels_probs[0]
        candidates = [(c, float(p0[b, c]), int(t0[b, c])) for c in range(topk)]
        beams = list(candidates)  # level 0 keeps every candidate, in order
        parents = [-1] + [flat for flat, _, _ in beams]
        for level in range(1, len(levels_probs)):
            p, t = levels_probs[level]
            level_candidates = []
            for j, (_, beam_score, _) in enumerate(beams):
                for c in range(topk):
                    flat = topk + (level - 1) * topk * topk + j * topk + c
                    score = beam_score * float(p[b * topk + j, c])
                    level_candidates.append((flat, score, int(t[b * topk + j, c])))
            beams = sorted(level_candidates, key=lambda x: (-x[1], x[0]))[:topk]
            if level < len(levels_probs) - 1:
                parents += [flat for flat, _, _ in beams]
            candidates += level_candidates
        best = sorted(candidates, key=lambda x: (-x[1], x[0]))[: num_draft_tokens - 1]
        best.sort()
        parent_lists.append(parents if len(levels_probs) > 1 else [-1])
        selections.append([flat for flat, _, _ in best])
        token_lists.append([token for _, _, token in best])
    return parent_lists, selections, token_lists


def as_draft_result(tree: DraftTree, topk: int, num_steps: int, n: int, seed: int) -> DraftResult:
    generator = torch.Generator().manual_seed(seed)
    batch = tree.draft_tokens.shape[0]
    return DraftResult(
        verified_id=torch.randint(0, VOCAB, (batch,), generator=generator),
        parent_list=tree.parent_list,
        top_scores_index=tree.top_scores_index,
        draft_tokens=tree.draft_tokens,
        seq_lens=torch.randint(1, 20, (batch,), generator=generator),
        topk=topk,
        spec_steps=num_steps,
        num_verify_tokens=n,
    )


def run_build_tree(draft: DraftResult, mode: TreeMaskMode = TreeMaskMode.FULL_MASK) -> tuple:
    return build_tree(
        draft.verified_id,
        draft.parent_list,
        draft.top_scores_index,
        draft.draft_tokens,
        draft.seq_lens,
        draft.seq_lens_sum,
        draft.topk,
        draft.spec_steps,
        draft.num_verify_tokens,
        mode,
        backend="torch",
    )


# (batch, topk, num_steps, num_draft_tokens): chains, one level, root only, full and partial trees.
CASES = [
    (1, 1, 1, 1),
    (2, 1, 4, 5),
    (3, 2, 1, 3),
    (3, 2, 3, 6),
    (2, 3, 4, 31),
    (2, 4, 3, 9),
    (1, 4, 5, 53),
]


@pytest.mark.parametrize("case", CASES)
def test_beam_selection_matches_plain_loops(case: tuple[int, int, int, int]) -> None:
    batch, topk, num_steps, n = case
    for seed in range(3):
        levels = random_level_probs(batch, topk, num_steps, torch.Generator().manual_seed(seed))
        with NoHostSync():
            tree = draft_with_levels(levels, topk, n)
        parents, selected, tokens = draft_reference(levels, topk, n)
        assert tree.parent_list.shape == (batch, topk * (num_steps - 1) + 1)
        assert tree.parent_list.tolist() == parents
        assert tree.top_scores_index.tolist() == selected
        assert tree.draft_tokens.tolist() == tokens
        draft = as_draft_result(tree, topk, num_steps, n, seed)
        check_describes_tree(draft, run_build_tree(draft), full_mask=True)


def test_selection_is_closed_under_parents_on_ties() -> None:
    # Every probability 1/2: a child ties its parent's siblings; lower flat index wins,
    # so no child is picked without its parent.
    topk, num_steps, n = 2, 3, 6
    half = torch.full((1, topk), 0.5)
    levels = [(half, torch.tensor([[1, 2]]))] + [
        (half.repeat(topk, 1), torch.tensor([[3, 4], [5, 6]])) for _ in range(num_steps - 1)
    ]
    tree = draft_with_levels(levels, topk, n)
    draft = as_draft_result(tree, topk, num_steps, n, seed=0)
    check_describes_tree(draft, run_build_tree(draft, TreeMaskMode.QLEN_ONLY), full_mask=False)


def test_organize_rejects_more_tokens_than_candidates() -> None:
    levels = random_level_probs(1, 2, 2, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"`num_draft_tokens` must lie in 1\.\.7"):
        draft_with_levels(levels, 2, 8)


@pytest.mark.parametrize(("topk", "num_steps", "n"), [(1, 4, 5), (2, 3, 7), (3, 3, 6), (4, 2, 3)])
def test_mtp_select_hangs_each_step_under_the_previous_top1(
    topk: int, num_steps: int, n: int
) -> None:
    batch = 3
    generator = torch.Generator().manual_seed(topk * 10 + num_steps)
    probs = torch.softmax(torch.randn(batch, num_steps, VOCAB, generator=generator) * 2, -1)
    topk_p, topk_index = probs.topk(topk, dim=-1)
    with NoHostSync():
        tree = mtp_select(topk_p, topk_index, n)
    assert tree.parent_list.shape == (batch, topk * (num_steps - 1) + 1)
    assert tree.top_scores_index.shape == tree.draft_tokens.shape == (batch, n - 1)
    draft = as_draft_result(tree, topk, num_steps, n, seed=1)
    check_describes_tree(draft, run_build_tree(draft), full_mask=True)
    for b in range(batch):
        parent, depth = expected_tree(draft, b)
        tokens = [-1, *tree.draft_tokens[b].tolist()]
        # Plain-loop expectation: node scores, then the best n-1 by (-score, level, rank).
        spine, expected = 1.0, []
        for step in range(num_steps):
            for rank in range(topk):
                score = spine * float(topk_p[b, step, rank])
                expected.append((-score, step, rank, int(topk_index[b, step, rank])))
            spine *= float(topk_p[b, step, 0])
        chosen = sorted(expected)[: n - 1]
        assert sorted((s, r, t) for _, s, r, t in chosen) == sorted(
            (depth[i] - 1, _rank(tokens[i], topk_index[b, depth[i] - 1]), tokens[i])
            for i in range(1, n)
        )
        for i in range(1, n):
            if depth[i] > 1:  # the parent is the previous step's top-1 token
                assert parent[i] >= 1 and tokens[parent[i]] == int(topk_index[b, depth[i] - 2, 0])


def _rank(token: int, row: torch.Tensor) -> int:
    return row.tolist().index(token)


def test_mtp_select_with_topk_1_is_a_chain() -> None:
    topk_p = torch.tensor([[[0.5], [0.4], [0.9]]])
    topk_index = torch.tensor([[[7], [8], [9]]])
    tree = mtp_select(topk_p, topk_index, 4)
    assert tree.parent_list.tolist() == [[-1, 0, 1]]
    assert tree.top_scores_index.tolist() == [[0, 1, 2]]
    assert tree.draft_tokens.tolist() == [[7, 8, 9]]
    with pytest.raises(ValueError, match="multi-layer"):
        mtp_select(topk_p, topk_index, 5)


def test_chain_tree_builds_a_chain() -> None:
    tokens = torch.tensor([[4, 5, 6], [7, 8, 9]])
    tree = chain_tree(tokens)
    draft = as_draft_result(tree, 1, 3, 4, seed=2)
    built = run_build_tree(draft)
    check_describes_tree(draft, built, full_mask=True)
    assert built.retrive_next_token.tolist() == [[1, 2, 3, -1]] * 2


@pytest.mark.parametrize("case", CASES)
def test_tree_from_parents_matches_build_tree(case: tuple[int, int, int, int]) -> None:
    batch, topk, num_steps, n = case
    levels = random_level_probs(batch, topk, num_steps, torch.Generator().manual_seed(5))
    draft = as_draft_result(draft_with_levels(levels, topk, n), topk, num_steps, n, seed=5)
    built = run_build_tree(draft, TreeMaskMode.QLEN_ONLY)
    parents = torch.tensor([expected_tree(draft, b)[0] for b in range(batch)])
    with NoHostSync():
        layout = tree_from_parents(
            parents, torch.ones(batch, n, dtype=torch.bool), draft.seq_lens, num_steps
        )
    assert torch.equal(layout.tree_mask.flatten(), built.tree_mask)
    assert torch.equal(layout.positions, built.positions)
    assert torch.equal(layout.retrive_index, built.retrive_index)
    assert torch.equal(layout.retrive_next_token, built.retrive_next_token)
    assert torch.equal(layout.retrive_next_sibling, built.retrive_next_sibling)


def test_tree_from_parents_leaves_invalid_nodes_unlinked() -> None:
    parents = torch.tensor([[-1, 0, 1, -1, 0]])
    valid = torch.tensor([[True, True, True, False, True]])
    layout = tree_from_parents(parents, valid, torch.tensor([10]), max_depth=4)
    assert layout.retrive_next_token.tolist() == [[1, 2, -1, -1, -1]]
    assert layout.retrive_next_sibling.tolist() == [[-1, 4, -1, -1, -1]]
    assert layout.positions.tolist() == [10, 11, 12, 11, 11]
    assert layout.tree_mask[0, 3].tolist() == [True, False, False, True, False]
    assert layout.tree_mask[0, 2].tolist() == [True, True, True, False, False]


def test_the_sync_detector_catches_host_reads() -> None:
    # (.tolist() on a CPU tensor bypasses dispatch; on CUDA it is a device-to-host copy.)
    for host_read in (
        lambda: torch.tensor([1]).item(),
        lambda: torch.tensor([1, 0]).nonzero(),
        lambda: torch.repeat_interleave(torch.tensor([1, 2])),
    ):
        with pytest.raises(AssertionError, match=r"host|output_size"), NoHostSync():
            host_read()


def test_tree_from_parents_host_loop_matches_the_torch_path() -> None:
    # Random parent arrays (parent index < node index), some nodes invalid: the CPU host loop
    # (small batches) and the vectorised path (graph-safe mode) lay them out identically.
    from relayc.engine.draft.tree import tree_from_parents
    from relayc.kernels._backend import graph_safe_paths

    gen = torch.Generator().manual_seed(3)
    for batch, n, max_depth in [(1, 1, 3), (1, 6, 3), (3, 8, 2), (4, 12, 5)]:
        nodes = torch.arange(n)
        parents = (torch.rand(batch, n, generator=gen) * nodes).long()
        parents[:, 0] = -1
        valid = torch.rand(batch, n, generator=gen) < 0.8
        valid[:, 0] = True
        seq_lens = torch.randint(0, 50, (batch,), generator=gen, dtype=torch.int32)
        host = tree_from_parents(parents, valid, seq_lens, max_depth)
        with graph_safe_paths():
            vectorised = tree_from_parents(parents, valid, seq_lens, max_depth)
        for name, got, want in zip(host._fields, host, vectorised, strict=True):
            assert got.dtype == want.dtype and torch.equal(got, want), name
