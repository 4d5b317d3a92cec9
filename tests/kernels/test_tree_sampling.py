from __future__ import annotations

import pytest
import torch

from relayc.kernels.tree_sampling import (
    tree_speculative_sampling_target_only,
    tree_speculative_sampling_target_only_reference,
)
from tests.kernels.stats import assert_distribution, grid_probs, grid_uniforms
from tests.kernels.trees import DraftTrees, random_trees

POISON_INDEX = -99
POISON_PREDICT = -1


def run(fn, trees: DraftTrees, num_spec_step: int, coins, final_coins, target, draft, **kw):
    predicts = torch.full((trees.batch * trees.num_draft,), POISON_PREDICT, dtype=torch.int32)
    accept_index = torch.full((trees.batch, num_spec_step), POISON_INDEX, dtype=torch.int32)
    accept_token_num = torch.full((trees.batch,), POISON_INDEX, dtype=torch.int32)
    draft_before = draft.clone()
    fn(
        predicts,
        accept_index,
        accept_token_num,
        trees.candidates,
        trees.retrive_index,
        trees.retrive_next_token,
        trees.retrive_next_sibling,
        coins,
        final_coins,
        target,
        draft,
        **kw,
    )
    assert torch.equal(draft, draft_before), "draft_probs must be left as it was"
    return predicts, accept_index, accept_token_num


def emitted_tokens(predicts, accept_index, accept_token_num):
    """Row b: the tokens the step emits, in order (accepted drafts, then the final draw)."""
    return [
        predicts[accept_index[b, : int(n) + 1].long()].tolist()
        for b, n in enumerate(accept_token_num)
    ]


CASES = [
    # (batch, num_draft, num_spec_step, max_depth, vocab, threshold_single, threshold_acc)
    (1, 1, 1, 1, 5, 1.0, 1.0),
    (1, 1, 3, 1, 5, 0.25, 0.5),
    (3, 6, 4, 8, 7, 1.0, 1.0),
    (3, 64, 9, 8, 33, 1.0, 1.0),
    (3, 64, 9, 8, 33, 0.25, 0.5),
    (64, 9, 5, 3, 6, 0.25, 0.5),
    (64, 12, 9, 8, 6, 1.0, 1.0),
    (3, 7, 3, 8, 1500, 1.0, 1.0),  # more than one BLOCK_V tile in the Triton kernel
]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize(
    (
        "batch",
        "num_draft",
        "num_spec_step",
        "max_depth",
        "vocab",
        "threshold_single",
        "threshold_acc",
    ),
    CASES,
)
def test_matches_reference(
    backend, batch, num_draft, num_spec_step, max_depth, vocab, threshold_single, threshold_acc
):
    gen = torch.Generator().manual_seed(7 * batch + 31 * num_draft + vocab + num_spec_step)
    trees = random_trees(batch, num_draft, vocab, gen, max_depth=max_depth)
    target = grid_probs((batch, num_draft, vocab), gen)
    # Half the rows target-only (draft 0, as SGLang calls it), half with a real draft.
    draft = grid_probs((batch, num_draft, vocab), gen) * (
        torch.rand(batch, 1, 1, generator=gen) < 0.5
    )
    coins = grid_uniforms((batch, num_draft), gen)
    final_coins = grid_uniforms((batch,), gen)
    inputs = (trees, num_spec_step, coins, final_coins, target, draft)
    kw = dict(threshold_single=threshold_single, threshold_acc=threshold_acc)
    want = run(tree_speculative_sampling_target_only_reference, *inputs, **kw)
    got = run(tree_speculative_sampling_target_only, *inputs, **kw, backend=backend)
    for name, g, w in zip(("predicts", "accept_index", "accept_token_num"), got, want, strict=True):
        assert torch.equal(g, w), f"{name} differs:\n{g}\nvs reference\n{w}"
    predicts, accept_index, accept_token_num = got
    assert (accept_index != POISON_INDEX).all() and (accept_token_num >= 0).all()
    assert (predicts[accept_index[accept_index >= 0].long()] != POISON_PREDICT).all()


def chain_tree(tokens: list[int]) -> DraftTrees:
    n = len(tokens)
    return DraftTrees(
        candidates=torch.tensor([tokens]),
        retrive_index=torch.arange(n)[None],
        retrive_next_token=torch.tensor([[*range(1, n), -1]]),
        retrive_next_sibling=torch.full((1, n), -1),
        parent=torch.tensor([[-1, *range(n - 1)]]),
        depth=torch.arange(n)[None],
    )


def one_hot_rows(tokens: list[int], vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab).float()[None]


BACKENDS = ["torch", "triton", "reference"]


def entry(backend: str):
    if backend == "reference":
        return tree_speculative_sampling_target_only_reference, {}
    return tree_speculative_sampling_target_only, {"backend": backend}


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_accepted_then_bonus_from_target(backend):
    fn, kw = entry(backend)
    trees = chain_tree([0, 1, 2])
    target = one_hot_rows([1, 2, 3], 5)  # each node's target puts all mass on the next draft
    draft = torch.ones(1, 3, 5)  # must be ignored for the bonus token
    coins = torch.full((1, 3), 0.999)
    out = run(fn, trees, 3, coins, torch.tensor([0.5]), target, draft, **kw)
    assert out[2].tolist() == [2] and emitted_tokens(*out) == [[1, 2, 3]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_probability_draft_is_never_accepted(backend):
    # coin 0 satisfies SGLang's `coin <= prob_acc` even when p(draft) = 0 (sglang#35771).
    fn, kw = entry(backend)
    trees = chain_tree([0, 1, 2])
    target = torch.tensor([[[0.0, 0.0, 0.5, 0.5], [0.25, 0.25, 0.25, 0.25], [1.0, 0, 0, 0]]])
    for kwargs in ({}, {"threshold_single": 0.0}):
        out = run(
            fn,
            trees,
            3,
            torch.zeros(1, 3),
            torch.tensor([0.0]),
            target,
            torch.zeros_like(target),
            **kw,
            **kwargs,
        )
        assert out[2].tolist() == [0], kwargs
        assert emitted_tokens(*out) == [[2]]  # first positive token of the root row


@pytest.mark.parametrize("backend", BACKENDS)
def test_rejected_siblings_leave_the_residual(backend):
    fn, kw = entry(backend)
    # Root with children tokens 0 and 1 (tried in that order), target [.25, .25, .5, 0].
    trees = DraftTrees(
        candidates=torch.tensor([[3, 0, 1]]),
        retrive_index=torch.arange(3)[None],
        retrive_next_token=torch.tensor([[1, -1, -1]]),
        retrive_next_sibling=torch.tensor([[-1, 2, -1]]),
        parent=torch.tensor([[-1, 0, 0]]),
        depth=torch.tensor([[0, 1, 1]]),
    )
    target = torch.tensor([[0.25, 0.25, 0.5, 0.0]]).repeat(3, 1)[None]
    draft = torch.zeros_like(target)
    coins = torch.tensor([[0.75, 0.0, 0.0]])  # above 0.25 + 0.25: both children rejected
    out = run(fn, trees, 3, coins, torch.tensor([0.0]), target, draft, **kw)
    assert out[2].tolist() == [0] and emitted_tokens(*out) == [[2]]
    coins = torch.tensor([[0.375, 0.0, 0.0]])  # in (0.25, 0.5]: the second child
    out = run(fn, trees, 3, coins, torch.tensor([0.0]), target, draft, **kw)
    assert out[1].tolist() == [[0, 2, -1]] and emitted_tokens(*out)[0][0] == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_root_only(backend):
    fn, kw = entry(backend)
    trees = chain_tree([2])
    target = torch.tensor([[[0.5, 0.25, 0.25]]])
    draft = torch.tensor([[[0.5, 0.0, 0.25]]])  # residual is all on token 1
    out = run(fn, trees, 4, torch.zeros(1, 1), torch.tensor([0.9]), target, draft, **kw)
    assert out[1].tolist() == [[0, -1, -1, -1]] and emitted_tokens(*out) == [[1]]


def star_tree_trials(trials: int) -> DraftTrees:
    """The same tree in every row: root -> children with tokens 3, 0, 5 (in that order),
    the child with token 0 has children with tokens 1 and 4."""
    one = DraftTrees(
        candidates=torch.tensor([[2, 3, 0, 5, 1, 4]]),
        retrive_index=torch.arange(6)[None],
        retrive_next_token=torch.tensor([[1, -1, 4, -1, -1, -1]]),
        retrive_next_sibling=torch.tensor([[-1, 2, 3, -1, 5, -1]]),
        parent=torch.tensor([[-1, 0, 0, 0, 2, 2]]),
        depth=torch.tensor([[0, 1, 1, 1, 2, 2]]),
    )
    rep = lambda t: t.repeat(trials, 1)  # noqa: E731
    return DraftTrees(
        rep(one.candidates),
        torch.arange(trials * 6).reshape(trials, 6),
        rep(one.retrive_next_token),
        rep(one.retrive_next_sibling),
        rep(one.parent),
        rep(one.depth),
    )


# Target rows per node of the star tree over V = 6; token 5 (the root's third child)
# has zero target probability, so accepting it would be visible as an impossible token.
STAR_TARGET = torch.tensor(
    [
        [0.30, 0.10, 0.15, 0.20, 0.25, 0.00],
        [0.10, 0.20, 0.30, 0.10, 0.20, 0.10],
        [0.05, 0.35, 0.10, 0.20, 0.10, 0.20],
        [0.20, 0.20, 0.20, 0.20, 0.10, 0.10],
        [0.10, 0.10, 0.10, 0.10, 0.30, 0.30],
        [0.30, 0.10, 0.10, 0.20, 0.10, 0.20],
    ]
)


def sample_star(trials: int, seed: int, **kw):
    gen = torch.Generator().manual_seed(seed)
    trees = star_tree_trials(trials)
    target = STAR_TARGET[None].repeat(trials, 1, 1)
    # Target-only: SGLang passes zero draft probabilities, which is what makes the
    # residual relu(target - 0) minus the rejected children exact.
    draft = torch.zeros_like(target)
    coins = torch.rand(trials, 6, generator=gen)
    final_coins = torch.rand(trials, generator=gen)
    out = run(
        tree_speculative_sampling_target_only,
        trees,
        4,
        coins,
        final_coins,
        target,
        draft,
        backend="torch",
        **kw,
    )
    predicts, accept_index, _ = out
    first = predicts[accept_index[:, 0].long()].long()
    # Second token, given that the first was token 0, i.e. node 2 was accepted.
    via_node2 = accept_index[:, 1] % 6 == 2
    second = predicts[accept_index[via_node2, 1].long()].long()
    return torch.bincount(first, minlength=6), torch.bincount(second, minlength=6)


def test_lossless_first_and_second_token():
    first, second = sample_star(40_000, seed=0)
    assert_distribution(first, STAR_TARGET[0])
    assert_distribution(second, STAR_TARGET[2])


@pytest.mark.parametrize(
    "biased", [{"threshold_acc": 0.95}, {"threshold_single": 0.2}], ids=["acc", "single"]
)
def test_chi_square_catches_a_biased_acceptance(biased):
    # The thresholds are SGLang's deliberately lossy knobs; the same check must reject
    # them (threshold_acc 0.95 is a bias of a few percent), or it could not catch a
    # real bug either.
    first, _ = sample_star(40_000, seed=0, **biased)
    with pytest.raises(AssertionError, match="not lossless"):
        assert_distribution(first, STAR_TARGET[0])


def test_rejects_wrong_dtype():
    trees = chain_tree([0, 1])
    target = torch.full((1, 2, 3), 1 / 3, dtype=torch.float64)
    with pytest.raises(TypeError, match="target_probs"):
        run(
            tree_speculative_sampling_target_only,
            trees,
            2,
            torch.zeros(1, 2),
            torch.zeros(1),
            target,
            target.clone(),
        )
