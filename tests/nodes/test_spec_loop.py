"""The generated decode steps of EAGLE, multi-layer EAGLE and n-gram on the real ops are
lossless: a hand-driven loop (prefill, then decode steps with KV windows, accepted tokens read
back one step at a time) emits exactly the target's greedy tokens."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from relayc.engine.algorithms import StepInputs
from relayc.engine.config import ModelConfig
from relayc.engine.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.naive import greedy_generate_naive
from relayc.engine.sampling import SamplingBatch, SamplingParams
from relayc.engine.speculative import SpeculativeDecoding
from relayc.engine.weights import random_model
from relayc.runtime.capture import capture_check
from tests.engine.helpers import PagedDriver

SMALL = ModelConfig(
    vocab_size=40, hidden_size=32, intermediate_size=48, num_layers=2, head_dim=8, max_position=256
)
PROMPTS = [[3, 5, 7, 9, 11, 3, 5, 7, 9], [1, 2, 30, 4], [20, 21, 22, 20, 21, 22, 20]]
NEW_TOKENS = 16


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run(
    name: str, *, num_steps: int, topk: int, n: int, check_capture: bool = False
) -> tuple[list[list[int]], list[int]]:
    target = random_model(SMALL, seed=11)
    algorithm = SpeculativeDecoding(
        name,
        target,
        req_pool_size=4,
        debug=not check_capture,  # debug checks read the host: off where the step must be capturable
        num_steps=num_steps,
        topk=topk,
        num_draft_tokens=n,
        draft_model=None,
        seed=5,
    )
    driver = PagedDriver(target, kv_size=2048, req_slots=4, max_context=128, shuffle_seed=3)
    reqs = [driver.new_request() for _ in PROMPTS]
    for req, prompt in zip(reqs, PROMPTS, strict=True):
        algorithm.on_prompt(req, prompt)
    lens = [len(p) for p in PROMPTS]
    slots = driver._alloc(sum(lens))
    forward = ForwardBatch.build(
        ForwardMode.EXTEND,
        PROMPTS,
        reqs,
        [0] * len(reqs),
        slots,
        driver.req_pool.req_to_token,
        driver.kv_cache,
    )
    sampling = SamplingBatch.build([SamplingParams()] * len(reqs), [0] * len(reqs), "cpu")
    first = algorithm.prefill(StepInputs(forward, sampling, torch.tensor(lens)))
    driver._commit(reqs, lens, slots)
    outputs = [[t] for t in first.next_tokens.tolist()]
    accepted: list[int] = []
    pending: list[list[int]] = [[t] for t in first.next_tokens.tolist()]  # host lag (n-gram)
    while min(len(o) for o in outputs) < NEW_TOKENS:
        width = algorithm.decode_width
        window = driver._alloc(len(reqs) * width)
        forward = ForwardBatch(
            mode=ForwardMode.VERIFY,
            input_ids=torch.zeros(len(reqs) * width, dtype=torch.int64),
            positions=torch.zeros(len(reqs) * width, dtype=torch.int64),
            out_cache_loc=window,
            req_pool_indices=torch.tensor(reqs),
            prefix_lens=torch.tensor(lens),
            extend_lens=torch.full((len(reqs),), width),
            max_prefix_len=max(lens),
            max_extend_len=width,
            req_to_token=driver.req_pool.req_to_token,
            kv_cache=driver.kv_cache,
            tree_mask=None,
        )
        ctx = algorithm._context(
            StepInputs(forward, sampling, torch.tensor(lens)),
            out_cache_loc=window,
            max_prefix_len=max(lens) + n,
        )
        inputs = {"req_pool_indices": forward.req_pool_indices, "seq_lens": forward.prefix_lens}
        if check_capture:  # the device part holds nothing a CUDA graph cannot
            host = algorithm.decode_step.run_host(ctx, **inputs)
            capture_check(algorithm.decode_step, ctx, inputs, host)
            return [], []  # the check runs the step twice: nothing left to compare
        result = algorithm.decode_step(ctx, **inputs)
        counts = result["accept.accept_lens"].tolist()
        tokens = result["accept.accept_tokens"].tolist()
        for b, req in enumerate(reqs):
            outputs[b] += tokens[b][: counts[b]]
            lens[b] += counts[b]
            driver.kv_pool.free(window.view(len(reqs), width)[b, counts[b] :])
            algorithm.on_tokens(req, pending[b])  # the host learns last step's tokens now
            pending[b] = tokens[b][: counts[b]]
        accepted += counts
    return outputs, accepted


@pytest.mark.parametrize(
    ("name", "num_steps", "topk", "n"),
    [("eagle", 3, 1, 4), ("eagle", 3, 4, 8), ("eagle_multilayer", 3, 2, 6), ("ngram", 3, 1, 5)],
)
def test_generated_steps_are_lossless(name: str, num_steps: int, topk: int, n: int) -> None:
    target = random_model(SMALL, seed=11)
    outputs, accepted = run(name, num_steps=num_steps, topk=topk, n=n)
    for prompt, got in zip(PROMPTS, outputs, strict=True):
        assert got[:NEW_TOKENS] == greedy_generate_naive(target, prompt, NEW_TOKENS)
    assert all(1 <= a <= n for a in accepted)


@pytest.mark.parametrize("name", ["eagle", "eagle_multilayer", "ngram"])
def test_decode_step_on_real_ops_passes_capture_check(name: str) -> None:
    run(name, num_steps=3, topk=2, n=5, check_capture=True)
