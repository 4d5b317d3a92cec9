"""The overlap contract, step by step, with a runner that runs a job only when it is waited for."""

from __future__ import annotations

import pytest
import torch

from relayc.engine import Engine, FinishReason, LlamaForCausalLM, SamplingParams, random_model
from relayc.engine.core.kv_cache import ReqToTokenPool, TokenToKVPool
from relayc.engine.serving.step_batch import LengthRing
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
    from relayc.engine.serving.overlap import set_cpu_threads

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert set_cpu_threads() == 1 and torch.get_num_threads() == 1
        assert set_cpu_threads(2) == 2 and torch.get_num_threads() == 2
        with pytest.raises(ValueError, match="at least 1"):
            set_cpu_threads(0)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("algorithm", ["none", "ngram"])
@pytest.mark.parametrize("overlap", [False, True])
def test_the_cpus_numpy_bookkeeping_is_the_torch_path(
    model: LlamaForCausalLM, algorithm: str, overlap: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU the scheduler commits a width-1 step's KV slots, frees a verify's unaccepted
    ones and fills the steps' lengths through NumPy views; with those views withheld it takes
    the torch path a GPU takes. Both leave the same tokens, slot table and free list."""
    prompts = [[256, 7, 7, 8, 7, 7, 8], [256, 1, 2, 3], [256, 9, 9, 9, 9, 9]]
    params = SamplingParams(max_new_tokens=12)

    def run() -> tuple[list[list[int]], list[list[int]], list[int]]:
        with Engine(model, algorithm=algorithm, overlap=overlap, debug=True) as engine:
            outs = [o.token_ids for o in engine.generate(prompts, params)]
            sched = engine.scheduler
            return outs, sched.req_pool.req_to_token.tolist(), sched.kv_pool._free.tolist()

    with_numpy = run()
    real_alloc = TokenToKVPool.alloc_host
    monkeypatch.setattr(ReqToTokenPool, "__setattr__", _no_host_table, raising=False)
    monkeypatch.setattr(
        TokenToKVPool, "alloc_host", lambda self, n: _without_view(real_alloc(self, n))
    )
    monkeypatch.setattr(LengthRing, "fill", _made_each_step)
    assert run() == with_numpy


def _no_host_table(self: ReqToTokenPool, name: str, value: object) -> None:
    object.__setattr__(self, name, None if name == "host_table" else value)


def _without_view(taken: tuple[torch.Tensor, object] | None) -> tuple[torch.Tensor, None] | None:
    return None if taken is None else (taken[0], None)


def _made_each_step(
    self: LengthRing, hints: list[int]
) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], None]:
    prefix = torch.tensor(hints, dtype=torch.int64)
    positions = torch.tensor([p + j for p in hints for j in range(self.width)])
    return (prefix, prefix if self.width == 1 else positions, prefix + self.width), None
