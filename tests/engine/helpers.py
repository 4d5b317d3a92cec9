"""A minimal driver of the model on the paged cache, playing the scheduler's part in tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

import relayc.engine.decoder.packing as packing_module
from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.core.kv_cache import KVCache, ReqToTokenPool, TokenToKVPool
from relayc.engine.decoder.fused_forward import FusedForward
from relayc.engine.model.llama import LlamaForCausalLM


def record_native_forwards(
    monkeypatch: pytest.MonkeyPatch, record: Callable[[int, torch.dtype], None]
) -> None:
    """``record(tokens, dtype)`` for every forward whose layers the native decoder ran: the
    layers' own call (``NativeWeights.run``, dtype that of its input) and a decode or verify
    made in one call (``FusedForward.run``, dtype the weights')."""
    real_run = packing_module.NativeWeights.run
    real_fused = FusedForward.run

    def run(self: Any, lib: Any, args: Any, x: torch.Tensor, *rest: Any) -> torch.Tensor:
        record(x.shape[0], x.dtype)
        return real_run(self, lib, args, x, *rest)

    def fused(self: FusedForward, batch: ForwardBatch, *rest: Any) -> Any:
        made = real_fused(self, batch, *rest)
        if made is not None:
            record(batch.input_ids.numel(), made[1].dtype)
        return made

    monkeypatch.setattr(packing_module.NativeWeights, "run", run)
    monkeypatch.setattr(FusedForward, "run", fused)


class PagedDriver:
    """Owns the pools; ``shuffle_seed`` scrambles the KV free list so slots are non-contiguous."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_size: int = 1024,
        req_slots: int = 8,
        max_context: int = 256,
        shuffle_seed: int | None = None,
    ) -> None:
        self.model = model
        self.kv_cache = KVCache.for_model(model.config, kv_size, model.device)
        self.req_pool = ReqToTokenPool(req_slots, max_context, model.device)
        self.kv_pool = TokenToKVPool(kv_size, model.device, check=True)
        if shuffle_seed is not None:
            everything = self.kv_pool.alloc(kv_size)
            assert everything is not None
            order = torch.randperm(kv_size, generator=torch.Generator().manual_seed(shuffle_seed))
            self.kv_pool.free(everything[order.to(everything.device)])
        self.lens: dict[int, int] = {}

    def new_request(self) -> int:
        slots = self.req_pool.alloc(1)
        assert slots is not None
        self.lens[slots[0]] = 0
        return slots[0]

    def _alloc(self, n: int) -> torch.Tensor:
        slots = self.kv_pool.alloc(n)
        assert slots is not None, "test KV pool too small"
        return slots

    def _commit(self, reqs: Sequence[int], counts: Sequence[int], slots: torch.Tensor) -> None:
        offset = 0
        for req, n in zip(reqs, counts, strict=True):
            start = self.lens[req]
            self.req_pool.req_to_token[req, start : start + n] = slots[offset : offset + n].int()
            self.lens[req] = start + n
            offset += n

    def extend(
        self, reqs: Sequence[int], chunks: Sequence[Sequence[int]], all_logits: bool = True
    ) -> torch.Tensor:
        """Run and commit ``chunks[i]`` after the cached tokens of ``reqs[i]``."""
        counts = [len(c) for c in chunks]
        slots = self._alloc(sum(counts))
        batch = ForwardBatch.build(
            ForwardMode.EXTEND,
            chunks,
            reqs,
            [self.lens[r] for r in reqs],
            slots,
            self.req_pool.req_to_token,
            self.kv_cache,
            return_all_logits=all_logits,
        )
        logits = self.model(batch).logits
        self._commit(reqs, counts, slots)
        return logits

    def decode(self, reqs: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
        """One token per request -> logits ``[B, vocab]``, committed."""
        slots = self._alloc(len(reqs))
        batch = ForwardBatch.build(
            ForwardMode.DECODE,
            [[t] for t in tokens],
            reqs,
            [self.lens[r] for r in reqs],
            slots,
            self.req_pool.req_to_token,
            self.kv_cache,
        )
        logits = self.model(batch).logits
        self._commit(reqs, [1] * len(reqs), slots)
        return logits

    def verify(
        self,
        reqs: Sequence[int],
        tokens: Sequence[Sequence[int]],
        depths: Sequence[Sequence[int]],
        tree_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Score a draft tree per request ``[B * N, vocab]``; nothing is committed."""
        prefix = [self.lens[r] for r in reqs]
        slots = self._alloc(sum(len(t) for t in tokens))
        batch = ForwardBatch.build(
            ForwardMode.VERIFY,
            tokens,
            reqs,
            prefix,
            slots,
            self.req_pool.req_to_token,
            self.kv_cache,
            positions=[[p + d for d in row] for p, row in zip(prefix, depths, strict=True)],
            tree_mask=tree_mask,
        )
        logits = self.model(batch).logits
        self.kv_pool.free(slots)
        return logits
