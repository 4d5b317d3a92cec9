"""Multi-token decode steps in the scheduler, with the test-only ``OracleDrafting`` (W = 4).

Greedy outputs must equal the naive loop's with overlap on and off, while the
host learns each step's token count one iteration late: windows, bounds,
freeing and accept lengths are what these tests pin down.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import pytest

from relayc.engine import (
    Engine,
    FinishReason,
    LlamaForCausalLM,
    SamplingParams,
    StepInputs,
    StepOutput,
    random_model,
)
from relayc.engine.serving.step_batch import StepKind
from tests.engine.engine_helpers import (
    DeferredRunner,
    Workload,
    assert_idle,
    naive_outputs,
    one_intra_op_thread,  # noqa: F401 - autouse fixture
    random_workload,
)
from tests.engine.oracle_drafting import OracleDrafting

W = OracleDrafting.decode_width


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(seed=5)


def oracle_engine(
    model: LlamaForCausalLM,
    work: Workload,
    free_runs: Sequence[Sequence[int]],
    *,
    overlap: bool,
    req_pool_size: int = 64,
    max_context: int | None = None,
    seed: int = 0,
    **kwargs: object,
) -> Engine:
    continuations = {tuple(p): list(run) for p, run in zip(work.prompts, free_runs, strict=True)}
    oracle = OracleDrafting(model, req_pool_size, continuations, max_context=max_context, seed=seed)
    return Engine(
        model,
        algorithm=oracle,
        overlap=overlap,
        req_pool_size=req_pool_size,
        max_context=max_context,
        debug=True,
        **kwargs,  # type: ignore[arg-type]
    )


def with_stops(
    work: Workload, free_runs: list[list[int]], seed: int
) -> tuple[list[SamplingParams], list[list[int]]]:
    """Give about half the requests a stop token from their own free run."""
    rng = random.Random(seed)
    params, expected = [], []
    for p, run in zip(work.params, free_runs, strict=True):
        if rng.random() < 0.5:
            stop = run[rng.randrange(len(run))]
            p = SamplingParams(max_new_tokens=p.max_new_tokens, stop_token_ids=(stop,))
            run = run[: run.index(stop) + 1]
        params.append(p)
        expected.append(run)
    return params, expected


def check_accept_lengths(engine: Engine, outs: list, params: Sequence[SamplingParams]) -> None:
    for out, p in zip(outs, params, strict=True):
        lengths = out.accept_lengths
        assert all(1 <= n <= W for n in lengths)
        # The prefill's token is no decode step; a step cut short by a stop token or
        # max_new_tokens still counts whole, so it may exceed the kept tokens by W - 1.
        assert len(out.token_ids) - 1 <= sum(lengths) <= len(out.token_ids) - 1 + W - 1
        stopped = bool(out.token_ids) and out.token_ids[-1] in p.stop_token_ids
        assert out.finish_reason is (FinishReason.STOP if stopped else FinishReason.LENGTH)
    oracle = engine.algorithm
    assert isinstance(oracle, OracleDrafting) and oracle.bound_violations == []
    check_hook_log(oracle, outs)


def check_hook_log(oracle: OracleDrafting, outs: list) -> None:
    """on_prompt / on_tokens / release replay each request's prompt and output, per slot."""
    open_records: dict[int, tuple[list[int], list[int]]] = {}
    closed = []
    for event, slot, ids in oracle.hook_log:
        if event == "prompt":
            assert slot not in open_records
            open_records[slot] = (ids, [])
        elif event == "tokens":
            open_records[slot][1].extend(ids)
        else:
            closed.append(open_records.pop(slot))
    assert not open_records
    got = sorted((tuple(p), tuple(t)) for p, t in closed)
    assert got == sorted((tuple(o.prompt_token_ids), tuple(o.token_ids)) for o in outs)


def test_32_staggered_requests_match_naive_with_and_without_overlap(
    model: LlamaForCausalLM,
) -> None:
    work = random_workload(11, 32, max_prompt=24, max_new=20, last_arrival=8)
    free_runs = naive_outputs(model, work.prompts, work.params)
    params, expected = with_stops(work, free_runs, seed=12)
    assert sum(len(e) < p.max_new_tokens for e, p in zip(expected, params, strict=True)) >= 8
    decode_rows = {}
    for overlap in (True, False):
        engine = oracle_engine(model, work, free_runs, overlap=overlap)
        outs = engine.generate(work.prompts, params, arrivals=work.arrivals)
        assert [o.token_ids for o in outs] == expected, f"overlap={overlap}"
        check_accept_lengths(engine, outs, params)
        lengths = [n for o in outs for n in o.accept_lengths]
        assert set(lengths) == set(range(1, W + 1))  # acceptance really varies
        stats = engine.scheduler.stats
        assert stats.max_running >= 16 and stats.mean_accept_length > 1.5
        decode_rows[overlap] = stats.decode_rows
        assert_idle(engine)
        engine.close()
    # Several tokens per step: far fewer decode rows than tokens.
    assert decode_rows[False] < sum(len(e) for e in expected) * 0.7


def test_random_join_and_leave_with_small_pools(model: LlamaForCausalLM) -> None:
    work = random_workload(13, 64, max_prompt=16, max_new=14, last_arrival=40)
    free_runs = naive_outputs(model, work.prompts, work.params)
    params, expected = with_stops(work, free_runs, seed=14)
    for overlap in (True, False):
        engine = oracle_engine(
            model, work, free_runs, overlap=overlap, req_pool_size=8, max_batch_size=6
        )
        outs = engine.generate(work.prompts, params, arrivals=work.arrivals)
        assert [o.token_ids for o in outs] == expected, f"overlap={overlap}"
        check_accept_lengths(engine, outs, params)
        assert engine.scheduler.stats.max_running == 6
        assert_idle(engine)
        engine.close()


@pytest.mark.parametrize("overlap", [True, False])
def test_a_full_kv_pool_makes_requests_wait_and_every_slot_returns(
    model: LlamaForCausalLM, overlap: bool
) -> None:
    work = random_workload(15, 16, max_prompt=20, max_new=16, last_arrival=2)
    free_runs = naive_outputs(model, work.prompts, work.params)
    # Room for about two requests at a time (each reserves prompt + max_new - 1 + 2 * (W - 1)).
    engine = oracle_engine(model, work, free_runs, overlap=overlap, kv_pool_tokens=72)
    outs = engine.generate(work.prompts, work.params, arrivals=work.arrivals)
    assert [o.token_ids for o in outs] == free_runs
    check_accept_lengths(engine, outs, work.params)
    assert engine.scheduler.stats.kv_blocked > 0
    assert engine.scheduler.kv_pool.available_size() == 72
    assert_idle(engine)
    engine.close()


def test_windows_and_lengths_under_the_host_lag(model: LlamaForCausalLM) -> None:
    """Step by step: the second window is allocated before the first count is known, and
    the first window's unaccepted slots return only when its step is processed."""
    prompt = [256, 7, 8, 9, 10]
    (run,) = naive_outputs(model, [prompt], [SamplingParams(max_new_tokens=40)])
    work = Workload([prompt], [SamplingParams(max_new_tokens=40)], [0])
    engine = oracle_engine(model, work, [run], overlap=True)
    sched = engine.scheduler
    sched.runner = DeferredRunner()
    pool = sched.config.kv_pool_tokens
    requests, _ = engine._submit(work.prompts, work.params, None)
    request = requests[0]
    sched.add_request(request)
    assert request.kv_need == len(prompt) + 40 - 1 + 2 * (W - 1)

    sched.step()  # launches the prefill
    assert sched.kv_pool.available_size() == pool - len(prompt)
    sched.step()  # launches decode 1 (window 1), processes the prefill
    assert request.output_ids == run[:1] and request.kv_len == len(prompt)
    assert sched.kv_pool.available_size() == pool - len(prompt) - W
    sched.step()  # launches decode 2 (window 2) before decode 1 is processed
    (decode_2,) = sched._inflight[-1].steps
    assert decode_2.kind is StepKind.DECODE
    assert decode_2.max_prefix_len == len(prompt) + W  # decode 1 may have filled its window
    assert decode_2.prefix_lens.tolist() == [len(prompt) + 1]  # or committed one token
    (first,) = request.accept_lengths
    assert request.output_ids == run[: 1 + first] and request.kv_len == len(prompt) + first
    assert request.inflight_decodes == 1
    # Window 1 kept `first` slots; window 2 is still whole.
    assert sched.kv_pool.available_size() == pool - len(prompt) - first - W
    while sched.has_work():
        sched.step()
    assert request.output_ids == run and request.finish_reason is FinishReason.LENGTH
    assert engine.algorithm.bound_violations == []
    assert_idle(engine)


@pytest.mark.parametrize("overlap", [True, False])
def test_the_context_end_stops_a_window_that_could_pass_it(
    model: LlamaForCausalLM, overlap: bool
) -> None:
    work = random_workload(16, 6, max_prompt=12, max_new=40, last_arrival=1)
    work.params = [SamplingParams(max_new_tokens=40)] * 6
    free_runs = naive_outputs(model, work.prompts, work.params)
    engine = oracle_engine(model, work, free_runs, overlap=overlap, max_context=24)
    outs = engine.generate(work.prompts, work.params, arrivals=work.arrivals)
    for out, prompt, run in zip(outs, work.prompts, free_runs, strict=True):
        # `none` would fill the context: 24 - len(prompt) + 1 tokens. A window of W
        # may stop up to W - 1 short, never past it, and what it emits is exact.
        full = 24 - len(prompt) + 1
        assert full - (W - 1) <= len(out.token_ids) <= full
        assert out.token_ids == run[: len(out.token_ids)]
        assert out.finish_reason is FinishReason.LENGTH
    assert engine.algorithm.bound_violations == []
    assert_idle(engine)
    engine.close()


def test_none_reports_one_token_per_decode_step(model: LlamaForCausalLM) -> None:
    work = random_workload(17, 8, max_prompt=10, max_new=8, last_arrival=2)
    with Engine(model) as engine:
        outs = engine.generate(work.prompts, work.params, arrivals=work.arrivals)
        assert engine.scheduler.stats.mean_accept_length == 1.0
    for out in outs:
        assert out.accept_lengths == [1] * (len(out.token_ids) - 1)


class _Uncommitted(OracleDrafting):
    def decode(self, step: StepInputs) -> StepOutput:
        return dataclasses.replace(super().decode(step), committed=False)


class _TooMany(OracleDrafting):
    def decode(self, step: StepInputs) -> StepOutput:
        out = super().decode(step)
        return dataclasses.replace(out, counts=out.counts + W)


class _WiderThanItsWindow(OracleDrafting):
    max_tokens_per_step = W + 1


@pytest.mark.parametrize(
    ("algorithm", "error", "message"),
    [
        (_Uncommitted, RuntimeError, "must commit its accepted KV itself"),
        (_TooMany, RuntimeError, "reported [5-8] tokens for a decode window of 4"),
        (_WiderThanItsWindow, ValueError, r"max_tokens_per_step 5 must lie in 1..decode_width"),
    ],
)
def test_a_broken_multi_token_algorithm_fails_clearly(
    model: LlamaForCausalLM, algorithm: type[OracleDrafting], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        with Engine(model, algorithm=algorithm(model, 128, {}), overlap=False) as engine:
            engine.generate([[256, 1, 2]], SamplingParams(max_new_tokens=8))
