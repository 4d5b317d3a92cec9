"""Speculation stays lossless at the context end (issue 23, class 2).

A request that fits ``max_context`` gets the tokens and the finish reason of ``none``
with every speculative algorithm, overlap on and off, graphs off and static: near the
end, where a decode window of ``W`` slots no longer fits, the scheduler finishes the
request with one-token tail steps instead of stopping it up to ``W - 1`` tokens early.
The prompts put every request's end at each offset from the context end up to past two
windows, with budgets that fill the context exactly, stop one short, or are clipped.
"""

from __future__ import annotations

from typing import Any

import pytest

from relayc.engine import Engine, LlamaForCausalLM, ModelConfig, SamplingParams, random_model
from relayc.engine.checkpoints.shipped import shipped_target
from relayc.engine.serving.request import FinishReason, Output
from relayc.engine.serving.scheduler import SchedulerStats
from tests.engine.engine_helpers import (
    assert_idle,
    one_intra_op_thread,  # noqa: F401 - autouse fixture
)

CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("eagle", {"num_steps": 3, "topk": 3, "num_draft_tokens": 8}),  # W = 8 + 3 * 2 = 14
    ("eagle_multilayer", {"num_steps": 3, "topk": 2, "num_draft_tokens": 6}),
    ("ngram", {"num_steps": 3, "topk": 1, "num_draft_tokens": 5}),
    ("standalone", {"num_steps": 3, "topk": 1, "num_draft_tokens": 4}),
    ("dflash", {"num_draft_tokens": 5}),  # the seeded random block drafter
]
IDS = [a for a, _ in CONFIGS]
CONTEXT = 40
TINY = ModelConfig(
    hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16
)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(TINY, seed=11)


def _workload(width: int) -> tuple[list[list[int]], list[SamplingParams], list[int]]:
    """Requests whose room (tokens ``none`` can emit: context - prompt + 1) runs from 1 to
    past two windows; budgets fill the room, fall one short of it, or exceed it. A short
    cyclic prompt makes the random model's continuation repeat, so n-gram drafts land."""
    prompts, params, arrivals = [], [], []
    rooms = [*range(1, width + 3), 2 * width, 2 * width + 1, CONTEXT]
    for i, room in enumerate(rooms):
        prompts.append([(7 * i + 3 * j) % 256 + 1 for j in range(CONTEXT + 1 - room)])
        budget = (1000, room, max(room - 1, 1))[i % 3]
        params.append(SamplingParams(max_new_tokens=budget))
        arrivals.append(i % 4)  # later arrivals' prompt chunks share forwards with tail steps
    return prompts, params, arrivals


def _generate(
    model: LlamaForCausalLM, algorithm: str, width: int | None = None, **kwargs: Any
) -> tuple[list[Output], int, SchedulerStats]:
    """The outputs of ``algorithm`` on the workload of window ``width`` (default: its own
    window), the width and the scheduler's counters."""
    engine = Engine(
        model,
        algorithm=algorithm,
        max_context=CONTEXT,
        max_prefill_tokens=24,  # long prompts are chunked
        max_batch_size=8,
        capture_batch_sizes=(2, 4, 8),
        debug=True,  # every KV free checked, relay buffers poisoned
        **kwargs,
    )
    with engine:
        width = width or engine.algorithm.decode_width
        prompts, params, arrivals = _workload(width)
        outs = engine.generate(prompts, params, arrivals=arrivals)
        assert_idle(engine)
    return outs, width, engine.scheduler.stats


_NONE: dict[int, list[Output]] = {}


def _none(model: LlamaForCausalLM, width: int) -> list[Output]:
    """``none`` on the workload of window ``width`` (kept: several tests share it)."""
    if width not in _NONE:
        outs, _, _ = _generate(model, "none", width)
        prompts, params, _ = _workload(width)
        # The workload reaches the end: a request whose budget covers its room fills it.
        for out, prompt, p in zip(outs, prompts, params, strict=True):
            assert len(out.token_ids) == min(CONTEXT + 1 - len(prompt), p.max_new_tokens)
            assert out.finish_reason is FinishReason.LENGTH
        _NONE[width] = outs
    return _NONE[width]


def _assert_equal(outs: list[Output], expected: list[Output]) -> None:
    for out, want in zip(outs, expected, strict=True):
        assert (out.token_ids, out.finish_reason) == (want.token_ids, want.finish_reason), (
            f"request {out.index}: {len(out.token_ids)} tokens, `none` {len(want.token_ids)}"
        )
        # Tail steps count as one-token decode steps; the prefill's token is none.
        assert sum(out.accept_lengths) >= len(out.token_ids) - 1


@pytest.mark.parametrize("graphs", ["off", "static"])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
@pytest.mark.parametrize(("algorithm", "sizes"), CONFIGS, ids=IDS)
def test_greedy_requests_at_the_context_end_equal_none(
    model: LlamaForCausalLM, algorithm: str, sizes: dict[str, Any], overlap: bool, graphs: str
) -> None:
    outs, width, stats = _generate(model, algorithm, overlap=overlap, graphs=graphs, **sizes)
    _assert_equal(outs, _none(model, width))
    assert stats.tail_steps > 0  # the requests did reach the context end


@pytest.mark.parametrize(("algorithm", "sizes"), CONFIGS, ids=IDS)
def test_sampled_requests_and_stop_tokens_at_the_context_end(
    model: LlamaForCausalLM, algorithm: str, sizes: dict[str, Any]
) -> None:
    """Sampled requests fill their room as ``none`` does (their tokens may differ: speculation
    is lossless in distribution); a stop token met in a tail step stops there."""
    width = Engine(model, algorithm=algorithm, **sizes).algorithm.decode_width
    prompts, params, arrivals = _workload(width)
    greedy = _none(model, width)
    # A stop token that `none` meets within the last window of each request that can
    # hold two tokens; the others sample.
    stops = [o.token_ids[-2] if len(o.token_ids) >= 2 else None for o in greedy]
    params = [
        SamplingParams(max_new_tokens=p.max_new_tokens, stop_token_ids=(stop,))
        if stop is not None
        else SamplingParams(max_new_tokens=p.max_new_tokens, temperature=0.8, seed=i)
        for i, (p, stop) in enumerate(zip(params, stops, strict=True))
    ]
    with Engine(model, max_context=CONTEXT, max_batch_size=8) as engine:
        expected = engine.generate(prompts, params, arrivals=arrivals)
    with Engine(
        model, algorithm=algorithm, max_context=CONTEXT, max_batch_size=8, debug=True, **sizes
    ) as engine:
        outs = engine.generate(prompts, params, arrivals=arrivals)
        assert_idle(engine)
    for out, want, p in zip(outs, expected, params, strict=True):
        assert (len(out.token_ids), out.finish_reason) == (len(want.token_ids), want.finish_reason)
        if p.temperature == 0:
            assert out.token_ids == want.token_ids
            assert out.finish_reason is FinishReason.STOP or len(out.token_ids) < 2


@pytest.mark.parametrize(("algorithm", "sizes"), CONFIGS, ids=IDS)
def test_requests_that_end_far_from_the_context_take_no_tail_step(
    model: LlamaForCausalLM, algorithm: str, sizes: dict[str, Any]
) -> None:
    with Engine(model, algorithm=algorithm, max_context=CONTEXT, **sizes) as engine:
        room = CONTEXT - engine.algorithm.decode_width  # the last window ends at the context
        outs = engine.generate([[1, 2, 3], [4] * 9], SamplingParams(max_new_tokens=room - 9))
        assert [len(o.token_ids) for o in outs] == [room - 9] * 2
        assert engine.scheduler.stats.tail_steps == 0


@pytest.mark.skipif(shipped_target() is None, reason="an install without the demo models")
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
@pytest.mark.parametrize(
    ("algorithm", "sizes"),
    [("eagle", {"num_steps": 3, "topk": 3, "num_draft_tokens": 8}), *CONFIGS[1:]],
    ids=IDS,
)
def test_the_shipped_drafters_fill_the_context_as_none(
    algorithm: str, sizes: dict[str, Any], overlap: bool
) -> None:
    """The issue's case: trained drafters get several tokens accepted per step, so the last
    windows fill and the steps in flight leave the host only a bound near the end."""
    prompts = ["def fibonacci(n):\n    " * 3, "import os\n", "class Stack:\n" * 5]
    params = SamplingParams(max_new_tokens=1000)
    with Engine(None, max_context=128) as engine:
        expected = engine.generate(prompts, params)
    with Engine(None, algorithm=algorithm, max_context=128, overlap=overlap, **sizes) as engine:
        outs = engine.generate(prompts, params)
        assert engine.scheduler.stats.mean_accept_length > 1.5  # the drafters do draft
        assert_idle(engine)
    for out, want in zip(outs, expected, strict=True):
        assert len(want.token_ids) == 128 + 1 - len(want.prompt_token_ids)
        assert (out.token_ids, out.finish_reason) == (want.token_ids, want.finish_reason)
