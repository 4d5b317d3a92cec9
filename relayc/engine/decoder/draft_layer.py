"""An EAGLE-3 draft head's decoder layer as native calls (``NativeDraftLayer``): its two
input norms in one call, the layer in another, packed as a one-layer stack."""

from __future__ import annotations

import copy
import ctypes
from typing import TYPE_CHECKING, Any

import torch

from relayc.engine.core.attention import PagedAttend
from relayc.engine.decoder.packing import (
    NATIVE_DTYPES,
    NativeWeights,
    _layer_blocks,
    _Stamps,
    _stamps,
    _unchanged,
    native_max_tokens,
)
from relayc.engine.native import library as native

if TYPE_CHECKING:
    from relayc.engine.core.layers import RopeTables


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
