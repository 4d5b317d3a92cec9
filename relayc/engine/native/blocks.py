"""A GGUF file's block-quantized matrices, kept beside the float32 model for the native decoder.

llama.cpp's Q4_1, Q4_0 and Q8_0 types store each row of a matrix in blocks of 32 weights
(along the input dimension): a float16 scale ``d`` and, for Q4_1, a float16 offset ``m``,
then 32 small integers ``q``. A weight is ``d * q + m`` (Q4_1), ``d * (q - 8)`` (Q4_0) or
``d * q`` (Q8_0, ``q`` signed), and each is a float32 number exactly (``d * q`` has at most
19 significant bits; ``+ m`` rounds once, as the ``gguf`` package's dequantize does). Q4_K
(most of a Q4_K_M file) is the same with ``d`` and ``m`` themselves products -- a float16
super-block scale times a 6-bit sub-block scale, each 32 weights -- exact in float32 too;
Q6_K (the rest of it) is ``(d * sc) * q`` with an 8-bit ``sc`` per 16 weights and a signed
6-bit ``q``: ``d * sc`` exact, the product rounded once, as ``gguf`` rounds it. Q5_0, Q5_1
and Q5_K are Q4_0, Q4_1 and Q4_K with a fifth bit. The 4-bit types keep their own panel
formats; Q6_K, the 5-bit ones and stacks of mixed types use an 8-bit one. So the
float32 model a GGUF loads into holds exactly these values, and a kernel that rebuilds them
in registers computes the float32 model's forward while reading 0.625 (Q4) or 1.0625 (Q8)
bytes a weight instead of four -- quants.c's ``gemm_blocks``, the same bits as gemm.c's float32
``gemm``.

:func:`attach` records a parameter's blocks when the GGUF loader fills it
(``relayc.engine.checkpoints.gguf``); :func:`blocks_of` hands them back only while the
parameter is float32 and still holds exactly their values, so a model that was trained,
converted or edited after loading runs its current weights.
:meth:`BlockWeight.panels` lays the blocks out as quants.c reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    import ctypes

# quants.c's panel formats and their bytes per 16 columns x 32 k: BLOCKS_Q4 (float16 d, m;
# 4-bit q), BLOCKS_Q8 (float16 d; 8-bit q), BLOCKS_Q4F (float32 d, m; 4-bit q), BLOCKS_I8F
# (float32 d, m per 16 k; 8-bit q: any type, and stacks of mixed types).
BLOCKS_Q4, BLOCKS_Q8, BLOCKS_Q4F, BLOCKS_I8F, BLOCKS_BF16, BLOCKS_F16 = 1, 2, 3, 4, 5, 6
# int8.c's panels of the same blocks for the integer-dot GEMMs (dtype "int8"): float16 d (and
# m), then q laid out four k of each column to a 32-bit lane (vpdpbusd's operand).
BLOCKS_I8Q4, BLOCKS_I8Q8 = 7, 8
INT8_FORMATS = {"Q4_0": BLOCKS_I8Q4, "Q4_1": BLOCKS_I8Q4, "Q8_0": BLOCKS_I8Q8}
PANEL_BYTES = {
    BLOCKS_I8Q4: 320,
    BLOCKS_I8Q8: 544,
    BLOCKS_Q4: 320,
    BLOCKS_Q8: 544,
    BLOCKS_Q4F: 384,
    BLOCKS_I8F: 768,
    BLOCKS_BF16: 1024,
    BLOCKS_F16: 1024,
}
_WORDS = (BLOCKS_BF16, BLOCKS_F16)  # two-byte words widened exactly, no scales
# GGUF type -> (weights a block, bytes a block, quants.c's panel format)
BLOCK_TYPES = {
    "Q4_0": (32, 18, BLOCKS_Q4),
    "Q4_1": (32, 20, BLOCKS_Q4),
    "Q8_0": (32, 34, BLOCKS_Q8),
    "Q4_K": (256, 144, BLOCKS_Q4F),
    "Q6_K": (256, 210, BLOCKS_I8F),
    "Q5_0": (32, 22, BLOCKS_I8F),
    "Q5_1": (32, 24, BLOCKS_I8F),
    "Q5_K": (256, 176, BLOCKS_I8F),
    # bfloat16 / float16 words, two bytes a weight: a GGUF BF16 tensor, or any float32
    # weight that is exactly such a number (exact_word_blocks). Counted in blocks of 32
    # weights, the panels' block; BLOCKS_BF16 / BLOCKS_F16 widen each exactly.
    "BF16": (32, 64, BLOCKS_BF16),
    "F16": (32, 64, BLOCKS_F16),
}
BLOCK = 32  # the panels' block: every type's block is a whole number of them
_ATTRIBUTE = "_relayc_blocks"
_PANELS_ONLY = "_relayc_panels_only"  # forget_blocks: float32 panels, whatever the values
_INT8 = "_relayc_int8"  # use_int8: the integer-dot GEMMs over the blocks


@dataclass(frozen=True)
class BlockWeight:
    """A ``[rows, cols]`` matrix as GGUF blocks: ``data`` is ``[rows, cols / block * bytes]``
    uint8, each row its blocks in order (the file's bytes, rows in the model's order).
    ``int8``: read by the integer-dot GEMMs (:data:`INT8_FORMATS`; :func:`use_int8`)."""

    qtype: str
    data: torch.Tensor
    cols: int
    int8: bool = False

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
        if self.int8 and self.qtype not in INT8_FORMATS:
            raise ValueError(
                f"{self.qtype} blocks have no integer-dot kernel: one of {sorted(INT8_FORMATS)}"
            )

    @property
    def rows(self) -> int:
        return int(self.data.shape[0])

    @property
    def format(self) -> int:
        """quants.c's panel format for this type (int8.c's where ``int8``)."""
        return INT8_FORMATS[self.qtype] if self.int8 else BLOCK_TYPES[self.qtype][2]

    def _fields(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """``d`` and ``m`` per 16 weights, ``[rows, cols / 32, 2]`` (float16; float32 for the
        K-quants; ``m`` None where it is 0) and ``q`` as int16 ``[rows, cols / 32, 32]`` in k
        order: each weight is ``d * q + m`` (Q4_0's ``q - 8`` folded into ``m = -8d``). Every
        type but Q6_K has one ``d`` and ``m`` per 32 weights (the pair holds it twice)."""
        size = BLOCK_TYPES[self.qtype][1]
        blocks = self.data.reshape(self.rows, -1, size)
        if self.qtype == "Q6_K":
            return _q6_k_fields(blocks)
        if self.qtype in ("Q5_0", "Q5_1"):
            d, m, q = _q5_fields(blocks, self.qtype == "Q5_1")
            return _pairs(d), None if m is None else _pairs(m), q
        if self.qtype in ("Q4_K", "Q5_K"):
            d, m, q = _k_fields(blocks, fifth_bit=self.qtype == "Q5_K")
        else:
            d = blocks[..., 0:2].contiguous().view(torch.float16)[..., 0]
            if self.qtype == "Q8_0":
                q = blocks[..., 2:].contiguous().view(torch.int8).to(torch.int16)
                return _pairs(d), None, q
            packed = blocks[..., 4:] if self.qtype == "Q4_1" else blocks[..., 2:]
            # a block's 16 bytes hold q[j] in the low nibble and q[j + 16] in the high one
            q = torch.cat([packed & 15, packed >> 4], dim=-1).to(torch.int16)
            if self.qtype == "Q4_1":
                m = blocks[..., 2:4].contiguous().view(torch.float16)[..., 0]
            else:
                m = d * -8  # exact in float16 (a power of two) unless it overflows to inf
        return _pairs(d), _pairs(m), q

    def _words(self) -> torch.Tensor:
        """BF16 / F16: the ``[rows, cols]`` two-byte words, as int16."""
        return self.data.contiguous().view(torch.int16).reshape(self.rows, self.cols)

    def dequantize(self) -> torch.Tensor:
        """The float32 ``[rows, cols]`` matrix: ``d * q (+ m)``, rounded once, as ``gguf``
        (BF16 / F16: each word widened, exactly)."""
        if self.qtype == "BF16":
            return ((self._words().to(torch.int32) & 0xFFFF) << 16).view(torch.float32)
        if self.qtype == "F16":
            return self._words().view(torch.float16).float()
        d, m, q = self._fields()
        w = d.float().repeat_interleave(16, dim=-1) * q.float()
        if m is not None:
            w = w + m.float().repeat_interleave(16, dim=-1)
        return w.reshape(self.rows, self.cols)

    def panels(self, format: int | None = None) -> torch.Tensor:
        """The blocks as quants.c's panels of 16 output columns (rows padded with zero
        blocks to a multiple of 16), flat uint8: panel p, then block b, :data:`PANEL_BYTES`
        each, in this type's own format or ``format`` (only BLOCKS_I8F, which every type
        fits) -- Q4: ``d[16]``, ``m[16]`` (float16), 16 rows of 16 bytes (row r, byte c:
        column c's ``q[2r]`` low nibble, ``q[2r + 1]`` high); Q4F: the same with float32
        ``d`` and ``m``; Q8: ``d[16]`` (float16), 32 rows of 16 signed bytes; I8F: float32
        ``d[16]``, ``m[16]`` for k 0-15, again for k 16-31, 32 rows of 16 signed bytes.
        Q4_1 and Q8_0 in their own format are laid out by gguf.c (``relayc_gguf_panels``,
        the same bytes) where the library is built; the rest by torch ops."""
        format = self.format if format is None else format
        if self.int8:
            if format != self.format:
                raise ValueError(f"int8 {self.qtype} blocks have no panel format {format}")
            return self._int8_panels()
        if format not in (self.format, BLOCKS_I8F) or (format != self.format in _WORDS):
            raise ValueError(f"{self.qtype} blocks have no panel format {format}")
        if format in _WORDS:
            # BF16 / F16: [P, nb, 32 k, 16 columns] words, rows padded with zero words
            words = self._words()
            pad = -self.rows % 16
            if pad:
                words = torch.cat([words, words.new_zeros(pad, self.cols)])
            panels, nb = words.shape[0] // 16, self.cols // BLOCK
            laid = words.reshape(panels, 16, nb, BLOCK).permute(0, 2, 3, 1).contiguous()
            return laid.view(torch.uint8).reshape(-1)
        found = None
        if format == self.format and self.qtype in NATIVE_PANEL_TYPES:
            found = native_gguf(self.data, self.qtype, self.rows, self.cols)
        if found is not None:
            lib, code, raw = found  # the same bytes, one pass in gguf.c
            size = -(-self.rows // 16) * (self.cols // BLOCK) * PANEL_BYTES[format]
            out = torch.empty(size, dtype=torch.uint8)
            status = lib.relayc_gguf_panels(
                raw.data_ptr(), code, self.rows, self.cols, out.data_ptr()
            )
            if status == 0:
                return out
        d, m, q = self._fields()
        rows, nb = d.shape[:2]
        if format == BLOCKS_I8F:
            d = d.float()
            m = d.new_zeros(d.shape) if m is None else m.float()
        pad = -rows % 16
        if pad:
            d = torch.cat([d, d.new_zeros(pad, nb, 2)])
            q = torch.cat([q, q.new_zeros(pad, nb, BLOCK)])
            if m is not None:
                m = torch.cat([m, m.new_zeros(pad, nb, 2)])
        panels = (rows + pad) // 16

        def lanes(t: torch.Tensor) -> torch.Tensor:  # [rows, nb] -> [P, nb, 16 values' bytes]
            return t.reshape(panels, 16, nb).transpose(1, 2).contiguous().view(torch.uint8)

        # q [P, 16 columns, nb, 32 k] -> [P, nb, 32 k, 16 columns]
        q = q.reshape(panels, 16, nb, BLOCK).permute(0, 2, 3, 1)
        signed = q.to(torch.int8).contiguous().view(torch.uint8).reshape(panels, nb, -1)
        if format == BLOCKS_I8F:
            assert m is not None
            halves = [lanes(t[..., h]) for h in range(2) for t in (d, m)]
            parts = [*halves, signed]
        elif m is None:
            parts = [lanes(d[..., 0]), signed]
        else:
            pairs = q.reshape(panels, nb, BLOCK // 2, 2, 16)
            body = (pairs[..., 0, :] | (pairs[..., 1, :] << 4)).to(torch.uint8)
            parts = [lanes(d[..., 0]), lanes(m[..., 0]), body.reshape(panels, nb, -1)]
        out = torch.cat(parts, dim=-1)
        assert out.shape[-1] == PANEL_BYTES[format]
        return out.reshape(-1).contiguous()

    def _int8_panels(self) -> torch.Tensor:
        """int8.c's panels, flat uint8: panel p, then block b -- BLOCKS_I8Q4: ``d[16]``,
        ``m[16]`` (float16), four chunks h of 64 bytes, byte ``4c + j`` holding column c's
        ``q[8h + j]`` (low nibble) and ``q[8h + 4 + j]`` (high); BLOCKS_I8Q8: ``d[16]``,
        eight chunks g of 64 signed bytes, byte ``4c + j`` column c's ``q[4g + j]``."""
        d, m, q = self._fields()
        d = d[..., 0]
        rows, nb = d.shape
        pad = -rows % 16
        if pad:
            d = torch.cat([d, d.new_zeros(pad, nb)])
            q = torch.cat([q, q.new_zeros(pad, nb, BLOCK)])
        panels = (rows + pad) // 16

        def lanes(t: torch.Tensor) -> torch.Tensor:  # [rows, nb] -> [P, nb, 16 values' bytes]
            return t.reshape(panels, 16, nb).transpose(1, 2).contiguous().view(torch.uint8)

        if m is None:  # Q8_0: [P, 16 c, nb, 8 g, 4 j] -> [P, nb, g, c, j]
            body = q.reshape(panels, 16, nb, 8, 4).permute(0, 2, 3, 1, 4).to(torch.int8)
            body = body.contiguous().view(torch.uint8).reshape(panels, nb, -1)
            parts = [lanes(d), body]
        else:  # Q4: [P, 16 c, nb, 4 h, 2 (low, high), 4 j] -> [P, nb, h, c, j, nibble]
            m = m[..., 0]
            if pad:
                m = torch.cat([m, m.new_zeros(pad, nb)])
            nib = q.reshape(panels, 16, nb, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)
            body = (nib[..., 0] | (nib[..., 1] << 4)).to(torch.uint8).reshape(panels, nb, -1)
            parts = [lanes(d), lanes(m), body]
        out = torch.cat(parts, dim=-1)
        assert out.shape[-1] == PANEL_BYTES[self.format]
        return out.reshape(-1).contiguous()

    @staticmethod
    def cat(parts: Sequence[BlockWeight]) -> BlockStack | None:
        """The matrices stacked by rows (a fused q/k/v or gate/up): in their panel format
        when they share one (Q4_0 and Q4_1 do), else in BLOCKS_I8F, which every type fits;
        None when their widths differ, or a part but the last has rows that would leave a
        panel half filled."""
        if not parts or len({p.cols for p in parts}) != 1:
            return None
        if any(p.rows % 16 for p in parts[:-1]):
            return None
        formats = {p.format for p in parts}
        if len(formats) > 1 and any(p.int8 for p in parts):
            # int8 parts of two panel formats (a Q8_0 v beside Q4_1 q and k): the float32
            # arithmetic over the blocks for the stack, as if int8 were off
            return BlockWeight.cat([replace(p, int8=False) for p in parts])
        if len(formats) > 1 and formats & set(_WORDS):
            return None  # two-byte words fit no other format: float32 panels for the stack
        return BlockStack(tuple(parts), formats.pop() if len(formats) == 1 else BLOCKS_I8F)


@dataclass(frozen=True)
class BlockStack:
    """Matrices stacked by rows, laid out in one panel ``format``."""

    parts: tuple[BlockWeight, ...]
    format: int

    def panels(self) -> torch.Tensor:
        return torch.cat([p.panels(self.format) for p in self.parts])

    def dequantize(self) -> torch.Tensor:
        return torch.cat([p.dequantize() for p in self.parts])


def _pairs(t: torch.Tensor) -> torch.Tensor:
    """One value per 32 weights ``[rows, nb]`` -> per 16 ``[rows, nb, 2]`` (twice each)."""
    return t[..., None].expand(*t.shape, 2)


def _q6_k_fields(blocks: torch.Tensor) -> tuple[torch.Tensor, None, torch.Tensor]:
    """Q6_K super-blocks ``[rows, n, 210]`` -> per 16 weights float32 ``d * sc`` and the
    signed 6-bit ``q``. A super-block: 128 bytes of low nibbles (two runs of 64: run h's
    low nibbles weights 128h + 0..63, high ones 128h + 64..127), 64 bytes of high bit pairs
    (two runs of 32: bits 2i..2i+1 of byte j of run h are weight 128h + 32i + j's), 16 int8
    ``sc`` (one per 16 weights), a float16 ``d``; ``q`` is the 6-bit value minus 32.
    ``d * sc`` is exact in float32; ``(d * sc) * q`` rounds once, as ``gguf`` does."""
    rows, n, _ = blocks.shape
    low = blocks[..., 0:128].reshape(rows, n, 2, 1, 64)
    low = torch.cat([low & 15, low >> 4], dim=3).reshape(rows, n, 256).long()
    high = blocks[..., 128:192].reshape(rows, n, 2, 1, 32).long()
    high = torch.cat([(high >> s) & 3 for s in (0, 2, 4, 6)], dim=3).reshape(rows, n, 256)
    q = ((low | (high << 4)) - 32).reshape(rows, n * 8, 32).to(torch.int16)
    sc = blocks[..., 192:208].contiguous().view(torch.int8).float()  # [rows, n, 16]
    d = blocks[..., 208:210].contiguous().view(torch.float16).float()  # [rows, n, 1]
    return (d * sc).reshape(rows, n * 8, 2), None, q


def _k_fields(
    blocks: torch.Tensor, fifth_bit: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K super-blocks ``[rows, n, 144 or 176]`` -> per 32 weights float32 ``d * sc``
    and ``-(dmin * m)`` and the 4- or 5-bit ``q``. A super-block: float16 ``d`` and
    ``dmin``, 12 bytes of eight 6-bit ``sc`` and eight 6-bit ``m`` (bytes 0-3: sc 0-3 low
    six bits, their top two bits sc 4-7's; bytes 4-7 the same for m; bytes 8-11: sc 4-7 low
    nibble, m 4-7 high); Q5_K then 32 bytes of fifth bits (bit i of byte j: weight 32i + j);
    then 128 bytes: four runs of 32, run c's low nibbles sub-block 2c, high ones 2c + 1.
    Both products are exact in float32, so ``d * q + m`` rounds once, as ``gguf`` does."""
    rows, n, _ = blocks.shape
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()  # [rows, n, 1]
    dmin = blocks[..., 2:4].contiguous().view(torch.float16).float()
    packed = blocks[..., 4:16].long()
    low, mid, high = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = torch.cat([low & 63, (high & 15) | ((low >> 2) & 0x30)], dim=-1)
    mins = torch.cat([mid & 63, (high >> 4) | ((mid >> 2) & 0x30)], dim=-1)
    start = 48 if fifth_bit else 16
    runs = blocks[..., start:].reshape(rows, n, 4, 1, 32)
    q = torch.cat([runs & 15, runs >> 4], dim=3).reshape(rows, n, 8, 32).long()
    if fifth_bit:
        bits = blocks[..., 16:48].long()  # [rows, n, 32]
        q = q | torch.stack([((bits >> i) & 1) << 4 for i in range(8)], dim=2)
    scale = (d * sc.float()).reshape(rows, n * 8)
    offset = -(dmin * mins.float()).reshape(rows, n * 8)
    return scale, offset, q.reshape(rows, n * 8, 32).to(torch.int16)


def _q5_fields(
    blocks: torch.Tensor, offset: bool
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Q5_0 / Q5_1 blocks ``[rows, nb, 22 or 24]`` -> float16 ``d`` (and Q5_1's ``m``)
    ``[rows, nb]`` and ``q``: float16 ``d`` (``m``), four bytes whose bit i (little-endian)
    is weight i's fifth bit, 16 bytes of nibbles (byte j: weight j low, j + 16 high). Q5_0's
    weight is ``d * (q - 16)``, Q5_1's ``d * q + m``: exact, or rounded once by ``+ m``."""
    d = blocks[..., 0:2].contiguous().view(torch.float16)[..., 0]
    m = blocks[..., 2:4].contiguous().view(torch.float16)[..., 0] if offset else None
    start = 4 if offset else 2
    high = blocks[..., start : start + 4].long()
    fifth = torch.cat([(high[..., i // 8 : i // 8 + 1] >> (i % 8)) & 1 for i in range(32)], -1)
    nibbles = blocks[..., start + 4 : start + 20].long()
    q = torch.cat([nibbles & 15, nibbles >> 4], dim=-1) | (fifth << 4)
    return d, m, (q if offset else q - 16).to(torch.int16)


def attach(weight: torch.Tensor, blocks: BlockWeight) -> None:
    """Record that ``weight`` (a parameter, as just loaded) holds ``blocks`` dequantized.
    The record rides on the parameter object, so a tied weight shares it."""
    if tuple(weight.shape) != (blocks.rows, blocks.cols):
        raise ValueError(
            f"{blocks.qtype} blocks of a [{blocks.rows}, {blocks.cols}] matrix cannot back a "
            f"{list(weight.shape)} weight"
        )
    setattr(weight, _ATTRIBUTE, blocks)


# The types gguf.c reads straight from a file's bytes (its GGUF_* codes): dequantized
# and compared there, not by NumPy's or torch's passes over the whole matrix.
NATIVE_GGUF_TYPES = {"Q4_0": 1, "Q4_1": 2, "Q8_0": 3}
# ... and those whose panels it lays out from them (Q4_0's offset is computed, in torch)
NATIVE_PANEL_TYPES = ("Q4_1", "Q8_0")


def native_gguf(
    raw: torch.Tensor, qtype: str, rows: int, cols: int
) -> tuple[ctypes.CDLL, int, torch.Tensor] | None:
    """``(library, type code, contiguous raw bytes)`` when gguf.c reads ``qtype``'s bytes
    ``raw [rows, row bytes]`` itself (:data:`NATIVE_GGUF_TYPES`, the library built), else
    None."""
    code = NATIVE_GGUF_TYPES.get(qtype)
    if code is None or cols % BLOCK or raw.dtype != torch.uint8 or raw.device.type != "cpu":
        return None
    if raw.numel() != rows * (cols // BLOCK) * BLOCK_TYPES[qtype][1]:
        return None
    from relayc.engine.native import (
        library as native,  # the checkpoint formats load without the library
    )

    lib = native.native_decoder()
    return None if lib is None else (lib, code, raw.contiguous())


def dequantize_gguf(raw: torch.Tensor, qtype: str, rows: int, cols: int) -> torch.Tensor | None:
    """The float32 ``[rows, cols]`` weights of GGUF bytes ``raw`` -- the `gguf` package's
    values, bit for bit -- computed by gguf.c, or None where it does not read ``qtype``."""
    found = native_gguf(raw, qtype, rows, cols)
    if found is None:
        return None
    lib, code, raw = found
    out = torch.empty(rows, cols, dtype=torch.float32)
    if lib.relayc_gguf_dequantize(raw.data_ptr(), code, rows, cols, out.data_ptr()) != 0:
        return None
    return out


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
    found = native_gguf(blocks.data, blocks.qtype, blocks.rows, blocks.cols)
    if found is not None:  # one pass over the bytes and the weight as laid out, no copy
        lib, code, raw = found
        values = weight.detach()
        row_stride, col_stride = values.stride()
        matches = lib.relayc_gguf_matches(
            raw.data_ptr(),
            code,
            blocks.rows,
            blocks.cols,
            values.data_ptr(),
            row_stride,
            col_stride,
        )
        return blocks if matches == 1 else None
    values = blocks.dequantize()
    if not torch.equal(values, weight.detach()):
        return None
    # quants.c's float16 conversion takes finite scales only; a non-finite scale or offset
    # makes every weight of its block non-finite. Finite float16 scales bound every weight
    # by 2^29 or so, so finite weights cannot sum to infinity: one reduction tells (a
    # torch.isfinite pass allocated a mask the size of the model's weights).
    if not torch.isfinite(values.sum()):
        return None
    return blocks


def exact_word_blocks(weight: torch.Tensor | None) -> BlockWeight | None:
    """``weight`` as BF16 (else F16) blocks when it is a float32 CPU matrix whose every
    value is a finite bfloat16 (float16) number -- a checkpoint stored at that precision and
    loaded as float32, such as the shipped EAGLE-3 heads -- and its width is whole blocks
    of 32, else None. Such a weight is read from two bytes instead of four, with the same
    bits (decoder.h's BLOCKS_BF16 / BLOCKS_F16)."""
    if (
        weight is None
        or weight.dtype != torch.float32
        or weight.device.type != "cpu"
        or weight.dim() != 2
        or weight.shape[1] % BLOCK
        or weight.numel() == 0
        or getattr(weight, _PANELS_ONLY, False)
    ):
        return None
    values = weight.detach()
    if not torch.isfinite(values.sum()):  # finite values cannot sum to inf here (< 2^128)
        return None
    for qtype, dtype in (("BF16", torch.bfloat16), ("F16", torch.float16)):
        words = values.to(dtype)
        if torch.equal(words.float(), values):
            raw = words.contiguous().view(torch.uint8).reshape(values.shape[0], -1)
            return BlockWeight(qtype, raw, int(values.shape[1]))
    return None


def native_blocks(weight: torch.Tensor | None) -> BlockWeight | None:
    """What the native decoder reads ``weight`` as: its GGUF blocks (:func:`blocks_of`;
    for the integer-dot GEMMs where :func:`use_int8` marked it and the type has them),
    else its two-byte words when it is exactly bfloat16 or float16
    (:func:`exact_word_blocks`), else None (float32 panels)."""
    blocks = blocks_of(weight)
    if blocks is not None and getattr(weight, _INT8, False) and blocks.qtype in INT8_FORMATS:
        return replace(blocks, int8=True)
    if getattr(weight, _PANELS_ONLY, False):  # forget_blocks, choose_float32_path
        return None
    return blocks or exact_word_blocks(weight)


def use_int8(module: torch.nn.Module, on: bool = True) -> int:
    """Compute ``module``'s matrix products over its Q4_0, Q4_1 and Q8_0 blocks with
    integer dot products (int8.c; dtype "int8"): its activations quantised to int8 per
    block of 32. Returns how many matrices have such blocks. Other matrices keep their
    float32 arithmetic; ``on=False`` turns it back off. Takes effect when the weights are
    next packed (``use_cpu_matmul_layout``)."""
    count = 0
    for param in module.parameters():
        setattr(param, _INT8, on)
        blocks = getattr(param, _ATTRIBUTE, None)
        count += isinstance(blocks, BlockWeight) and blocks.qtype in INT8_FORMATS
    return count


def require_int8(module: torch.nn.Module, source: str) -> None:
    """:func:`use_int8` for ``Engine(dtype="int8")``: a ValueError saying what to load
    instead where ``module`` (loaded from ``source``) has no Q4_0, Q4_1 or Q8_0 matrix or
    is not on the CPU."""
    where = "`dtype='int8'` (integer dot products over a GGUF file's Q4_0, Q4_1 or Q8_0 blocks)"
    devices = {p.device.type for p in module.parameters()}
    if devices != {"cpu"}:
        raise ValueError(
            f"{where} runs on the native CPU decoder; {source} is on {', '.join(sorted(devices))}:"
            " use `device='cpu'`, or dtype='float32' / 'bfloat16'"
        )
    if use_int8(module) == 0:
        use_int8(module, on=False)
        raise ValueError(
            f"{where}: {source} has no such matrix; load a GGUF file that has them "
            "(`model='smollm2'` is Q4_1 and Q8_0), or use dtype='float32'"
        )


# float32's fastest exact path per CPU, keyed on what the native decoder was compiled for
# (-march=native: this CPU's features; quants.c's relayc_block_isa), first match wins.
# Measured on SmolLM2 one request at a time (docs/benchmarks.md): with AVX-512 the blocks
# run `none` 2.9x faster than float32 panels (57.2 against 19.4 tokens/s); with AVX2 alone
# the panels run 2.3x faster (37.0 against 16.0: rebuilding each weight costs FMA work that
# the panels only pay in bandwidth). No start-up measurement: the table is the choice.
FLOAT32_PATHS: tuple[tuple[str, str], ...] = (
    ("avx512f", "blocks"),
    ("avx2", "panels"),
    ("", "blocks"),  # unmeasured (no AVX2: another architecture): the fewest bytes
)
_ISA_BITS = {"avx512f": 1, "avx2": 2, "fma": 4, "f16c": 8}


def build_features() -> tuple[str, ...]:
    """The x86 features the native decoder was compiled for (names as in
    :data:`FLOAT32_PATHS`); () where it is not built."""
    from relayc.engine.native import library as native

    lib = native.native_decoder()
    if lib is None:
        return ()
    isa = lib.relayc_block_isa()
    return tuple(name for name, bit in _ISA_BITS.items() if isa & bit)


def float32_path(features: Sequence[str] | None = None) -> str:
    """``"blocks"`` or ``"panels"``: how float32 reads a GGUF file's quantized matrices on a
    CPU with ``features`` (default: this one's, :func:`build_features`)."""
    have = set(build_features() if features is None else features)
    return next(path for feature, path in FLOAT32_PATHS if not feature or feature in have)


def choose_float32_path(module: torch.nn.Module) -> str:
    """Apply :func:`float32_path` to ``module`` (the engine does, for float32 models):
    where it says panels, the native decoder reads its float32 panels -- the blocks stay
    recorded (:func:`blocks_of`), only not read -- unless :func:`use_int8` marked it (an
    int8 model shared by a second engine keeps its int8 path). Returns the path."""
    path = float32_path()
    if path == "panels" and not int8_enabled(module):
        for param in module.parameters():
            setattr(param, _PANELS_ONLY, True)
    return path


def int8_enabled(module: torch.nn.Module) -> bool:
    """Whether :func:`use_int8` turned ``module``'s integer-dot products on."""
    return any(getattr(p, _INT8, False) for p in module.parameters())


def forget_blocks(module: torch.nn.Module) -> int:
    """Drop the blocks recorded on ``module``'s parameters (returns how many) and keep
    exactly-bfloat16 weights from being read as such: the native decoder then reads
    float32 panels -- the same bits, four bytes a weight; a benchmark's and a test's
    baseline. Takes effect when the weights are next packed (``use_cpu_matmul_layout``)."""
    count = 0
    for param in module.parameters():
        setattr(param, _PANELS_ONLY, True)
        if hasattr(param, _ATTRIBUTE):
            delattr(param, _ATTRIBUTE)
            count += 1
    return count


def random_blocks(
    qtype: str, rows: int, cols: int, seed: int, scale: float = 2**-12
) -> BlockWeight:
    """Random ``qtype`` blocks for tests and benchmarks (the ``gguf`` package cannot write
    the K-quants): random bytes, but every float16 scale (and offset) set to ``scale``, so
    the weights stay small and finite. The same seed gives the same bytes."""
    block, size, _ = BLOCK_TYPES[qtype]
    if qtype in ("BF16", "F16"):  # words: normal values of about `scale * 2^12`
        values = np.random.default_rng(seed).standard_normal((rows, cols), np.float32)
        words = torch.from_numpy(values * np.float32(scale * 2**12))
        words = words.to(torch.bfloat16 if qtype == "BF16" else torch.float16)
        return BlockWeight(qtype, words.contiguous().view(torch.uint8).reshape(rows, -1), cols)
    data = np.random.default_rng(seed).integers(0, 256, (rows, cols // block, size), np.uint8)
    word = np.array([scale], dtype=np.float16).view(np.uint8)
    # where each type keeps its float16 scale (and offset): first, but Q6_K's last
    offsets = {"Q6_K": [size - 2], "Q4_1": [0, 2], "Q5_1": [0, 2], "Q4_K": [0, 2], "Q5_K": [0, 2]}
    for start in offsets.get(qtype, [0]):
        data[..., start : start + 2] = word
    return BlockWeight(qtype, torch.from_numpy(data.reshape(rows, -1)), cols)
