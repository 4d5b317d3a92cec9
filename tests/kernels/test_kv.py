from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import random

import pytest
import torch

from relayc.kernels._backend import triton_available
from relayc.kernels.build_tree import build_tree_reference
from relayc.kernels.kv import (
    AcceptedCacheLocs,
    assign_req_to_token_pool,
    assign_req_to_token_pool_reference,
    fill_accept_out_cache_loc,
    fill_accept_out_cache_loc_reference,
    read_req_to_token_pool,
    read_req_to_token_pool_reference,
)
from tests.kernels.tree_utils import draft_eagle_tree

BACKENDS = [
    "torch",
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(not triton_available(), reason="triton is not installed"),
    ),
]
POOL_SLOTS = 1 << 16
MAX_CONTEXT = 96


def _windows(
    batch_size: int, n: int, uniform: bool, dtype: torch.dtype, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A request pool poisoned with -1, distinct rows per request, and fresh slots for
    each request's window (``n`` tokens each, or 0..n when not ``uniform``)."""
    pool_rows = batch_size + 5
    req_to_token = torch.full((pool_rows, MAX_CONTEXT), -1, dtype=dtype)
    req_pool_indices = torch.randperm(pool_rows, generator=gen)[:batch_size]
    lens = (
        torch.full((batch_size,), n)
        if uniform
        else torch.randint(0, n + 1, (batch_size,), generator=gen)
    )
    start = torch.randint(0, MAX_CONTEXT - n + 1, (batch_size,), generator=gen)
    end = start + lens
    out_cache_loc = torch.randperm(POOL_SLOTS, generator=gen)[: int(lens.sum())] + 1
    return req_pool_indices, req_to_token, start, end, out_cache_loc


WINDOW_CASES = [(1, 1, True), (3, 7, True), (3, 5, False), (1, 64, False), (64, 16, True)]


@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize(("batch_size", "n", "uniform"), WINDOW_CASES)
def test_assign_and_read_req_to_token_pool(
    batch_size: int, n: int, uniform: bool, dtype: torch.dtype, backend: str
) -> None:
    if backend == "triton" and batch_size > 8:
        batch_size = 8  # the interpreter runs one program at a time
    gen = torch.Generator().manual_seed(batch_size * 1000 + n)
    req_pool_indices, req_to_token, start, end, out_cache_loc = _windows(
        batch_size, n, uniform, dtype, gen
    )

    want = req_to_token.clone()
    assign_req_to_token_pool_reference(req_pool_indices, want, start, end, out_cache_loc)
    got = req_to_token.clone()
    assign_req_to_token_pool(req_pool_indices, got, start, end, out_cache_loc, backend=backend)
    assert torch.equal(got, want)
    assert (got != -1).sum() == out_cache_loc.numel()

    # Fill every slot outside the windows too, so a read from the wrong place is seen.
    got[got == -1] = -2 - torch.arange(int((got == -1).sum()), dtype=dtype)
    num_tokens = out_cache_loc.numel()
    read = read_req_to_token_pool(
        req_pool_indices,
        got,
        start,
        end,
        num_tokens,
        out=torch.full((num_tokens,), -1, dtype=torch.int64),
        backend=backend,
    )
    assert torch.equal(read, read_req_to_token_pool_reference(req_pool_indices, got, start, end))
    assert torch.equal(read, out_cache_loc)


def _accept_index_from_trees(
    batch_size: int, topk: int, spec_steps: int, n: int, seed: int, mode: str
) -> torch.Tensor:
    """accept_index as verify_tree_greedy writes it: the root, then a random root-to-node
    path of the real tree (``mode``: random length, root only, or as deep as possible)."""
    draft = draft_eagle_tree(batch_size, topk, spec_steps, n, torch.Generator().manual_seed(seed))
    tree = build_tree_reference(
        draft.verified_id,
        draft.parent_list,
        draft.top_scores_index,
        draft.draft_tokens,
        draft.seq_lens,
        draft.seq_lens_sum,
        topk,
        spec_steps,
        n,
    )
    rng = random.Random(seed)
    accept_index = torch.full((batch_size, spec_steps + 1), -1, dtype=torch.int64)
    for b in range(batch_size):
        path = [0]
        while mode != "root_only":
            children = []
            child = int(tree.retrive_next_token[b, path[-1]])
            while child != -1:
                children.append(child)
                child = int(tree.retrive_next_sibling[b, child])
            if not children or (mode == "random" and rng.random() < 0.3):
                break
            path.append(rng.choice(children))
        accept_index[b, : len(path)] = torch.tensor(path) + b * n
    return accept_index


ACCEPT_CASES = [
    # (batch_size, topk, spec_steps, n, mode)
    (1, 1, 1, 2, "random"),
    (3, 1, 5, 6, "deepest"),  # a chain, every draft accepted: no -1 at all
    (3, 2, 4, 9, "root_only"),
    (3, 4, 6, 27, "random"),
    (1, 2, 8, 16, "random"),
    (64, 4, 8, 64, "random"),
    (64, 1, 3, 4, "deepest"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pad_slot", [0, 5])
@pytest.mark.parametrize("case", ACCEPT_CASES, ids=str)
def test_fill_accept_out_cache_loc(case: tuple, pad_slot: int, backend: str) -> None:
    batch_size, topk, spec_steps, n, mode = case
    if backend == "triton" and batch_size > 8:
        batch_size = 7  # the interpreter runs one program at a time
    for seed in range(2):
        accept_index = _accept_index_from_trees(batch_size, topk, spec_steps, n, seed, mode)
        out_cache_loc = torch.randperm(POOL_SLOTS)[: batch_size * n] + 1
        _check_fill_accept(accept_index, out_cache_loc, pad_slot, backend)
        if mode == "deepest" and topk == 1:
            assert (accept_index != -1).all()
        if mode == "root_only":
            assert (accept_index[:, 1:] == -1).all()


@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_fill_accept_skips_minus_one_anywhere(dtype: torch.dtype, backend: str) -> None:
    # SGLang's kernel skips -1 wherever it sits, not only in the padded tail.
    gen = torch.Generator().manual_seed(3)
    batch_size, width, n = 5, 7, 11
    accept_index = torch.randint(0, batch_size * n, (batch_size, width), generator=gen)
    accept_index[torch.rand(batch_size, width, generator=gen) < 0.4] = -1
    accept_index[2] = -1  # a request with nothing accepted at all
    out_cache_loc = torch.randperm(POOL_SLOTS, generator=gen)[: batch_size * n] + 1
    _check_fill_accept(accept_index.to(dtype), out_cache_loc.to(dtype), 0, backend)


def _check_fill_accept(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, pad_slot: int, backend: str
) -> None:
    batch_size, width = accept_index.shape
    want = fill_accept_out_cache_loc_reference(accept_index, out_cache_loc, pad_slot)
    poisoned = AcceptedCacheLocs(
        torch.full((batch_size * width,), -1, dtype=torch.int64),
        torch.full((batch_size,), -1, dtype=torch.int64),
        torch.full((batch_size,), -1, dtype=torch.int64),
    )
    got = fill_accept_out_cache_loc(
        accept_index, out_cache_loc, out=poisoned, pad_slot=pad_slot, backend=backend
    )
    for name, g, w in zip(AcceptedCacheLocs._fields, got, want, strict=True):
        assert torch.equal(g, w), name
    # The packed slots of request b are its accepted windows' slots, in order.
    for b in range(batch_size):
        start = int(got.accept_offsets[b])
        row = [i for i in accept_index[b].tolist() if i != -1]
        assert (
            got.accept_out_cache_loc[start : start + len(row)].tolist()
            == out_cache_loc[row].tolist()
        )
