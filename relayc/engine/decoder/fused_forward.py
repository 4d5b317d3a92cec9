"""A decode or verify forward of the CPU model in one native call (forward.c's ``relayc_forward``).

Run op by op, such a forward made three native calls -- the attention metadata, the layers,
the LM head with its argmax -- and some thirty torch calls and Python checks around them:
the embedding lookup, the rotary rows, the conversions and shape checks of each call. Those
cost little back to back, but every forward streams the model's weights (96 MB for
SmolLM2's Q4_1 file) through the caches, and right after it each of them runs cold: on
SmolLM2 the forward's own Python took 0.6-0.9 ms an iteration beside 15 ms of native
compute (``bench/engine.py --steps``). Here the per-model part -- every pointer the layers,
caches, embedding, rotary tables and head need -- is filled once into a
:class:`relayc.engine.native.library.NativeModel` and kept while it stays current; a forward then
checks its batch, makes its outputs and calls once. The same bits as the calls made one by
one: the same functions run inside, on the same inputs.

Any batch it does not take (an extend, a large or mixed one, other index types, autograd on,
a model whose layers or head do not run natively) gets None, and the caller runs the usual
path. So does a bad index -- a token id, position, request row or KV slot out of range --
which the native call finds before it writes anything: the usual path then raises the error
that names it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import torch

from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.decoder.cpu_decoder import ScriptedLayers
from relayc.engine.decoder.head import NativeHead
from relayc.engine.decoder.packing import NativeWeights, native_max_tokens
from relayc.engine.native import head_argmax
from relayc.engine.native import library as native

_INDEX = torch.int64


def index_arrays(*tensors: torch.Tensor) -> bool:
    """Each a contiguous int64 CPU tensor: what the one-call entry points (the draft's, the
    greedy accept's, the compaction's) read as ``int64_t`` arrays; False: the caller runs
    its torch path."""
    return all(t.dtype == _INDEX and t.device.type == "cpu" and t.is_contiguous() for t in tensors)


class ModelSlot:
    """A :class:`relayc.engine.native.library.NativeModel` of one set of packed layers, K/V caches,
    embedding, rotary tables and LM head: filled once, kept while each is the same object
    and its data unchanged, refilled otherwise. The struct holds (``held``) every object it
    points into, so a call that holds the struct keeps its pointers valid while the slot
    refills for another call (another engine's caches, on another thread)."""

    def __init__(self) -> None:
        self._model: native.NativeModel | None = None
        self._keep: tuple[object, ...] = ()  # what the NativeModel points into
        self._stamps: tuple[int, ...] = ()

    def get(
        self,
        weights: NativeWeights,
        args: dict[str, Any],
        k_cache: list[torch.Tensor],
        v_cache: list[torch.Tensor],
        head: NativeHead,
        embed: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
    ) -> native.NativeModel | None:
        """The struct for the layers ``weights`` (their ``args``: heads, kv_heads,
        head_dim, intermediate) over ``k_cache`` / ``v_cache`` (one per layer), the
        embedding ``embed [vocab, hidden]``, the tables ``rotary`` (cos, signed sin) and
        ``head``; None where one of them does not fit the native call (another dtype, a
        layout it does not read)."""
        if len(k_cache) != len(weights.tensors["ln1"]) or k_cache[0].dtype != weights.dtype:
            return None
        pointers = weights.cache_pointers(k_cache, v_cache, (args["kv_heads"], args["head_dim"]))
        cos, sin = rotary
        held = (weights, head, pointers, embed, cos, sin)
        stamps = (embed.data_ptr(), embed._version, cos.data_ptr(), sin.data_ptr())
        if (
            self._stamps == stamps
            and len(self._keep) == len(held)
            and all(a is b for a, b in zip(self._keep, held, strict=True))
        ):
            return self._model
        self._model, self._keep, self._stamps = None, held, stamps
        dtype = weights.dtype
        hidden = int(embed.shape[1]) if embed.dim() == 2 else -1
        if (
            embed.dim() != 2
            or embed.device.type != "cpu"
            or embed.dtype != dtype
            or not embed.is_contiguous()
            or hidden != head.width
            or head.dtype != dtype
            or not all(t.dtype == torch.float32 and t.is_contiguous() for t in (cos, sin))
            or cos.shape != sin.shape
            or cos.shape[1] != args["head_dim"]
        ):
            return None
        self._model = native.NativeModel(
            hidden=hidden,
            heads=args["heads"],
            kv_heads=args["kv_heads"],
            head_dim=args["head_dim"],
            inter=args["intermediate"],
            layers=len(weights.tensors["ln1"]),
            kind=2 if weights.blocks else 0 if dtype == torch.float32 else 1,
            formats=ctypes.addressof(weights.format_array) if weights.blocks else None,
            **{
                name: ctypes.addressof(array)
                for name, array in zip(weights.ARRAY_NAMES, weights.arrays, strict=True)
            },
            eps1=ctypes.addressof(weights.eps[0]),
            eps2=ctypes.addressof(weights.eps[1]),
            k_cache=ctypes.addressof(pointers.k),
            v_cache=ctypes.addressof(pointers.v),
            cache_rows=pointers.rows,
            embed=embed.data_ptr(),
            embed_bf16=int(dtype == torch.bfloat16),
            vocab_rows=embed.shape[0],
            cos_table=cos.data_ptr(),
            sin_table=sin.data_ptr(),
            max_position=cos.shape[0],
            norm_weight=head.weight.data_ptr(),
            norm_eps=float(head.norm.eps),
            head=head.packed.data_ptr(),
            head_format=head.format or (0 if dtype == torch.float32 else -1),
            vocab=head.vocab,
            vocab_padded=head.padded,
        )
        # The struct holds what it points into, so a caller holding it (another thread's
        # call, while this slot refills for other caches) keeps every pointer valid.
        self._model.held = held
        return self._model


class FusedForward:
    """One model's decode and verify forwards in one native call each; see the module
    docstring. ``run`` returns ``(logits [T, vocab] float32, hidden [T, H], aux)`` or None."""

    def __deepcopy__(self, memo: dict[int, Any]) -> FusedForward:
        """An empty one: the struct holds raw pointers into this model's tensors."""
        return FusedForward()

    def __init__(self) -> None:
        self._slot = ModelSlot()
        self._captures: dict[tuple[int, ...], ctypes.Array[ctypes.c_int]] = {}

    @staticmethod
    def takes(batch: ForwardBatch, layers: int) -> bool:
        """Whether ``batch`` has the shape and index types the one call takes (the weights,
        caches and row count are checked by :meth:`run`)."""
        if batch.mode is ForwardMode.EXTEND or torch.is_grad_enabled():
            return False
        ids, cache = batch.input_ids, batch.kv_cache
        rows, table, tree = batch.req_pool_indices, batch.req_to_token, batch.tree_mask
        tokens = ids.numel()
        return (
            ids.device.type == "cpu"
            and tokens == rows.numel() * batch.max_extend_len
            and len(cache.k) == layers
            and table.dtype == torch.int32
            and table.dim() == 2
            and table.is_contiguous()
            and all(
                t.dtype == _INDEX and t.is_contiguous() and t.numel() == n
                for t, n in (
                    (ids, tokens),
                    (batch.positions, tokens),
                    (batch.out_cache_loc, tokens),
                    (rows, rows.numel()),
                    (batch.prefix_lens, rows.numel()),
                )
            )
            and (
                batch.mode is ForwardMode.DECODE
                or (
                    tree is not None
                    and tree.dtype == torch.bool
                    and tree.is_contiguous()
                    and tuple(tree.shape)
                    == (rows.numel(), batch.max_extend_len, batch.max_extend_len)
                )
            )
        )

    def _native_model(
        self,
        scripted: ScriptedLayers,
        head: NativeHead,
        embed: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        batch: ForwardBatch,
    ) -> native.NativeModel | None:
        weights, args = scripted.native_weights(), scripted.args()
        if weights is None or args is None:
            return None
        cache = batch.kv_cache
        return self._slot.get(weights, args, cache.k, cache.v, head, embed, rotary)

    def run(
        self,
        batch: ForwardBatch,
        capture: Sequence[int],
        scripted: ScriptedLayers,
        head: NativeHead,
        embed: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        """The forward of ``batch`` (which :meth:`takes`): ``embed``'s rows, the rotary
        tables ``rotary`` (cos, signed sin), the layers with the inputs of the ``capture``
        layers (ascending) side by side as ``aux``, then ``head``; None: run the usual
        path."""
        lib = native.native_decoder()
        model = self._native_model(scripted, head, embed, rotary, batch) if lib else None
        if lib is None or model is None:
            return None
        dtype = scripted.dtype
        bs, queries = batch.batch_size, batch.max_extend_len
        tokens, width = bs * queries, model.hidden
        weights = scripted.native_weights()
        int8 = weights is not None and weights.int8
        if tokens > min(native_max_tokens(dtype, True, int8), head_argmax.MAX_ROWS):
            return None
        captures = tuple(capture)
        ids = self._captures.get(captures)
        if ids is None:
            ids = self._captures[captures] = (ctypes.c_int * max(len(captures), 1))(*captures)
        aux = torch.empty(tokens, len(captures) * width) if captures else None
        x = torch.empty(tokens, width)
        logits = torch.empty(tokens, model.vocab_padded)
        argmax = torch.empty(tokens, dtype=_INDEX)
        table, tree = batch.req_to_token, batch.tree_mask
        code = lib.relayc_forward(
            ctypes.byref(model),
            bs,
            queries,
            batch.max_prefix_len,
            table.data_ptr(),
            table.shape[0],
            table.shape[1],
            batch.req_pool_indices.data_ptr(),
            batch.prefix_lens.data_ptr(),
            batch.out_cache_loc.data_ptr(),
            tree.data_ptr() if batch.mode is ForwardMode.VERIFY and tree is not None else None,
            batch.input_ids.data_ptr(),
            batch.positions.data_ptr(),
            ids,
            len(captures),
            None if aux is None else aux.data_ptr(),
            x.data_ptr(),
            logits.data_ptr(),
            argmax.data_ptr(),
        )
        if code in (-2, -3, -4, -5, -6):
            return None  # a bad index, found before any write: the usual path names it
        if code != 0:
            raise RuntimeError(f"the native forward failed (code {code})")
        if model.vocab_padded != model.vocab:
            logits = logits[:, : model.vocab].contiguous()
        head_argmax.remember(logits, argmax)
        if dtype != torch.float32:
            x = x.to(dtype)
            aux = None if aux is None else aux.to(dtype)
        return logits, x, aux
