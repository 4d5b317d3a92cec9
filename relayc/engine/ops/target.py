"""Implementations of the target-only ops: `target_prefill`, `target_decode` and `sample`.

These run plain decoding (`none`) and the target half of every algorithm's prefill.
`ctx.sampling` is None when no request in the batch samples: the greedy shortcut takes
the argmax, what the sampler gives greedy rows, without the sampling work.
"""

from __future__ import annotations

import dataclasses

import torch

from relayc.engine.ops.context import StepContext
from relayc.engine.ops.registry import implements
from relayc.engine.sampling import sample


def next_token(ctx: StepContext, logits: torch.Tensor) -> torch.Tensor:
    """`[B]` int64: the argmax when every request is greedy, the keyed sampler otherwise."""
    if ctx.sampling is None:
        return torch.argmax(logits, dim=-1)
    return sample(logits, ctx.sampling, ctx.extras["sample_positions"])


def target_prefill(ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Target forward over the prompts; (first tokens [B], hidden [T, H], committed lens [B])."""
    forward = ctx.prefill
    out = ctx.model(forward)
    return next_token(ctx, out.logits), out.hidden_states, forward.prefix_lens + forward.extend_lens


@implements("target_prefill")
def impl_target_prefill(
    ctx: StepContext, *, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
) -> dict[str, torch.Tensor]:
    next_tokens, _, _ = target_prefill(ctx)
    return {"next_tokens": next_tokens}


@implements("target_decode")
def impl_target_decode(
    ctx: StepContext,
    *,
    input_ids: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """One target forward per request on ``input_ids`` (the relayed tokens), in the KV slots
    and at the positions the scheduler chose for this one-token step."""
    forward = dataclasses.replace(ctx.forward, input_ids=input_ids)
    return {"logits": ctx.model(forward).logits}


@implements("sample")
def impl_sample(ctx: StepContext, *, logits: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"next_tokens": next_token(ctx, logits)}
