from __future__ import annotations

import pytest
import torch

from relayc.kernels.chain_sampling import (
    chain_speculative_sampling,
    chain_speculative_sampling_reference,
)
from tests.kernels.stats import assert_distribution, grid_probs, grid_uniforms

POISON_INDEX = -99
POISON_PREDICT = -1


def run(fn, drafts, coins, final_coins, target, draft, **kw):
    batch, num_drafts = drafts.shape
    predicts = torch.full((batch * (num_drafts + 1),), POISON_PREDICT, dtype=torch.int32)
    accept_index = torch.full((batch, num_drafts + 1), POISON_INDEX, dtype=torch.int32)
    accept_token_num = torch.full((batch,), POISON_INDEX, dtype=torch.int32)
    fn(predicts, accept_index, accept_token_num, drafts, coins, final_coins, target, draft, **kw)
    return predicts, accept_index, accept_token_num


def emitted_tokens(predicts, accept_index, accept_token_num):
    return [
        predicts[accept_index[b, : int(n) + 1].long()].tolist()
        for b, n in enumerate(accept_token_num)
    ]


def random_inputs(batch: int, num_drafts: int, vocab: int, gen: torch.Generator):
    """Grid-exact inputs with drafts sampled from their draft distributions."""
    target = grid_probs((batch, num_drafts + 1, vocab), gen)
    draft = grid_probs((batch, num_drafts, vocab), gen)
    # Some rows draft with the target's own distribution, so long accepted runs occur.
    same = torch.rand(batch, 1, 1, generator=gen) < 0.3
    draft = torch.where(same, target[:, :num_drafts], draft)
    flat = draft.reshape(-1, vocab)
    if flat.shape[0]:
        drafts = torch.multinomial(flat, 1, generator=gen).reshape(batch, num_drafts)
    else:
        drafts = torch.zeros(batch, 0, dtype=torch.int64)
    # Some drafts replaced by arbitrary tokens, including ones the target rules out.
    arbitrary = torch.rand(batch, num_drafts, generator=gen) < 0.2
    drafts = torch.where(arbitrary, torch.randint(vocab, drafts.shape, generator=gen), drafts)
    return (
        drafts,
        grid_uniforms((batch, num_drafts), gen),
        grid_uniforms((batch,), gen),
        target,
        draft,
    )


CASES = [
    # (batch, num_drafts, vocab)
    (1, 0, 5),
    (1, 1, 5),
    (3, 4, 7),
    (3, 7, 1500),  # more than one BLOCK_V tile in the Triton kernel
    (64, 1, 3),
    (64, 5, 6),
]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize(("batch", "num_drafts", "vocab"), CASES)
def test_matches_reference(backend, batch, num_drafts, vocab):
    gen = torch.Generator().manual_seed(100 * batch + 10 * num_drafts + vocab)
    inputs = random_inputs(batch, num_drafts, vocab, gen)
    want = run(chain_speculative_sampling_reference, *inputs)
    got = run(chain_speculative_sampling, *inputs, backend=backend)
    for name, g, w in zip(("predicts", "accept_index", "accept_token_num"), got, want, strict=True):
        assert torch.equal(g, w), f"{name} differs:\n{g}\nvs reference\n{w}"
    predicts, accept_index, accept_token_num = got
    assert (accept_index != POISON_INDEX).all() and (accept_token_num >= 0).all()
    assert (predicts[accept_index[accept_index >= 0].long()] != POISON_PREDICT).all()


BACKENDS = ["torch", "triton", "reference"]


def entry(backend: str):
    if backend == "reference":
        return chain_speculative_sampling_reference, {}
    return chain_speculative_sampling, {"backend": backend}


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_accepted_then_bonus_from_last_target(backend):
    fn, kw = entry(backend)
    drafts = torch.tensor([[1, 2]])
    target = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.5, 0.5]]])
    draft = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])
    out = run(fn, drafts, torch.full((1, 2), 0.999), torch.tensor([0.75]), target, draft, **kw)
    assert out[2].tolist() == [2] and out[1].tolist() == [[0, 1, 2]]
    assert emitted_tokens(*out) == [[1, 2, 2]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_none_accepted_resamples_from_residual(backend):
    fn, kw = entry(backend)
    drafts = torch.tensor([[0, 1]])
    target = torch.tensor([[[0.25, 0.25, 0.5], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]])
    draft = torch.tensor([[[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]])  # residual: [0, .25, .5] / .75
    out = run(fn, drafts, torch.tensor([[0.5, 0.0]]), torch.tensor([0.5]), target, draft, **kw)
    assert out[2].tolist() == [0] and out[1].tolist() == [[0, -1, -1]]
    assert emitted_tokens(*out) == [[2]]  # u = 0.5 * 0.75 = 0.375 > 0.25


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_probability_draft_is_never_accepted(backend):
    fn, kw = entry(backend)
    drafts = torch.tensor([[0]])
    target = torch.tensor([[[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]]])
    # q(draft) = 0 and 0.5; in both the residual's first positive token is 1.
    for q_row in ([0.0, 0.25, 0.75], [0.5, 0.25, 0.25]):
        draft = torch.tensor([[q_row]])
        out = run(fn, drafts, torch.zeros(1, 1), torch.tensor([0.0]), target, draft, **kw)
        assert out[2].tolist() == [0] and emitted_tokens(*out) == [[1]], q_row


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_residual_falls_back_to_target(backend):
    fn, kw = entry(backend)
    drafts = torch.tensor([[1]])
    target = torch.tensor([[[0.5, 0.25, 0.25], [1.0, 0.0, 0.0]]])
    draft = torch.ones(1, 1, 3)  # unnormalised on purpose: relu(p - q) is all zero
    out = run(fn, drafts, torch.tensor([[0.5]]), torch.tensor([0.625]), target, draft, **kw)
    assert out[2].tolist() == [0] and emitted_tokens(*out) == [[1]]


# Target rows p_0..p_3 and draft rows q_0..q_2 over V = 5, the same for every prefix.
# q_0 likes token 4, which p_0 rules out.
CHAIN_TARGET = torch.tensor(
    [
        [0.40, 0.10, 0.30, 0.20, 0.00],
        [0.10, 0.40, 0.20, 0.20, 0.10],
        [0.25, 0.25, 0.25, 0.15, 0.10],
        [0.20, 0.20, 0.20, 0.20, 0.20],
    ]
)
CHAIN_DRAFT = torch.tensor(
    [
        [0.20, 0.30, 0.10, 0.10, 0.30],
        [0.10, 0.50, 0.10, 0.20, 0.10],
        [0.30, 0.20, 0.20, 0.20, 0.10],
    ]
)


def sample_chain(trials: int, seed: int, draft_seen_by_kernel: torch.Tensor):
    gen = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(CHAIN_DRAFT, trials, replacement=True, generator=gen).T.contiguous()
    target = CHAIN_TARGET[None].repeat(trials, 1, 1)
    draft = draft_seen_by_kernel[None].repeat(trials, 1, 1)
    coins = torch.rand(trials, 3, generator=gen)
    final_coins = torch.rand(trials, generator=gen)
    predicts, _, num = run(
        chain_speculative_sampling, drafts, coins, final_coins, target, draft, backend="torch"
    )
    by_position = predicts.reshape(trials, 4).long()
    first = torch.bincount(by_position[:, 0], minlength=5)
    # Given the first token was an accepted draft, the second is drawn at node 1.
    second = torch.bincount(by_position[num >= 1, 1], minlength=5)
    return first, second


def test_lossless_first_and_second_token():
    first, second = sample_chain(40_000, seed=0, draft_seen_by_kernel=CHAIN_DRAFT)
    assert_distribution(first, CHAIN_TARGET[0])
    assert_distribution(second, CHAIN_TARGET[1])


def test_chi_square_catches_an_acceptance_that_ignores_q():
    # Zero draft probabilities turn the test into `u * 0 < p`: every draft with p > 0 is
    # accepted whatever q was. The same check must call that biased.
    first, _ = sample_chain(40_000, seed=0, draft_seen_by_kernel=torch.zeros_like(CHAIN_DRAFT))
    with pytest.raises(AssertionError, match="not lossless"):
        assert_distribution(first, CHAIN_TARGET[0])


def test_rejects_mismatched_shapes():
    drafts, coins, final_coins, target, draft = random_inputs(2, 3, 4, torch.Generator())
    with pytest.raises(ValueError, match="draft_probs"):
        run(chain_speculative_sampling, drafts, coins, final_coins, target, draft[:, :2])
