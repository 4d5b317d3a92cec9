"""Greedy outputs of the Engine: overlap on == overlap off == the naive full-recompute loop."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from relayc.engine import (
    Engine,
    FinishReason,
    LlamaForCausalLM,
    SamplingParams,
    random_model,
    save_checkpoint,
)
from relayc.engine.serving.overlap import ThreadRunner
from relayc.generated import none as none_relay
from tests.engine.engine_helpers import (
    assert_idle,
    naive_outputs,
    one_intra_op_thread,  # noqa: F401 - autouse fixture
    random_workload,
)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(seed=3)


def test_32_staggered_requests_match_naive_with_and_without_overlap(
    model: LlamaForCausalLM,
) -> None:
    work = random_workload(1, 32, max_prompt=24, max_new=12, last_arrival=8)
    expected = naive_outputs(model, work.prompts, work.params)
    for overlap in (True, False):
        engine = Engine(model, overlap=overlap, debug=True)
        outs = engine.generate(work.prompts, work.params, arrivals=work.arrivals)
        assert [o.token_ids for o in outs] == expected, f"overlap={overlap}"
        assert all(o.finish_reason is FinishReason.LENGTH for o in outs)
        assert engine.scheduler.stats.max_running >= 16  # they really ran together
        assert_idle(engine)
        engine.close()


def test_random_join_and_leave_over_many_iterations(model: LlamaForCausalLM) -> None:
    """Arrivals over 120 iterations, early stops, a batch and request pool too small for all."""
    rng = random.Random(7)
    work = random_workload(2, 64, max_prompt=16, max_new=10, last_arrival=120)
    free_runs = naive_outputs(model, work.prompts, work.params)
    params, expected = [], []
    for p, run in zip(work.params, free_runs, strict=True):
        if rng.random() < 0.5:  # leave early on a token it will sample
            stop = run[rng.randrange(len(run))]
            p = SamplingParams(max_new_tokens=p.max_new_tokens, stop_token_ids=(stop,))
            run = run[: run.index(stop) + 1]
        params.append(p)
        expected.append(run)
    early = sum(len(run) < p.max_new_tokens for run, p in zip(expected, params, strict=True))
    assert early >= 10

    decode_rows: dict[bool | str, int] = {}
    # "mixed": the default runner, whose one-request jobs run inline (no lag) while larger
    # batches overlap; True: every job on the worker, the contract in full.
    for overlap in (True, "mixed", False):
        engine = Engine(model, overlap=bool(overlap), max_batch_size=6, req_pool_size=8, debug=True)
        if overlap is True:
            engine.runner.close()
            engine.runner = engine.scheduler.runner = ThreadRunner(inline_rows=0)
        outs = engine.generate(work.prompts, params, arrivals=work.arrivals)
        assert [o.token_ids for o in outs] == expected, f"overlap={overlap}"
        for out, p in zip(outs, params, strict=True):
            stopped = bool(out.token_ids) and out.token_ids[-1] in p.stop_token_ids
            assert out.finish_reason is (FinishReason.STOP if stopped else FinishReason.LENGTH)
        stats = engine.scheduler.stats
        assert stats.iterations > 120 and stats.max_running == 6
        decode_rows[overlap] = stats.decode_rows
        assert_idle(engine)
        engine.close()
    # The overlap contract: a request that stops early is seen finished one iteration
    # late, so exactly one extra decode row ran (and its token was dropped) per such request.
    assert decode_rows[True] - decode_rows[False] == early
    assert decode_rows[False] <= decode_rows["mixed"] <= decode_rows[True]


def test_decode_inputs_come_from_the_relay(
    model: LlamaForCausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = random_workload(3, 6, max_prompt=8, max_new=6, last_arrival=0)
    work.params = [SamplingParams(max_new_tokens=6)] * 6
    expected = naive_outputs(model, work.prompts, work.params)
    # eager steps: a recorded one (graphs="tape", the CPU's default) keeps the resolve it
    # recorded, as a CUDA graph keeps its kernels
    engine = Engine(model, overlap=True, graphs="off")
    fmap = engine.algorithm.relay
    resolve = fmap.resolve

    def shifted(indices: torch.Tensor) -> none_relay.RelayPayload:
        tokens = resolve(indices).bonus_tokens
        return none_relay.RelayPayload(bonus_tokens=(tokens + 1) % 256)

    monkeypatch.setattr(fmap, "resolve", shifted)
    got = [o.token_ids for o in engine.generate(work.prompts, work.params)]
    assert [g[0] for g in got] == [e[0] for e in expected]  # the prefill samples on the host's ids
    assert got != expected  # every later input went through the relay
    monkeypatch.undo()
    assert [o.token_ids for o in engine.generate(work.prompts, work.params)] == expected
    engine.close()


def test_context_limit_clips_generation_and_calls_reuse_the_engine(
    model: LlamaForCausalLM,
) -> None:
    prompt = list(range(40, 50))
    full = naive_outputs(model, [prompt], [SamplingParams(max_new_tokens=20)])[0]
    with Engine(model, max_context=16, debug=True) as engine:
        for _ in range(2):
            (out,) = engine.generate([prompt], SamplingParams(max_new_tokens=20))
            # 16 positions hold the prompt and 6 tokens; the 7th is sampled, never stored.
            assert out.token_ids == full[:7] and out.finish_reason is FinishReason.LENGTH
            assert_idle(engine)


def test_engine_loads_a_checkpoint_directory(model: LlamaForCausalLM, tmp_path: Path) -> None:
    save_checkpoint(model, tmp_path / "ckpt")
    work = random_workload(4, 5, max_prompt=8, max_new=6, last_arrival=2)
    with Engine(str(tmp_path / "ckpt")) as engine:
        assert engine.tokenizer is not None  # a byte-level vocabulary gets the byte tokenizer
        outs = engine.generate(work.prompts, work.params, arrivals=work.arrivals)
    assert [o.token_ids for o in outs] == naive_outputs(model, work.prompts, work.params)


@pytest.mark.parametrize("overlap", [True, False])
def test_long_prompts_are_prefilled_in_chunks(model: LlamaForCausalLM, overlap: bool) -> None:
    work = random_workload(5, 12, max_prompt=30, max_new=6, last_arrival=3)
    with Engine(model, overlap=overlap, max_prefill_tokens=7, debug=True) as engine:
        outs = engine.generate(work.prompts, work.params, arrivals=work.arrivals)
        assert engine.scheduler.stats.prefill_chunks >= 10
        assert_idle(engine)
    assert [o.token_ids for o in outs] == naive_outputs(model, work.prompts, work.params)
