"""Implementations of the target-only ops: `target_prefill`, `target_decode` and `sample`.

These run plain decoding (`none`) and the target half of every algorithm's prefill.
`ctx.sampling` is None when no request in the batch samples: the greedy shortcut takes
the argmax, what the sampler gives greedy rows, without the sampling work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from relayc.engine.core.sampling import sample
from relayc.engine.native import head_argmax
from relayc.engine.native import library as native
from relayc.engine.ops.context import StepContext
from relayc.engine.ops.registry import implements

# Vocabulary chunk of `greedy_tokens`' torch path (measured on 2 CPU cores, SmolLM2's 49152
# tokens: 1024, 512 and 2048 within 15% of each other).
_ARGMAX_CHUNK = 1024


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """``torch.argmax(logits, dim=-1)``, the same indices, faster on the CPU for wide rows.

    Logits the native LM head has just made come with their argmax, taken as it made them
    (:mod:`relayc.engine.native.head_argmax`): that is returned as is. ATen's CPU argmax is a
    scalar loop (about 0.55 ns per element here: 220 us for a verify of 8 rows of a
    49152-token vocabulary, more than the rest of the tree bookkeeping). Other float32 CPU
    logits go to the native library's ``relayc_argmax`` (one vectorised pass
    for the maximum, one for its first index: torch's rule, the first maximal index, NaN
    counting as the maximum). Without the library, a row is cut into chunks of
    ``_ARGMAX_CHUNK``: the argmax of the chunk maxima (``amax`` is vectorised) is the first
    chunk holding the row's maximum, and the argmax inside it the first maximum there
    (``amax`` propagates NaN, and the first chunk with a NaN holds the first NaN). Fixed
    shapes, no host reads: graph-safe. Other devices and narrow or indivisible rows take
    ``torch.argmax`` itself.
    """
    known = head_argmax.lookup(logits)
    if known is not None:  # the native LM head took it as it made these logits
        return known
    vocab = logits.shape[-1]
    lead = logits.shape[:-1]
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and vocab > 0:
        lib = native.native_decoder()
        if lib is not None:
            rows = logits.reshape(-1, vocab).contiguous()
            out = torch.empty(rows.shape[0], dtype=torch.int64)
            if lib.relayc_argmax(rows.data_ptr(), rows.shape[0], vocab, out.data_ptr()) != 0:
                raise RuntimeError(f"relayc_argmax refused logits {list(logits.shape)}")
            return out.view(lead)
    if logits.device.type != "cpu" or vocab % _ARGMAX_CHUNK or vocab < 4 * _ARGMAX_CHUNK:
        return torch.argmax(logits, dim=-1)
    chunks = logits.reshape(-1, vocab // _ARGMAX_CHUNK, _ARGMAX_CHUNK)
    first = chunks.amax(dim=-1).argmax(dim=-1)  # [R] the first chunk holding the maximum
    rows = torch.arange(chunks.shape[0], device=logits.device)
    inside = chunks[rows, first].argmax(dim=-1)
    return (first * _ARGMAX_CHUNK + inside).view(lead)


def next_token(ctx: StepContext, logits: torch.Tensor) -> torch.Tensor:
    """`[B]` int64: the argmax when every request is greedy, the keyed sampler otherwise."""
    if ctx.sampling is None:
        return greedy_tokens(logits)
    assert ctx.extras is not None, "the engine's StepContext always carries extras"
    return sample(logits, ctx.sampling, ctx.extras["sample_positions"])


def target_prefill(
    ctx: StepContext, capture: Sequence[int] = ()
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Target forward over the prompts; (first tokens [B], hidden [T, H], committed lens [B]).

    With ``capture`` (EAGLE-3) the middle value is the captured layers' inputs instead,
    ``[T, len(capture) * H]`` (``ForwardOutput.aux_hidden_states``)."""
    forward = ctx.prefill
    assert forward is not None, "a prefill op runs with the prefill batch in ctx"
    if not capture:
        out = ctx.model(forward)
        hidden = out.hidden_states
    else:
        out = ctx.model(forward, capture=capture)
        assert out.aux_hidden_states is not None, "a captured forward returns its features"
        hidden = out.aux_hidden_states
    return next_token(ctx, out.logits), hidden, forward.prefix_lens + forward.extend_lens


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
    assert ctx.forward is not None, "a decode op runs with the decode batch in ctx"
    forward = dataclasses.replace(ctx.forward, input_ids=input_ids)
    return {"logits": ctx.model(forward).logits}


@implements("sample")
def impl_sample(ctx: StepContext, *, logits: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"next_tokens": next_token(ctx, logits)}
