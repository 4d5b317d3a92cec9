"""``Engine(block_verification=True)``: the option reaches the chain accept op, and only
chain-drafting algorithms take it (issue 16; the kernel's rules and losslessness are tested
in tests/kernels/test_chain_sampling.py)."""

from __future__ import annotations

import pytest

import relayc.engine.ops.verify as verify_ops
from relayc.engine import Engine, LlamaForCausalLM, SamplingParams, random_model

CHAIN = {"num_steps": 3, "topk": 1, "num_draft_tokens": 4}


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(seed=3)


@pytest.mark.parametrize("block_verification", [False, True])
def test_the_option_reaches_the_chain_sampler(
    model: LlamaForCausalLM, block_verification: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bool] = []
    real = verify_ops.chain_speculative_sampling

    def spy(*args, block_verification: bool = False, **kwargs) -> None:  # type: ignore[no-untyped-def]
        seen.append(block_verification)
        real(*args, block_verification=block_verification, **kwargs)

    monkeypatch.setattr(verify_ops, "chain_speculative_sampling", spy)
    engine = Engine(model, algorithm="standalone", block_verification=block_verification, **CHAIN)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=5)
    outs = engine.generate([[1, 2, 3], [4, 5, 6, 7]], params)
    engine.close()
    assert seen and set(seen) == {block_verification}
    for out in outs:
        assert len(out.token_ids) == 12
        assert all(1 <= a <= CHAIN["num_draft_tokens"] for a in out.accept_lengths)


@pytest.mark.parametrize(
    ("algorithm", "sizes", "message"),
    [
        ("none", {}, "`none` does not draft a chain"),
        ("eagle", {"num_steps": 3, "topk": 2, "num_draft_tokens": 5}, "use `standalone`"),
    ],
)
def test_algorithms_without_chain_drafts_refuse_the_option(
    model: LlamaForCausalLM, algorithm: str, sizes: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Engine(model, algorithm=algorithm, block_verification=True, **sizes)
