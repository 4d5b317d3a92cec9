"""Shared setup for the draft-model tests: a small target, prefilled requests, a sync detector."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from relayc.engine.core.config import ModelConfig
from relayc.engine.draft.eagle import EagleHead
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import random_model
from relayc.kernels._backend import graph_safe_paths
from tests.engine.helpers import PagedDriver

SMALL = ModelConfig(
    vocab_size=40, hidden_size=32, intermediate_size=48, num_layers=2, head_dim=8, max_position=256
)
MAX_CONTEXT = 64


@dataclass
class Prefilled:
    """Requests whose prompts the target has cached; what an EAGLE prefill hands the head."""

    driver: PagedDriver
    reqs: list[int]
    prompts: list[list[int]]
    hidden: list[torch.Tensor]  # per request [n, hidden], the target's pre-norm states
    next_tokens: list[int]  # the target's greedy token after each prompt

    @property
    def req_pool_indices(self) -> torch.Tensor:
        return torch.tensor(self.reqs)

    @property
    def req_to_token(self) -> torch.Tensor:
        return self.driver.req_pool.req_to_token

    @property
    def seq_lens(self) -> torch.Tensor:
        return torch.tensor([len(p) for p in self.prompts])

    def scratch(self, width: int) -> torch.Tensor:
        """``[B, width]`` fresh KV slots (never in req_to_token)."""
        slots = self.driver.kv_pool.alloc(len(self.reqs) * width)
        assert slots is not None
        return slots.view(len(self.reqs), width)


def prefill(
    target: LlamaForCausalLM, prompts: Sequence[Sequence[int]], shuffle_seed: int = 0
) -> Prefilled:
    driver = PagedDriver(
        target, kv_size=512, req_slots=4, max_context=MAX_CONTEXT, shuffle_seed=shuffle_seed
    )
    reqs = [driver.new_request() for _ in prompts]
    driver.extend(reqs, [list(p) for p in prompts])
    hidden, next_tokens = [], []
    for prompt in prompts:
        out = target.forward_dense(torch.tensor(list(prompt)))
        hidden.append(out.hidden_states)
        next_tokens.append(int(out.logits[-1].argmax()))
    return Prefilled(driver, reqs, [list(p) for p in prompts], hidden, next_tokens)


def padded(rows: Sequence[Sequence[int]], fill: int = 0) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [fill] * (width - len(r)) for r in rows], dtype=torch.int64)


def padded_states(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """``[B, W, hidden]`` from per-request ``[n_b, hidden]``; padding rows are NaN so a
    leak of padding into a real row shows."""
    width = max(r.shape[0] for r in rows)
    out = torch.full((len(rows), width, rows[0].shape[1]), float("nan"), dtype=rows[0].dtype)
    for b, row in enumerate(rows):
        out[b, : row.shape[0]] = row
    return out


class NoHostSync(TorchDispatchMode):
    """Fails on ops a CUDA graph cannot hold: host reads and data-dependent shapes.

    Like ``capture_check`` it turns the CPU's host-loop fast paths off, so the code under
    test takes the path a GPU would capture.
    """

    def __enter__(self):  # type: ignore[no-untyped-def]
        self._graph_safe = graph_safe_paths()
        self._graph_safe.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: object):  # type: ignore[no-untyped-def]
        self._graph_safe.__exit__(None, None, None)
        return super().__exit__(*exc)

    FORBIDDEN = frozenset(
        {
            "aten::_local_scalar_dense",
            "aten::nonzero",
            "aten::masked_select",
            "aten::_unique2",
            "aten::unique_dim",
            "aten::unique_consecutive",
        }
    )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = func._schema.name
        if name in self.FORBIDDEN:
            raise AssertionError(f"{name} reads the device on the host")
        if name == "aten::repeat_interleave" and isinstance(args[0], torch.Tensor):
            if kwargs.get("output_size") is None and func.__name__.endswith("Tensor"):
                raise AssertionError("repeat_interleave with tensor repeats needs output_size")
        return func(*args, **kwargs)


def copying_head(config_seed: int) -> tuple[LlamaForCausalLM, EagleHead]:
    """A one-layer target whose attention output is zeroed (its next token depends on the
    current token only) and a head built from that layer: fc passes the embedding through,
    so the head's logits at draft position t equal the target's at position t+1."""
    target = random_model(SMALL.replace(num_layers=1), seed=config_seed)
    with torch.no_grad():
        target.model.layers[0].self_attn.o_proj.weight.zero_()
    head = EagleHead(target.config, target)
    hidden = target.config.hidden_size
    with torch.no_grad():
        layer = head.layers[0]
        layer.fc.weight.copy_(torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1))
        layer.layer.load_state_dict(target.model.layers[0].state_dict())
        layer.norm.weight.copy_(target.model.norm.weight)
    return target, head
