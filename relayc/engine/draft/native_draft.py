"""An EAGLE-3 head's draft extend and greedy chain, each in one native call.

Both run on the CPU right after a target forward has streamed the weights through the
caches, where every torch call costs some 20 us; step by step, they were the largest part
of an EAGLE-3 iteration's Python (``bench/engine.py --steps``: some 1.2 ms the extend and
1 ms the chain of a 4-token chain, beside 1 ms for the rest of the step).

**Draft extend** (draft.c's ``relayc_draft_extend``, :meth:`NativeDraft.extend`): what
``Eagle3Head.extend`` runs as about twenty torch calls and four native ones -- the
accepted nodes' features gathered from the verify's (``feature_rows``), padding rows
zeroed, the padded batch's slots and positions, ``fc``, the embedding, the two input
norms, the attention metadata, the layer, the last real rows, the head -- in one call
with the same native functions on the same values: the same ``g``, logits and K/V bits.
The relayed top-k (a softmax and its top-k) stays in torch, so its probabilities keep
their bits.

**The chain** (draft.c's ``relayc_draft_chain``, :meth:`NativeDraft.chain`): a chain
that keeps every draft (``topk`` 1, ``num_draft_tokens = num_steps + 1``: the best
speculative rows on the real model) runs ``num_steps - 1`` head steps after the relayed
first draft. Step by step (``EagleHead._chain_tokens``), each made a dozen torch calls and
three native ones -- the scratch attention's mask and batch view, the d2t map and the
embedding, the two input norms, the rotary rows, the layer, the head, the softmax and its
top-1 -- every one of them right after a forward has streamed the weights through the
caches, where a torch call costs some 20 us. Here the whole chain is one call: the same
native functions on the same values (the norms, the layer, the head of the step-by-step
path), so the same drafts.

A bfloat16 head runs the same way: the calls round where the step-by-step path holds
bfloat16 tensors (``fc``'s output, each layer's output), widen the embedding's words, and
take the norms' weights as float32 (exact); the target's bfloat16 features are widened
before the call.

Anything a call does not take (autograd, a graph-safe check, more rows than the native
layers take, other index types) gets None, and the caller runs the step-by-step path.
The one place the chain's two paths could part is the pick. The step-by-step chain takes
the top-1 of the softmax, as the beam search does; the native call takes the greedy token
of the logits. They agree unless two logits nearly tie at the top, where rounding can make
their probabilities equal (the first index then wins the softmax's tie). The native call checks
every step's row for that (draft.c's ``clear_top``) and hands such a chain back; so does
any bad index. The caller then drafts step by step, which decides the tie as before and
raises the error that names a bad index.
"""

from __future__ import annotations

import ctypes
from typing import Protocol

import torch

from relayc.engine.core.config import ModelConfig
from relayc.engine.core.kv_cache import KVCache
from relayc.engine.core.layers import Linear, RMSNorm, RotaryEmbedding
from relayc.engine.decoder.fused_forward import ModelSlot, index_arrays
from relayc.engine.decoder.head import NativeHead, NativeLinear, native_head_eligible
from relayc.engine.decoder.packing import native_max_tokens
from relayc.engine.draft.layers import Eagle3Layer, TargetParts
from relayc.engine.native import head_argmax
from relayc.engine.native import library as native
from relayc.kernels._backend import native_paths

_INDEX = torch.int64


class NativeDraftHead(Protocol):
    """What the native drafter reads of an EAGLE-3 head (``Eagle3Head``, which holds this
    drafter and so sits above it), and the packs it keeps on the head."""

    config: ModelConfig
    target: TargetParts
    fc: Linear
    midlayer: Eagle3Layer
    norm: RMSNorm
    lm_head: Linear
    rotary: RotaryEmbedding
    d2t: torch.Tensor
    _native_head: NativeHead | None
    _native_fc: NativeLinear | None


class NativeDraft:
    """One head's draft extends and chains in one native call each (see the module
    docstring); keeps the filled model struct of its draft layer, draft cache, embedding,
    tables and head."""

    def __init__(self) -> None:
        self._slot = ModelSlot()
        # the draft layer's two input norms' weights as float32 (the calls read float32),
        # with what they were made from: (weight, its version) each
        self._norms: tuple[tuple[torch.Tensor, int], ...] = ()
        self._norm_weights: tuple[torch.Tensor, torch.Tensor] | None = None

    def _float_norms(self, head: NativeDraftHead) -> tuple[torch.Tensor, torch.Tensor]:
        """The input norm's and hidden norm's weights as float32 (themselves when they are
        float32 already), kept while the weights are unchanged."""
        weights = (head.midlayer.input_layernorm.weight, head.midlayer.hidden_norm.weight)
        key = tuple((w, w._version) for w in weights)
        known = self._norm_weights
        if known is None or any(
            a is not b or va != vb for (a, va), (b, vb) in zip(key, self._norms, strict=True)
        ):
            known = (weights[0].detach().float(), weights[1].detach().float())
            self._norms, self._norm_weights = key, known
        return known

    def __deepcopy__(self, memo: dict[int, object]) -> NativeDraft:
        """An empty one: the struct holds raw pointers into this head's tensors."""
        return NativeDraft()

    def _model(
        self, head: NativeDraftHead, kv_cache: KVCache, req_to_token: torch.Tensor, rows: int
    ) -> tuple[ctypes.CDLL, native.NativeModel] | None:
        """The library and the head's filled struct when a call over ``rows`` rows can run
        natively as the step-by-step path would (the CPU, autograd off, the layer and the
        head packed in one dtype, not a graph-safe check); else None."""
        lib = native.native_decoder()
        if (
            lib is None
            or not native_paths()  # checking the path a GPU captures: the step-by-step one
            or torch.is_grad_enabled()
            or rows > native_max_tokens(head.lm_head.weight.dtype)
            or req_to_token.dtype != torch.int32
            or req_to_token.dim() != 2
            or not req_to_token.is_contiguous()
        ):
            return None
        layer = head.midlayer
        packed = layer.native.packed()
        if (
            packed is None
            or packed[0].dtype != head.lm_head.weight.dtype
            or not native_head_eligible(head.norm, head.lm_head)
            or any(
                n.weight.dtype != packed[0].dtype
                or not n.weight.is_contiguous()
                or tuple(n.weight.shape) != (head.config.hidden_size,)
                for n in (layer.input_layernorm, layer.hidden_norm)
            )
        ):
            return None
        norm_head = head._native_head = NativeHead.reuse(head._native_head, head.norm, head.lm_head)
        model = self._slot.get(
            *packed,
            [kv_cache.k[0]],
            [kv_cache.v[0]],
            norm_head,
            head.target.embed_tokens.weight,
            (head.rotary.cos, head.rotary.signed_sin),
        )
        return None if model is None else (lib, model)

    def extend(
        self,
        head: NativeDraftHead,
        input_ids: torch.Tensor,
        target_features: torch.Tensor,
        lens: torch.Tensor,
        prefix_lens: torch.Tensor,
        req_pool_indices: torch.Tensor,
        req_to_token: torch.Tensor,
        kv_cache: KVCache,
        max_prefix_len: int,
        out_cache_loc: torch.Tensor | None,
        feature_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``Eagle3Head.extend``'s ``g [B, hidden]`` of each request's last real row and
        its logits ``[B, draft_vocab]``, in one native call (draft.c's
        ``relayc_draft_extend``; ``feature_rows`` as ``Eagle3Head.extend`` takes it); None:
        run it step by step."""
        batch, width = input_ids.shape
        if (
            not index_arrays(input_ids, lens, prefix_lens, req_pool_indices)
            or (
                out_cache_loc is not None
                and not (index_arrays(out_cache_loc) and out_cache_loc.shape == input_ids.shape)
            )
            or (
                feature_rows is not None
                and not (index_arrays(feature_rows) and feature_rows.shape == input_ids.shape)
            )
            or target_features.dtype not in (torch.float32, torch.bfloat16)
            or not target_features.is_contiguous()
            or target_features.dim() != 3
            or (feature_rows is None and target_features.shape[:2] != input_ids.shape)
            or not lens.numel() == prefix_lens.numel() == req_pool_indices.numel() == batch
            or head.fc.weight.dtype != head.lm_head.weight.dtype
            or head.fc.weight.device.type != "cpu"
            or tuple(head.fc.weight.shape) != (head.config.hidden_size, target_features.shape[2])
        ):
            return None
        made = self._model(head, kv_cache, req_to_token, batch * width)
        if made is None:
            return None
        lib, model = made
        fc = head._native_fc = NativeLinear.reuse(head._native_fc, head.fc)
        norms = (head.midlayer.input_layernorm, head.midlayer.hidden_norm)
        norm_weights = self._float_norms(head)
        features = target_features.float()  # bfloat16 features widened (exact)
        g = torch.empty(batch, model.hidden)
        logits = torch.empty(batch, model.vocab_padded)
        argmax = torch.empty(batch, dtype=_INDEX)
        code = lib.relayc_draft_extend(
            ctypes.byref(model),
            batch,
            width,
            max_prefix_len,
            req_to_token.data_ptr(),
            req_to_token.shape[0],
            req_to_token.shape[1],
            req_pool_indices.data_ptr(),
            prefix_lens.data_ptr(),
            lens.data_ptr(),
            None if out_cache_loc is None else out_cache_loc.data_ptr(),
            input_ids.data_ptr(),
            features.data_ptr(),
            features.shape[2],
            None if feature_rows is None else feature_rows.data_ptr(),
            features.shape[0] * features.shape[1],
            fc.packed.data_ptr(),
            fc.format,
            norm_weights[0].data_ptr(),
            float(norms[0].eps),
            norm_weights[1].data_ptr(),
            float(norms[1].eps),
            g.data_ptr(),
            logits.data_ptr(),
            argmax.data_ptr(),
        )
        if code == -1:
            raise MemoryError("the native draft extend could not allocate its buffers")
        if code != 0:
            return None
        if model.vocab_padded != model.vocab:
            logits = logits[:, : model.vocab].contiguous()
        head_argmax.remember(logits, argmax)
        return g.to(head.lm_head.weight.dtype), logits  # float32: the same tensor

    def chain(
        self,
        head: NativeDraftHead,
        first: torch.Tensor,
        hidden_states: torch.Tensor,
        seq_lens: torch.Tensor,
        req_pool_indices: torch.Tensor,
        req_to_token: torch.Tensor,
        kv_cache: KVCache,
        scratch_cache_loc: torch.Tensor,
        max_prefix_len: int,
    ) -> torch.Tensor | None:
        """The chain's draft ids ``[B, steps + 1]`` (``first [B]`` then one per scratch
        column of ``scratch_cache_loc [B, steps]``), as ``EagleHead._chain_tokens`` drafts
        them with the greedy pick; None: draft it step by step (no library, a layout or
        dtype the call does not take, a near tie, a bad index)."""
        batch, steps = scratch_cache_loc.shape
        # A batch's scratch columns are a slice of the step's wider slot table; the call
        # reads them as rows of ``steps``.
        scratch_cache_loc = scratch_cache_loc.contiguous()
        if (
            steps < 1
            or not index_arrays(first, seq_lens, req_pool_indices, scratch_cache_loc, head.d2t)
            or hidden_states.dtype not in (torch.float32, torch.bfloat16)
            or tuple(hidden_states.shape) != (batch, head.config.hidden_size)
            or not first.numel() == seq_lens.numel() == req_pool_indices.numel() == batch
        ):
            return None
        made = self._model(head, kv_cache, req_to_token, batch)
        if made is None:
            return None
        lib, model = made
        norms = (head.midlayer.input_layernorm, head.midlayer.hidden_norm)
        norm_weights = self._float_norms(head)
        tokens = torch.empty(batch, steps + 1, dtype=_INDEX)
        tokens[:, 0] = first
        hidden = hidden_states.float().contiguous()
        code = lib.relayc_draft_chain(
            ctypes.byref(model),
            batch,
            steps,
            max_prefix_len,
            req_to_token.data_ptr(),
            req_to_token.shape[0],
            req_to_token.shape[1],
            req_pool_indices.data_ptr(),
            seq_lens.data_ptr(),
            scratch_cache_loc.data_ptr(),
            head.d2t.data_ptr(),
            norm_weights[0].data_ptr(),
            float(norms[0].eps),
            norm_weights[1].data_ptr(),
            float(norms[1].eps),
            hidden.data_ptr(),
            tokens.data_ptr(),
        )
        if code == -1:
            raise MemoryError("the native draft chain could not allocate its buffers")
        return tokens if code == 0 else None
