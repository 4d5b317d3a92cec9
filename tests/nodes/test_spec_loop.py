"""The generated decode steps of EAGLE, multi-layer EAGLE, n-gram and standalone on the real ops are
lossless and capturable, driven by hand (tests/nodes/spec_driver.py)."""

from __future__ import annotations

import pytest

from relayc.engine.core.sampling import SamplingParams
from relayc.engine.model.naive import greedy_generate_naive
from relayc.engine.model.weights import random_model
from tests.engine.engine_helpers import one_intra_op_thread  # noqa: F401 - autouse fixture
from tests.nodes.spec_driver import SMALL, SpecDriver

PROMPTS = [[3, 5, 7, 9, 11, 3, 5, 7, 9], [1, 2, 30, 4], [20, 21, 22, 20, 21, 22, 20]]
NEW_TOKENS = 16
CONFIGS = [
    ("eagle", 3, 1, 4),
    ("eagle", 3, 4, 8),
    ("eagle_multilayer", 3, 2, 6),
    ("ngram", 3, 1, 5),
    ("standalone", 3, 1, 4),
]


@pytest.mark.parametrize(("name", "num_steps", "topk", "n"), CONFIGS)
def test_generated_steps_are_lossless(name: str, num_steps: int, topk: int, n: int) -> None:
    target = random_model(SMALL, seed=11)
    spec = SpecDriver(target, name, num_steps=num_steps, topk=topk, n=n, batch=len(PROMPTS))
    spec.prefill(PROMPTS, [SamplingParams()] * len(PROMPTS), [0] * len(PROMPTS))
    while min(len(o) for o in spec.outputs) < NEW_TOKENS:
        spec.decode()
    for prompt, got in zip(PROMPTS, spec.outputs, strict=True):
        assert got[:NEW_TOKENS] == greedy_generate_naive(target, prompt, NEW_TOKENS)
    assert all(1 <= a <= n for a in spec.accepted)


@pytest.mark.parametrize(("name", "num_steps", "topk", "n"), CONFIGS)
def test_decode_step_on_real_ops_passes_capture_check(
    name: str, num_steps: int, topk: int, n: int
) -> None:
    target = random_model(SMALL, seed=11)
    # debug mode checks resolved rows on the host: off where the step must be capturable
    spec = SpecDriver(
        target, name, num_steps=num_steps, topk=topk, n=n, batch=len(PROMPTS), debug=False
    )
    spec.prefill(PROMPTS, [SamplingParams(temperature=0.7)] * len(PROMPTS), [1, 2, 3])
    spec.decode()
    spec.capture_check()
