"""The KV compaction after a verify in one native call (verify.c's ``relayc_compact``,
``relayc.engine.ops.verify._native_compact``): the K/V every layer ends with, the
``req_to_token`` entries and the new lengths of the torch path; indices it refuses go the
torch way, which raises."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from relayc.engine.core.kv_cache import KVCache
from relayc.engine.native import library as native
from relayc.engine.ops.verify import _native_compact, impl_compact_accepted_kv
from relayc.kernels._backend import graph_safe_paths


def _state(seed: int, dtype: torch.dtype) -> tuple[SimpleNamespace, dict[str, torch.Tensor]]:
    """Three requests with verify windows of 5 over shuffled slots, random accepted paths
    (the root first, then distinct nodes in any order), random K/V."""
    gen = torch.Generator().manual_seed(seed)
    batch, n, width = 3, 5, 8
    cache = KVCache(2, 40, 2, 4, dtype=dtype)
    cache.buffer.copy_(torch.randn(cache.buffer.shape, generator=gen).to(dtype))
    slots = torch.randperm(40, generator=gen)[: batch * width] + 1
    accept_index = torch.full((batch, n), -1, dtype=torch.int64)
    accept_lens = torch.zeros(batch, dtype=torch.int32)
    for b in range(batch):
        path = [0, *(1 + torch.randperm(n - 1, generator=gen)).tolist()][: 1 + b + seed % 2]
        accept_index[b, : len(path)] = torch.tensor(path) + b * n
        accept_lens[b] = len(path)
    ctx = SimpleNamespace(
        kv_cache=cache,
        req_to_token=torch.zeros(6, 32, dtype=torch.int32),
        out_cache_loc=slots.view(batch, width),  # each window is the front of its row
    )
    inputs = {
        "accept_index": accept_index,
        "accept_lens": accept_lens,
        "seq_lens": torch.tensor([3, 0, 20]),
        "req_pool_indices": torch.tensor([4, 1, 2]),
    }
    return ctx, inputs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_native_compaction_is_the_torch_path(
    seed: int, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert native.native_decoder() is not None, "the native decoder should build here"
    calls: list[int] = []
    lib = native.native_decoder()
    real = lib.relayc_compact

    def counted(*args: object) -> int:
        calls.append(int(real(*args)))
        return calls[-1]

    monkeypatch.setattr(lib, "relayc_compact", counted)
    ctx, inputs = _state(seed, dtype)
    got = impl_compact_accepted_kv(ctx, **inputs)  # type: ignore[arg-type]
    assert calls == [0]
    want_ctx, want_inputs = _state(seed, dtype)
    with graph_safe_paths():  # the torch path, every slot copied
        want = impl_compact_accepted_kv(want_ctx, **want_inputs)  # type: ignore[arg-type]
    assert len(calls) == 1
    assert torch.equal(got["new_seq_lens"], want["new_seq_lens"])
    assert got["new_seq_lens"].dtype == want["new_seq_lens"].dtype
    assert torch.equal(ctx.req_to_token, want_ctx.req_to_token)
    assert torch.equal(ctx.kv_cache.buffer, want_ctx.kv_cache.buffer)
    moved = int((inputs["accept_index"][:, 1:] >= 0).sum())
    assert moved == 0 or not torch.equal(
        ctx.kv_cache.buffer, _state(seed, dtype)[0].kv_cache.buffer
    )


def test_a_window_past_req_to_token_is_refused_and_raises_the_torch_error() -> None:
    ctx, inputs = _state(0, torch.float32)
    inputs["seq_lens"] = torch.tensor([3, 0, 30])  # 30 + 5 positions past the 32 columns
    before = ctx.kv_cache.buffer.clone()
    window = ctx.out_cache_loc[:, :5]
    assert _native_compact(ctx, window, **inputs) is None  # type: ignore[arg-type]
    assert torch.equal(ctx.kv_cache.buffer, before)  # nothing written
    assert torch.equal(ctx.req_to_token, torch.zeros(6, 32, dtype=torch.int32))
    with pytest.raises(IndexError):
        impl_compact_accepted_kv(ctx, **inputs)  # type: ignore[arg-type]
