"""Drive a speculative algorithm's generated steps by hand: prefill, then decode steps with
KV windows, the accepted tokens read back one step at a time (the scheduler's part, small)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from relayc.engine.core.config import ModelConfig
from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.core.sampling import SamplingBatch, SamplingParams
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.serving.algorithms import GeneratedAlgorithm, StepInputs
from relayc.runtime.capture import capture_check
from tests.engine.helpers import PagedDriver

SMALL = ModelConfig(
    vocab_size=40, hidden_size=32, intermediate_size=48, num_layers=2, head_dim=8, max_position=256
)


class SpecDriver:
    def __init__(
        self,
        target: LlamaForCausalLM,
        name: str,
        *,
        num_steps: int,
        topk: int,
        n: int,
        batch: int,
        debug: bool = True,
        kv_size: int = 2048,
        module: object = None,
        draft_model: object = None,
    ) -> None:
        self.target = target
        self.algorithm = GeneratedAlgorithm(
            name,
            target,
            req_pool_size=batch,
            debug=debug,
            num_steps=num_steps,
            topk=topk,
            num_draft_tokens=n,
            draft_model=draft_model,  # type: ignore[arg-type]
            seed=5,
            module=module,
        )
        self.driver = PagedDriver(
            target, kv_size=kv_size, req_slots=batch, max_context=128, shuffle_seed=3
        )
        self.n = n
        self.accepted: list[int] = []

    def prefill(
        self,
        prompts: Sequence[Sequence[int]],
        params: Sequence[SamplingParams],
        seeds: Sequence[int],
    ) -> list[list[int]]:
        self.reqs = [self.driver.new_request() for _ in prompts]
        for req, prompt in zip(self.reqs, prompts, strict=True):
            self.algorithm.on_prompt(req, list(prompt))
        self.lens = [len(p) for p in prompts]
        slots = self.driver._alloc(sum(self.lens))
        forward = ForwardBatch.build(
            ForwardMode.EXTEND,
            prompts,
            self.reqs,
            [0] * len(prompts),
            slots,
            self.driver.req_pool.req_to_token,
            self.driver.kv_cache,
        )
        self.sampling = SamplingBatch.build(list(params), list(seeds), self.target.device)
        first = self.algorithm.prefill(
            StepInputs(forward, self.sampling, self._t(self.lens), max_prefix_len=0)
        )
        self.driver._commit(self.reqs, self.lens, slots)
        self.outputs = [[t] for t in first.next_tokens.tolist()]
        self.pending = [[t] for t in first.next_tokens.tolist()]  # the host lags one step
        return self.outputs

    def _t(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, device=self.target.device)

    def _inputs(self) -> tuple[object, dict[str, torch.Tensor], torch.Tensor]:
        batch, width = len(self.reqs), self.algorithm.decode_width
        window = self.driver._alloc(batch * width)
        forward = ForwardBatch(
            mode=ForwardMode.VERIFY,
            input_ids=torch.zeros(batch * width, dtype=torch.int64, device=self.target.device),
            positions=torch.zeros(batch * width, dtype=torch.int64, device=self.target.device),
            out_cache_loc=window,
            req_pool_indices=self._t(self.reqs),
            prefix_lens=self._t(self.lens),
            extend_lens=torch.full((batch,), width, device=self.target.device),
            max_prefix_len=max(self.lens),
            max_extend_len=width,
            req_to_token=self.driver.req_pool.req_to_token,
            kv_cache=self.driver.kv_cache,
            tree_mask=None,
        )
        ctx = self.algorithm._context(
            StepInputs(forward, self.sampling, self._t(self.lens), max(self.lens) + self.n),
            out_cache_loc=window,
            max_prefix_len=max(self.lens) + self.n,
        )
        inputs = {"req_pool_indices": forward.req_pool_indices, "seq_lens": forward.prefix_lens}
        return ctx, inputs, window

    def decode(self) -> None:
        ctx, inputs, window = self._inputs()
        result = self.algorithm.decode_step(ctx, **inputs)
        counts = result.counts.tolist()
        tokens = result.tokens.tolist()
        width = self.algorithm.decode_width
        for b, req in enumerate(self.reqs):
            self.outputs[b] += tokens[b][: counts[b]]
            self.lens[b] += counts[b]
            self.driver.kv_pool.free(window.view(len(self.reqs), width)[b, counts[b] :])
            self.algorithm.on_tokens(req, self.pending[b])
            self.pending[b] = tokens[b][: counts[b]]
        self.accepted += counts

    def capture_check(self) -> None:
        ctx, inputs, _ = self._inputs()
        host = self.algorithm.decode_step.run_host(ctx, **inputs)
        capture_check(self.algorithm.decode_step, ctx, inputs, host)
