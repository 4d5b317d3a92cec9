"""Adding a relay field end to end (issue: speculative decoding): a copy of the bundled EAGLE
spec relays `draft_probs`, drafts a chain (topk 1) that keeps every draft's distribution and
accepts with chain rejection sampling on those real probabilities -- recompiled with
`relayc compile`, run by the engine, still lossless (greedy exactly, sampling in law)."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import pytest
import torch

from relayc.cli import main
from relayc.engine import Engine, SamplingParams, random_model
from relayc.engine.model.naive import greedy_generate_naive
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
from tests.spec_edits import CHAIN_ACCEPT_EDITS, DRAFT_PROBS_EDITS, edited_eagle_spec


@pytest.fixture(scope="module")
def chain_module(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    work = tmp_path_factory.mktemp("spec")
    edited_eagle_spec(work, DRAFT_PROBS_EDITS + CHAIN_ACCEPT_EDITS, "eagle_chain")
    assert main(["compile", str(work / "eagle_chain.yaml"), "-o", str(work / "out")]) == 0
    spec = importlib.util.spec_from_file_location("eagle_chain", work / "out" / "eagle_chain.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert "draft_probs" in module.RelayPayload.__dataclass_fields__
    return module


def test_greedy_chain_with_draft_probs_is_lossless(chain_module: ModuleType) -> None:
    model = random_model(seed=3)
    prompts = [[10, 20, 30, 40, 50], [7, 7, 7], list(range(60, 80))]
    engine = Engine(
        model,
        algorithm="eagle",
        num_steps=3,
        topk=1,
        num_draft_tokens=4,
        req_pool_size=16,
        debug=True,
        relay_module=chain_module,
    )
    assert engine.algorithm.chain_drafts  # the compiled module, not relayc.generated.eagle
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=12))
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == greedy_generate_naive(model, prompt, 12)
    engine.close()


def test_chain_rejection_sampling_with_draft_probs_is_lossless(chain_module: ModuleType) -> None:
    target = random_model(TINY_VOCAB, seed=3)
    with torch.no_grad():
        target.model.norm.weight.mul_(2.5)
    spec = SpecDriver(
        target,
        "eagle",
        num_steps=3,
        topk=1,
        n=4,
        batch=REQUESTS,
        debug=False,
        kv_size=REQUESTS * 40,
        module=chain_module,
    )
    spec.prefill([PROMPT] * REQUESTS, [SamplingParams(temperature=1.0)] * REQUESTS, range(REQUESTS))
    while min(len(o) for o in spec.outputs) < TOKENS:
        spec.decode()
    from collections import Counter

    counts = Counter(tuple(o[:TOKENS]) for o in spec.outputs)
    stat, critical = chi_square(counts, exact_probabilities(target), REQUESTS)
    assert stat < critical, f"chi-square {stat:.1f} >= {critical:.1f}"
    assert max(spec.accepted) > 1  # drafts were accepted, not only bonus tokens
