"""Quantizing a model's matrices after loading: llama.cpp's Q8_0, for a drafter.

A drafter's forwards read its weights once per draft token, and after the target's forward
has streamed its own weights none of them is in cache: on the CPU an EAGLE-3 head's layer
and its vocabulary head are memory-bound. Q8_0 stores 32 weights in 34 bytes (a float16
scale ``d`` and 32 signed bytes ``q``, each weight ``d * q``) against 64 for bfloat16 words,
so the native decoder reads the head in about half the time (``relayc.engine.checkpoints
.blocks``: ``gemm_blocks`` rebuilds each weight in registers).

:func:`quantize_q8_0` gives the bytes llama.cpp's ``quantize`` and the ``gguf`` package
write for a matrix (the same rounding, bit for bit); :func:`quantize_linears` replaces a
module's ``Linear`` weights by their Q8_0 values in place and records the blocks on them,
so the float32 module computes exactly what the native decoder reads. The drafts change by
the rounding of the weights; what the target verifies does not, so a speculative
algorithm's tokens stay those of ``none``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from relayc.engine.checkpoints.blocks import BLOCK, BlockWeight, attach
from relayc.engine.model import Linear

QUANTIZATIONS = ("q8_0",)  # what `Engine(draft_quantization=...)` takes


def quantize_q8_0(weight: torch.Tensor) -> BlockWeight:
    """``weight [rows, cols]`` (float32, ``cols`` whole blocks of 32) as Q8_0 blocks.

    Per block of 32: ``d = max |w| / 127``, ``q = round(w / d)`` (half away from zero, as
    C's ``roundf``) with ``1 / d`` taken in float32 first, ``d`` stored as float16 -- the
    reference implementation's arithmetic (ggml-quants.c, the ``gguf`` package's
    ``Q8_0.quantize_blocks``), so the bytes are those llama.cpp would write.
    """
    if weight.dim() != 2 or weight.shape[1] % BLOCK or weight.numel() == 0:
        raise ValueError(
            f"Q8_0 quantizes matrices of whole blocks of {BLOCK} columns; got {list(weight.shape)}"
        )
    values = weight.detach().to(device="cpu", dtype=torch.float32)
    if not bool(torch.isfinite(values).all()):
        raise ValueError("Q8_0 cannot hold infinite or NaN weights")
    rows, cols = values.shape
    blocks = values.reshape(rows, cols // BLOCK, BLOCK)
    d = blocks.abs().amax(dim=-1, keepdim=True) / 127
    inverse = torch.where(d == 0, 0.0, 1 / torch.where(d == 0, 1.0, d))
    scaled = blocks * inverse
    magnitude = scaled.abs()
    whole = magnitude.floor()
    q = torch.sign(scaled) * (whole + (2 * (magnitude - whole)).floor())
    raw = torch.cat(
        [
            d.to(torch.float16).view(torch.uint8),  # [rows, blocks, 2]
            q.to(torch.int8).view(torch.uint8),  # [rows, blocks, 32]
        ],
        dim=-1,
    )
    return BlockWeight("Q8_0", raw.reshape(rows, -1).contiguous(), cols)


def quantize_linears(
    module: nn.Module, qtype: str, *, keep: Iterable[torch.Tensor] = ()
) -> list[str]:
    """Quantize every ``Linear`` weight of ``module`` to ``qtype`` (one of
    :data:`QUANTIZATIONS`) in place; returns the names of the weights quantized.

    Each weight takes its blocks' values (what the native decoder then reads from the
    blocks instead of bfloat16 words or float32 panels). Weights in ``keep`` -- a target's
    parameters a drafter shares -- and weights the format cannot hold (not float32 on the
    CPU, rows not whole blocks of 32) stay as they are.
    """
    if qtype not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {qtype!r}; one of {', '.join(QUANTIZATIONS)}")
    kept = {id(t) for t in keep}
    done: list[str] = []
    for name, child in module.named_modules():
        weight = child._parameters.get("weight") if isinstance(child, Linear) else None
        if (
            weight is None
            or id(weight) in kept
            or weight.dtype != torch.float32
            or weight.device.type != "cpu"
            or weight.dim() != 2
            or weight.shape[1] % BLOCK
        ):
            continue
        blocks = quantize_q8_0(weight)
        with torch.no_grad():
            weight.copy_(blocks.dequantize())
        attach(weight, blocks)
        done.append(f"{name}.weight" if name else "weight")
    return done
