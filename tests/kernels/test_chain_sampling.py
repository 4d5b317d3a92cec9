from __future__ import annotations

import pytest
import torch

from relayc.kernels._inverse_cdf import sample_residual_torch
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


@pytest.mark.parametrize("block_verification", [False, True])
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize(("batch", "num_drafts", "vocab"), CASES)
def test_matches_reference(backend, batch, num_drafts, vocab, block_verification):
    gen = torch.Generator().manual_seed(100 * batch + 10 * num_drafts + vocab)
    inputs = random_inputs(batch, num_drafts, vocab, gen)
    mode = {"block_verification": block_verification}
    want = run(chain_speculative_sampling_reference, *inputs, **mode)
    got = run(chain_speculative_sampling, *inputs, backend=backend, **mode)
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


def test_chi_square_catches_an_acceptance_with_the_wrong_q():
    # The kernel is told the drafts came from a uniform q while they came from CHAIN_DRAFT:
    # acceptance then uses the wrong ratio, and the same check must call that biased.
    # (Zero q, the old way to fake this, is now a rejected draft and lossless.)
    wrong_q = torch.full_like(CHAIN_DRAFT, 0.2)
    first, _ = sample_chain(40_000, seed=0, draft_seen_by_kernel=wrong_q)
    with pytest.raises(AssertionError, match="not lossless"):
        assert_distribution(first, CHAIN_TARGET[0])


def test_rejects_mismatched_shapes():
    drafts, coins, final_coins, target, draft = random_inputs(2, 3, 4, torch.Generator())
    with pytest.raises(ValueError, match="draft_probs"):
        run(chain_speculative_sampling, drafts, coins, final_coins, target, draft[:, :2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_verification_accepts_a_block_token_wise_rejects(backend):
    # Sun et al. 2024's motivating case: the first draft alone is over-proposed
    # (w_1 = 0.5 / 1), the pair is not (w_2 = min(1, 0.5 * 1 / 0.5) = 1, so h_2 = 1).
    # Token-wise rejects draft 1 with u_0 = 0.75 >= 0.5; block accepts both.
    fn, kw = entry(backend)
    drafts = torch.tensor([[0, 1]])
    target = torch.tensor([[[0.5, 0.5], [0.0, 1.0], [0.25, 0.75]]])
    draft = torch.tensor([[[1.0, 0.0], [0.5, 0.5]]])
    coins, final = torch.tensor([[0.75, 0.5]]), torch.tensor([0.5])
    token_wise = run(fn, drafts, coins, final, target, draft, **kw)
    assert token_wise[2].tolist() == [0] and emitted_tokens(*token_wise) == [[1]]
    block = run(fn, drafts, coins, final, target, draft, block_verification=True, **kw)
    assert block[2].tolist() == [2] and emitted_tokens(*block) == [[0, 1, 1]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_verification_scales_the_residual_by_the_prefix_weight(backend):
    # w_1 = 0.5, w_2 = 0.25; r_1 = sum relu(0.5 * [.5, .5] - [1, 0]) = 0.25, so
    # h_1 = 0.25 / (0.25 + 1 - 0.5) = 1/3 and h_2 = 0.25. Coins [0.25, 0.5]: n = 1, and
    # the next token comes from relu(w_1 * p_1 - q_1) = [0, 0.25]: token 1.
    fn, kw = entry(backend)
    drafts = torch.tensor([[0, 0]])
    target = torch.tensor([[[0.5, 0.5], [0.5, 0.5], [0.25, 0.75]]])
    draft = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    out = run(
        fn,
        drafts,
        torch.tensor([[0.25, 0.5]]),
        torch.tensor([0.0]),
        target,
        draft,
        block_verification=True,
        **kw,
    )
    assert out[2].tolist() == [1] and emitted_tokens(*out) == [[0, 1]]
    # A coin at h_1 = 1/3 exactly (as float32) is not below it: nothing accepted.
    third = float(torch.tensor(0.25, dtype=torch.float32) / torch.tensor(0.75))
    out = run(
        fn,
        drafts,
        torch.tensor([[third, 0.5]]),
        torch.tensor([0.0]),
        target,
        draft,
        block_verification=True,
        **kw,
    )
    assert out[2].tolist() == [0] and emitted_tokens(*out) == [[1]]


# A first-order Markov pair over V = 3: the target's and the draft's next-token rows given
# the last token. The draft over-proposes token 0 after 0 and token 2 after 1, so block
# and token-wise verification accept different amounts.
MARKOV_TARGET = torch.tensor([[0.2, 0.5, 0.3], [0.4, 0.2, 0.4], [0.3, 0.3, 0.4]])
MARKOV_DRAFT = torch.tensor([[0.6, 0.2, 0.2], [0.1, 0.1, 0.8], [0.3, 0.5, 0.2]])
STREAM = 3  # the first STREAM generated tokens are checked: 27 sequences


def biased_block_verification(predicts, accept_index, accept_token_num, drafts, coins, final,
                              target, draft):  # fmt: skip
    """Block verification without the residual-mass correction: accept the longest prefix
    with ``u < w_i`` (``h_i = w_i``). It accepts more than the real rule and is biased,
    which the chi-square test below must catch."""
    batch, num_drafts = drafts.shape
    nodes = num_drafts + 1
    p = target[:, :num_drafts].gather(2, drafts[..., None])[..., 0]
    q = draft.gather(2, drafts[..., None])[..., 0]
    w = torch.ones(batch)
    weights = [w]
    for i in range(num_drafts):
        w = (w * p[:, i] / q[:, i]).clamp(max=1.0)
        weights.append(w)
    weights = torch.stack(weights, 1)
    slots = torch.arange(1, nodes)
    n = torch.where(coins < weights[:, 1:], slots, 0).amax(1)
    rows = torch.arange(batch)
    residual = weights[rows, n, None] * target[rows, n] - draft[rows, n.clamp(max=num_drafts - 1)]
    residual = torch.where((n == num_drafts)[:, None], target[rows, n], residual.clamp(min=0))
    sampled = sample_residual_torch(target[rows, n], residual, final)
    tokens = torch.cat([drafts, drafts.new_zeros(batch, 1)], 1)
    tokens[rows, n] = sampled
    predicts.copy_(tokens.flatten().to(torch.int32))
    path = rows[:, None] * nodes + torch.arange(nodes)
    accept_index.copy_(torch.where(torch.arange(nodes) <= n[:, None], path, -1))
    accept_token_num.copy_(n)


def generate_streams(trials: int, num_drafts: int, seed: int, verify) -> tuple[torch.Tensor, float]:
    """Decode ``STREAM`` tokens per trial from the Markov pair by draft-then-verify rounds;
    returns the streams ``[trials, STREAM]`` and the mean accepted drafts per verify."""
    gen = torch.Generator().manual_seed(seed)
    streams = torch.zeros(trials, STREAM + num_drafts + 1, dtype=torch.int64)
    lengths = torch.zeros(trials, dtype=torch.int64)
    last = torch.zeros(trials, dtype=torch.int64)  # the prompt ends in token 0
    rows = torch.arange(trials)
    accepted, rounds = 0, 0
    while bool((lengths < STREAM).any()):
        contexts = [last]
        for _ in range(num_drafts):
            contexts.append(torch.multinomial(MARKOV_DRAFT[contexts[-1]], 1, generator=gen)[:, 0])
        drafts = torch.stack(contexts[1:], 1)
        context = torch.stack(contexts, 1)
        target = MARKOV_TARGET[context]
        draft = MARKOV_DRAFT[context[:, :num_drafts]]
        coins = torch.rand(trials, num_drafts, generator=gen)
        final = torch.rand(trials, generator=gen)
        predicts, _, num = run(verify, drafts, coins, final, target, draft)
        active = lengths < STREAM
        accepted += int(num[active].sum())
        rounds += int(active.sum())
        emitted = predicts.view(trials, num_drafts + 1).long()
        for k in range(num_drafts + 1):
            write = active & (k <= num)
            streams[rows[write], lengths[write] + k] = emitted[write, k]
        lengths = torch.where(active, lengths + num.long() + 1, lengths)
        last = streams[rows, lengths - 1]
    return streams[:, :STREAM], accepted / rounds


def stream_probs() -> torch.Tensor:
    probs = torch.zeros(3**STREAM)
    for code in range(3**STREAM):
        prob, prev = 1.0, 0
        for k in reversed(range(STREAM)):
            token = code // 3**k % 3
            prob *= float(MARKOV_TARGET[prev, token])
            prev = token
        probs[code] = prob
    return probs


def stream_counts(streams: torch.Tensor) -> torch.Tensor:
    codes = sum(streams[:, k] * 3 ** (STREAM - 1 - k) for k in range(STREAM))
    return torch.bincount(codes, minlength=3**STREAM)


def torch_chain(block_verification: bool):
    def verify(*args):
        chain_speculative_sampling(*args, backend="torch", block_verification=block_verification)

    return verify


@pytest.mark.parametrize("block_verification", [False, True])
def test_generated_streams_are_lossless(block_verification):
    """Whole decoded sequences, over several verify rounds, follow the target's joint law."""
    streams, _ = generate_streams(20_000, 3, seed=1, verify=torch_chain(block_verification))
    assert_distribution(stream_counts(streams), stream_probs())


def test_chi_square_catches_biased_block_verification():
    streams, _ = generate_streams(20_000, 3, seed=1, verify=biased_block_verification)
    with pytest.raises(AssertionError, match="not lossless"):
        assert_distribution(stream_counts(streams), stream_probs())


def test_block_verification_accepts_more_per_verify():
    # Sun et al. 2024, Theorem 2: block verification's expected accepted drafts are at
    # least token-wise's. On this pair the gain is large enough to show in 20k rounds.
    _, token_wise = generate_streams(20_000, 4, seed=2, verify=torch_chain(False))
    _, block = generate_streams(20_000, 4, seed=2, verify=torch_chain(True))
    assert block > token_wise + 0.02, (block, token_wise)
