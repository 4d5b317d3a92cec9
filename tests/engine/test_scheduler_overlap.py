"""The overlap contract, step by step, with a runner that runs a job only when it is waited for."""

from __future__ import annotations

import pytest
import torch

from relayc.engine import Engine, FinishReason, LlamaForCausalLM, SamplingParams, random_model
from tests.engine.engine_helpers import (
    DeferredRunner,
    naive_outputs,
    one_intra_op_thread,  # noqa: F401 - autouse fixture
)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(seed=4)


def test_a_stop_is_seen_one_iteration_late_and_its_slots_wait_for_the_extra_forward(
    model: LlamaForCausalLM,
) -> None:
    prompt = [256, 10, 20, 30]
    free_run = naive_outputs(model, [prompt], [SamplingParams(max_new_tokens=10)])[0]
    params = SamplingParams(max_new_tokens=10, stop_token_ids=(free_run[1],))
    engine = Engine(model, overlap=True, debug=True)
    sched = engine.scheduler
    sched.runner = DeferredRunner()
    requests, _ = engine._submit([prompt], params, None)
    sched.add_request(requests[0])
    slots = sched.config.req_pool_size
    assert free_run[0] != free_run[1]

    # Iteration 0 launches the prefill; nothing has come back yet.
    assert sched.step() == []
    (request,) = sched.running
    assert len(sched.runner.queued) == 1 and request.output_ids == []
    # Iteration 1 launches decode 1 (its input comes from the relay), then processes the prefill.
    sched.step()
    assert request.output_ids == free_run[:1] and request.inflight == 1
    # Iteration 2 launches decode 2 before the host has seen decode 1's stop token.
    sched.step()
    assert request.output_ids == free_run[:2] and request.finish_reason is FinishReason.STOP
    assert request.inflight == 1 and sched.stats.decode_rows == 2
    assert sched.req_pool.available_size() == slots - 1  # decode 2 may still stash into its row
    # Iteration 3 has nothing to launch: decode 2 is processed, its token dropped, slots freed.
    sched.step()
    assert request.output_ids == free_run[:2] and request.inflight == 0
    assert sched.req_pool.available_size() == slots
    assert sched.kv_pool.available_size() == sched.config.kv_pool_tokens
    assert not sched.has_work()


def test_without_overlap_the_stop_costs_no_extra_forward(model: LlamaForCausalLM) -> None:
    prompt = [256, 10, 20, 30]
    free_run = naive_outputs(model, [prompt], [SamplingParams(max_new_tokens=10)])[0]
    params = SamplingParams(max_new_tokens=10, stop_token_ids=(free_run[1],))
    with Engine(model, overlap=False, debug=True) as engine:
        (out,) = engine.generate([prompt], params)
        assert out.token_ids == free_run[:2] and engine.scheduler.stats.decode_rows == 1


def test_set_cpu_threads_defaults_to_one_and_rejects_zero() -> None:
    from relayc.engine.overlap import set_cpu_threads

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert set_cpu_threads() == 1 and torch.get_num_threads() == 1
        assert set_cpu_threads(2) == 2 and torch.get_num_threads() == 2
        with pytest.raises(ValueError, match="at least 1"):
            set_cpu_threads(0)
    finally:
        torch.set_num_threads(before)
