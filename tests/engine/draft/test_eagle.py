"""EAGLE head: draft extend on the paged cache, tree drafting against a brute-force beam search."""

from __future__ import annotations

import pytest
import torch

from relayc.engine.draft.eagle import EagleHead
from relayc.engine.draft.tree import DraftTree
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import random_model
from relayc.kernels import build_tree
from tests.engine.draft.helpers import (
    MAX_CONTEXT,
    SMALL,
    NoHostSync,
    Prefilled,
    copying_head,
    padded,
    padded_states,
    prefill,
)
from tests.kernels.tree_utils import DraftResult, check_describes_tree

PROMPTS = [[3, 5, 7, 9, 11], [1, 2, 30, 4, 8, 16, 32, 9, 2], [20, 21]]


@pytest.fixture(scope="module")
def target() -> LlamaForCausalLM:
    return random_model(SMALL, seed=1)


@pytest.fixture(scope="module")
def head(target: LlamaForCausalLM) -> EagleHead:
    return EagleHead.random(target, seed=2)


def extend_prompts(head: EagleHead, pre: Prefilled, topk: int):  # type: ignore[no-untyped-def]
    """EAGLE prefill's draft half: prompt[1:] + first token, paired with the prompt's states."""
    kv = head.make_kv_cache(pre.driver.kv_cache.size)
    ids = [[*p[1:], t] for p, t in zip(pre.prompts, pre.next_tokens, strict=True)]
    out = head.extend(
        padded(ids),
        padded_states(pre.hidden),
        pre.seq_lens,
        torch.zeros(len(ids), dtype=torch.int64),
        pre.req_pool_indices,
        pre.req_to_token,
        kv,
        topk=topk,
        max_prefix_len=MAX_CONTEXT,
    )
    return kv, ids, out


def test_extend_in_one_call_equals_token_by_token(
    target: LlamaForCausalLM, head: EagleHead
) -> None:
    pre = prefill(target, PROMPTS, shuffle_seed=3)
    kv, ids, once = extend_prompts(head, pre, topk=3)
    stepwise = head.make_kv_cache(pre.driver.kv_cache.size)
    longest = max(len(i) for i in ids)
    for start in range(0, longest, 2):  # chunks of up to 2 tokens, requests ending early
        live = [b for b, i in enumerate(ids) if start < len(i)]
        chunks = [ids[b][start : start + 2] for b in live]
        step = head.extend(
            padded(chunks),
            padded_states([pre.hidden[b][start : start + 2] for b in live]),
            torch.tensor([len(c) for c in chunks]),
            torch.full((len(live),), start),
            pre.req_pool_indices[live],
            pre.req_to_token,
            stepwise,
            topk=3,
            max_prefix_len=MAX_CONTEXT,
        )
        for row, b in enumerate(live):
            if start + len(chunks[row]) == len(ids[b]):
                torch.testing.assert_close(step.topk_p[row], once.topk_p[b])
                assert torch.equal(step.topk_index[row], once.topk_index[b])
                torch.testing.assert_close(step.hidden_states[row], once.hidden_states[b])
    for b, req in enumerate(pre.reqs):
        slots = pre.req_to_token[req, : len(ids[b])].long()
        torch.testing.assert_close(stepwise.k[0][slots], kv.k[0][slots])
        torch.testing.assert_close(stepwise.v[0][slots], kv.v[0][slots])
    # and both agree with the cache-free path
    for b in range(len(ids)):
        logits, g = head.forward_dense(torch.tensor(ids[b]), pre.hidden[b])
        torch.testing.assert_close(g[-1], once.hidden_states[b])
        torch.testing.assert_close(torch.softmax(logits[-1], -1), once.draft_probs[b])
    assert torch.allclose(once.draft_probs.sum(-1), torch.ones(len(ids)))


def head_probs_after(
    head: EagleHead, ids: list[int], states: torch.Tensor, path: list[int]
) -> torch.Tensor:
    """The head's distribution after ``ids + path`` by cache-free runs, the draft hidden input
    of each path position rebuilt from the previous position's output."""
    hidden = [*states]
    for j in range(len(path)):
        _, g = head.forward_dense(torch.tensor(ids + path[:j]), torch.stack(hidden))
        hidden.append(g[-1])
    logits, _ = head.forward_dense(torch.tensor(ids + path), torch.stack(hidden))
    return torch.softmax(logits[-1], -1)


def brute_force_tree(
    head: EagleHead,
    ids: list[int],
    states: torch.Tensor,
    topk: int,
    num_steps: int,
    n: int,
) -> tuple[list[int], list[int], list[int]]:
    """EAGLE-2 beam search with plain loops; every candidate's distribution recomputed by a
    cache-free run of the head over prompt + path (draft hidden inputs rebuilt position by
    position), so no cache, scratch slot or mask is shared with the implementation."""

    def probs_after(path: list[int]) -> list[float]:
        return head_probs_after(head, ids, states, path).tolist()

    def top(probs: list[float]) -> list[int]:
        return sorted(range(len(probs)), key=lambda t: (-probs[t], t))[:topk]

    p0 = probs_after([])
    # candidate: (flat index, score, token, path)
    candidates = [(c, p0[t], t, [t]) for c, t in enumerate(top(p0))]
    beams = list(candidates)
    parents = [-1] + [c[0] for c in beams]
    for level in range(1, num_steps):
        level_candidates = []
        for j, (_, score, _, path) in enumerate(beams):
            probs = probs_after(path)
            for c, t in enumerate(top(probs)):
                flat = topk + (level - 1) * topk * topk + j * topk + c
                level_candidates.append((flat, score * probs[t], t, [*path, t]))
        beams = sorted(level_candidates, key=lambda x: (-x[1], x[0]))[:topk]
        if level < num_steps - 1:
            parents += [c[0] for c in beams]
        candidates += level_candidates
    best = sorted(sorted(candidates, key=lambda x: (-x[1], x[0]))[: n - 1])
    return (parents if num_steps > 1 else [-1]), [c[0] for c in best], [c[2] for c in best]


def draft(
    head: EagleHead, pre: Prefilled, topk: int, num_steps: int, n: int, sync_check: bool = False
) -> DraftTree:
    kv, _, out = extend_prompts(head, pre, topk)
    scratch = pre.scratch(topk * (num_steps - 1))
    args = (out.topk_p, out.topk_index, out.hidden_states, pre.seq_lens, pre.req_pool_indices)
    kwargs = {"num_steps": num_steps, "num_draft_tokens": n, "max_prefix_len": MAX_CONTEXT}
    if sync_check:
        with NoHostSync():
            return head.draft_tree(*args, pre.req_to_token, kv, scratch, **kwargs)
    return head.draft_tree(*args, pre.req_to_token, kv, scratch, **kwargs)


def check_builds_tree(pre: Prefilled, tree: DraftTree, topk: int, num_steps: int, n: int) -> None:
    result = DraftResult(
        verified_id=torch.tensor(pre.next_tokens),
        parent_list=tree.parent_list,
        top_scores_index=tree.top_scores_index,
        draft_tokens=tree.draft_tokens,
        seq_lens=pre.seq_lens,
        topk=topk,
        spec_steps=num_steps,
        num_verify_tokens=n,
    )
    built = build_tree(
        result.verified_id,
        tree.parent_list,
        tree.top_scores_index,
        tree.draft_tokens,
        pre.seq_lens,
        result.seq_lens_sum,
        topk,
        num_steps,
        n,
        backend="torch",
    )
    check_describes_tree(result, built, full_mask=True)


@pytest.mark.parametrize(
    ("topk", "num_steps", "n"),
    [(1, 4, 5), (1, 4, 3), (1, 1, 2), (2, 3, 6), (3, 3, 10), (2, 1, 3), (4, 2, 8)],
)
def test_tree_drafting_matches_brute_force_beam_search(
    target: LlamaForCausalLM, head: EagleHead, topk: int, num_steps: int, n: int
) -> None:
    pre = prefill(target, PROMPTS[:2], shuffle_seed=topk)
    tree = draft(head, pre, topk, num_steps, n)
    assert tree.parent_list.shape == (2, topk * (num_steps - 1) + 1)
    assert tree.top_scores_index.shape == tree.draft_tokens.shape == (2, n - 1)
    for b in range(2):
        ids = [*pre.prompts[b][1:], pre.next_tokens[b]]
        parents, selected, tokens = brute_force_tree(head, ids, pre.hidden[b], topk, num_steps, n)
        assert tree.parent_list[b].tolist() == parents
        assert tree.top_scores_index[b].tolist() == selected
        assert tree.draft_tokens[b].tolist() == tokens
    check_builds_tree(pre, tree, topk, num_steps, n)


@pytest.mark.parametrize("num_steps", [1, 2, 4])
def test_a_kept_chain_is_the_beam_searchs_tree(
    target: LlamaForCausalLM, head: EagleHead, num_steps: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """topk 1 with every draft kept skips the beam bookkeeping: the same tree, bit for bit,
    as the beam search gives it (and the same draft cache writes)."""
    pre = prefill(target, PROMPTS, shuffle_seed=2)
    chain = draft(head, pre, 1, num_steps, num_steps + 1, sync_check=True)
    monkeypatch.setattr(type(head), "chain_shortcut", False)
    beams = draft(head, pre, 1, num_steps, num_steps + 1)
    for got, want in zip(chain, beams, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape and got.is_contiguous()
        assert torch.equal(got, want)


def test_tree_drafting_leaves_the_committed_draft_cache_alone(
    target: LlamaForCausalLM, head: EagleHead
) -> None:
    pre = prefill(target, PROMPTS, shuffle_seed=0)
    kv, ids, out = extend_prompts(head, pre, topk=2)
    committed = torch.cat(
        [pre.req_to_token[r, : len(i)] for r, i in zip(pre.reqs, ids, strict=True)]
    )
    before = kv.k[0][committed.long()].clone()
    head.draft_tree(
        out.topk_p,
        out.topk_index,
        out.hidden_states,
        pre.seq_lens,
        pre.req_pool_indices,
        pre.req_to_token,
        kv,
        pre.scratch(2 * 3),
        num_steps=4,
        num_draft_tokens=8,
        max_prefix_len=MAX_CONTEXT,
    )
    assert torch.equal(kv.k[0][committed.long()], before)


def test_extend_and_tree_drafting_never_read_the_device_on_the_host(
    target: LlamaForCausalLM, head: EagleHead
) -> None:
    pre = prefill(target, PROMPTS, shuffle_seed=1)
    kv = head.make_kv_cache(pre.driver.kv_cache.size)
    ids = [[*p[1:], t] for p, t in zip(pre.prompts, pre.next_tokens, strict=True)]
    with NoHostSync():
        head.extend(
            padded(ids),
            padded_states(pre.hidden),
            pre.seq_lens,
            torch.zeros(len(ids), dtype=torch.int64),
            pre.req_pool_indices,
            pre.req_to_token,
            kv,
            topk=2,
            max_prefix_len=MAX_CONTEXT,
        )
    tree = draft(head, pre, 2, 3, 6, sync_check=True)
    check_builds_tree(pre, tree, 2, 3, 6)


def greedy_next(target: LlamaForCausalLM, tokens: list[int]) -> int:
    return int(target.forward_dense(torch.tensor(tokens)).logits[-1].argmax())


@pytest.mark.parametrize(("topk", "num_steps", "n"), [(1, 5, 6), (3, 4, 12)])
def test_a_head_that_copies_the_target_drafts_its_greedy_path(
    topk: int, num_steps: int, n: int
) -> None:
    target, head = copying_head(config_seed=4)
    pre = prefill(target, PROMPTS, shuffle_seed=2)
    tree = draft(head, pre, topk, num_steps, n)
    check_builds_tree(pre, tree, topk, num_steps, n)
    built = build_tree(
        torch.tensor(pre.next_tokens),
        tree.parent_list,
        tree.top_scores_index,
        tree.draft_tokens,
        pre.seq_lens,
        int(pre.seq_lens.sum()),
        topk,
        num_steps,
        n,
        backend="torch",
    )
    for b, prompt in enumerate(pre.prompts):
        # Walk the tree from the root taking the child the target would emit; every node
        # with children must offer it (the argmax is each beam's best child).
        tokens = built.draft_tokens[b * n : (b + 1) * n].tolist()
        path, node = [*prompt, tokens[0]], 0
        while int(built.retrive_next_token[b, node]) != -1:
            want = greedy_next(target, path)
            child = int(built.retrive_next_token[b, node])
            while child != -1 and tokens[child] != want:
                child = int(built.retrive_next_sibling[b, child])
            assert child != -1, f"request {b}: no child {want} under node {node}"
            path.append(want)
            node = child
        if topk == 1:  # a chain: the whole greedy continuation
            assert len(path) == len(prompt) + n


@pytest.mark.parametrize("sampled", [False, True])
def test_chain_drafting_carries_each_drafts_distribution(
    target: LlamaForCausalLM, head: EagleHead, sampled: bool
) -> None:
    num_steps = 4
    pre = prefill(target, PROMPTS, shuffle_seed=6)
    first_coins = torch.tensor([0.2, 0.7, 0.95]) if sampled else None
    kv = head.make_kv_cache(pre.driver.kv_cache.size)
    ids = [[*p[1:], t] for p, t in zip(pre.prompts, pre.next_tokens, strict=True)]
    out = head.extend(
        padded(ids),
        padded_states(pre.hidden),
        pre.seq_lens,
        torch.zeros(len(ids), dtype=torch.int64),
        pre.req_pool_indices,
        pre.req_to_token,
        kv,
        topk=1,
        max_prefix_len=MAX_CONTEXT,
        coins=first_coins,
    )
    coins = torch.rand(len(ids), num_steps - 1, generator=torch.Generator().manual_seed(0))
    with NoHostSync():
        chain = head.draft_chain(
            out.topk_index,
            out.draft_probs,
            out.hidden_states,
            pre.seq_lens,
            pre.req_pool_indices,
            pre.req_to_token,
            kv,
            pre.scratch(num_steps - 1),
            num_steps=num_steps,
            max_prefix_len=MAX_CONTEXT,
            coins=coins if sampled else None,
        )
    for b in range(len(ids)):
        path: list[int] = []
        step_coins = [float(first_coins[b]), *coins[b].tolist()] if sampled else None
        for step in range(num_steps):
            probs = head_probs_after(head, ids[b], pre.hidden[b], path)
            torch.testing.assert_close(chain.draft_probs[b, step], probs)
            if step_coins is None:
                path.append(int(probs.argmax()))
            else:  # the first token whose CDF passes the coin
                cdf = probs.cumsum(0)
                path.append(int((cdf <= step_coins[step] * cdf[-1]).sum()))
        assert chain.tree.draft_tokens[b].tolist() == path
    if not sampled:  # greedy chains are topk-1 trees
        tree = draft(head, pre, 1, num_steps, num_steps + 1)
        assert torch.equal(tree.draft_tokens, chain.tree.draft_tokens)
        assert torch.equal(tree.parent_list, chain.tree.parent_list)
