"""The paged-cache forward against itself in other layouts and against the dense path."""

from __future__ import annotations

import pytest
import torch

from relayc.engine.core.config import ModelConfig
from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import random_model
from tests.engine.helpers import PagedDriver
from tests.tolerance import assert_forwards_close


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(seed=11)


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_extend_matches_dense_for_mixed_lengths(model: LlamaForCausalLM) -> None:
    prompts = [_tokens(n, seed=n) for n in (1, 9, 17, 4)]
    driver = PagedDriver(model, shuffle_seed=0)
    reqs = [driver.new_request() for _ in prompts]
    got = driver.extend(reqs, prompts).split([len(p) for p in prompts])
    for prompt, logits in zip(prompts, got, strict=True):
        expected = model.forward_dense(torch.tensor(prompt)).logits
        assert_forwards_close(logits, expected, model.config)


def test_extend_returns_last_logits_per_request(model: LlamaForCausalLM) -> None:
    prompts = [_tokens(n, seed=n) for n in (5, 2, 8)]
    full = PagedDriver(model)
    everything = full.extend([full.new_request() for _ in prompts], prompts)
    last = PagedDriver(model)
    got = last.extend([last.new_request() for _ in prompts], prompts, all_logits=False)
    ends = torch.tensor([5, 7, 15]) - 1
    assert_forwards_close(got, everything[ends], model.config)


def test_chunked_prefill_matches_one_shot(model: LlamaForCausalLM) -> None:
    prompt = _tokens(23, seed=5)
    one_shot = PagedDriver(model)
    expected = one_shot.extend([one_shot.new_request()], [prompt])
    chunked = PagedDriver(model, shuffle_seed=3)
    req = chunked.new_request()
    pieces = [chunked.extend([req], [prompt[a:b]]) for a, b in ((0, 7), (7, 8), (8, 20), (20, 23))]
    assert_forwards_close(torch.cat(pieces), expected, model.config)


def test_chunks_of_different_requests_share_one_batch(model: LlamaForCausalLM) -> None:
    """One request's second chunk next to another request's first prefill."""
    a, b = _tokens(12, seed=1), _tokens(9, seed=2)
    driver = PagedDriver(model, shuffle_seed=4)
    ra, rb = driver.new_request(), driver.new_request()
    driver.extend([ra], [a[:5]])
    got = driver.extend([ra, rb], [a[5:], b]).split([7, 9])
    assert_forwards_close(got[0], model.forward_dense(torch.tensor(a)).logits[5:], model.config)
    assert_forwards_close(got[1], model.forward_dense(torch.tensor(b)).logits, model.config)


def _decode_run(model: LlamaForCausalLM, shuffle_seed: int | None) -> torch.Tensor:
    prompts = [_tokens(n, seed=20 + n) for n in (3, 10)]
    follow = [_tokens(6, seed=30), _tokens(6, seed=31)]
    driver = PagedDriver(model, shuffle_seed=shuffle_seed)
    reqs = [driver.new_request() for _ in prompts]
    driver.extend(reqs, prompts, all_logits=False)
    steps = [driver.decode(reqs, [f[i] for f in follow]) for i in range(6)]
    return torch.stack(steps)


def test_decode_on_shuffled_slots_matches_contiguous(model: LlamaForCausalLM) -> None:
    contiguous = _decode_run(model, shuffle_seed=None)
    shuffled = _decode_run(model, shuffle_seed=9)
    assert_forwards_close(shuffled, contiguous, model.config)


def test_padding_row_and_static_bounds_leave_real_rows_unchanged(model: LlamaForCausalLM) -> None:
    """A CUDA-graph batch: padded with request slot 0 / KV slot 0, bounds at bucket size."""
    prompt = _tokens(7, seed=8)
    driver = PagedDriver(model)
    req = driver.new_request()
    driver.extend([req], [prompt[:-1]])
    reference = driver.decode([req], [prompt[-1]])
    driver.lens[req] -= 1  # decode the same token again into a fresh slot
    slot = driver.kv_pool.alloc(1)
    assert slot is not None
    batch = ForwardBatch.build(
        ForwardMode.DECODE,
        [[prompt[-1]], [0]],
        [req, 0],
        [6, 0],
        torch.cat([slot, torch.zeros(1, dtype=torch.int64)]),
        driver.req_pool.req_to_token,
        driver.kv_cache,
    )
    batch.max_prefix_len = driver.req_pool.max_context  # the static bucket width
    logits = model(batch).logits
    assert torch.isfinite(logits).all()
    assert_forwards_close(logits[:1], reference, model.config)


def test_verify_with_chain_mask_matches_sequential_decode(model: LlamaForCausalLM) -> None:
    prompt, draft = _tokens(8, seed=40), _tokens(5, seed=41)
    sequential = PagedDriver(model)
    req = sequential.new_request()
    sequential.extend([req], [prompt], all_logits=False)
    expected = torch.cat([sequential.decode([req], [t]) for t in draft])

    verifier = PagedDriver(model, shuffle_seed=5)
    req = verifier.new_request()
    verifier.extend([req], [prompt], all_logits=False)
    chain = torch.ones(5, 5, dtype=torch.bool).tril()[None]
    got = verifier.verify([req], [draft], [list(range(5))], chain)
    assert_forwards_close(got, expected, model.config)


# A draft tree of 7 nodes (parent index per node, -1 = root):
#        0
#      /   \
#     1     2
#    / \    |
#   3   4   5
#           |
#           6
PARENTS = [-1, 0, 0, 1, 1, 2, 5]
BRANCHES = [[0, 1, 3], [0, 1, 4], [0, 2, 5, 6]]


def _tree_mask(parents: list[int]) -> tuple[torch.Tensor, list[int]]:
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    depths = []
    for node in range(n):
        depth, walk = 0, node
        while walk != -1:
            mask[node, walk] = True
            walk = parents[walk]
            depth += 1
        depths.append(depth - 1)
    return mask, depths


def test_verify_with_tree_mask_matches_each_branch_alone(model: LlamaForCausalLM) -> None:
    mask, depths = _tree_mask(PARENTS)
    prompts = [_tokens(6, seed=50), _tokens(11, seed=51)]
    trees = [_tokens(len(PARENTS), seed=52), _tokens(len(PARENTS), seed=53)]
    driver = PagedDriver(model, shuffle_seed=6)
    reqs = [driver.new_request() for _ in prompts]
    driver.extend(reqs, prompts, all_logits=False)
    got = driver.verify(reqs, trees, [depths, depths], torch.stack([mask, mask]))
    got = got.view(2, len(PARENTS), -1)
    for b, (prompt, tree) in enumerate(zip(prompts, trees, strict=True)):
        for branch in BRANCHES:
            path = prompt + [tree[node] for node in branch]
            expected = model.forward_dense(torch.tensor(path)).logits[len(prompt) :]
            assert_forwards_close(got[b, branch], expected, model.config)


def test_verify_rejects_a_mask_of_the_wrong_shape(model: LlamaForCausalLM) -> None:
    driver = PagedDriver(model)
    req = driver.new_request()
    driver.extend([req], [_tokens(3, seed=0)])
    with pytest.raises(ValueError, match="tree_mask"):
        driver.verify([req], [[1, 2, 3]], [[0, 1, 2]], torch.ones(1, 2, 2, dtype=torch.bool))


def test_build_rejects_inconsistent_batches(model: LlamaForCausalLM) -> None:
    driver = PagedDriver(model)
    table, cache = driver.req_pool.req_to_token, driver.kv_cache
    with pytest.raises(ValueError, match="exactly one token"):
        ForwardBatch.build(ForwardMode.DECODE, [[1, 2]], [1], [0], [1, 2], table, cache)
    with pytest.raises(ValueError, match="out_cache_loc"):
        ForwardBatch.build(ForwardMode.EXTEND, [[1, 2]], [1], [0], [1], table, cache)
    with pytest.raises(ValueError, match="tree_mask is required"):
        ForwardBatch.build(ForwardMode.VERIFY, [[1, 2]], [1], [0], [1, 2], table, cache)


def test_bfloat16_paged_decode_tracks_float32() -> None:
    """Half precision runs end to end (cache in bf16) and stays near the float32 logits."""
    full = random_model(seed=11)
    half = random_model(ModelConfig(dtype=torch.bfloat16), seed=11)  # the same weights, rounded
    prompt, follow = _tokens(9, seed=60), _tokens(4, seed=61)
    runs = []
    for model in (full, half):
        driver = PagedDriver(model)
        assert driver.kv_cache.k[0].dtype == model.config.dtype
        req = driver.new_request()
        driver.extend([req], [prompt], all_logits=False)
        runs.append(torch.cat([driver.decode([req], [t]) for t in follow]))
    assert runs[1].dtype == torch.float32 and torch.isfinite(runs[1]).all()
    scale = runs[0].abs().max().item()
    assert (runs[1] - runs[0]).abs().max().item() < 0.05 * scale
    assert (runs[1].argmax(-1) == runs[0].argmax(-1)).float().mean() >= 0.75


def test_max_prefix_len_beyond_the_table_is_rejected(model: LlamaForCausalLM) -> None:
    driver = PagedDriver(model, max_context=16)
    req = driver.new_request()
    batch = ForwardBatch.build(
        ForwardMode.DECODE, [[1]], [req], [0], [1], driver.req_pool.req_to_token, driver.kv_cache
    )
    batch.max_prefix_len = 17
    with pytest.raises(ValueError, match="max_prefix_len 17"):
        model(batch)
