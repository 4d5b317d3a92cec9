"""Request-slot and KV-slot allocators."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from relayc.engine.core.config import ModelConfig
from relayc.engine.core.kv_cache import KVCache, ReqToTokenPool, TokenToKVPool


def test_kv_pool_hands_out_every_slot_but_zero_then_reports_full() -> None:
    pool = TokenToKVPool(10, check=True)
    first, second = pool.alloc(4), pool.alloc(6)
    assert first is not None and second is not None
    assert sorted(torch.cat([first, second]).tolist()) == list(range(1, 11))
    assert pool.alloc(1) is None and pool.available_size() == 0
    pool.free(first)
    assert pool.alloc(5) is None  # a failed alloc takes nothing
    again = pool.alloc(4)
    assert again is not None and sorted(again.tolist()) == sorted(first.tolist())


def test_kv_pool_check_catches_double_free_and_padding_slot() -> None:
    pool = TokenToKVPool(4, check=True)
    slots = pool.alloc(2)
    assert slots is not None
    pool.free(slots)
    with pytest.raises(ValueError, match="twice"):
        pool.free(slots[:1])
    with pytest.raises(ValueError, match=r"1\.\.4"):
        pool.free(torch.tensor([0]))
    pool.free(torch.tensor([], dtype=torch.int64))
    assert pool.available_size() == 4


def test_kv_pool_is_first_freed_first_reused_and_never_rewrites_slots_in_use() -> None:
    """Slots come back in the order they were freed, through many refills of the free
    list's buffer, and a tensor ``alloc`` returned keeps its values while it is held; the
    host's NumPy views (``alloc_host``, ``free_host``) are the same slots throughout."""
    size = 7
    pool = TokenToKVPool(size, check=True)
    order = list(range(1, size + 1))  # the free list as a plain list
    held: list[tuple[torch.Tensor, np.ndarray | None, list[int]]] = []
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        coin = torch.rand(1, generator=g).item()
        if held and (len(order) < 3 or coin < 0.5):
            slots, host, values = held.pop(int(torch.randint(len(held), (1,), generator=g)))
            assert slots.tolist() == values  # nothing wrote it while it was held
            assert host is None or host.tolist() == values
            keep = int(torch.randint(len(values) + 1, (1,), generator=g))
            if host is not None and coin < 0.25:
                pool.free_host(host[keep:])  # the scheduler's way on the CPU
            else:
                pool.free(slots[keep:])  # a verify's unaccepted tail
            order += values[keep:]
            if keep:
                held.append((slots[:keep], None if host is None else host[:keep], values[:keep]))
        else:
            n = int(torch.randint(1, len(order) + 1, (1,), generator=g))
            if coin < 0.75:
                taken = pool.alloc_host(n)
                assert taken is not None
                slots, host = taken
                assert host is not None  # the CPU
            else:
                slots, host = pool.alloc(n), None
            assert slots is not None and slots.tolist() == order[:n]
            order = order[n:]
            held.append((slots, host, slots.tolist()))
        assert pool.available_size() == len(order)
    for slots, host, values in held:
        assert slots.tolist() == values
        assert host is None or host.tolist() == values


def test_kv_pool_host_free_is_checked_as_free_is() -> None:
    pool = TokenToKVPool(4, check=True)
    taken = pool.alloc_host(2)
    assert taken is not None and taken[1] is not None
    pool.free_host(taken[1])
    with pytest.raises(ValueError, match="twice"):
        pool.free_host([int(taken[1][0])])
    with pytest.raises(ValueError, match=r"1\.\.4"):
        pool.free_host([5])
    pool.free_host([])
    assert pool.available_size() == 4
    assert pool.alloc_host(5) is None


def test_req_pool_host_table_is_the_table() -> None:
    pool = ReqToTokenPool(3, 16)
    assert pool.host_table is not None
    pool.host_table[2, 5] = 41
    assert int(pool.req_to_token[2, 5]) == 41
    pool.reset()  # keeps the storage the view reads
    assert int(pool.host_table[2, 5]) == 0
    pool.req_to_token[1, 1] = 7
    assert int(pool.host_table[1, 1]) == 7


def test_req_pool_never_hands_out_slot_zero() -> None:
    pool = ReqToTokenPool(3, max_context=16)
    assert pool.req_to_token.shape == (4, 16) and pool.req_to_token.dtype == torch.int32
    taken = pool.alloc(3)
    assert taken is not None and sorted(taken) == [1, 2, 3]
    assert pool.alloc(1) is None
    pool.free(taken[1])
    assert pool.alloc(1) == [taken[1]]
    with pytest.raises(ValueError, match="outside"):
        pool.free(0)
    with pytest.raises(ValueError, match="twice"):
        pool.free([taken[0], taken[0]])
    pool.free(taken[0])
    with pytest.raises(ValueError, match="twice"):
        pool.free(taken[0])


def test_kv_cache_layout_and_write() -> None:
    config = ModelConfig(num_layers=2, num_kv_heads=2, head_dim=8)
    cache = KVCache.for_model(config, size=5)
    assert len(cache.k) == 2 and cache.k[0].shape == (6, 2, 8)
    k = torch.randn(2, 2, 8)
    cache.write(1, torch.tensor([4, 2]), k, -k)
    assert torch.equal(cache.k[1][4], k[0]) and torch.equal(cache.v[1][2], -k[1])
    assert not cache.k[0].any() and not cache.k[1][0].any()
