"""The reference generator: recompute the whole sequence every step, no KV cache.

Slow on purpose and never edited to match the engine; scheduler tests compare
the engine's greedy output against it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from relayc.engine.model.llama import LlamaForCausalLM


def greedy_generate_naive(
    model: LlamaForCausalLM,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    stop_token_ids: Sequence[int] = (),
) -> list[int]:
    """The greedy continuation of ``prompt_ids`` (new tokens only, a stop token included)."""
    if not prompt_ids:
        raise ValueError("prompt_ids must hold at least one token")
    sequence = list(prompt_ids)
    generated: list[int] = []
    for _ in range(max_new_tokens):
        ids = torch.tensor(sequence, dtype=torch.int64, device=model.device)
        token = int(torch.argmax(model.forward_dense(ids).logits[-1]))
        generated.append(token)
        sequence.append(token)
        if token in stop_token_ids:
            break
    return generated
