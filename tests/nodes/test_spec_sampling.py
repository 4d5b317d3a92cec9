"""Speculative sampling is lossless: under EAGLE, n-gram and standalone (chain rejection
sampling with the draft model's real probabilities), the first sampled tokens follow
the target's own distribution (chi-square against the exact probabilities, fixed seeds), and
the same test rejects a deliberately biased acceptance rule."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch

from relayc.engine.core.config import ModelConfig
from relayc.engine.core.sampling import SamplingParams
from relayc.engine.model.weights import random_model
from relayc.engine.ops.verify import impl_accept_tree
from tests.engine.engine_helpers import one_intra_op_thread  # noqa: F401 - autouse fixture
from tests.nodes.spec_driver import SpecDriver

TINY_VOCAB = ModelConfig(
    vocab_size=4, hidden_size=32, intermediate_size=48, num_layers=1, head_dim=8, max_position=64
)
PROMPT = [1, 2, 1, 2, 1, 2, 1]
REQUESTS = 1200
TOKENS = 3  # (x1, x2, x3): x1 from the prefill, x2 and x3 from speculative decode steps


@pytest.fixture(scope="module")
def target():  # type: ignore[no-untyped-def]
    model = random_model(TINY_VOCAB, seed=3)
    with torch.no_grad():  # sharper distributions than the default init: a bias shows more
        model.model.norm.weight.mul_(2.5)
    return model


def exact_probabilities(target) -> dict[tuple[int, ...], float]:  # type: ignore[no-untyped-def]
    """P(x1, x2, x3 | prompt) by enumeration with cache-free forwards."""
    vocab = TINY_VOCAB.vocab_size

    @torch.no_grad()
    def next_probs(tokens: list[int]) -> list[float]:
        logits = target.forward_dense(torch.tensor(tokens)).logits[-1]
        return torch.softmax(logits.double(), dim=-1).tolist()

    probs: dict[tuple[int, ...], float] = {}
    for seq in itertools.product(range(vocab), repeat=TOKENS):
        p = 1.0
        for i in range(TOKENS):
            p *= next_probs(PROMPT + list(seq[:i]))[seq[i]]
        probs[seq] = p
    return probs


def chi_square(
    counts: Counter, probs: dict[tuple[int, ...], float], total: int
) -> tuple[float, float]:
    """Statistic over cells with expected count >= 5 (the rest pooled) and its 0.1% critical
    value (Wilson-Hilferty approximation of the chi-square quantile)."""
    stat, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for seq, p in probs.items():
        expected = p * total
        if expected < 5:
            pooled_obs += counts[seq]
            pooled_exp += expected
            continue
        stat += (counts[seq] - expected) ** 2 / expected
        cells += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    df = cells - 1
    z = 3.090  # the standard normal's 0.999 quantile
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat, critical


def sample_sequences(target, name: str, biased: bool = False) -> Counter:  # type: ignore[no-untyped-def]
    topk = 1 if name == "standalone" else 2  # the standalone model drafts a chain
    spec = SpecDriver(
        target,
        name,
        num_steps=3,
        topk=topk,
        n=4,
        batch=REQUESTS,
        debug=False,
        kv_size=REQUESTS * 40,
    )
    if biased:  # accept with the greedy rule even when sampling: not lossless
        step = spec.algorithm.decode_step

        def greedy_accept(ctx, **inputs):  # type: ignore[no-untyped-def]
            ctx.sampling = None
            return impl_accept_tree(ctx, **inputs)

        step._accept_tree = greedy_accept
    spec.prefill([PROMPT] * REQUESTS, [SamplingParams(temperature=1.0)] * REQUESTS, range(REQUESTS))
    while min(len(o) for o in spec.outputs) < TOKENS:
        spec.decode()
    return Counter(tuple(o[:TOKENS]) for o in spec.outputs)


@pytest.mark.parametrize("name", ["eagle", "ngram", "standalone"])
def test_speculative_sampling_matches_the_target_distribution(target, name: str) -> None:  # type: ignore[no-untyped-def]
    probs = exact_probabilities(target)
    stat, critical = chi_square(sample_sequences(target, name), probs, REQUESTS)
    assert stat < critical, f"chi-square {stat:.1f} >= {critical:.1f}"


def test_a_biased_acceptance_rule_fails_the_same_check(target) -> None:  # type: ignore[no-untyped-def]
    probs = exact_probabilities(target)
    stat, critical = chi_square(sample_sequences(target, "eagle", biased=True), probs, REQUESTS)
    assert stat >= critical, f"the biased rule passed: chi-square {stat:.1f} < {critical:.1f}"
