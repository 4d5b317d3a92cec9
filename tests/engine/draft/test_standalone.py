"""Standalone draft model: extend, greedy and sampled chains, checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from relayc.engine.core.config import ModelConfig
from relayc.engine.draft.standalone import StandaloneDrafter
from relayc.kernels import build_tree
from tests.engine.draft.helpers import MAX_CONTEXT, SMALL, NoHostSync, padded, prefill
from tests.kernels.tree_utils import DraftResult, check_describes_tree

DRAFT_CONFIG = SMALL.replace(num_layers=1, intermediate_size=32)
PROMPTS = [[3, 5, 7, 9, 11], [1, 2, 30, 4, 8, 16, 32, 9, 2], [20, 21]]


@pytest.fixture(scope="module")
def drafter() -> StandaloneDrafter:
    return StandaloneDrafter.random(DRAFT_CONFIG, seed=7)


def dense_probs(drafter: StandaloneDrafter, tokens: list[int]) -> torch.Tensor:
    return torch.softmax(drafter.model.forward_dense(torch.tensor(tokens)).logits[-1], -1)


def prefilled_draft(drafter: StandaloneDrafter, coins: torch.Tensor | None = None):  # type: ignore[no-untyped-def]
    """Prefill: the draft model reads prompt + bonus, one position past the target."""
    pre = prefill(drafter.model, PROMPTS, shuffle_seed=5)  # the draft model's own slots
    ids = [[*p, t] for p, t in zip(pre.prompts, pre.next_tokens, strict=True)]
    slots = pre.scratch(1)  # the slot the scheduler reserves for the bonus position
    for req, prompt, slot in zip(pre.reqs, pre.prompts, slots[:, 0], strict=True):
        pre.req_to_token[req, len(prompt)] = slot
    kv = drafter.make_kv_cache(pre.driver.kv_cache.size)
    with NoHostSync():
        out = drafter.extend(
            padded(ids),
            torch.tensor([len(i) for i in ids]),
            torch.zeros(len(ids), dtype=torch.int64),
            pre.req_pool_indices,
            pre.req_to_token,
            kv,
            topk=1,
            max_prefix_len=MAX_CONTEXT,
            coins=coins,
        )
    return pre, ids, kv, out


@pytest.mark.parametrize("num_steps", [1, 4])
def test_chain_is_the_greedy_continuation_of_the_draft_model(
    drafter: StandaloneDrafter, num_steps: int
) -> None:
    pre, ids, kv, out = prefilled_draft(drafter)
    with NoHostSync():
        chain = drafter.draft_chain(
            out.topk_index,
            out.draft_probs,
            torch.tensor([len(i) for i in ids]),
            pre.req_pool_indices,
            pre.req_to_token,
            kv,
            pre.scratch(num_steps - 1),
            num_steps=num_steps,
            max_prefix_len=MAX_CONTEXT,
        )
    assert chain.draft_probs.shape == (len(ids), num_steps, DRAFT_CONFIG.vocab_size)
    torch.testing.assert_close(chain.draft_probs.sum(-1), torch.ones(len(ids), num_steps))
    for b, tokens in enumerate(ids):
        context = list(tokens)
        for step in range(num_steps):
            probs = dense_probs(drafter, context)
            torch.testing.assert_close(chain.draft_probs[b, step], probs)
            context.append(int(probs.argmax()))
        assert chain.tree.draft_tokens[b].tolist() == context[len(tokens) :]
    draft = DraftResult(
        verified_id=torch.tensor(pre.next_tokens),
        parent_list=chain.tree.parent_list,
        top_scores_index=chain.tree.top_scores_index,
        draft_tokens=chain.tree.draft_tokens,
        seq_lens=pre.seq_lens,
        topk=1,
        spec_steps=num_steps,
        num_verify_tokens=num_steps + 1,
    )
    built = build_tree(
        draft.verified_id,
        draft.parent_list,
        draft.top_scores_index,
        draft.draft_tokens,
        draft.seq_lens,
        draft.seq_lens_sum,
        1,
        num_steps,
        num_steps + 1,
        backend="torch",
    )
    check_describes_tree(draft, built, full_mask=True)


def test_extend_over_emitted_tokens_equals_one_prefill(drafter: StandaloneDrafter) -> None:
    # Prefill the first half, then extend the rest as a verify would emit it.
    pre, ids, kv_once, once = prefilled_draft(drafter)
    kv = drafter.make_kv_cache(pre.driver.kv_cache.size)
    halves = [len(i) // 2 for i in ids]
    for part in range(2):
        chunks = [i[:h] if part == 0 else i[h:] for i, h in zip(ids, halves, strict=True)]
        out = drafter.extend(
            padded(chunks),
            torch.tensor([len(c) for c in chunks]),
            torch.tensor(halves) * part,
            pre.req_pool_indices,
            pre.req_to_token,
            kv,
            topk=3,
            max_prefix_len=MAX_CONTEXT,
        )
    torch.testing.assert_close(out.draft_probs, once.draft_probs)
    assert torch.equal(out.topk_index[:, 0], once.topk_index[:, 0])
    for b, req in enumerate(pre.reqs):
        slots = pre.req_to_token[req, : len(ids[b])].long()
        torch.testing.assert_close(kv.k[0][slots], kv_once.k[0][slots])


def test_sampled_drafts_invert_the_cdf_of_their_distribution(drafter: StandaloneDrafter) -> None:
    coins = torch.tensor([0.1, 0.5, 0.97])
    pre, ids, kv, out = prefilled_draft(drafter, coins=coins)
    step_coins = torch.tensor([[0.3, 0.8], [0.01, 0.6], [0.99, 0.45]])
    chain = drafter.draft_chain(
        out.topk_index,
        out.draft_probs,
        torch.tensor([len(i) for i in ids]),
        pre.req_pool_indices,
        pre.req_to_token,
        kv,
        pre.scratch(2),
        num_steps=3,
        max_prefix_len=MAX_CONTEXT,
        coins=step_coins,
    )
    for b, tokens in enumerate(ids):
        context = list(tokens)
        for step, coin in enumerate([float(coins[b]), *step_coins[b].tolist()]):
            probs = dense_probs(drafter, context).tolist()
            running, expected = 0.0, len(probs) - 1
            for token, p in enumerate(probs):  # first token whose CDF passes the coin
                running += p
                if running > coin * sum(probs):
                    expected = token
                    break
            assert int(chain.tree.draft_tokens[b, step]) == expected
            context.append(expected)
        assert float(out.topk_p[b, 0]) == pytest.approx(
            dense_probs(drafter, tokens)[context[len(tokens)]]
        )


def test_save_load_round_trip(tmp_path: Path, drafter: StandaloneDrafter) -> None:
    drafter.save(tmp_path)
    loaded = StandaloneDrafter.load(tmp_path)
    assert loaded.model.config == drafter.model.config
    ids = torch.tensor([1, 2, 3])
    assert torch.equal(
        loaded.model.forward_dense(ids).logits, drafter.model.forward_dense(ids).logits
    )
    assert StandaloneDrafter.random(DRAFT_CONFIG, seed=7).model.lm_head.weight.equal(
        drafter.model.lm_head.weight
    )
    assert isinstance(loaded.model.config, ModelConfig)
