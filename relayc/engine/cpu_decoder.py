"""The decoder layers of a CPU forward in one call: native (native/csrc/) or TorchScript.

``use_cpu_matmul_layout`` (relayc.engine.model) gives every decoder stack a
:class:`ScriptedLayers`, and the model a :class:`NativeHead`. Per forward,
``ScriptedLayers`` runs the layers natively for uniform batches of at most
``native_max_tokens(dtype)`` tokens (relayc.engine.native), else -- float32 only -- as one
TorchScript function (relayc.engine.scripted: the eager ops, same bits), else returns None
and the caller runs the eager modules. Both read the weights as lists, checked still
current on every call.

Which path runs where (CPU, autograd off, paged attention; :func:`native_max_tokens`,
measured with bench/real_model_forward.py on SmolLM2-135M, one thread, AVX-512):

=========  ========================================  =======================================
weights    decoder layers                            final norm + LM head
=========  ========================================  =======================================
float32    native: uniform batches of <= 64 tokens;  native: <= 64 rows; else eager (MKL)
           else TorchScript (MKL)
GGUF       float32, the native calls reading each    the same, when the head has blocks
blocks     matrix's Q4/Q5/Q8, Q4_K-Q6_K blocks
           (same bits, a sixth of the bytes for Q4)
bfloat16   native: decodes and verifies of any       the same rule
           size, uniform prefills of <= 64 tokens;
           else eager (oneDNN bf16)
other      eager                                     eager
=========  ========================================  =======================================

Where the layers and the LM head both run natively, a decode or verify forward of the
whole model is one native call (relayc.engine.fused_forward: the embedding, rotary rows,
attention metadata, layers and head with its argmax), the same functions on the same
values; the classes here hold what that call reads.

A model loaded from a GGUF file keeps its block-quantized matrices beside the float32
weights (relayc.engine.checkpoints.blocks); each matrix that still holds its blocks'
values is read as those blocks by the native layers (quants.c's ``gemm_blocks``), the
others as float32 panels (a weight edited since loading, a type with no block kernel),
and the same for the LM head. On SmolLM2's Q4_1 file that is what makes float32 decoding
faster than bfloat16: a one-token decode streams 96 MB instead of 540 (270 in bfloat16).

The native paths are the ones whose rows do not depend on the batch (a token's logits are
the same bits decoded alone or inside a verify), which speculative greedy decoding needs
to equal plain greedy decoding exactly. In float32 the engine's default verify (4 tokens a
request) stays native up to 16 requests, an 8-token verify up to 8; above that (a prompt's
prefill, a large batch) the forward is compute-bound and MKL's GEMMs are faster, and their
rounding differences (about 2^-24 of a logit) rarely flip a token. In bfloat16 they flip
tokens often, so decodes and verifies stay native at any size
(``NATIVE_MAX_DECODE_ROWS_BF16``) and only prefills above 64 tokens go to oneDNN.

The native bfloat16 GEMMs round their input activations to bfloat16 and sum the exact
products in float32, with the best kernel the CPU has, one per process (gemm_bf16.c's
gemm_bf16; relayc.engine.native.bf16_kernel): AMX tiles, AVX512-BF16 (vdpbf16ps), or
weights widened to float32 (any CPU). With AVX512-BF16 (AMD Zen 5, no AMX) they are 0.9x
oneDNN's time at 64 rows and faster below (an 8-row verify 1.7x a decode; 2.6-2.9x widened);
so the limit is 64, as for float32, also because 8 requests verifying 8 tokens each -- the
batched speculative case -- need rows that do not depend on the batch.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from relayc.engine import head_argmax, native, scripted
from relayc.engine.attention import PagedAttend
from relayc.engine.checkpoints.blocks import BlockStack, BlockWeight, native_blocks
from relayc.engine.forward_batch import ForwardMode

if TYPE_CHECKING:
    from relayc.engine.model import Linear, LlamaDecoderLayer, RMSNorm, RopeTables

# Above this many tokens (a prompt's prefill) a forward is compute-bound and MKL's GEMMs,
# through the TorchScript layers, are faster than the native decoder's.
NATIVE_MAX_TOKENS = 64
# The same for bfloat16 weights: 64 at least, whatever oneDNN's speed, since only the native
# rows are batch-independent, which lossless batched speculation needs (module docstring).
NATIVE_MAX_TOKENS_BF16 = 64
# bfloat16 decode and verify forwards (every row a request's next token or a drafted one)
# run natively up to this many rows: any batch the engine forms. The library GEMM rounds a
# row differently with other rows beside it, and in bfloat16 that flips greedy tokens
# often (11 of 24 chat prompts at 64 tokens each when 24 requests verified 8 tokens
# together), so speculation would stop equalling `none`; the native rows cost 1.1-1.2x
# oneDNN's time at 128-256 rows.
NATIVE_MAX_DECODE_ROWS_BF16 = 4096
NATIVE_DTYPES = (torch.float32, torch.bfloat16)


def native_max_tokens(dtype: torch.dtype, decode: bool = False) -> int:
    """The most tokens (rows) a forward with ``dtype`` weights runs natively -- layers and
    LM head alike; 0: never (no native kernel for that dtype). ``decode``: a decode or
    verify forward (not a prefill). See the module docstring."""
    if dtype == torch.float32:
        return NATIVE_MAX_TOKENS
    if dtype == torch.bfloat16:
        return NATIVE_MAX_DECODE_ROWS_BF16 if decode else NATIVE_MAX_TOKENS_BF16
    return 0


def native_head_library(
    hidden: torch.Tensor, dtype: torch.dtype, decode: bool = False
) -> ctypes.CDLL | None:
    """The native library when the rows of ``hidden [..., width]`` can go through a
    :class:`NativeHead` with ``dtype`` weights -- on the CPU, autograd off, ``hidden`` in
    that dtype, at most :func:`native_max_tokens` rows (``decode``: of a decode or verify
    forward) -- else None (the library GEMM)."""
    if (
        hidden.dim() >= 1
        and hidden.device.type == "cpu"
        and hidden.dtype == dtype
        and not torch.is_grad_enabled()
        and hidden.shape[:-1].numel() <= native_max_tokens(dtype, decode)
    ):
        return native.native_decoder()
    return None


# (a module's parameters, its weight, the weight's _stamp) per weight checked
_Stamps = list[tuple[dict[str, Any], torch.Tensor, tuple[int, int]]]


def _stamp(weight: torch.Tensor) -> tuple[int, int]:
    """What changes when a parameter's values may have: its storage or its version counter
    (bumped by every in-place op through it)."""
    return weight.data_ptr(), weight._version


class ScriptedLayers:
    """The weights of ``layers`` as the lists :func:`_layers` takes, checked still current
    on every call (a replaced parameter or a stale fused weight -> eager, never stale)."""

    def __init__(self, layers: Sequence[LlamaDecoderLayer]) -> None:
        # A bad RELAYC_NATIVE fails here, where Engine(...) lays its models out, rather
        # than at the first forward of a generate() call.
        native.enabled()
        self.layers = list(layers)
        self._args: dict[str, Any] | None = None
        self._native: NativeWeights | None = None
        self._dtype = torch.float32  # the weights' dtype, once built
        self._built = False
        self._checks: _Stamps = []
        self._pins = 0  # open pinned() blocks: the weights are trusted while there are any
        self._pin_lock = threading.Lock()

    def __deepcopy__(self, memo: dict[int, Any]) -> ScriptedLayers:
        """A copy over the copied layers, packed again at its first use: the packs hold raw
        pointers (and a lock), which neither copy nor pickle."""
        return ScriptedLayers(copy.deepcopy(self.layers, memo))

    def _build(self) -> dict[str, Any] | None:
        layers = self.layers
        self._native = None
        self._checks = _stamps(
            [
                module
                for layer in layers
                for module in (
                    layer.input_layernorm,
                    layer.post_attention_layernorm,
                    layer.self_attn.o_proj,
                    layer.self_attn.q_proj,
                    layer.self_attn.k_proj,
                    layer.self_attn.v_proj,
                    layer.mlp.gate_proj,
                    layer.mlp.up_proj,
                    layer.mlp.down_proj,
                )
            ]
        )
        fused = [(layer.self_attn.qkv, layer.mlp.gate_up) for layer in layers]
        qkv = [f.weight if f is not None and f.current() else None for f, _ in fused]
        gate_up = [f.weight if f is not None and f.current() else None for _, f in fused]
        splits = {tuple(f.splits) for _, f in fused if f is not None}
        if any(w is None for w in (*qkv, *gate_up)) or len(splits) != 1:
            return None
        (split,) = splits
        if len(split) != 2 or split[0] != split[1]:
            return None
        params: dict[str, list[torch.Tensor | None]] = {
            "ln1": [layer.input_layernorm.weight.detach() for layer in layers],
            "w_o": [layer.self_attn.o_proj.weight.detach() for layer in layers],
            "ln2": [layer.post_attention_layernorm.weight.detach() for layer in layers],
            "w_down": [layer.mlp.down_proj.weight.detach() for layer in layers],
            "w_qkv": qkv,
            "w_gate_up": gate_up,
        }
        dtypes = {t.dtype if t is not None else None for values in params.values() for t in values}
        if len(dtypes) != 1 or any(
            t is None or t.device.type != "cpu" for values in params.values() for t in values
        ):
            return None
        (dtype,) = dtypes
        if dtype not in NATIVE_DTYPES:
            return None
        self._dtype = dtype
        attn = layers[0].self_attn
        native = all(
            t is not None and t.shape[0] % 16 == 0
            for name in ("w_qkv", "w_o", "w_gate_up", "w_down")
            for t in params[name]
        ) and all(t is not None and t.is_contiguous() for t in (*params["ln1"], *params["ln2"]))
        eps1 = [float(layer.input_layernorm.eps) for layer in layers]
        eps2 = [float(layer.post_attention_layernorm.eps) for layer in layers]
        if native:
            blocks = _layer_blocks(layers) if dtype == torch.float32 else None
            self._native = NativeWeights(params, eps1, eps2, dtype, blocks)
        return {
            **params,
            "eps1": eps1,
            "eps2": eps2,
            "heads": attn.num_heads,
            "kv_heads": attn.num_kv_heads,
            "head_dim": attn.head_dim,
            "intermediate": split[0],
        }

    def _current(self) -> bool:
        return _unchanged(self._checks)

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype (float32 until they are first read)."""
        return self._dtype

    def native_weights(self) -> NativeWeights | None:
        """The packed weights the native decoder reads (checked as :meth:`args` checks
        them); None where the layers do not run natively."""
        return self._native if self.args() is not None else None

    def args(self) -> dict[str, Any] | None:
        """The weight arguments, rebuilt when a parameter changed; None: not eligible.
        Inside a :meth:`pinned` block, as checked when the block opened."""
        if self._pins and self._built:
            return self._args
        return self._checked_args()

    def _checked_args(self) -> dict[str, Any] | None:
        if not self._built or not self._current():
            self._args = self._build()
            self._built = True
        return self._args

    @contextlib.contextmanager
    def pinned(self) -> Iterator[None]:
        """Check the weights now (repacking what changed), then trust them until the block
        ends: the forwards inside skip the per-call check of every parameter's stamp (270
        of them for SmolLM2: a few hundred microseconds a forward once its weights have
        streamed through the caches). The caller promises that no weight changes inside
        the block; ``Engine.generate`` holds one for its call."""
        with self._pin_lock:
            self._checked_args()
            self._pins += 1
        try:
            yield
        finally:
            with self._pin_lock:
                self._pins -= 1

    def __call__(
        self,
        x: torch.Tensor,
        rope: RopeTables,
        cache_layers: Sequence[int],
        attend: object,
        capture: Sequence[int] = (),
        captured: list[torch.Tensor] | None = None,
    ) -> torch.Tensor | None:
        """The layers over ``x``, or None when this call must run eagerly. ``capture``
        (indices into these layers): natively, the input of each is appended to
        ``captured``; a call with ``capture`` that cannot run natively returns None (the
        caller runs the layers in segments)."""
        if not isinstance(attend, PagedAttend) or x.device.type != "cpu" or torch.is_grad_enabled():
            return None
        args = self.args()
        if args is None:
            return None
        cache = attend.batch.kv_cache
        k_all, v_all = cache.k, cache.v
        # One dtype for the activations, the weights and the cache the eager path shares.
        if not x.dtype == k_all[0].dtype == self._dtype:
            return None
        if len(cache_layers) == len(k_all) and list(cache_layers) == list(range(len(k_all))):
            k_cache, v_cache = k_all, v_all
        else:
            k_cache = [k_all[i] for i in cache_layers]
            v_cache = [v_all[i] for i in cache_layers]
        meta = attend.meta
        if (
            self._native is not None
            and meta.padded_index is None
            and x.shape[0] <= native_max_tokens(self._dtype, _decoding(attend))
        ):
            lib = native.native_decoder()
            if lib is not None:
                return self._native.run(
                    lib, args, x, rope, attend, k_cache, v_cache, None, capture, captured
                )
        if capture or self._dtype != torch.float32:
            # The TorchScript layers are the float32 eager ops; bfloat16's eager RMSNorm
            # rounds differently, so other dtypes run the eager modules.
            return None
        fn = scripted.scripted_layers()
        if fn is None:
            return None
        # The executor's profiling/specialising passes find nothing to fuse on the CPU and
        # re-profile as shapes change (every step's key count): plain interpretation is
        # faster. The flag is thread-local; restored after the call.
        optimize = torch._C._get_graph_executor_optimize()
        torch._C._set_graph_executor_optimize(False)
        try:
            return fn(
                x,
                rope.cos,
                rope.sin,
                attend.batch.out_cache_loc,
                meta.kv_loc,
                meta.mask,
                meta.padded_index,
                meta.token_req,
                meta.token_row,
                meta.batch_size,
                meta.max_extend_len,
                k_cache=k_cache,
                v_cache=v_cache,
                **args,
            )
        finally:
            torch._C._set_graph_executor_optimize(optimize)


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


_MATRICES = ("w_qkv", "w_o", "w_gate_up", "w_down")  # layer.c's formats[4 * l + i] order


def _layer_blocks(
    layers: Sequence[Any],
) -> dict[str, list[BlockStack | None]] | None:
    """Each matrix of ``layers`` (q/k/v and gate/up stacked as the fused weights are) as
    the blocks the native decoder reads instead of float32 panels when every part has them
    (relayc.engine.checkpoints.blocks.native_blocks: a GGUF file's blocks while the weight
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
            # the greedy token of each row comes with its logits (see relayc.engine.head_argmax)
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


class NativeDraftLayer:
    """An EAGLE-3 draft layer (``relayc.engine.draft.eagle3.Eagle3Layer``) in one native
    call: its q/k/v read ``[input_layernorm(embed); hidden_norm(hidden)]`` (computed by the
    caller, ``attn_in``) and ``hidden`` is the residual (layer.c's ``relayc_decoder_ex``).

    The eager layer costs about five native forwards' worth of small library GEMMs per
    draft step on the CPU; the packed weights are rebuilt when a parameter changes (a
    training step, a load), as :class:`ScriptedLayers` does."""

    def __init__(self, layer: Any) -> None:
        native.enabled()
        self.layer = layer
        self._weights: NativeWeights | None = None
        self._args: dict[str, Any] | None = None
        self._checks: _Stamps = []

    def __deepcopy__(self, memo: dict[int, Any]) -> NativeDraftLayer:
        """A copy over the copied layer, packed again at its first use (as ScriptedLayers)."""
        return NativeDraftLayer(copy.deepcopy(self.layer, memo))

    def _modules(self) -> list[Any]:
        attn, mlp = self.layer.self_attn, self.layer.mlp
        return [self.layer.hidden_norm, self.layer.post_attention_layernorm, attn.q_proj,
                attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj,
                mlp.down_proj]  # fmt: skip

    def _current(self) -> bool:
        return bool(self._checks) and _unchanged(self._checks)

    def _build(self) -> None:
        self._weights, self._args, self._checks = None, None, []
        modules = self._modules()
        weights = [m._parameters["weight"] for m in modules]
        if any(w is None or w.device.type != "cpu" for w in weights):
            return
        self._checks = _stamps(modules)
        dtypes = {w.dtype for w in weights}
        if len(dtypes) != 1 or next(iter(dtypes)) not in NATIVE_DTYPES:
            return
        (dtype,) = dtypes
        attn, mlp, layer = self.layer.self_attn, self.layer.mlp, self.layer
        with torch.no_grad():
            qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
            gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        params: dict[str, list[torch.Tensor | None]] = {
            # ln1 is not read (attn_in replaces the input norm); the shape check wants hidden
            "ln1": [layer.hidden_norm.weight.detach()],
            "w_qkv": [qkv],
            "w_o": [attn.o_proj.weight.detach()],
            "ln2": [layer.post_attention_layernorm.weight.detach()],
            "w_gate_up": [gate_up],
            "w_down": [mlp.down_proj.weight.detach()],
        }
        if any(t.shape[0] % 16 for n in ("w_qkv", "w_o", "w_gate_up", "w_down")
               for t in params[n] if t is not None):  # fmt: skip
            return
        eps = [float(layer.post_attention_layernorm.eps)]
        # a bfloat16 or float16 head loaded as float32 (the shipped heads are float16) reads
        # its two-byte words: the same bits
        blocks = _layer_blocks([layer]) if dtype == torch.float32 else None
        self._weights = NativeWeights(params, eps, eps, dtype, blocks)
        self._args = {
            "heads": attn.num_heads,
            "kv_heads": attn.num_kv_heads,
            "head_dim": attn.head_dim,
            "intermediate": mlp.gate_proj.weight.shape[0],
        }

    def prepare(self) -> bool:
        """Pack the weights now (else the first call does); False: the layer cannot run
        natively (not on the CPU, another dtype, a shape the kernels do not take)."""
        if not self._current():
            self._build()
        return self._weights is not None and native.native_decoder() is not None

    def packed(self) -> tuple[NativeWeights, dict[str, Any]] | None:
        """The packed weights and their arguments (heads, kv_heads, head_dim,
        intermediate), repacked if a parameter changed; None: the layer cannot run
        natively."""
        if not self._current():
            self._build()
        if self._weights is None or self._args is None:
            return None
        return self._weights, self._args

    def _runnable(
        self, hidden: torch.Tensor, attend: object
    ) -> tuple[ctypes.CDLL, NativeWeights, dict[str, Any]] | None:
        """The library, the packed weights and their arguments when this call can run
        natively (the CPU, autograd off, paged attention, few enough tokens), else None."""
        if (
            not isinstance(attend, PagedAttend)
            or hidden.device.type != "cpu"
            or torch.is_grad_enabled()
            or attend.meta.padded_index is not None
        ):
            return None
        packed = self.packed()
        if packed is None:
            return None
        weights, args = packed
        cache = attend.batch.kv_cache
        if (
            hidden.dtype != weights.dtype
            or cache.k[0].dtype != weights.dtype
            or hidden.shape[0] > native_max_tokens(weights.dtype)
        ):
            return None
        lib = native.native_decoder()
        return None if lib is None else (lib, weights, args)

    def attn_in(
        self, embeds: torch.Tensor, hidden: torch.Tensor, attend: object
    ) -> torch.Tensor | None:
        """``[input_layernorm(embeds); hidden_norm(hidden)]`` ``[T, 2 * hidden]`` float32 in
        one native call (``relayc_norm_pair``: the norms the target's native layers compute,
        in float32 over bfloat16 inputs too -- the layer's first GEMM rounds their output,
        as the native draft extend and chain do) when the layer will run natively, else
        None (the caller's modules)."""
        runnable = self._runnable(hidden, attend)
        layer = self.layer
        norms = (layer.input_layernorm.weight, layer.hidden_norm.weight)
        if (
            runnable is None
            or not embeds.dtype == hidden.dtype
            or embeds.dtype not in NATIVE_DTYPES
            or embeds.shape != hidden.shape
            or any(w.dtype != embeds.dtype or not w.is_contiguous() for w in norms)
            or any(w.shape != embeds.shape[-1:] for w in norms)
        ):
            return None
        norms = (norms[0].float(), norms[1].float())  # themselves when float32
        a, b = embeds.float().contiguous(), hidden.float().contiguous()
        tokens, width = a.shape
        out = a.new_empty(tokens, 2 * width)
        code = runnable[0].relayc_norm_pair(
            tokens,
            width,
            a.data_ptr(),
            norms[0].data_ptr(),
            float(layer.input_layernorm.eps),
            width,
            b.data_ptr(),
            norms[1].data_ptr(),
            float(layer.hidden_norm.eps),
            out.data_ptr(),
        )
        return out if code == 0 else None

    def __call__(
        self, attn_in: torch.Tensor, hidden: torch.Tensor, rope: RopeTables, attend: object
    ) -> torch.Tensor | None:
        """The layer's output ``[T, hidden]`` in ``hidden``'s dtype, or None: run it eagerly
        (not the CPU, autograd on, not paged attention, too many tokens, no library)."""
        runnable = self._runnable(hidden, attend)
        if runnable is None:
            return None
        lib, weights, args = runnable
        assert isinstance(attend, PagedAttend)  # _runnable checked it
        cache = attend.batch.kv_cache
        return weights.run(
            lib, args, hidden, rope, attend, [cache.k[0]], [cache.v[0]], attn_in=attn_in
        )


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
