"""Attention metadata made by one native call (paged_meta.c's ``relayc_paged_meta``) against the
torch path it stands in for: the same key slots and the same additive mask, bit for bit."""

from __future__ import annotations

import pytest
import torch

from relayc.engine.core.attention import PagedAttentionMetadata
from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.core.kv_cache import KVCache
from relayc.engine.native import library as native


def _batch(
    mode: ForwardMode,
    prefix: list[int],
    queries: int,
    *,
    p_max: int | None = None,
    tree_seed: int | None = None,
    cache_dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> ForwardBatch:
    """A uniform batch (``queries`` new tokens per request) over a scrambled req_to_token."""
    g = torch.Generator().manual_seed(seed)
    bs = len(prefix)
    table = torch.randint(0, 1000, (9, 64), generator=g, dtype=torch.int32)
    rows = torch.randperm(8, generator=g)[:bs] + 1
    tree = None
    if mode is ForwardMode.VERIFY:
        tree = (
            torch.rand(
                bs, queries, queries, generator=torch.Generator().manual_seed(tree_seed or 0)
            )
            < 0.5
        )
        tree |= torch.eye(queries, dtype=torch.bool)  # every row sees itself
    lens = torch.tensor(prefix, dtype=torch.int64)
    return ForwardBatch(
        mode=mode,
        input_ids=torch.zeros(bs * queries, dtype=torch.int64),
        positions=torch.zeros(bs * queries, dtype=torch.int64),
        out_cache_loc=torch.randint(0, 1000, (bs * queries,), generator=g),
        req_pool_indices=rows.to(torch.int64),
        prefix_lens=lens,
        extend_lens=torch.full((bs,), queries, dtype=torch.int64),
        max_prefix_len=max(prefix) if p_max is None else p_max,
        max_extend_len=queries,
        req_to_token=table,
        kv_cache=KVCache(1, 1000, 1, 4, cache_dtype),
        tree_mask=tree,
        equal_extend_lens=mode is ForwardMode.EXTEND,
    )


def _torch_path(batch: ForwardBatch, monkeypatch: pytest.MonkeyPatch) -> PagedAttentionMetadata:
    with monkeypatch.context() as m:
        m.setattr(PagedAttentionMetadata, "_native_uniform", classmethod(lambda cls, b: None))
        return PagedAttentionMetadata.build(batch)


def _same(got: PagedAttentionMetadata, want: PagedAttentionMetadata) -> None:
    assert torch.equal(got.kv_loc, want.kv_loc) and got.kv_loc.dtype == want.kv_loc.dtype
    assert got.mask.dtype == want.mask.dtype and got.mask.shape == want.mask.shape
    assert torch.equal(got.mask, want.mask)
    assert (got.batch_size, got.max_extend_len) == (want.batch_size, want.max_extend_len)
    assert got.padded_index is got.token_req is got.token_row is None


@pytest.fixture
def native_meta(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the native metadata calls that returned a result."""
    assert native.native_decoder() is not None, "the native library should build here"
    made: list[int] = []
    real = PagedAttentionMetadata._native_uniform.__func__  # type: ignore[attr-defined]

    def counted(cls: type, batch: ForwardBatch) -> PagedAttentionMetadata | None:
        out = real(cls, batch)
        if out is not None:
            made.append(batch.batch_size)
        return out

    monkeypatch.setattr(PagedAttentionMetadata, "_native_uniform", classmethod(counted))
    return made


@pytest.mark.parametrize(
    ("mode", "prefix", "queries", "p_max"),
    [
        (ForwardMode.DECODE, [5], 1, None),
        (ForwardMode.DECODE, [3, 17, 0, 40], 1, None),
        (ForwardMode.DECODE, [3, 17], 1, 50),  # a loose bound: columns past every prefix
        (ForwardMode.VERIFY, [7, 2, 30], 4, None),
        (ForwardMode.VERIFY, [0], 8, 12),
        (ForwardMode.EXTEND, [4, 9], 3, None),  # a padded extend: causal new tokens
    ],
)
def test_native_metadata_equals_the_torch_path(
    mode: ForwardMode,
    prefix: list[int],
    queries: int,
    p_max: int | None,
    native_meta: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for seed in range(3):
        batch = _batch(mode, prefix, queries, p_max=p_max, tree_seed=seed, seed=seed)
        got = PagedAttentionMetadata.build(batch)
        _same(got, _torch_path(batch, monkeypatch))
    assert len(native_meta) == 3, "the native path should have made every one"


def test_native_metadata_in_the_cache_dtype(
    native_meta: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = _batch(ForwardMode.VERIFY, [6, 11], 3, cache_dtype=torch.bfloat16)
    got = PagedAttentionMetadata.build(batch)
    assert got.mask.dtype == torch.bfloat16
    _same(got, _torch_path(batch, monkeypatch))
    assert native_meta == [2]


def test_prefix_lengths_past_the_bound_see_every_column(
    native_meta: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefix length over ``max_prefix_len`` sees all of its columns, as in torch."""
    batch = _batch(ForwardMode.DECODE, [9, 30], 1, p_max=20)
    got = PagedAttentionMetadata.build(batch)
    _same(got, _torch_path(batch, monkeypatch))
    assert bool((got.mask[1, 0, 0, :21] == 0).all())


def test_bad_rows_and_other_layouts_take_the_torch_path(
    native_meta: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request row outside the table is the torch path's IndexError; a negative one its
    wrapped row; an int64 table or a strided index its result -- never the native call's."""
    batch = _batch(ForwardMode.DECODE, [3, 5], 1)
    batch.req_pool_indices = torch.tensor([1, 40])
    with pytest.raises(IndexError):
        PagedAttentionMetadata.build(batch)
    batch.req_pool_indices = torch.tensor([1, -2])
    _same(PagedAttentionMetadata.build(batch), _torch_path(batch, monkeypatch))
    batch.req_pool_indices = torch.tensor([1, 2])
    batch.req_to_token = batch.req_to_token.long()
    _same(PagedAttentionMetadata.build(batch), _torch_path(batch, monkeypatch))
    batch.req_to_token = batch.req_to_token.int()
    batch.req_pool_indices = torch.tensor([[1, 9], [2, 9]])[:, 0]
    _same(PagedAttentionMetadata.build(batch), _torch_path(batch, monkeypatch))
    assert native_meta == []


def test_a_wrong_tree_mask_is_refused_before_either_path(native_meta: list[int]) -> None:
    batch = _batch(ForwardMode.VERIFY, [4], 3)
    batch.tree_mask = torch.ones(1, 2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"tree_mask \[B, N, N\] = \[1, 3, 3\]"):
        PagedAttentionMetadata.build(batch)
    assert native_meta == []
