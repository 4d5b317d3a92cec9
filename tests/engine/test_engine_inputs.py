"""Bad requests get a clear error in their own Output; full pools make requests wait."""

from __future__ import annotations

import re

import pytest

from relayc.engine import Engine, FinishReason, LlamaForCausalLM, SamplingParams, random_model
from tests.engine.engine_helpers import (
    assert_idle,
    naive_outputs,
    one_intra_op_thread,  # noqa: F401 - autouse fixture
    random_workload,
)

SP = SamplingParams
BAD = [
    ("", SP(), r"^prompt is empty$"),
    ([], SP(), r"^prompt is empty$"),
    ([1, 259, -3], SP(), r"token ids \[259, -3\] are outside the vocabulary \[0, 259\)"),
    ([1, 2.5], SP(), r"prompt token ids must be integers"),
    (list(range(65)), SP(), r"prompt has 65 tokens but the context holds 64 \(`max_context`\)"),
    ([1, 2], SP(max_new_tokens=0), r"`max_new_tokens` must be positive; got 0"),
    ([1, 2], SP(max_new_tokens=-3), r"`max_new_tokens` must be positive; got -3"),
    ([1, 2], SP(max_new_tokens=2.5), r"`max_new_tokens` must be an integer; got 2.5"),
    ([1, 2], SP(temperature=-1.0), r"`temperature` must be >= 0"),
    ([1, 2], SP(temperature=float("nan")), r"`temperature` must be >= 0"),
    ([1, 2], SP(top_p=0.0), r"`top_p` must be in \(0, 1\]; got 0.0"),
    ([1, 2], SP(top_p=1.5), r"`top_p` must be in \(0, 1\]; got 1.5"),
    ([1, 2], SP(top_k=-1), r"`top_k` must be >= 0"),
    ([1, 2], SP(stop_token_ids=(999,)), r"`stop_token_ids` \[999\] are outside the vocabulary"),
    ([1, 2], "greedy", r"sampling params must be a SamplingParams; got str"),
    (
        [1] * 30,
        SP(max_new_tokens=40),
        r"needs 64 KV slots \(prompt \+ max_new_tokens - 1\) but the pool holds 60",
    ),
]


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(seed=8)


@pytest.mark.parametrize("overlap", [True, False])
def test_bad_requests_fail_alone_and_the_others_run(model: LlamaForCausalLM, overlap: bool) -> None:
    good = [[256, 72, 105], "Hi", [7] * 12, [200, 1]]
    good_params = [SP(max_new_tokens=n) for n in (5, 3, 6, 4)]
    prompts: list = []
    params: list = []
    for i, (prompt, p, _) in enumerate(BAD):  # interleave: good, bad, bad, bad, good, ...
        if i % 4 == 0:
            prompts.append(good[i // 4])
            params.append(good_params[i // 4])
        prompts.append(prompt)
        params.append(p)
    with Engine(model, overlap=overlap, max_context=64, kv_pool_tokens=60, debug=True) as engine:
        outs = engine.generate(prompts, params)
        assert_idle(engine)
        good_ids = [[256, *b"Hi"] if g == "Hi" else g for g in good]
    expected_good = iter(naive_outputs(model, good_ids, good_params))
    expected_bad = iter(BAD)
    for out, prompt in zip(outs, prompts, strict=True):
        if any(prompt is g for g in good):
            assert out.error is None and out.token_ids == next(expected_good)
            continue
        _, _, message = next(expected_bad)
        assert out.finish_reason is FinishReason.ERROR and out.token_ids == []
        assert out.error is not None and re.search(message, out.error), out.error


@pytest.mark.parametrize("overlap", [True, False])
def test_a_full_kv_pool_makes_requests_wait_and_loses_nothing(
    model: LlamaForCausalLM, overlap: bool
) -> None:
    work = random_workload(21, 10, max_prompt=20, max_new=12, last_arrival=2)
    # Each request reserves prompt + max_new - 1 <= 31 slots: one to three fit at a time.
    with Engine(model, overlap=overlap, kv_pool_tokens=40, debug=True) as engine:
        outs = engine.generate(work.prompts, work.params, arrivals=work.arrivals)
        stats = engine.scheduler.stats
        assert stats.kv_blocked > 0 and 1 < stats.max_running < 10
        assert_idle(engine)
    assert [o.token_ids for o in outs] == naive_outputs(model, work.prompts, work.params)


def test_a_full_request_pool_makes_requests_wait(model: LlamaForCausalLM) -> None:
    work = random_workload(22, 7, max_prompt=10, max_new=8, last_arrival=0)
    with Engine(model, max_batch_size=4, req_pool_size=2, debug=True) as engine:
        outs = engine.generate(work.prompts, work.params)
        assert engine.scheduler.stats.max_running == 2
        assert_idle(engine)
    assert [o.token_ids for o in outs] == naive_outputs(model, work.prompts, work.params)


def test_call_mistakes_and_algorithms_raise(model: LlamaForCausalLM) -> None:
    with pytest.raises(ValueError, match=r"unknown algorithm `beam` \(known: none, eagle"):
        Engine(model, algorithm="beam")
    with Engine(model) as engine:
        with pytest.raises(TypeError, match="not a string"):
            engine.generate("Hello")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="got 1 SamplingParams for 2 prompts"):
            engine.generate(["a", "b"], [SP()])
        with pytest.raises(ValueError, match="one non-negative iteration per prompt"):
            engine.generate(["a"], arrivals=[-1])
        assert_idle(engine)
