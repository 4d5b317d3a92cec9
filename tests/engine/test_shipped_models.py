"""The shipped demo models (issue: trained demo models): the engine's default, the drafters
agree with the target (real acceptance), and every algorithm stays lossless on them."""

from __future__ import annotations

import pytest

from relayc.engine import Engine, SamplingParams
from relayc.engine.algorithms import shipped_drafter
from relayc.engine.checkpoints.shipped import DEMO_DIR, heldout_prompts, shipped_target
from relayc.engine.draft import EagleHead, StandaloneDrafter
from relayc.engine.model.naive import greedy_generate_naive
from relayc.engine.text.bytes import BOS_ID, ByteTokenizer
from relayc.tools.demo import toy_algorithms
from relayc.tools.train import eagle_chain_proposer, simulate_chain, standalone_chain_proposer
from tests.engine.engine_helpers import one_intra_op_thread  # noqa: F401 - autouse fixture

ALGORITHMS = toy_algorithms()

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return heldout_prompts()[:4]


def test_the_engine_defaults_to_the_shipped_target_and_drafters() -> None:
    assert shipped_target() is not None
    with Engine(algorithm="eagle") as engine:
        assert engine.model.config.num_layers > 1
        assert engine.algorithm.drafter is not None
    for algorithm in ("eagle", "eagle_multilayer", "standalone"):
        assert (shipped_drafter(algorithm, 3) / "config.json").is_file()
    with pytest.raises(ValueError, match="use num_steps=3"):
        shipped_drafter("eagle_multilayer", 5)


@pytest.mark.parametrize(
    ("name", "sizes"), ALGORITHMS[1:], ids=[f"{n}-topk{s['topk']}" for n, s in ALGORITHMS[1:]]
)
def test_every_algorithm_is_lossless_on_the_shipped_models(
    prompts: list[str], name: str, sizes: dict[str, int]
) -> None:
    with Engine(algorithm=name, overlap=True, **sizes) as engine:
        tokenizer = ByteTokenizer()
        expected = [
            greedy_generate_naive(engine.model, tokenizer.encode(p), NEW_TOKENS) for p in prompts
        ]
        outs = engine.generate(prompts, SamplingParams(max_new_tokens=NEW_TOKENS))
    assert [o.token_ids for o in outs] == expected
    accepts = [a for o in outs for a in o.accept_lengths]
    if name != "ngram":  # trained drafters agree with the target: more than the bonus per verify
        assert sum(accepts) / len(accepts) > 1.5, (name, sizes, accepts)


@pytest.mark.parametrize("name", ["eagle", "standalone"])
def test_engine_chains_match_a_dense_simulation_verify_for_verify(
    prompts: list[str], name: str
) -> None:
    """Every accept length of the engine's chain drafting equals that of a cache-free dense
    simulation (relayc.tools.train.simulate_chain): the draft caches hold exactly the right
    keys at every position (prompt, accepted drafts, the standalone bonus slot)."""
    with Engine(algorithm=name, overlap=True, num_steps=3, topk=1, num_draft_tokens=4) as engine:
        outs = engine.generate(prompts, SamplingParams(max_new_tokens=NEW_TOKENS))
        target = engine.model
    if name == "eagle":
        propose = eagle_chain_proposer(EagleHead.load(DEMO_DIR / "eagle", target), 3)
    else:
        propose = standalone_chain_proposer(
            StandaloneDrafter.load(DEMO_DIR / "standalone").model, 3
        )
    for prompt, out in zip(prompts, outs, strict=True):
        ids = [BOS_ID, *prompt.encode("utf-8")]
        assert out.accept_lengths == simulate_chain(target, propose, ids, NEW_TOKENS)
