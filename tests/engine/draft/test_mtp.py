"""Multi-layer EAGLE: drafting inside draft extend, cache consistency, select for build_tree."""

from __future__ import annotations

import pytest
import torch

from relayc.engine.core.attention import dense_causal_attention
from relayc.engine.draft.mtp import MtpDrafter
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import random_model
from relayc.kernels import build_tree
from tests.engine.draft.helpers import (
    MAX_CONTEXT,
    SMALL,
    NoHostSync,
    padded,
    padded_states,
    prefill,
)
from tests.kernels.tree_utils import DraftResult, check_describes_tree

PROMPTS = [[3, 5, 7, 9, 11, 13], [1, 2, 30], [20, 21, 22, 23, 24, 25, 26, 27]]
NUM_STEPS, TOPK = 3, 2


@pytest.fixture(scope="module")
def target() -> LlamaForCausalLM:
    return random_model(SMALL, seed=1)


@pytest.fixture(scope="module")
def drafter(target: LlamaForCausalLM) -> MtpDrafter:
    return MtpDrafter.random(target, NUM_STEPS, seed=3)


def test_extend_in_one_call_equals_chunks_and_the_dense_path(
    target: LlamaForCausalLM, drafter: MtpDrafter
) -> None:
    pre = prefill(target, PROMPTS, shuffle_seed=4)
    ids = [[*p[1:], t] for p, t in zip(pre.prompts, pre.next_tokens, strict=True)]
    once_kv = drafter.make_kv_cache(pre.driver.kv_cache.size)
    assert len(once_kv.k) == NUM_STEPS
    with NoHostSync():
        once = drafter.extend(
            padded(ids),
            padded_states(pre.hidden),
            pre.seq_lens,
            torch.zeros(len(ids), dtype=torch.int64),
            pre.req_pool_indices,
            pre.req_to_token,
            once_kv,
            topk=TOPK,
            max_prefix_len=MAX_CONTEXT,
        )
    assert once.topk_p.shape == once.topk_index.shape == (len(ids), NUM_STEPS, TOPK)
    chunked_kv = drafter.make_kv_cache(pre.driver.kv_cache.size)
    for start in range(0, max(len(i) for i in ids), 3):
        live = [b for b, i in enumerate(ids) if start < len(i)]
        chunks = [ids[b][start : start + 3] for b in live]
        out = drafter.extend(
            padded(chunks),
            padded_states([pre.hidden[b][start : start + 3] for b in live]),
            torch.tensor([len(c) for c in chunks]),
            torch.full((len(live),), start),
            pre.req_pool_indices[live],
            pre.req_to_token,
            chunked_kv,
            topk=TOPK,
            max_prefix_len=MAX_CONTEXT,
        )
        for row, b in enumerate(live):
            if start + len(chunks[row]) == len(ids[b]):
                torch.testing.assert_close(out.topk_p[row], once.topk_p[b])
                assert torch.equal(out.topk_index[row], once.topk_index[b])
    for layer in range(NUM_STEPS):
        for b, req in enumerate(pre.reqs):
            slots = pre.req_to_token[req, : len(ids[b])].long()
            torch.testing.assert_close(chunked_kv.k[layer][slots], once_kv.k[layer][slots])
    for b in range(len(ids)):
        dense = drafter.forward_dense(torch.tensor(ids[b]), pre.hidden[b], TOPK)
        torch.testing.assert_close(dense.topk_p[0], once.topk_p[b])
        assert torch.equal(dense.topk_index[0], once.topk_index[b])


def test_layer_k_drafts_under_the_previous_layers_top1(
    target: LlamaForCausalLM, drafter: MtpDrafter
) -> None:
    # Recompute layer by layer by hand: layer k reads layer k-1's argmax token and state.
    prompt = PROMPTS[0]
    states = target.forward_dense(torch.tensor(prompt)).hidden_states
    ids = torch.tensor([*prompt[1:], 4])
    out = drafter.forward_dense(ids, states, TOPK)
    tokens, hidden = ids, states
    positions = torch.arange(ids.numel())

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return dense_causal_attention(q, k, v)

    for k, layer in enumerate(drafter.layers):
        hidden = layer(
            target.model.embed_tokens(tokens), hidden, positions, drafter.rotary, k, attend
        )
        probs = torch.softmax(target.lm_head(layer.norm(hidden)).float(), -1)
        p, index = probs[-1].topk(TOPK)
        torch.testing.assert_close(out.topk_p[0, k], p)
        assert torch.equal(out.topk_index[0, k], index)
        tokens = probs.argmax(-1)
    assert not torch.equal(out.topk_index[0, 0], out.topk_index[0, 1])  # layers differ


@pytest.mark.parametrize(("topk", "n"), [(1, 4), (2, 7), (2, 4), (3, 9)])
def test_select_gives_build_tree_a_valid_tree(target: LlamaForCausalLM, topk: int, n: int) -> None:
    drafter = MtpDrafter.random(target, NUM_STEPS, seed=5)
    pre = prefill(target, PROMPTS, shuffle_seed=0)
    ids = [[*p[1:], t] for p, t in zip(pre.prompts, pre.next_tokens, strict=True)]
    out = drafter.extend(
        padded(ids),
        padded_states(pre.hidden),
        pre.seq_lens,
        torch.zeros(len(ids), dtype=torch.int64),
        pre.req_pool_indices,
        pre.req_to_token,
        drafter.make_kv_cache(pre.driver.kv_cache.size),
        topk=topk,
        max_prefix_len=MAX_CONTEXT,
    )
    tree = drafter.select(out.topk_p, out.topk_index, n)
    draft = DraftResult(
        verified_id=torch.tensor(pre.next_tokens),
        parent_list=tree.parent_list,
        top_scores_index=tree.top_scores_index,
        draft_tokens=tree.draft_tokens,
        seq_lens=pre.seq_lens,
        topk=topk,
        spec_steps=NUM_STEPS,
        num_verify_tokens=n,
    )
    built = build_tree(
        draft.verified_id,
        tree.parent_list,
        tree.top_scores_index,
        tree.draft_tokens,
        pre.seq_lens,
        draft.seq_lens_sum,
        topk,
        NUM_STEPS,
        n,
        backend="torch",
    )
    check_describes_tree(draft, built, full_mask=True)
    if n == topk * NUM_STEPS + 1:  # every candidate drafted is in the tree
        assert sorted(tree.draft_tokens[0].tolist()) == sorted(out.topk_index[0].flatten().tolist())
