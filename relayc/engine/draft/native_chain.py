"""An EAGLE-3 head's greedy chain drafted in one native call (decoder.c's ``relayc_draft_chain``).

A chain that keeps every draft (``topk`` 1, ``num_draft_tokens = num_steps + 1``: the best
speculative rows on the real model) runs ``num_steps - 1`` head steps after the relayed
first draft. Step by step (``EagleHead._chain_tokens``), each made a dozen torch calls and
three native ones -- the scratch attention's mask and batch view, the d2t map and the
embedding, the two input norms, the rotary rows, the layer, the head, the softmax and its
top-1 -- every one of them right after a forward has streamed the weights through the
caches, where a torch call costs some 20 us. Here the whole chain is one call: the same
native functions on the same values (the norms, the layer, the head of the step-by-step
path), so the same drafts.

The one place the two could part is the pick. The step-by-step chain takes the top-1 of
the softmax, as the beam search does; the native call takes the greedy token of the
logits. They agree unless two logits nearly tie at the top, where rounding can make their
probabilities equal (the first index then wins the softmax's tie). The native call checks
every step's row for that (decoder.c's ``clear_top``) and hands such a chain back; so does
any bad index. The caller then drafts step by step, which decides the tie as before and
raises the error that names a bad index.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import torch

from relayc.engine import native
from relayc.engine.cpu_decoder import NativeHead, native_head_eligible, native_max_tokens
from relayc.engine.fused_forward import ModelSlot
from relayc.engine.kv_cache import KVCache
from relayc.kernels._backend import graph_safe

if TYPE_CHECKING:
    from relayc.engine.draft.eagle3 import Eagle3Head

_INDEX = torch.int64


class NativeChain:
    """One head's chains in one native call each (see the module docstring); keeps the
    filled model struct of its draft layer, draft cache, embedding, tables and head."""

    def __init__(self) -> None:
        self._slot = ModelSlot()

    def draft(
        self,
        head: Eagle3Head,
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
        lib = native.native_decoder()
        batch, steps = scratch_cache_loc.shape
        if (
            lib is None
            or graph_safe()  # checking the path a GPU captures: drafting step by step
            or torch.is_grad_enabled()
            or steps < 1
            or batch > native_max_tokens(torch.float32)
            or not _indices(first, seq_lens, req_pool_indices, scratch_cache_loc, head.d2t)
            or req_to_token.dtype != torch.int32
            or req_to_token.dim() != 2
            or not req_to_token.is_contiguous()
            or hidden_states.dtype != torch.float32
            or tuple(hidden_states.shape) != (batch, head.config.hidden_size)
            or first.numel() != batch
            or seq_lens.numel() != batch
            or req_pool_indices.numel() != batch
        ):
            return None
        layer = head.midlayer
        packed = layer.native.packed()
        norms = (layer.input_layernorm, layer.hidden_norm)
        if (
            packed is None
            or packed[0].dtype != torch.float32
            or not native_head_eligible(head.norm, head.lm_head)
            or any(
                n.weight.dtype != torch.float32
                or not n.weight.is_contiguous()
                or tuple(n.weight.shape) != (head.config.hidden_size,)
                for n in norms
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
        if model is None:
            return None
        tokens = torch.empty(batch, steps + 1, dtype=_INDEX)
        tokens[:, 0] = first
        hidden = hidden_states.contiguous()
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
            norms[0].weight.data_ptr(),
            float(norms[0].eps),
            norms[1].weight.data_ptr(),
            float(norms[1].eps),
            hidden.data_ptr(),
            tokens.data_ptr(),
        )
        if code == -1:
            raise MemoryError("the native draft chain could not allocate its buffers")
        return tokens if code == 0 else None


def _indices(*tensors: torch.Tensor) -> bool:
    """Each a contiguous int64 CPU tensor."""
    return all(t.dtype == _INDEX and t.device.type == "cpu" and t.is_contiguous() for t in tensors)
