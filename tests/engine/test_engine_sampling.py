"""Seeded sampling through the Engine: reproducible run to run, with overlap on and off,
and independent of which other requests share the batch."""

from __future__ import annotations

import dataclasses

import pytest

from relayc.engine import Engine, FinishReason, LlamaForCausalLM, SamplingParams, random_model
from tests.engine.engine_helpers import (
    naive_outputs,
    one_intra_op_thread,  # noqa: F401 - autouse fixture
    random_workload,
)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(seed=5)


def _mixed_params(n: int) -> list[SamplingParams]:
    """Greedy, temperature, top-k and top-p rows; explicit seeds on every third."""
    settings = [
        {"temperature": 0.0},
        {"temperature": 1.0},
        {"temperature": 0.7, "top_k": 8},
        {"temperature": 1.3, "top_p": 0.8},
        {"temperature": 1.0, "top_k": 20, "top_p": 0.9},
    ]
    return [
        SamplingParams(
            max_new_tokens=4 + i % 7, seed=1000 + i if i % 3 == 0 else None, **settings[i % 5]
        )
        for i in range(n)
    ]


def _run(model: LlamaForCausalLM, overlap: bool, seed: int = 0) -> list[list[int]]:
    work = random_workload(11, 20, max_prompt=12, max_new=1, last_arrival=5)
    with Engine(model, overlap=overlap, seed=seed, max_batch_size=8) as engine:
        outs = engine.generate(work.prompts, _mixed_params(20), arrivals=work.arrivals)
    return [o.token_ids for o in outs]


def test_seeded_sampling_is_reproducible_and_overlap_independent(model: LlamaForCausalLM) -> None:
    first = _run(model, overlap=True)
    assert _run(model, overlap=True) == first
    assert _run(model, overlap=False) == first
    other_seed = _run(model, overlap=True, seed=1)
    # Only requests without an explicit seed follow the engine seed.
    params = _mixed_params(20)
    follows = [i for i, p in enumerate(params) if p.seed is None and p.temperature > 0]
    assert any(other_seed[i] != first[i] for i in follows)
    assert all(other_seed[i] == first[i] for i, p in enumerate(params) if p.seed is not None)


def test_a_request_samples_the_same_tokens_alone_or_in_a_crowd(model: LlamaForCausalLM) -> None:
    work = random_workload(12, 12, max_prompt=10, max_new=1, last_arrival=3)
    params = [
        SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.95, seed=50 + i)
        for i in range(12)
    ]
    with Engine(model) as engine:
        crowd = [o.token_ids for o in engine.generate(work.prompts, params, arrivals=work.arrivals)]
        for i in (0, 5, 11):
            (alone,) = engine.generate([work.prompts[i]], [params[i]])
            assert alone.token_ids == crowd[i]
    greedy = naive_outputs(model, work.prompts, [SamplingParams(max_new_tokens=8)] * 12)
    assert crowd != greedy  # temperature 1 really samples


def test_top_k_one_is_greedy_and_sampled_stop_tokens_end_a_request(
    model: LlamaForCausalLM,
) -> None:
    work = random_workload(13, 6, max_prompt=10, max_new=8, last_arrival=2)
    top1 = [dataclasses.replace(p, temperature=1.5, top_k=1) for p in work.params]
    with Engine(model) as engine:
        outs = engine.generate(work.prompts, top1, arrivals=work.arrivals)
        assert [o.token_ids for o in outs] == naive_outputs(model, work.prompts, work.params)

        sampled = SamplingParams(max_new_tokens=12, temperature=1.0, seed=3)
        (free,) = engine.generate([work.prompts[0]], sampled)
        stop = free.token_ids[4]
        stopped = dataclasses.replace(sampled, stop_token_ids=(stop,))
        (out,) = engine.generate([work.prompts[0]], stopped)
    assert out.token_ids == free.token_ids[: free.token_ids.index(stop) + 1]
    assert out.finish_reason is FinishReason.STOP


def test_ngram_sampling_is_the_same_alone_batched_and_staggered() -> None:
    """n-gram's tree depends on what the host knew when it proposed (overlap in a batch
    proposes one iteration behind, a request alone does not); its sampled tokens must not:
    each node draws its token keyed by seed and position, so they are ``none``'s."""
    prompts = [
        "def foo(x):\n    return x\n\ndef foo(y):\n    return",
        "import os\nimport sys\nimport os\n",
        "class A:\n    def f(self):\n        pass\n\nclass B:\n    def",
        "for i in range(10):\n    print(i)\nfor j in range(10):\n",
    ]
    params = [SamplingParams(max_new_tokens=24, temperature=0.8, seed=7 + i) for i in range(4)]
    with Engine(algorithm="none", overlap=False) as plain:
        want = [o.token_ids for o in plain.generate(prompts, params)]
    with Engine(algorithm="ngram", num_draft_tokens=6, max_batch_size=8) as engine:
        solo = [engine.generate([p], [q])[0] for p, q in zip(prompts, params, strict=True)]
        assert [o.token_ids for o in solo] == want
        assert any(max(o.accept_lengths) > 1 for o in solo)  # drafts were accepted
        for i, j in [(0, 1), (1, 0), (2, 3), (3, 2), (0, 2), (3, 1)]:
            for arrival in (0, 1, 3):  # together, and j a few iterations after i
                pair = engine.generate(
                    [prompts[i], prompts[j]], [params[i], params[j]], arrivals=[0, arrival]
                )
                assert [o.token_ids for o in pair] == [want[i], want[j]], (i, j, arrival)
