"""Uniforms keyed by ``(seed, position)``: reproducible, generator-free, graph-safe.

The sampling kernels take their randomness as uniform tensors (like SGLang).
``keyed_uniforms`` makes them as a pure function of a per-request seed, the
request's position (e.g. its sequence length at this step), a stream id (to keep
the acceptance coins and the final-draw coin independent) and the index within
the row. No ``torch.Generator`` state is read or advanced, so the same call
gives the same numbers on every run, on the CPU and on CUDA alike (integer ops
only), inside a captured CUDA graph, and whatever the batch composition is: a
request's coins do not depend on its row or its neighbours.

The mixing function is Chris Wellons' ``lowbias32`` integer hash, chained over
the key words; it is a statistical hash, not a cryptographic one, which is all
sampling needs. Arithmetic is on int64 tensors masked to 32 bits, with each
multiplication split in 16-bit halves so nothing overflows int64.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
# float32 has a 24-bit significand: 24 random bits map to [0, 1) exactly.
_SCALE = 1.0 / (1 << 24)

ACCEPT_STREAM = 0
FINAL_STREAM = 1


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    low = x * (constant & 0xFFFF)
    high = ((x * (constant >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _lowbias32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def keyed_uniforms(
    seeds: torch.Tensor, positions: torch.Tensor, count: int, stream: int = ACCEPT_STREAM
) -> torch.Tensor:
    """``[B, count]`` float32 uniforms in [0, 1) for ``seeds`` / ``positions`` ``[B]`` int64.

    E.g. for ``tree_speculative_sampling_target_only``:
    ``uniform_samples = keyed_uniforms(seeds, positions, N)`` and
    ``uniform_samples_for_final_sampling = keyed_uniforms(seeds, positions, 1,
    FINAL_STREAM)[:, 0]``.
    """
    if seeds.shape != positions.shape or seeds.dim() != 1:
        raise ValueError(
            f"`seeds` and `positions` must both be [B]; got {list(seeds.shape)} "
            f"and {list(positions.shape)}"
        )
    if seeds.dtype != torch.int64 or positions.dtype != torch.int64:
        raise TypeError("`seeds` and `positions` must be torch.int64")
    h = torch.zeros_like(seeds)
    for word in (seeds & _MASK32, seeds >> 32, positions & _MASK32, positions >> 32):
        h = _lowbias32(h ^ (word & _MASK32))
    h = _lowbias32(h ^ stream)
    index = torch.arange(count, device=seeds.device, dtype=torch.int64)
    bits = _lowbias32(h[:, None] ^ index) >> 8
    return bits.to(torch.float32) * _SCALE
