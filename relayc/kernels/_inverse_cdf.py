"""Inverse-CDF sampling of the residual distribution, and the degenerate-input policy.

Both tree and chain speculative sampling end by drawing one token from an
unnormalised residual ``w = relu(scale * target - draft)`` (some tokens masked out;
``scale`` is 1 except after block verification) with one uniform ``coin`` per
request. The rule, identical in the reference, the torch path and the Triton
helper (it is FlashInfer's, which SGLang's kernel uses):

- if ``w`` sums to zero (the draft covered all of the target's mass, or rounding
  emptied it), sample from the plain ``target`` row instead: it is the honest
  distribution there, where SGLang would return token ``V - 1``;
- ``u = coin * sum(w)``; the token is the first ``i`` with ``cumsum(w)[i] > u``;
- if rounding leaves no such ``i`` (``coin`` within an ulp of 1), take the last
  ``i`` with ``w[i] > 0``; if there is none either (an all-zero target row, bad
  input), take ``V - 1`` like SGLang.

Sums are float32 in an order each backend picks, so the backends agree exactly
only where the sums are exact; the tests use probabilities on a 2^-12 grid.

Degenerate inputs (one policy for every kernel and backend, applied on load):

- a target entry counts as probability mass only if it is positive and finite:
  NaN, +-inf, negative and zero entries all count as 0, so such a token is never
  accepted and never drawn. Rows need not sum to 1 (the draw scales the coin by
  the row's sum), so rows off by rounding are fine. A row with no mass at all is
  the one case where nothing valid exists to emit: no draft is accepted against
  it and the draw returns ``V - 1`` (SGLang's fallback);
- a draft entry ``q`` is a probability if ``0 < q <= 1``; a peaked softmax can
  round a little above 1, so ``1 < q <= 1 + 1e-3`` (:data:`DRAFT_PROB_MAX`) counts
  as 1. Anything else (0, negative, NaN, +-inf, or above that slack) counts as 0:
  a drafted token with such a ``q`` could not have been drafted, so it is
  rejected, and in the residual it subtracts nothing (SGLang's chain kernel,
  ``sglang/kernels/ops/speculative/reject_sampling.py`` in 0.5.23, zeroes such
  ``q`` the same way, but without the slack above 1).
"""

from __future__ import annotations

import struct

import torch

from relayc.kernels._triton import jit, tl

# float32(1 + 1e-3): the largest draft probability still read as a rounded 1. Stored as
# the float32 value so Python floats, torch float32 and Triton compare the same number.
DRAFT_PROB_MAX = float(torch.tensor(1 + 1e-3, dtype=torch.float32))
# Finite float32 values are at most this; NaN and inf fail `x <= FLOAT32_MAX`.
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def target_mass_reference(x: float) -> float:
    return x if 0.0 < x <= FLOAT32_MAX else 0.0


def draft_mass_reference(x: float) -> float:
    return min(x, 1.0) if 0.0 < x <= DRAFT_PROB_MAX else 0.0


def target_mass_torch(x: torch.Tensor) -> torch.Tensor:
    return torch.where((x > 0) & (x <= FLOAT32_MAX), x, 0.0)


def draft_mass_torch(x: torch.Tensor) -> torch.Tensor:
    return torch.where((x > 0) & (x <= DRAFT_PROB_MAX), x.clamp(max=1.0), 0.0)


@jit
def target_mass_triton(x):
    return tl.where((x > 0.0) & (x <= 3.4028234663852886e38), x, 0.0)


@jit
def draft_mass_triton(x):
    # 1.00100004673004150390625 is DRAFT_PROB_MAX; Triton reads it as that float32.
    return tl.where((x > 0.0) & (x <= 1.00100004673004150390625), tl.minimum(x, 1.0), 0.0)


def f32(x: float) -> float:
    """Round a Python float to float32, for references that must match float32 kernels
    bit for bit (one rounding of an exact double result is the float32 result for
    +, -, * and /)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def sample_residual_reference(target: list[float], residual: list[float], coin: float) -> int:
    """One row, plain loops (the definition); ``target`` already through
    :func:`target_mass_reference`, ``residual`` built from such rows."""
    weights = residual if sum(residual) > 0 else target
    u = coin * sum(weights)
    running = 0.0
    for token, w in enumerate(weights):
        running += w
        if running > u:
            return token
    positive = [token for token, w in enumerate(weights) if w > 0]
    return positive[-1] if positive else len(weights) - 1


def sample_residual_torch(
    target: torch.Tensor, residual: torch.Tensor, coins: torch.Tensor
) -> torch.Tensor:
    """Rows at once: ``target``/``residual`` ``[B, V]`` float32, ``coins`` ``[B]`` -> ``[B]`` int64
    (``target`` already through :func:`target_mass_torch`).

    Both fallbacks (an all-zero residual; a coin past the last positive weight) are
    computed for every row and selected per row, so the path never reads the device on
    the host and stays capturable in a CUDA graph.
    """
    vocab = target.shape[-1]
    residual_cdf = residual.cumsum(-1)
    empty = residual_cdf[:, -1:] <= 0
    cdf = torch.where(empty, target.cumsum(-1), residual_cdf)
    u = coins * cdf[:, -1]
    # right=True: the first index whose cdf is > u (cdf never decreases).
    sampled = torch.searchsorted(cdf, u[:, None], right=True)[:, 0]
    weights = torch.where(empty, target, residual)
    token_ids = torch.arange(vocab, device=target.device)
    last_positive = torch.where(weights > 0, token_ids, -1).amax(-1)
    fallback = torch.where(last_positive >= 0, last_positive, vocab - 1)
    return torch.where(sampled >= vocab, fallback, sampled)


@jit
def _residual_tile(
    target_row_ptr,
    draft_row_ptr,
    subtract_draft,
    target_scale,
    excluded_tokens,
    excluded,
    offs,
    vocab,
):
    in_vocab = offs < vocab
    target = target_mass_triton(tl.load(target_row_ptr + offs, mask=in_vocab, other=0.0))
    # A bound rather than `in_vocab & subtract_draft`: the interpreter rejects a load
    # mask built from a vector & scalar.
    draft_end = tl.where(subtract_draft, vocab, 0)
    draft = draft_mass_triton(tl.load(draft_row_ptr + offs, mask=offs < draft_end, other=0.0))
    hit = (offs[:, None] == excluded_tokens[None, :]) & excluded[None, :]
    is_excluded = tl.max(hit.to(tl.int32), axis=1) > 0
    residual = tl.where(is_excluded, 0.0, tl.maximum(target * target_scale - draft, 0.0))
    return target, residual


@jit
def sample_residual_triton(
    target_row_ptr,
    draft_row_ptr,
    subtract_draft,
    target_scale,
    excluded_tokens,
    excluded,
    vocab,
    coin,
    BLOCK_V: tl.constexpr,
):
    """Draw from ``relu(target_scale * target - draft)`` (draft only if ``subtract_draft``)
    with the tokens in ``excluded_tokens[excluded]`` zeroed; two passes over the row."""
    residual_total = 0.0
    target_total = 0.0
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        target, residual = _residual_tile(
            target_row_ptr,
            draft_row_ptr,
            subtract_draft,
            target_scale,
            excluded_tokens,
            excluded,
            offs,
            vocab,
        )
        residual_total += tl.sum(residual, axis=0)
        target_total += tl.sum(target, axis=0)
    use_residual = residual_total > 0
    u = coin * tl.where(use_residual, residual_total, target_total)

    first_above = vocab
    last_positive = -1
    running = 0.0
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        target, residual = _residual_tile(
            target_row_ptr,
            draft_row_ptr,
            subtract_draft,
            target_scale,
            excluded_tokens,
            excluded,
            offs,
            vocab,
        )
        weights = tl.where(use_residual, residual, target)
        cdf = tl.cumsum(weights, axis=0) + running
        in_vocab = offs < vocab
        first_above = tl.minimum(
            first_above, tl.min(tl.where((cdf > u) & in_vocab, offs, vocab), axis=0)
        )
        last_positive = tl.maximum(
            last_positive, tl.max(tl.where((weights > 0) & in_vocab, offs, -1), axis=0)
        )
        running += tl.sum(weights, axis=0)
    fallback = tl.where(last_positive >= 0, last_positive, vocab - 1)
    return tl.where(first_above < vocab, first_above, fallback)
