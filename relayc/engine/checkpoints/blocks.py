"""A GGUF file's block-quantized matrices, kept beside the float32 model for the native decoder.

llama.cpp's Q4_1, Q4_0 and Q8_0 types store each row of a matrix in blocks of 32 weights
(along the input dimension): a float16 scale ``d`` and, for Q4_1, a float16 offset ``m``,
then 32 small integers ``q``. A weight is ``d * q + m`` (Q4_1), ``d * (q - 8)`` (Q4_0) or
``d * q`` (Q8_0, ``q`` signed), and each is a float32 number exactly (``d * q`` has at most
19 significant bits; ``+ m`` rounds once, as the ``gguf`` package's dequantize does). Q4_K
(most of a Q4_K_M file) is the same with ``d`` and ``m`` themselves products -- a float16
super-block scale times a 6-bit sub-block scale, each 32 weights -- exact in float32 too. So the
float32 model a GGUF loads into holds exactly these values, and a kernel that rebuilds them
in registers computes the float32 model's forward while reading 0.625 (Q4) or 1.0625 (Q8)
bytes a weight instead of four -- decoder.c's ``gemm_blocks``, the same bits as its float32
``gemm``.

:func:`attach` records a parameter's blocks when the GGUF loader fills it
(``relayc.engine.checkpoints.gguf``); :func:`blocks_of` hands them back only while the
parameter is float32 and still holds exactly their values, so a model that was trained,
converted or edited after loading runs its current weights.
:meth:`BlockWeight.panels` lays the blocks out as decoder.c reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# decoder.c's panel formats and their bytes per 16 columns x 32 k: BLOCKS_Q4 (float16 d, m;
# 4-bit q), BLOCKS_Q8 (float16 d; 8-bit q), BLOCKS_Q4F (float32 d, m; 4-bit q).
BLOCKS_Q4, BLOCKS_Q8, BLOCKS_Q4F = 1, 2, 3
PANEL_BYTES = {BLOCKS_Q4: 320, BLOCKS_Q8: 544, BLOCKS_Q4F: 384}
# GGUF type -> (weights a block, bytes a block, decoder.c's panel format)
BLOCK_TYPES = {
    "Q4_0": (32, 18, BLOCKS_Q4),
    "Q4_1": (32, 20, BLOCKS_Q4),
    "Q8_0": (32, 34, BLOCKS_Q8),
    "Q4_K": (256, 144, BLOCKS_Q4F),
}
BLOCK = 32  # the panels' block: every type's block is a whole number of them
_ATTRIBUTE = "_relayc_blocks"


@dataclass(frozen=True)
class BlockWeight:
    """A ``[rows, cols]`` matrix as GGUF blocks: ``data`` is ``[rows, cols / block * bytes]``
    uint8, each row its blocks in order (the file's bytes, rows in the model's order)."""

    qtype: str
    data: torch.Tensor
    cols: int

    def __post_init__(self) -> None:
        if self.qtype not in BLOCK_TYPES:
            raise ValueError(f"block type {self.qtype} is not one of {sorted(BLOCK_TYPES)}")
        block, size, _ = BLOCK_TYPES[self.qtype]
        if self.cols <= 0 or self.cols % block:
            raise ValueError(
                f"a {self.qtype} matrix has whole blocks of {block} columns, not {self.cols}"
            )
        if (
            self.data.dtype != torch.uint8
            or self.data.dim() != 2
            or self.data.shape[1] != self.cols // block * size
        ):
            raise ValueError(
                f"{self.qtype} blocks of a {self.cols}-column matrix are [rows, "
                f"{self.cols // block * size}] uint8, got {list(self.data.shape)} {self.data.dtype}"
            )

    @property
    def rows(self) -> int:
        return int(self.data.shape[0])

    @property
    def format(self) -> int:
        """decoder.c's panel format for this type."""
        return BLOCK_TYPES[self.qtype][2]

    def _fields(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Per 32 weights ``d`` and ``m`` ``[rows, cols / 32]`` (float16; float32 for Q4_K;
        ``m`` None for Q8_0) and ``q`` as int16 ``[rows, cols / 32, 32]`` in k order: each
        weight is ``d * q + m`` (Q4_0's ``q - 8`` folded into ``m = -8d``)."""
        size = BLOCK_TYPES[self.qtype][1]
        blocks = self.data.reshape(self.rows, -1, size)
        if self.qtype == "Q4_K":
            return _q4_k_fields(blocks)
        d = blocks[..., 0:2].contiguous().view(torch.float16)[..., 0]
        if self.qtype == "Q8_0":
            q = blocks[..., 2:].contiguous().view(torch.int8).to(torch.int16)
            return d, None, q
        packed = blocks[..., 4:] if self.qtype == "Q4_1" else blocks[..., 2:]
        # a block's 16 bytes hold q[j] in the low nibble and q[j + 16] in the high one
        q = torch.cat([packed & 15, packed >> 4], dim=-1).to(torch.int16)
        if self.qtype == "Q4_1":
            m = blocks[..., 2:4].contiguous().view(torch.float16)[..., 0]
        else:
            m = d * -8  # exact in float16 (a power of two) unless it overflows: finite() checks
        return d, m, q

    def finite(self) -> bool:
        """Every scale and offset finite (decoder.c's float16 conversion handles no others)."""
        d, m, _ = self._fields()
        return bool(torch.isfinite(d).all()) and (m is None or bool(torch.isfinite(m).all()))

    def dequantize(self) -> torch.Tensor:
        """The float32 ``[rows, cols]`` matrix: ``d * q (+ m)``, rounded once, as ``gguf``."""
        d, m, q = self._fields()
        w = d.float()[..., None] * q.float()
        if m is not None:
            w = w + m.float()[..., None]
        return w.reshape(self.rows, self.cols)

    def panels(self) -> torch.Tensor:
        """The blocks as decoder.c's panels of 16 output columns (rows padded with zero
        blocks to a multiple of 16), flat uint8: panel p, then block b, :data:`PANEL_BYTES`
        each -- Q4: ``d[16]``, ``m[16]`` (float16), 16 rows of 16 bytes (row r, byte c:
        column c's ``q[2r]`` low nibble, ``q[2r + 1]`` high); Q8: ``d[16]``, 32 rows of 16
        signed bytes."""
        d, m, q = self._fields()
        rows, nb = d.shape
        pad = -rows % 16
        if pad:
            d = torch.cat([d, d.new_zeros(pad, nb)])
            q = torch.cat([q, q.new_zeros(pad, nb, BLOCK)])
            if m is not None:
                m = torch.cat([m, m.new_zeros(pad, nb)])
        panels = (rows + pad) // 16

        def halves(t: torch.Tensor) -> torch.Tensor:  # [rows, nb] -> [P, nb, 16 x 2 or 4 bytes]
            return t.reshape(panels, 16, nb).transpose(1, 2).contiguous().view(torch.uint8)

        # q [P, 16 columns, nb, 32 k] -> [P, nb, 32 k, 16 columns]
        q = q.reshape(panels, 16, nb, BLOCK).permute(0, 2, 3, 1)
        if m is None:
            body = q.to(torch.int8).contiguous().view(torch.uint8).reshape(panels, nb, -1)
            parts = [halves(d), body]
        else:
            pairs = q.reshape(panels, nb, BLOCK // 2, 2, 16)
            body = (pairs[..., 0, :] | (pairs[..., 1, :] << 4)).to(torch.uint8)
            parts = [halves(d), halves(m), body.reshape(panels, nb, -1)]
        out = torch.cat(parts, dim=-1)
        assert out.shape[-1] == PANEL_BYTES[self.format]
        return out.reshape(-1).contiguous()

    @staticmethod
    def cat(parts: Sequence[BlockWeight]) -> BlockWeight | None:
        """The matrices stacked by rows (a fused q/k/v or gate/up), or None when they do not
        share one panel format and width (Q4_0 and Q4_1 mix: Q4_0 rows become Q4_1's)."""
        if not parts or len({(p.format, p.cols) for p in parts}) != 1:
            return None
        if len({p.qtype for p in parts}) == 1:
            return BlockWeight(parts[0].qtype, torch.cat([p.data for p in parts]), parts[0].cols)
        return BlockWeight("Q4_1", torch.cat([p.as_q4_1().data for p in parts]), parts[0].cols)

    def as_q4_1(self) -> BlockWeight:
        """Q4_0 blocks rewritten as Q4_1 (``m = -8d``; the same weights); Q4_1 unchanged."""
        if self.qtype == "Q4_1":
            return self
        if self.qtype != "Q4_0":
            raise ValueError(f"{self.qtype} blocks have no Q4_1 form")
        blocks = self.data.reshape(self.rows, -1, 18)
        d = blocks[..., 0:2]
        m = (d.contiguous().view(torch.float16) * -8).view(torch.uint8)
        data = torch.cat([d, m, blocks[..., 2:]], dim=-1).reshape(self.rows, -1)
        return BlockWeight("Q4_1", data.contiguous(), self.cols)


def _q4_k_fields(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K super-blocks ``[rows, n, 144]`` -> per 32 weights float32 ``d * sc`` and
    ``-(dmin * m)`` and the 4-bit ``q``. A super-block: float16 ``d`` and ``dmin``, 12 bytes
    of eight 6-bit ``sc`` and eight 6-bit ``m`` (bytes 0-3: sc 0-3 low six bits, their top
    two bits sc 4-7's; bytes 4-7 the same for m; bytes 8-11: sc 4-7 low nibble, m 4-7 high),
    then 128 bytes: four runs of 32, run c's low nibbles sub-block 2c, high ones 2c + 1.
    Both products are exact in float32, so ``d * q + m`` rounds once, as ``gguf`` does."""
    rows, n, _ = blocks.shape
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()  # [rows, n, 1]
    dmin = blocks[..., 2:4].contiguous().view(torch.float16).float()
    packed = blocks[..., 4:16].long()
    low, mid, high = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = torch.cat([low & 63, (high & 15) | ((low >> 2) & 0x30)], dim=-1)
    mins = torch.cat([mid & 63, (high >> 4) | ((mid >> 2) & 0x30)], dim=-1)
    runs = blocks[..., 16:].reshape(rows, n, 4, 1, 32)
    q = torch.cat([runs & 15, runs >> 4], dim=3).reshape(rows, n * 8, 32).to(torch.int16)
    scale = (d * sc.float()).reshape(rows, n * 8)
    offset = -(dmin * mins.float()).reshape(rows, n * 8)
    return scale, offset, q


def attach(weight: torch.Tensor, blocks: BlockWeight) -> None:
    """Record that ``weight`` (a parameter, as just loaded) holds ``blocks`` dequantized.
    The record rides on the parameter object, so a tied weight shares it."""
    if tuple(weight.shape) != (blocks.rows, blocks.cols):
        raise ValueError(
            f"{blocks.qtype} blocks of a [{blocks.rows}, {blocks.cols}] matrix cannot back a "
            f"{list(weight.shape)} weight"
        )
    setattr(weight, _ATTRIBUTE, blocks)


def blocks_of(weight: torch.Tensor | None) -> BlockWeight | None:
    """``weight``'s blocks while it is float32 and still holds exactly their values, else
    None. The values are compared (a fraction of a second for a 135M model, once per
    packing): a parameter re-laid out in memory keeps its blocks, one trained, converted or
    edited since loading does not."""
    if weight is None or weight.dtype != torch.float32 or weight.device.type != "cpu":
        return None
    blocks = getattr(weight, _ATTRIBUTE, None)
    if not isinstance(blocks, BlockWeight) or tuple(weight.shape) != (blocks.rows, blocks.cols):
        return None
    if not blocks.finite() or not torch.equal(blocks.dequantize(), weight.detach()):
        return None
    return blocks


def forget_blocks(module: torch.nn.Module) -> int:
    """Drop the blocks recorded on ``module``'s parameters (returns how many): the native
    decoder then reads float32 panels -- the same bits, four bytes a weight; a benchmark's
    baseline. Takes effect when the weights are next packed (``use_cpu_matmul_layout``)."""
    count = 0
    for param in module.parameters():
        if hasattr(param, _ATTRIBUTE):
            delattr(param, _ATTRIBUTE)
            count += 1
    return count
