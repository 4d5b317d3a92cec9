"""``suffix`` through the Engine is lossless: greedy outputs equal ``none``'s token for token
(one at a time and 16+ staggered, overlap on and off, recorded steps, the context end),
seeded sampling gives ``none``'s tokens alone, batched and overlapped, and a request's
output never carries another request's text, though the global tree drafts from it."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from relayc.engine import Engine, LlamaForCausalLM, ModelConfig, SamplingParams, random_model
from relayc.engine.draft.ngram import EMPTY
from relayc.engine.serving.request import FinishReason
from tests.engine.engine_helpers import (
    assert_idle,
    naive_outputs,
    one_intra_op_thread,  # noqa: F401 - autouse fixture
    random_workload,
)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("arctic_inference") is None,
    reason="arctic-inference is not installed: `pip install 'relayc[suffix]'` (docs/suffix.md)",
)

SIZES: dict[str, Any] = {"num_steps": 3, "topk": 1, "num_draft_tokens": 6}


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(seed=3)


def _mean_accept(outs: list[Any]) -> float:
    lens = [a for o in outs for a in o.accept_lengths]
    return sum(lens) / len(lens)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_staggered_requests_equal_greedy_none_cold_and_from_the_global_tree(
    model: LlamaForCausalLM, overlap: bool
) -> None:
    """The second pass over the same workload drafts from the first pass's outputs (the
    global tree), so long drafts are verified and accepted, staggered and lagging."""
    work = random_workload(5, 24, max_prompt=20, max_new=14, last_arrival=6)
    expected = naive_outputs(model, work.prompts, work.params)
    with Engine(model, algorithm="suffix", overlap=overlap, debug=True, **SIZES) as engine:
        cold = engine.generate(work.prompts, work.params, arrivals=work.arrivals)
        assert [o.token_ids for o in cold] == expected
        assert engine.scheduler.stats.max_running >= 16
        warm = engine.generate(work.prompts, work.params, arrivals=work.arrivals)
        assert [o.token_ids for o in warm] == expected
        assert _mean_accept(warm) > 2.0, _mean_accept(warm)
        for out in (*cold, *warm):
            assert all(1 <= a <= SIZES["num_draft_tokens"] for a in out.accept_lengths)
        assert_idle(engine)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_one_request_at_a_time_equals_greedy_none(model: LlamaForCausalLM, overlap: bool) -> None:
    # Cyclic prompts: the request's own tree drafts from its prompt.
    prompts = [[256, *([7, 8, 9, 10] * 4)], [256, 1, 2, 3, 1, 2, 3, 1, 2], [256, *range(40, 60)]]
    params = SamplingParams(max_new_tokens=20)
    expected = naive_outputs(model, prompts, [params] * len(prompts))
    with Engine(model, algorithm="suffix", overlap=overlap, debug=True, **SIZES) as engine:
        for _ in range(2):  # cold, then with the outputs in the global tree
            outs = [engine.generate([p], params)[0] for p in prompts]
            assert [o.token_ids for o in outs] == expected
        assert max(a for o in outs for a in o.accept_lengths) > 1


TINY = ModelConfig(
    hidden_size=32, intermediate_size=64, num_layers=4, num_heads=2, num_kv_heads=1, head_dim=16
)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
@pytest.mark.parametrize("graphs", ["tape", "static"])
def test_recorded_steps_equal_eager(overlap: bool, graphs: str) -> None:
    """Recorded (``tape``) and static-buffer steps verify the whole window; eager ones only
    the widest tree (``verify_len``): the same tokens either way."""
    model = random_model(TINY, seed=5)
    work = random_workload(9, 7, max_prompt=12, max_new=12, last_arrival=3)

    def run(mode: str) -> list[list[int]]:
        with Engine(
            model,
            algorithm="suffix",
            overlap=overlap,
            graphs=mode,
            capture_batch_sizes=(1, 2, 4),
            max_batch_size=8,
            **SIZES,
        ) as engine:
            outs = [
                [o.token_ids for o in engine.generate(work.prompts, work.params, arrivals=arrivals)]
                for arrivals in (work.arrivals, [0] * 7, work.arrivals)  # the last from the tree
            ]
            if mode == graphs:
                assert engine.algorithm.graphs.runners[True].replays > 0
            return [tokens for run in outs for tokens in run]

    assert run(graphs) == run("off")


def test_requests_at_the_context_end_equal_none() -> None:
    from tests.engine.test_context_limit import CONTEXT, _workload
    from tests.engine.test_context_limit import TINY as LIMIT_MODEL

    limit_model = random_model(LIMIT_MODEL, seed=11)
    outputs = {}
    for algorithm, sizes in (("none", {}), ("suffix", SIZES)):
        for overlap in (True, False):
            with Engine(
                limit_model,
                algorithm=algorithm,
                max_context=CONTEXT,
                max_prefill_tokens=24,
                max_batch_size=8,
                overlap=overlap,
                debug=True,
                **sizes,
            ) as engine:
                prompts, params, arrivals = _workload(SIZES["num_draft_tokens"])
                for rep in range(2):  # the second from the global tree
                    outs = engine.generate(prompts, params, arrivals=arrivals)
                    outputs[algorithm, overlap, rep] = [
                        (o.token_ids, o.finish_reason) for o in outs
                    ]
                if algorithm == "suffix":
                    assert engine.scheduler.stats.tail_steps > 0
                assert_idle(engine)
    want = outputs["none", False, 0]
    assert any(reason is FinishReason.LENGTH for _, reason in want)
    assert all(got == want for got in outputs.values())


def test_seeded_sampling_is_nones_alone_batched_staggered_and_overlapped() -> None:
    prompts = [
        "def foo(x):\n    return x\n\ndef foo(y):\n    return",
        "import os\nimport sys\nimport os\n",
        "class A:\n    def f(self):\n        pass\n\nclass B:\n    def",
        "for i in range(10):\n    print(i)\nfor j in range(10):\n",
    ]
    params = [SamplingParams(max_new_tokens=24, temperature=0.8, seed=7 + i) for i in range(4)]
    with Engine(algorithm="none", overlap=False) as plain:
        want = [o.token_ids for o in plain.generate(prompts, params)]
    for overlap in (True, False):
        with Engine(algorithm="suffix", num_draft_tokens=6, max_batch_size=8, overlap=overlap) as e:
            solo = [e.generate([p], [q])[0] for p, q in zip(prompts, params, strict=True)]
            assert [o.token_ids for o in solo] == want
            assert any(max(o.accept_lengths) > 1 for o in solo)  # drafts were accepted
            together = e.generate(prompts, params, arrivals=[0, 2, 1, 3])
            assert [o.token_ids for o in together] == want, overlap


def test_another_requests_output_is_drafted_never_emitted(model: LlamaForCausalLM) -> None:
    """Request B's prompt ends where request A's output began, so the global tree drafts
    A's continuation for B; the target rejects it wherever B goes elsewhere, and B's output
    is ``none``'s, in an engine that served A first as in one that did not."""
    params = SamplingParams(max_new_tokens=24)
    prompt_a = [256, 31, 32, 33, 34]
    with Engine(model, algorithm="none") as plain:
        (output_a,) = [o.token_ids for o in plain.generate([prompt_a], params)]
        prompt_b = [256, 90, 91, *output_a[:4]]
        (want_b,) = [o.token_ids for o in plain.generate([prompt_b], params)]
    assert want_b != output_a[4 : 4 + len(want_b)]  # B's own continuation differs from A's
    with Engine(model, algorithm="suffix", **SIZES) as engine:
        (got_a,) = engine.generate([prompt_a], params)
        assert got_a.token_ids == output_a
        proposer = engine.algorithm.drafter
        proposer.add_request(99, prompt_b)  # what B's first proposal will be
        drafted = [t for t in proposer.propose_for_suffixes(99).proposals[0].tolist() if t != EMPTY]
        proposer.remove_request(99)
        assert [t & 0xFFFFFFFF for t in drafted[1:]] == output_a[4 : 4 + len(drafted) - 1] != []
        (got_b,) = engine.generate([prompt_b], params)
        assert got_b.token_ids == want_b
    with Engine(model, algorithm="suffix", **SIZES) as fresh:
        assert fresh.generate([prompt_b], params)[0].token_ids == want_b
