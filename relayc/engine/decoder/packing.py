"""The weights of a decoder stack packed for the native decoder, and how many rows a native call
takes.

``NativeWeights`` holds one stack's packed matrices (float32 panels, bfloat16 words or a GGUF
file's blocks) and the cache pointers a native call reads; the stamps say when a parameter
changed and the pack must be rebuilt. Which dtype runs natively up to how many rows is in
``relayc.engine.decoder.cpu_decoder``'s docstring.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from relayc.engine.core.attention import PagedAttend
from relayc.engine.core.forward_batch import ForwardMode
from relayc.engine.native.blocks import (
    BLOCKS_I8Q4,
    BLOCKS_I8Q8,
    BlockStack,
    BlockWeight,
    native_blocks,
)

if TYPE_CHECKING:
    from relayc.engine.core.layers import RopeTables


# Above this many tokens (a prompt's prefill) a forward is compute-bound and MKL's GEMMs,
# through the TorchScript layers, are faster than the native decoder's.
NATIVE_MAX_TOKENS = 64


# The same for bfloat16 weights: 64 at least, whatever oneDNN's speed, since only the native
# rows are batch-independent, which lossless batched speculation needs (cpu_decoder.py's docstring).
NATIVE_MAX_TOKENS_BF16 = 64


# bfloat16 decode and verify forwards (every row a request's next token or a drafted one)
# run natively up to this many rows: any batch the engine forms. The library GEMM rounds a
# row differently with other rows beside it, and in bfloat16 that flips greedy tokens
# often (11 of 24 chat prompts at 64 tokens each when 24 requests verified 8 tokens
# together), so speculation would stop equalling `none`; the native rows cost 1.1-1.2x
# oneDNN's time at 128-256 rows.
NATIVE_MAX_DECODE_ROWS_BF16 = 4096


# Weights read by the integer-dot GEMMs (dtype "int8", int8.c) run natively up to this many
# rows, prefills too: only the native GEMMs compute in int8, so a forward sent to MKL would
# change precision with the batch.
NATIVE_MAX_TOKENS_INT8 = 4096


NATIVE_DTYPES = (torch.float32, torch.bfloat16)


def native_max_tokens(dtype: torch.dtype, decode: bool = False, int8: bool = False) -> int:
    """The most tokens (rows) a forward with ``dtype`` weights runs natively -- layers and
    LM head alike; 0: never (no native kernel for that dtype). ``decode``: a decode or
    verify forward (not a prefill); ``int8``: the weights are read by the integer-dot
    GEMMs. See cpu_decoder.py's docstring."""
    if int8 and dtype == torch.float32:
        return NATIVE_MAX_TOKENS_INT8
    if dtype == torch.float32:
        return NATIVE_MAX_TOKENS
    if dtype == torch.bfloat16:
        return NATIVE_MAX_DECODE_ROWS_BF16 if decode else NATIVE_MAX_TOKENS_BF16
    return 0


# (a module's parameters, its weight, the weight's _stamp) per weight checked
_Stamps = list[tuple[dict[str, Any], torch.Tensor, tuple[int, int]]]


def _stamp(weight: torch.Tensor) -> tuple[int, int]:
    """What changes when a parameter's values may have: its storage or its version counter
    (bumped by every in-place op through it)."""
    return weight.data_ptr(), weight._version


def _stamps(modules: Sequence[Any]) -> _Stamps:
    """What :func:`_unchanged` checks of each module's ``weight`` parameter."""
    stamps: _Stamps = []
    for module in modules:
        weight = module._parameters["weight"]
        assert weight is not None
        stamps.append((module._parameters, weight, _stamp(weight)))
    return stamps


def _unchanged(stamps: _Stamps) -> bool:
    """Every stamped parameter is still the module's and unchanged (a replaced parameter or
    an in-place update means a repack)."""
    return all(
        params["weight"] is weight and _stamp(weight) == stamp for params, weight, stamp in stamps
    )


INT8_PANELS = (BLOCKS_I8Q4, BLOCKS_I8Q8)  # the panel formats of the integer-dot GEMMs

_MATRICES = ("w_qkv", "w_o", "w_gate_up", "w_down")  # layer.c's formats[4 * l + i] order


def _layer_blocks(
    layers: Sequence[Any],
) -> dict[str, list[BlockStack | None]] | None:
    """Each matrix of ``layers`` (q/k/v and gate/up stacked as the fused weights are) as
    the blocks the native decoder reads instead of float32 panels when every part has them
    (relayc.engine.native.blocks.native_blocks: a GGUF file's blocks while the weight
    still holds their values, or the two-byte words of a weight that is exactly bfloat16 or
    float16: an EAGLE-3 head's layer as well as a model's), else
    None for that matrix: its float32 panels (a weight edited since loading, a type with no
    block kernel). None: no blocks at all."""
    found: dict[str, list[BlockStack | None]] = {name: [] for name in _MATRICES}
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        groups = {
            "w_qkv": (attn.q_proj, attn.k_proj, attn.v_proj),
            "w_o": (attn.o_proj,),
            "w_gate_up": (mlp.gate_proj, mlp.up_proj),
            "w_down": (mlp.down_proj,),
        }
        for name, modules in groups.items():
            parts = [native_blocks(m._parameters["weight"]) for m in modules]
            stacked = None
            if all(p is not None for p in parts):
                stacked = BlockWeight.cat([p for p in parts if p is not None])
            found[name].append(stacked)
    if all(b is None for values in found.values() for b in values):
        return None
    return found


def _decoding(attend: PagedAttend) -> bool:
    """A decode or verify forward (not a prefill): :func:`native_max_tokens`'s ``decode``."""
    return attend.batch.mode is not ForwardMode.EXTEND


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """A ``[out, in]`` weight as gemm.c reads it: panels of 16 output columns (``out``
    padded with zero columns to a multiple of 16). float32: each panel ``[in, 16]``
    contiguous. bfloat16: each panel ``[in' / 2, 16, 2]``, k in pairs, ``in`` padded with
    zero rows to ``in'``, a multiple of 32 -- AMX's VNNI layout, one B tile per 32 k, and
    what vdpbf16ps reads: one 64-byte load holds two k steps of the panel's 16 columns."""
    k_by_n = weight.detach().t()
    rows, cols = k_by_n.shape
    if cols % 16:
        k_by_n = torch.cat([k_by_n, k_by_n.new_zeros(rows, 16 - cols % 16)], dim=1)
        cols = k_by_n.shape[1]
    if weight.dtype == torch.bfloat16:
        if rows % 32:
            k_by_n = torch.cat([k_by_n, k_by_n.new_zeros(32 - rows % 32, cols)], dim=0)
            rows = k_by_n.shape[0]
        return k_by_n.reshape(rows // 2, 2, cols // 16, 16).permute(2, 0, 3, 1).contiguous()
    return k_by_n.reshape(rows, cols // 16, 16).permute(1, 0, 2).contiguous()


@dataclass(frozen=True)
class _CachePointers:
    """What the native decoder takes of a set of K/V cache tensors (``NativeWeights``)."""

    # id() of each, K then V, then their data pointers: the same tensors while they live
    ids: tuple[int, ...]
    refs: list[weakref.ref[torch.Tensor]]
    k: Any  # ctypes arrays of the layers' data pointers
    v: Any
    rows: int  # the fewest rows of any: every slot must be below it

    def alive(self) -> bool:
        return all(ref() is not None for ref in self.refs)


class NativeWeights:
    """The per-layer pointers the native decoder (layer.c) takes, for one weight set."""

    # what each of ``arrays`` points to, in layer.c's parameter order
    ARRAY_NAMES = ("ln1", "w_qkv", "w_o", "ln2", "w_gate_up", "w_down")

    def __init__(
        self,
        params: dict[str, list[torch.Tensor | None]],
        eps1: list[float],
        eps2: list[float],
        dtype: torch.dtype,
        blocks: dict[str, list[BlockStack | None]] | None = None,
    ) -> None:
        """``blocks`` (float32 only): per matrix, GGUF blocks read instead of its float32
        panels, or None (layer.c's ``relayc_decoder_blocks_ex``: the same bits)."""
        self.dtype = dtype
        tensors: dict[str, list[torch.Tensor]] = {}
        # each layer's q/k/v, o, gate/up and down: 0 (float32 panels) or a block format
        formats = [[0] * len(_MATRICES) for _ in params["ln1"]]
        for name, values in params.items():
            weights = [t for t in values if t is not None]
            if not name.startswith("w_"):
                # the norm weights float32 whatever the dtype: the norms run in float32
                tensors[name] = [t.float().contiguous() for t in weights]
                continue
            parts = blocks[name] if blocks is not None else [None] * len(weights)
            tensors[name] = []
            for layer, (weight, block) in enumerate(zip(weights, parts, strict=True)):
                if block is None:
                    tensors[name].append(_pack(weight))
                else:
                    tensors[name].append(block.panels())
                    formats[layer][_MATRICES.index(name)] = block.format
        self.formats = [f for layer in formats for f in layer]
        # any matrix read by the integer-dot GEMMs (dtype "int8"): native at any row count
        self.int8 = any(f in INT8_PANELS for f in self.formats)
        self.format_array = (ctypes.c_int * len(self.formats))(*self.formats)
        self.blocks = any(self.formats)
        # Kept alive here: the pointer arrays point into these tensors.
        self.tensors = tensors
        self.arrays = [
            (ctypes.c_void_p * len(tensors[name]))(*(t.data_ptr() for t in tensors[name]))
            for name in self.ARRAY_NAMES
        ]
        self.eps = [(ctypes.c_float * len(e))(*e) for e in (eps1, eps2)]
        self._caches: _CachePointers | None = None  # the K/V caches of the last call

    def cache_pointers(
        self, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor], row: tuple[int, int]
    ) -> _CachePointers:
        """The K/V caches' pointer arrays and rows, checked once per set of cache tensors
        (every forward of an engine passes the same ones: a Python pass over each layer's
        two caches on every call cost more than the rest of the call's setup)."""
        caches = (*k_cache, *v_cache)
        ids = (*map(id, caches), *map(torch.Tensor.data_ptr, caches))
        known = self._caches
        if known is not None and known.ids == ids and known.alive():
            return known
        if any(
            c.dtype != self.dtype or not c.is_contiguous() or tuple(c.shape[1:]) != row
            for c in caches
        ):
            raise ValueError(
                f"the native decoder needs contiguous {self.dtype} K/V caches [N, {row}]"
            )
        layers = len(k_cache)
        self._caches = known = _CachePointers(
            ids,
            [weakref.ref(c) for c in caches],
            (ctypes.c_void_p * layers)(*(c.data_ptr() for c in k_cache)),
            (ctypes.c_void_p * layers)(*(c.data_ptr() for c in v_cache)),
            min(c.shape[0] for c in caches),
        )
        return known

    def run(
        self,
        lib: ctypes.CDLL,
        args: dict[str, Any],
        x: torch.Tensor,
        rope: RopeTables,
        attend: PagedAttend,
        k_cache: list[torch.Tensor],
        v_cache: list[torch.Tensor],
        attn_in: torch.Tensor | None = None,
        capture: Sequence[int] = (),
        captured: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The layers over ``x`` (float32 inside); ``attn_in [T, K]`` (float32): the first
        layer's attention reads it instead of its input norm of ``x`` (EAGLE-3's draft
        layer); ``capture`` (indices into these layers): the input of each is appended to
        ``captured`` in ``x``'s dtype (EAGLE-3's target features) -- layer.c's
        ``relayc_decoder_ex``."""
        if capture and captured is None:
            raise ValueError("capture needs a list to append the captured states to")
        meta = attend.meta
        # float32 activations, rotary tables and mask in the call, whatever the weights'
        # dtype: the residual stream stays float32 across the layers of one call.
        out = x.to(torch.float32, copy=True).contiguous()
        tokens = out.shape[0]
        slots = attend.batch.out_cache_loc.to(torch.int64).contiguous()
        kv_loc = meta.kv_loc.contiguous()
        mask = meta.mask.float().contiguous()
        cos, sin = rope.cos.float().contiguous(), rope.sin.float().contiguous()
        pointers = self.cache_pointers(k_cache, v_cache, (args["kv_heads"], args["head_dim"]))
        batch, queries = meta.batch_size, meta.max_extend_len
        keys = kv_loc.numel() // batch
        shapes = {
            "hidden": (tuple(out.shape), (tokens, self.tensors["ln1"][0].shape[0])),
            "rotary": (tuple(cos.shape[::2]), (tokens, args["head_dim"])),
            "out_cache_loc": (tuple(slots.shape), (tokens,)),
            "kv_loc": (kv_loc.numel(), batch * keys),
            "mask": (tuple(mask.shape), (batch, 1, queries, keys)),
            "K/V cache layers": (len(k_cache), len(self.tensors["w_qkv"])),
        }
        for name, (got, want) in shapes.items():
            if got != want or tokens != batch * queries:
                raise ValueError(f"native decoder: {name} is {got}, expected {want}")
        layers = len(k_cache)
        f32 = self.dtype == torch.float32
        extra: tuple[Any, ...] = ()
        if attn_in is None and not capture and not self.blocks:
            decoder = lib.relayc_decoder if f32 else lib.relayc_decoder_bf16
        else:
            if self.blocks:
                decoder, extra = lib.relayc_decoder_blocks_ex, (self.format_array,)
            else:
                decoder = lib.relayc_decoder_ex if f32 else lib.relayc_decoder_bf16_ex
            in_ptr, in_width = None, 0
            if attn_in is not None:
                attn_in = attn_in.to(torch.float32).contiguous()
                if attn_in.dim() != 2 or attn_in.shape[0] != tokens:
                    raise ValueError(
                        f"native decoder: attn_in is {list(attn_in.shape)}, expected [{tokens}, K]"
                    )
                in_ptr, in_width = attn_in.data_ptr(), attn_in.shape[1]
            layer_ids = list(capture)
            if any(not 0 <= i < layers for i in layer_ids):
                raise ValueError(f"native decoder: capture {layer_ids} outside 0..{layers - 1}")
            aux = out.new_empty(tokens, len(layer_ids) * out.shape[1])
            ids = (ctypes.c_int * max(len(layer_ids), 1))(*layer_ids)
            extra = (*extra, in_ptr, in_width, ids, len(layer_ids), aux.data_ptr())
        code = decoder(
            tokens,
            out.shape[1],
            args["heads"],
            args["kv_heads"],
            args["head_dim"],
            args["intermediate"],
            layers,
            out.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            slots.data_ptr(),
            kv_loc.data_ptr(),
            mask.data_ptr(),
            batch,
            queries,
            keys,
            *self.arrays,
            *self.eps,
            pointers.k,
            pointers.v,
            pointers.rows,
            *extra,
        )
        if code in (-3, -4):
            what = "out_cache_loc" if code == -3 else "a request's KV slots (req_to_token)"
            raise IndexError(f"{what} names a KV slot outside the cache's {pointers.rows} rows")
        if code != 0:
            raise RuntimeError(f"the native decoder failed (code {code})")
        if captured is not None:
            width = out.shape[1]
            for c in range(len(capture)):
                part = aux[:, c * width : (c + 1) * width]
                captured.append(part if x.dtype == torch.float32 else part.to(x.dtype))
        return out if x.dtype == torch.float32 else out.to(x.dtype)
