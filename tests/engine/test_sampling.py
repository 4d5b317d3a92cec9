"""The batched sampler: greedy paths, filters, keyed randomness, and parameter validation."""

from __future__ import annotations

import pytest
import torch

from relayc.engine.core.sampling import SamplingBatch, SamplingParams, keyed_uniform, sample

VOCAB = 37


def _logits(rows: int, seed: int = 0, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def _sample(logits: torch.Tensor, params: list[SamplingParams], seeds, positions) -> torch.Tensor:
    batch = SamplingBatch.build(params, seeds, logits.device)
    return sample(logits, batch, torch.tensor(positions))


def test_greedy_is_argmax_with_lowest_id_on_ties() -> None:
    logits = _logits(5)
    logits[0, 3] = logits[0, 9] = logits[0].max() + 1.0
    got = _sample(logits, [SamplingParams()] * 5, range(5), range(5))
    assert got.tolist() == [3, *logits[1:].argmax(-1).tolist()]


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=1.3, top_k=1), SamplingParams(temperature=2.0, top_p=1e-6)],
)
def test_top_k_one_and_tiny_top_p_equal_greedy(params: SamplingParams) -> None:
    logits = _logits(64, seed=1)
    logits[0, 5] = logits[0, 2] = logits[0].max() + 1.0  # tie: the lower id wins, as in greedy
    greedy = _sample(logits, [SamplingParams()] * 64, range(64), [7] * 64)
    assert _sample(logits, [params] * 64, range(64), [7] * 64).tolist() == greedy.tolist()


def test_same_seed_and_position_give_the_same_token_in_any_batch() -> None:
    logits = _logits(6, seed=2)
    params = [SamplingParams(temperature=1.0, top_k=20, top_p=0.9)] * 6
    seeds, positions = [11, 12, 13, 14, 15, 16], [3, 3, 4, 9, 0, 100]
    together = _sample(logits, params, seeds, positions)
    reversed_batch = _sample(logits.flip(0), params, seeds[::-1], positions[::-1]).flip(0)
    alone = [
        _sample(logits[i : i + 1], params[:1], seeds[i : i + 1], positions[i : i + 1])
        for i in range(6)
    ]
    assert together.tolist() == reversed_batch.tolist() == torch.cat(alone).tolist()
    assert together.tolist() == _sample(logits, params, seeds, positions).tolist()


def test_mixed_batch_keeps_greedy_rows_greedy() -> None:
    logits = _logits(4, seed=3)
    params = [SamplingParams(), SamplingParams(temperature=5.0)] * 2
    got = _sample(logits, params, [1, 2, 3, 4], [0, 0, 0, 0])
    assert got[0] == logits[0].argmax() and got[2] == logits[2].argmax()


def test_keys_differ_across_seed_and_position() -> None:
    u = keyed_uniform(torch.tensor([0, 0, 1, 1 << 40]), torch.tensor([0, 1, 0, 0]), 1000)
    assert ((u > 0) & (u < 1)).all()
    for a in range(4):
        for b in range(a + 1, 4):
            assert not torch.equal(u[a], u[b])
    assert abs(u.mean().item() - 0.5) < 0.02


def _empirical(logits: torch.Tensor, params: SamplingParams, draws: int) -> torch.Tensor:
    tokens = _sample(logits.expand(draws, -1), [params] * draws, [5] * draws, range(draws))
    return torch.bincount(tokens, minlength=logits.shape[-1]).float() / draws


def test_temperature_sampling_follows_softmax() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]])
    draws = 20000
    freq = _empirical(logits, SamplingParams(temperature=0.7), draws)
    expected = torch.softmax(logits[0] / 0.7, -1)
    # 4.5 binomial standard deviations: a correct sampler fails ~1e-5 of the time.
    tolerance = 4.5 * (expected * (1 - expected) / draws).sqrt()
    assert ((freq - expected).abs() <= tolerance).all(), (freq, expected)


def test_top_k_and_top_p_renormalise_over_the_kept_tokens() -> None:
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    draws = 20000
    top_k = _empirical(logits, SamplingParams(temperature=1.0, top_k=2), draws)
    expected = torch.tensor([0.4, 0.3, 0.0, 0.0]) / 0.7
    assert ((top_k - expected).abs() <= 0.02).all(), top_k
    # top_p=0.75: 0.4 + 0.3 < 0.75, so the third token (mass above it 0.7) stays too.
    top_p = _empirical(logits, SamplingParams(temperature=1.0, top_p=0.75), draws)
    expected = torch.tensor([0.4, 0.3, 0.2, 0.0]) / 0.9
    assert ((top_p - expected).abs() <= 0.02).all(), top_p


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (SamplingParams(max_new_tokens=0), "max_new_tokens"),
        (SamplingParams(temperature=-0.1), "temperature"),
        (SamplingParams(temperature=float("nan")), "temperature"),
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(top_p=1.5), "top_p"),
        (SamplingParams(top_k=-1), "top_k"),
        (SamplingParams(stop_token_ids=(3, VOCAB)), "stop_token_ids"),
        (SamplingParams(stop_token_ids=(-1,)), "stop_token_ids"),
    ],
)
def test_validate_names_the_bad_field(params: SamplingParams, field: str) -> None:
    with pytest.raises(ValueError, match=f"`{field}`"):
        params.validate(VOCAB)


def test_defaults_validate_and_seed_resolution() -> None:
    params = SamplingParams()
    params.validate(VOCAB)
    assert params == SamplingParams(32, 0.0, 0, 1.0, None, ())
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)  # type: ignore[arg-type]
    assert params.resolve_seed(engine_seed=100, request_id=7) == 107
    assert SamplingParams(seed=5).resolve_seed(engine_seed=100, request_id=7) == 5
