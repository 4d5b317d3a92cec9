"""Quantizing a model's matrices after loading: llama.cpp's Q8_0, Q4_1 or Q4_0, for a drafter.

A drafter's forwards read its weights once per draft token, and after the target's forward
has streamed its own weights none of them is in cache: on the CPU an EAGLE-3 head's layer
and its vocabulary head are memory-bound. Against 64 bytes for 32 bfloat16 words, Q8_0
stores 32 weights in 34 bytes (a float16 scale ``d`` and 32 signed bytes ``q``, each weight
``d * q``), Q4_1 in 20 (float16 ``d`` and ``m``, 32 nibbles, each weight ``d * q + m``) and
Q4_0 in 18 (float16 ``d``, each weight ``d * (q - 8)``), so the native decoder reads the head
in about a half, a third or a quarter of the time (``relayc.engine.native.blocks``:
``gemm_blocks`` rebuilds each weight in registers).

:func:`quantize_q8_0`, :func:`quantize_q4_1` and :func:`quantize_q4_0` give the bytes
llama.cpp's ``quantize`` and the ``gguf`` package write for a matrix (the same rounding, bit
for bit); :func:`quantize_linears` replaces a module's ``Linear`` weights by their quantized
values in place and records the blocks on them, so the float32 module computes exactly what
the native decoder reads. The drafts change by the rounding of the weights; what the target
verifies does not, so a speculative algorithm's tokens stay those of ``none``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from relayc.engine.core.layers import Linear
from relayc.engine.native.blocks import BLOCK, BlockWeight, attach


def _blocks(weight: torch.Tensor, qtype: str) -> torch.Tensor:
    """``weight`` as float32 blocks ``[rows, cols / 32, 32]``, or the error saying why not."""
    if weight.dim() != 2 or weight.shape[1] % BLOCK or weight.numel() == 0:
        raise ValueError(
            f"{qtype} quantizes matrices of whole blocks of {BLOCK} columns; "
            f"got {list(weight.shape)}"
        )
    values = weight.detach().to(device="cpu", dtype=torch.float32)
    if not bool(torch.isfinite(values).all()):
        raise ValueError(f"{qtype} cannot hold infinite or NaN weights")
    rows, cols = values.shape
    return values.reshape(rows, cols // BLOCK, BLOCK)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """``1 / d`` in float32, 0 where ``d`` is 0 (an all-equal block)."""
    return torch.where(d == 0, 0.0, 1 / torch.where(d == 0, 1.0, d))


def _nibbles(q: torch.Tensor) -> torch.Tensor:
    """Codes 0-15 ``[rows, blocks, 32]`` as 16 bytes a block: byte ``j`` holds code ``j`` in
    its low nibble and code ``j + 16`` in its high one."""
    codes = q.to(torch.uint8)
    return codes[..., : BLOCK // 2] | (codes[..., BLOCK // 2 :] << 4)


def _halves(*scales: torch.Tensor) -> list[torch.Tensor]:
    """Each ``[rows, blocks, 1]`` float32 scale as its float16's two bytes."""
    return [s.to(torch.float16).view(torch.uint8) for s in scales]


def quantize_q8_0(weight: torch.Tensor) -> BlockWeight:
    """``weight [rows, cols]`` (float32, ``cols`` whole blocks of 32) as Q8_0 blocks.

    Per block of 32: ``d = max |w| / 127``, ``q = round(w / d)`` (half away from zero, as
    C's ``roundf``) with ``1 / d`` taken in float32 first, ``d`` stored as float16 -- the
    reference implementation's arithmetic (ggml-quants.c, the ``gguf`` package's
    ``Q8_0.quantize_blocks``), so the bytes are those llama.cpp would write.
    """
    blocks = _blocks(weight, "Q8_0")
    d = blocks.abs().amax(dim=-1, keepdim=True) / 127
    scaled = blocks * _inverse(d)
    magnitude = scaled.abs()
    whole = magnitude.floor()
    q = torch.sign(scaled) * (whole + (2 * (magnitude - whole)).floor())
    raw = torch.cat([*_halves(d), q.to(torch.int8).view(torch.uint8)], dim=-1)
    return BlockWeight("Q8_0", raw.reshape(blocks.shape[0], -1).contiguous(), weight.shape[1])


def quantize_q4_1(weight: torch.Tensor) -> BlockWeight:
    """``weight [rows, cols]`` (float32, ``cols`` whole blocks of 32) as Q4_1 blocks.

    Per block of 32: ``m`` its minimum, ``d = (max - m) / 15``, each code ``q = trunc((w -
    m) / d + 0.5)`` capped at 15, with ``1 / d`` taken in float32 first; ``d`` and ``m``
    stored as float16, then the codes two a byte -- the reference implementation's
    arithmetic (ggml-quants.c, the ``gguf`` package's ``Q4_1.quantize_blocks``).
    """
    blocks = _blocks(weight, "Q4_1")
    low = blocks.amin(dim=-1, keepdim=True)
    d = (blocks.amax(dim=-1, keepdim=True) - low) / 15
    q = torch.trunc((blocks - low) * _inverse(d) + 0.5).clamp(0, 15)
    raw = torch.cat([*_halves(d, low), _nibbles(q)], dim=-1)
    return BlockWeight("Q4_1", raw.reshape(blocks.shape[0], -1).contiguous(), weight.shape[1])


def quantize_q4_0(weight: torch.Tensor) -> BlockWeight:
    """``weight [rows, cols]`` (float32, ``cols`` whole blocks of 32) as Q4_0 blocks.

    Per block of 32: ``d = w* / -8`` with ``w*`` the weight of largest magnitude (the first
    one, sign kept), each code ``q = trunc(w / d + 8.5)`` capped at 15, with ``1 / d`` taken
    in float32 first; ``d`` stored as float16, then the codes two a byte -- the reference
    implementation's arithmetic (ggml-quants.c, the ``gguf`` package's
    ``Q4_0.quantize_blocks``).
    """
    blocks = _blocks(weight, "Q4_0")
    extreme = blocks.gather(-1, blocks.abs().argmax(dim=-1, keepdim=True))
    d = extreme / -8
    q = torch.trunc(blocks * _inverse(d) + 8.5).clamp(0, 15)
    raw = torch.cat([*_halves(d), _nibbles(q)], dim=-1)
    return BlockWeight("Q4_0", raw.reshape(blocks.shape[0], -1).contiguous(), weight.shape[1])


# What `Engine(draft_quantization=...)` takes, and the quantizer of each.
QUANTIZERS: dict[str, Callable[[torch.Tensor], BlockWeight]] = {
    "q8_0": quantize_q8_0,
    "q4_1": quantize_q4_1,
    "q4_0": quantize_q4_0,
}
QUANTIZATIONS = tuple(QUANTIZERS)


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
        blocks = QUANTIZERS[qtype](weight)
        with torch.no_grad():
            weight.copy_(blocks.dequantize())
        attach(weight, blocks)
        done.append(f"{name}.weight" if name else "weight")
    return done
