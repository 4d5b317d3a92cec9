"""The generated eagle3 decode step on the real ops, driven by hand: sampling is lossless --
with a head that drafts from a reduced vocabulary (one target token it can never propose),
the first sampled tokens still follow the target's own distribution (the chi-square test of
test_spec_sampling, fixed seeds) -- and the device part passes capture_check (no host syncs
in the capture forward, the d2t map or the EAGLE-3 head)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from relayc.engine.core.sampling import SamplingParams
from relayc.engine.draft import Eagle3Head
from relayc.engine.model.weights import random_model
from tests.engine.engine_helpers import one_intra_op_thread  # noqa: F401 - autouse fixture
from tests.nodes.spec_driver import SMALL, SpecDriver
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


@pytest.mark.parametrize("topk", [1, 3])
def test_eagle3_decode_step_passes_capture_check(tmp_path: Path, topk: int) -> None:
    target = random_model(SMALL.replace(num_layers=4), seed=11)
    head = Eagle3Head.random(target, seed=2, draft_vocab_size=30, layer_ids=[0, 1, 2])
    prompts = [[3, 5, 7, 9, 11, 3], [1, 2, 30, 4], [20, 21, 22]]
    # debug mode checks resolved rows on the host: off where the step must be capturable
    spec = SpecDriver(
        target,
        "eagle3",
        num_steps=3,
        topk=topk,
        n=6 if topk > 1 else 4,
        batch=len(prompts),
        debug=False,
        draft_model=head.save(tmp_path / "head"),
    )
    spec.prefill(prompts, [SamplingParams(temperature=0.7)] * len(prompts), [1, 2, 3])
    spec.decode()
    spec.capture_check()
