"""The decoder layers of a CPU forward in one call: native (native/csrc/) or TorchScript.

``use_cpu_matmul_layout`` (relayc.engine.model.llama) gives every decoder stack a
:class:`ScriptedLayers`, and the model a :class:`NativeHead`. Per forward,
``ScriptedLayers`` runs the layers natively for uniform batches of at most
``native_max_tokens(dtype)`` tokens (relayc.engine.native.library), else -- float32 only -- as one
TorchScript function (relayc.engine.native.scripted: the eager ops, same bits), else returns None
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
whole model is one native call (relayc.engine.decoder.fused_forward: the embedding, rotary rows,
attention metadata, layers and head with its argmax), the same functions on the same
values; the classes here hold what that call reads.

A model loaded from a GGUF file keeps its block-quantized matrices beside the float32
weights (relayc.engine.native.blocks); each matrix that still holds its blocks'
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
gemm_bf16; relayc.engine.native.library.bf16_kernel): AMX tiles, AVX512-BF16 (vdpbf16ps), or
weights widened to float32 (any CPU). With AVX512-BF16 (AMD Zen 5, no AMX) they are 0.9x
oneDNN's time at 64 rows and faster below (an 8-row verify 1.7x a decode; 2.6-2.9x widened);
so the limit is 64, as for float32, also because 8 requests verifying 8 tokens each -- the
batched speculative case -- need rows that do not depend on the batch.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from relayc.engine.core.attention import PagedAttend
from relayc.engine.decoder.packing import (
    NATIVE_DTYPES,
    NativeWeights,
    _decoding,
    _layer_blocks,
    _Stamps,
    _stamps,
    _unchanged,
    native_max_tokens,
)
from relayc.engine.native import library as native
from relayc.engine.native import scripted
from relayc.engine.native.blocks import build_features

if TYPE_CHECKING:
    from relayc.engine.core.layers import LlamaDecoderLayer, RopeTables


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

    def _each_request(
        self,
        lib: Any,
        args: dict[str, Any],
        x: torch.Tensor,
        rope: RopeTables,
        attend: PagedAttend,
        k_cache: Sequence[torch.Tensor],
        v_cache: Sequence[torch.Tensor],
        capture: Sequence[int],
        captured: list[torch.Tensor] | None,
    ) -> torch.Tensor:
        """A prefill of prompts of different lengths in int8: each request's rows as a
        native call of their own. The native decoder takes uniform batches only, and the
        TorchScript layers would compute these rows in float32, so the precision -- and a
        request's bits -- would change with the prompts beside it; here they are the bits
        of the request prefilled alone."""
        assert self._native is not None
        batch = attend.batch
        outs: list[torch.Tensor] = []
        parts: list[list[torch.Tensor]] = [[] for _ in capture]
        start = 0
        for b, n in enumerate(batch.extend_lens.tolist()):
            end = start + n
            one = dataclasses.replace(
                batch,
                input_ids=batch.input_ids[start:end],
                positions=batch.positions[start:end],
                out_cache_loc=batch.out_cache_loc[start:end],
                req_pool_indices=batch.req_pool_indices[b : b + 1],
                prefix_lens=batch.prefix_lens[b : b + 1],
                extend_lens=batch.extend_lens[b : b + 1],
                max_prefix_len=int(batch.prefix_lens[b]),
                max_extend_len=n,
                equal_extend_lens=True,
            )
            got: list[torch.Tensor] = []
            outs.append(
                self._native.run(
                    lib,
                    args,
                    x[start:end],
                    rope._replace(cos=rope.cos[start:end], sin=rope.sin[start:end]),
                    PagedAttend.build(one),
                    list(k_cache),
                    list(v_cache),
                    None,
                    capture,
                    got if capture else None,
                )
            )
            for part, tensor in zip(parts, got, strict=False):
                part.append(tensor)
            start = end
        if captured is not None:
            captured.extend(torch.cat(part) for part in parts)
        return torch.cat(outs)

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
            and x.shape[0] <= native_max_tokens(self._dtype, _decoding(attend), self._native.int8)
        ):
            lib = native.native_decoder()
            if lib is not None:
                return self._native.run(
                    lib, args, x, rope, attend, k_cache, v_cache, None, capture, captured
                )
        if (
            self._native is not None
            and self._native.int8
            and meta.padded_index is not None
            and int(attend.batch.extend_lens.max()) <= native_max_tokens(self._dtype, False, True)
        ):
            lib = native.native_decoder()
            if lib is not None:
                return self._each_request(
                    lib, args, x, rope, attend, k_cache, v_cache, capture, captured
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


def cpu_path(model: Any) -> str:
    """The path a CPU decode of ``model`` (a LlamaForCausalLM laid out for the CPU) runs, in
    words, for ``relayc generate`` to print: the precision, what the layers' weights are
    read as, and the kernel or the CPU features that chose it."""
    lib = native.native_decoder()
    layers: ScriptedLayers | None = getattr(model, "scripted", None)
    weights = layers.native_weights() if layers is not None else None
    if lib is None or weights is None:
        return "float32 TorchScript or eager layers (the native decoder does not run them)"
    if weights.int8:
        kernel = native.INT8_KERNELS[lib.relayc_int8_kernel(-1)]
        return f"int8 dot products over the GGUF blocks ({kernel} kernel)"
    if weights.dtype == torch.bfloat16:
        return f"bfloat16 weights ({native.bf16_kernel(lib)} kernel)"
    cpu = ", ".join(build_features()) or "no AVX2"
    if weights.blocks:
        return f"float32 over the GGUF blocks (the fastest exact path here: {cpu})"
    return f"float32 panels ({cpu})"
