"""A decode batch its host drafter proposed nothing for runs as one-token steps
(``relayc.engine.serving.undrafted``): exactly where the verify would have verified the
root alone for every request, with the verify's tokens and acceptance record, and a relay
the next verify reads as a verify that accepted the bonus token alone."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from relayc.engine import Engine, SamplingParams
from relayc.engine.draft.ngram import NgramProposer
from relayc.engine.ops.draft import proposes_nothing
from tests.engine.engine_helpers import one_intra_op_thread  # noqa: F401 - autouse fixture

SIZES: dict[str, Any] = {"num_steps": 3, "topk": 1, "num_draft_tokens": 6}
HOST_DRAFTERS = [
    "ngram",
    pytest.param(
        "suffix",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("arctic_inference") is None,
            reason="arctic-inference is not installed: `pip install 'relayc[suffix]'`",
        ),
    ),
]
# The toy model (trained on text and code) copies: one prompt its own history drafts from at
# once, two that draft nothing for their first steps, then from their output.
CYCLIC = "import os\nimport sys\nimport os\n"
PLAIN = ["zebra", "Why?"]


def test_one_row_with_a_draft_keeps_the_batch_verifying() -> None:
    drafter = NgramProposer(num_draft_tokens=6, max_depth=5)
    drafter.add_request(1, [256, *([7, 8, 9, 10] * 4)])
    drafter.add_request(2, [256, *range(40, 60)])
    assert proposes_nothing(drafter, [2])
    assert not proposes_nothing(drafter, [1])
    assert not proposes_nothing(drafter, [2, 1])
    assert not proposes_nothing(object(), [2])  # not a lag-keyed host drafter: always verify


def _run(
    algorithm: str,
    prompts: list[str],
    params: SamplingParams,
    *,
    graphs: str,
    undrafted: bool,
) -> tuple[list[list[int]], list[list[int]], int]:
    """Tokens, accept lengths per request, and one-token steps taken for drafting nothing."""
    with Engine(algorithm=algorithm, overlap=False, debug=True, graphs=graphs, **SIZES) as engine:
        if not undrafted:  # the verify step for every batch: what the path must reproduce
            engine.algorithm.drafts_nothing = lambda req_pool_indices: False  # type: ignore[method-assign]
        outs = engine.generate(prompts, [params] * len(prompts))
        steps = engine.scheduler.stats.undrafted_steps
    return [o.token_ids for o in outs], [list(o.accept_lengths) for o in outs], steps


@pytest.mark.parametrize("graphs", ["off", "tape"])
@pytest.mark.parametrize("algorithm", HOST_DRAFTERS)
def test_undrafted_steps_are_the_verify_s_to_the_token_and_the_accept_length(
    algorithm: str, graphs: str
) -> None:
    """A batch of a drafting request and two that draft nothing: the path runs only while
    no row drafts (else the drafting row's longer accepts would turn into ones), and every
    token and accept length is the verify's (the relay after a one-token step read right)."""
    prompts = [CYCLIC, *PLAIN]
    params = SamplingParams(max_new_tokens=24)
    expected = _run("none", prompts, params, graphs="off", undrafted=True)[0]
    batched = _run(algorithm, prompts, params, graphs=graphs, undrafted=True)
    verified = _run(algorithm, prompts, params, graphs=graphs, undrafted=False)
    assert batched[0] == verified[0] == expected
    assert batched[1] == verified[1]
    assert max(batched[1][0]) > 1  # the cyclic request's drafts were verified and accepted
    assert batched[2] > 0 and verified[2] == 0
    for prompt in PLAIN:  # alone, each drafts nothing for a while, then from its output
        alone = _run(algorithm, [prompt], params, graphs=graphs, undrafted=True)
        assert alone[:2] == _run(algorithm, [prompt], params, graphs=graphs, undrafted=False)[:2]
        assert alone[0] == [expected[PLAIN.index(prompt) + 1]]
        assert alone[2] > 0


@pytest.mark.parametrize("algorithm", HOST_DRAFTERS)
def test_seeded_sampling_is_unchanged(algorithm: str) -> None:
    prompts = [CYCLIC, *PLAIN]
    params = SamplingParams(max_new_tokens=24, temperature=0.8, top_k=20, seed=7)
    none = _run("none", prompts, params, graphs="off", undrafted=True)[0]
    undrafted = _run(algorithm, prompts, params, graphs="off", undrafted=True)
    verified = _run(algorithm, prompts, params, graphs="off", undrafted=False)
    assert undrafted[0] == verified[0] == none
    assert undrafted[2] > 0
