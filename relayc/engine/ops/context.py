"""What op implementations read besides their typed inputs.

A generated step passes `ctx` through untouched; the engine builds one per
forward. Tensors in it are device tensors the engine owns; a CUDA-graph runner
keeps the same object and updates its tensors in place between replays.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from relayc.engine.core.forward_batch import ForwardBatch
from relayc.engine.core.kv_cache import KVCache
from relayc.engine.core.sampling import SamplingBatch
from relayc.engine.model.llama import LlamaForCausalLM


@dataclass
class StepContext:
    model: LlamaForCausalLM  # the target
    kv_cache: KVCache
    req_to_token: torch.Tensor  # [req_pool_size + 1, max_context] int32
    dims: Mapping[str, int]  # topk, num_steps, num_draft_tokens (and hidden, vocab)
    # decode: the KV slots of each request's verify window, [B * num_draft_tokens] int64
    out_cache_loc: torch.Tensor | None = None
    max_prefix_len: int = 0  # host bound on committed lengths: fixes attention shapes
    sampling: SamplingBatch | None = None  # None: greedy for every request
    prefill: ForwardBatch | None = None  # prefill ops: the prompt batch
    # decode: the scheduler's batch. Its positions are exact only for one-token steps
    # (`target_decode`); speculative ops compute theirs from the relay.
    forward: ForwardBatch | None = None
    drafter: Any = None  # the algorithm's draft model / proposer
    extras: dict[str, Any] | None = None  # per-algorithm state (e.g. n-gram host tables)
    block_verification: bool = False  # accept_chain: Sun et al. 2024's block rule
