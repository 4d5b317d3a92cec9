"""EAGLE-3 sampling is lossless: with a head that drafts from a reduced vocabulary (one
target token it can never propose), the first sampled tokens still follow the target's own
distribution (the chi-square test of test_spec_sampling, fixed seeds)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from relayc.engine.draft import Eagle3Head
from relayc.engine.sampling import SamplingParams
from relayc.engine.weights import random_model
from tests.engine.engine_helpers import one_intra_op_thread  # noqa: F401 - autouse fixture
from tests.nodes.spec_driver import SpecDriver
from tests.nodes.test_spec_sampling import (
    PROMPT,
    REQUESTS,
    TINY_VOCAB,
    TOKENS,
    chi_square,
    exact_probabilities,
)


@pytest.mark.parametrize("topk", [1, 2])
def test_eagle3_sampling_matches_the_target_distribution(tmp_path: Path, topk: int) -> None:
    target = random_model(TINY_VOCAB.replace(num_layers=3), seed=3)
    with torch.no_grad():  # as in test_spec_sampling: sharper distributions
        target.model.norm.weight.mul_(2.5)
    head = Eagle3Head.random(target, seed=4, draft_vocab_size=3, layer_ids=[-1, 0, 1])
    assert int(head.t2d.sum()) == 3  # one of the four target tokens is never drafted
    spec = SpecDriver(
        target,
        "eagle3",
        num_steps=3,
        topk=topk,
        n=4,
        batch=REQUESTS,
        debug=False,
        kv_size=REQUESTS * 40,
        draft_model=head.save(tmp_path / "head"),
    )
    spec.prefill([PROMPT] * REQUESTS, [SamplingParams(temperature=1.0)] * REQUESTS, range(REQUESTS))
    while min(len(o) for o in spec.outputs) < TOKENS:
        spec.decode()
    counts = Counter(tuple(o[:TOKENS]) for o in spec.outputs)
    stat, critical = chi_square(counts, exact_probabilities(target), REQUESTS)
    assert stat < critical, f"chi-square {stat:.1f} >= {critical:.1f}"
    assert max(spec.accepted) > 1, "no draft was ever accepted: the test checks nothing"
