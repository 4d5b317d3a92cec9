"""A model's final norm and LM head, and a draft head's linears, as native calls
(``NativeHead``, ``NativeLinear``): their weights packed once, checked current per call."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import torch

from relayc.engine.decoder.packing import NATIVE_DTYPES, _pack, _stamp, native_max_tokens
from relayc.engine.native import head_argmax
from relayc.engine.native import library as native
from relayc.engine.native.blocks import native_blocks

if TYPE_CHECKING:
    from relayc.engine.core.layers import Linear, RMSNorm


def native_head_library(
    hidden: torch.Tensor, dtype: torch.dtype, decode: bool = False, int8: bool = False
) -> ctypes.CDLL | None:
    """The native library when the rows of ``hidden [..., width]`` can go through a
    :class:`NativeHead` with ``dtype`` weights -- on the CPU, autograd off, ``hidden`` in
    that dtype, at most :func:`native_max_tokens` rows (``decode``: of a decode or verify
    forward; ``int8``: the head is read by the integer-dot GEMMs) -- else None (the library
    GEMM)."""
    if (
        hidden.dim() >= 1
        and hidden.device.type == "cpu"
        and hidden.dtype == dtype
        and not torch.is_grad_enabled()
        and hidden.shape[:-1].numel() <= native_max_tokens(dtype, decode, int8)
    ):
        return native.native_decoder()
    return None


class NativeHead:
    """The final norm and LM head for the native decoder: row-independent logits."""

    def __init__(self, norm: RMSNorm, lm_head: Linear) -> None:
        self.norm, self.lm_head = norm, lm_head
        self.params = (norm.weight, lm_head.weight)
        self.stamps = [_stamp(p) for p in self.params]
        self.dtype = lm_head.weight.dtype
        self.weight = norm.weight.detach().float().contiguous()
        # a GGUF file's quantized head (SmolLM2's is Q8_0) read as its blocks, an exactly
        # bfloat16 or float16 one as its words: the same logits, fewer bytes
        blocks = native_blocks(lm_head._parameters["weight"])
        self.format = blocks.format if blocks is not None else 0
        self.int8 = blocks is not None and blocks.int8  # the integer-dot GEMMs (int8.c)
        self.packed = blocks.panels() if blocks is not None else _pack(lm_head.weight)
        self.vocab, self.width = lm_head.weight.shape
        self.padded = -(-self.vocab // 16) * 16

    @classmethod
    def reuse(cls, head: NativeHead | None, norm: RMSNorm, lm_head: Linear) -> NativeHead:
        """``head`` while it still holds ``norm`` and ``lm_head``, else a new pack of them."""
        return head if head is not None and head.current(norm, lm_head) else cls(norm, lm_head)

    def current(self, norm: RMSNorm, lm_head: Linear) -> bool:
        """Still what ``norm`` and ``lm_head`` hold: the same parameters, unchanged."""
        return (
            norm is self.norm
            and lm_head is self.lm_head
            and norm.weight is self.params[0]
            and lm_head.weight is self.params[1]
            and [_stamp(p) for p in self.params] == self.stamps
        )

    def logits(self, lib: ctypes.CDLL, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., vocab]`` float32 of ``hidden [..., hidden_size]`` (any leading
        shape: rows are independent, so they are flattened and shaped back). The norm runs
        in float32; with bfloat16 weights the products take its output rounded to
        bfloat16 (gemm_bf16.c's gemm_bf16)."""
        width = self.width
        if hidden.dim() == 0 or hidden.shape[-1] != width:
            # head.c reads ``width`` floats per row: a narrower row would read past it.
            raise ValueError(
                f"the native LM head takes hidden states [..., {width}], got {list(hidden.shape)}"
            )
        leading = hidden.shape[:-1]
        hidden = hidden.reshape(-1, width).float().contiguous()
        rows = hidden.shape[0]
        out = hidden.new_empty(rows, self.padded)
        args = (
            width,
            out.shape[1],
            hidden.data_ptr(),
            self.weight.data_ptr(),
            float(self.norm.eps),
            self.packed.data_ptr(),
            out.data_ptr(),
        )
        if rows <= head_argmax.MAX_ROWS:
            # the greedy token of each row comes with its logits (see relayc.engine.native.head_argmax)
            argmax = torch.empty(rows, dtype=torch.int64)
            kind = self.format or (0 if self.dtype == torch.float32 else -1)
            code = lib.relayc_head_argmax(
                rows, *args[:2], self.vocab, *args[2:], kind, argmax.data_ptr()
            )
        elif self.format:
            argmax, code = None, lib.relayc_head_blocks(rows, *args, self.format)
        else:
            head = lib.relayc_head if self.dtype == torch.float32 else lib.relayc_head_bf16
            argmax, code = None, head(rows, *args)
        if code != 0:
            raise RuntimeError(f"the native LM head failed (code {code})")
        logits = out[:, : self.vocab].contiguous().view(*leading, self.vocab)
        if argmax is None:
            head_argmax.forget()
        else:
            head_argmax.remember(logits, argmax.view(leading))
        return logits


class NativeLinear:
    """A ``Linear`` (no bias) for the native decoder's GEMM (``relayc_linear``): the weight
    packed as the layers' are -- its GGUF or Q8_0 blocks, its bfloat16 words, else float32
    panels -- rows independent of the batch. An EAGLE-3 head's ``fc``: the library GEMM
    took several times as long on a draft extend's few rows."""

    def __init__(self, linear: Linear) -> None:
        self.linear = linear
        self.param = linear.weight
        self.stamp = _stamp(self.param)
        self.dtype = linear.weight.dtype
        blocks = native_blocks(linear._parameters["weight"])
        self.format = (
            blocks.format if blocks is not None else 0 if self.dtype == torch.float32 else -1
        )
        self.packed = blocks.panels() if blocks is not None else _pack(linear.weight)
        self.out_features, self.in_features = linear.weight.shape
        self.padded = -(-self.out_features // 16) * 16

    @classmethod
    def reuse(cls, packed: NativeLinear | None, linear: Linear) -> NativeLinear:
        """``packed`` while it still holds ``linear``'s weight unchanged, else a new pack."""
        current = (
            packed is not None
            and packed.linear is linear
            and linear.weight is packed.param
            and _stamp(packed.param) == packed.stamp
        )
        return packed if current and packed is not None else cls(linear)

    def __call__(self, lib: ctypes.CDLL, x: torch.Tensor) -> torch.Tensor:
        """``x [..., in]`` times the weight: ``[..., out]`` in the weight's dtype."""
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(
                f"the native linear takes [..., {self.in_features}], got {list(x.shape)}"
            )
        leading = x.shape[:-1]
        rows = x.reshape(-1, self.in_features).float().contiguous()
        out = rows.new_empty(rows.shape[0], self.padded)
        code = lib.relayc_linear(
            rows.shape[0],
            self.in_features,
            self.padded,
            rows.data_ptr(),
            self.packed.data_ptr(),
            out.data_ptr(),
            self.format,
        )
        if code != 0:
            raise RuntimeError(f"the native linear failed (code {code})")
        y = out[:, : self.out_features].reshape(*leading, self.out_features)
        return y if self.dtype == torch.float32 else y.to(self.dtype)


def native_head_eligible(norm: RMSNorm, lm_head: Linear) -> bool:
    """Whether ``lm_head`` (after ``norm``) can run as a :class:`NativeHead` at all: CPU
    weights of a dtype the native decoder takes, and the library built."""
    weight = lm_head.weight
    return (
        weight.device.type == "cpu"
        and weight.dtype in NATIVE_DTYPES
        and norm.weight.dtype == weight.dtype
        and native.native_decoder() is not None
    )
