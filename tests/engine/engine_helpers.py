"""Shared by the Engine tests: a one-thread fixture, workloads, the naive reference and a
runner that runs a job only when it is waited for."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from relayc.engine import Engine, LlamaForCausalLM, SamplingParams, greedy_generate_naive
from relayc.engine.serving.overlap import ForwardRunner, Pending


@pytest.fixture(autouse=True, scope="module")
def one_intra_op_thread() -> Iterator[None]:
    """Run with one intra-op thread, restored afterwards.

    Two intra-op threads spin-wait on a busy two-core machine and make these
    tiny forwards ~20x slower; one also leaves the host thread a core of its own
    while the forward worker runs.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@dataclass
class Workload:
    prompts: list[list[int]]
    params: list[SamplingParams]
    arrivals: list[int]


def random_workload(
    seed: int,
    n: int,
    *,
    max_prompt: int,
    max_new: int,
    last_arrival: int,
    vocab: int = 259,
    **params: object,
) -> Workload:
    """``n`` requests with mixed prompt lengths, token budgets and arrival iterations."""
    rng = random.Random(seed)
    return Workload(
        prompts=[
            [rng.randrange(vocab) for _ in range(rng.randint(1, max_prompt))] for _ in range(n)
        ],
        params=[SamplingParams(max_new_tokens=rng.randint(1, max_new), **params) for _ in range(n)],
        arrivals=[rng.randint(0, last_arrival) for _ in range(n)],
    )


def naive_outputs(
    model: LlamaForCausalLM, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]
) -> list[list[int]]:
    return [
        greedy_generate_naive(model, p, sp.max_new_tokens, sp.stop_token_ids)
        for p, sp in zip(prompts, params, strict=True)
    ]


def assert_idle(engine: Engine) -> None:
    """Every request slot, KV slot and KV reservation is back: nothing leaked."""
    sched, cfg = engine.scheduler, engine.config
    assert not sched.has_work()
    assert sched.req_pool.available_size() == cfg.req_pool_size
    assert sched.kv_pool.available_size() == cfg.kv_pool_tokens
    assert sched.kv_unreserved == cfg.kv_pool_tokens


class _Deferred(Pending[Any]):
    def __init__(self, runner: DeferredRunner) -> None:
        super().__init__()
        self._runner = runner

    def wait(self) -> Any:
        while self._result is None:
            self._runner.run_next()
        return self._result


class DeferredRunner(ForwardRunner):
    """Overlap without a thread: job ``i`` is still queued while the host prepares ``i + 1``."""

    overlap = True

    def __init__(self) -> None:
        self.queued: deque[tuple[Callable[[], Any], _Deferred]] = deque()

    def submit(self, job: Callable[[], Any]) -> Pending[Any]:
        pending = _Deferred(self)
        self.queued.append((job, pending))
        return pending

    def run_next(self) -> None:  # FIFO, as a stream or the worker thread runs them
        job, pending = self.queued.popleft()
        pending._result = job()
