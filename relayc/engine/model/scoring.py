"""Teacher-forced scores of a token sequence through the model's own paged forward.

One extend over the whole sequence on a fresh cache, every position's logits returned:
the path a prefill of that length takes (native for a float32 model up to 64 tokens,
TorchScript above; natively at any length in dtype "int8"), so the scores are those of the
precision under test. bench/int8_agreement.py and the int8 tests read it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.core.kv_cache import KVCache, ReqToTokenPool
from relayc.engine.model.llama import LlamaForCausalLM


@torch.no_grad()
def teacher_forced_logprobs(model: LlamaForCausalLM, ids: Sequence[int]) -> torch.Tensor:
    """``[len(ids) - 1, vocab]`` float32: log-probabilities of the token after each of
    ``ids[:-1]``, read from one forward over ``ids``."""
    if len(ids) < 2:
        raise ValueError("teacher forcing scores the tokens after the first: give two or more")
    if len(ids) > model.config.max_position:
        raise ValueError(
            f"{len(ids)} tokens do not fit the model's {model.config.max_position} positions"
        )
    n = len(ids)
    cache = KVCache.for_model(model.config, n + 1, model.device)
    table = ReqToTokenPool(1, n, model.device).req_to_token
    slots = torch.arange(1, n + 1, dtype=torch.int64, device=model.device)  # slot 0: padding
    table[1, :n] = slots.to(table.dtype)
    batch = ForwardBatch.build(
        ForwardMode.EXTEND, [list(ids)], [1], [0], slots, table, cache, return_all_logits=True
    )
    logits = model(batch).logits.float()
    return torch.log_softmax(logits[:-1], dim=-1)
