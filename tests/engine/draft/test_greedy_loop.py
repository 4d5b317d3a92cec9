"""Every drafter in a greedy speculative loop on the paged cache emits the target's greedy tokens.

The loop plays the decode steps by hand (draft, tree layout, target verify,
``verify_tree_greedy``, KV commit, draft extend, relay), with the conventions
the drafters document: the EAGLE/MTP draft cache is as long as the target's,
the standalone one runs one position ahead (the bonus position's slot is
reserved before the draft extend and the next verify writes the root there),
and the n-gram host sees the output one iteration late.
"""

from __future__ import annotations

import pytest
import torch

from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.draft.eagle import EagleHead
from relayc.engine.draft.mtp import MtpDrafter
from relayc.engine.draft.ngram import NgramProposer, splice_proposals
from relayc.engine.draft.standalone import StandaloneDrafter
from relayc.engine.draft.tree import DraftTree, tree_from_parents
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.naive import greedy_generate_naive
from relayc.engine.model.weights import random_model
from relayc.kernels import TreeMaskMode, build_tree, verify_tree_greedy
from tests.engine.draft.helpers import (
    MAX_CONTEXT,
    SMALL,
    Prefilled,
    copying_head,
    padded,
    prefill,
)

PROMPTS = [[3, 5, 7, 9, 11, 3, 5, 7], [1, 2, 30, 4], [20, 21, 22, 20, 21]]
NEW_TOKENS = 14


class Loop:
    """Target-side bookkeeping of a greedy speculative loop."""

    def __init__(self, target: LlamaForCausalLM) -> None:
        self.target = target
        self.pre: Prefilled = prefill(target, PROMPTS, shuffle_seed=9)
        self.seq_lens = [len(p) for p in PROMPTS]
        self.output = [[t] for t in self.pre.next_tokens]
        self.bonus = list(self.pre.next_tokens)
        self.emitted = [[t] for t in self.pre.next_tokens]
        for b in range(len(PROMPTS)):
            self.reserve(b)

    @property
    def batch(self) -> int:
        return len(PROMPTS)

    def alloc(self, n: int) -> torch.Tensor:
        slots = self.pre.driver.kv_pool.alloc(n)
        assert slots is not None
        return slots

    def reserve(self, b: int) -> None:
        """A slot for the bonus position, which the next verify's root writes."""
        self.pre.req_to_token[self.pre.reqs[b], self.seq_lens[b]] = self.alloc(1).int()

    def done(self) -> bool:
        return min(len(o) for o in self.output) >= NEW_TOKENS

    def verify(
        self,
        candidates: torch.Tensor,
        tree_mask: torch.Tensor,
        positions: torch.Tensor,
        retrive: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """Target verify + greedy accept + KV commit; returns the hidden states ``[B*N, H]``
        and sets ``emitted`` / ``paths`` per request."""
        n = candidates.shape[1]
        req_to_token = self.pre.req_to_token
        slots = self.alloc(self.batch * n).view(self.batch, n)
        for b, req in enumerate(self.pre.reqs):
            slots[b, 0] = req_to_token[req, self.seq_lens[b]]
        batch = ForwardBatch(
            mode=ForwardMode.VERIFY,
            input_ids=candidates.flatten(),
            positions=positions,
            out_cache_loc=slots.flatten(),
            req_pool_indices=self.pre.req_pool_indices,
            prefix_lens=torch.tensor(self.seq_lens),
            extend_lens=torch.full((self.batch,), n),
            max_prefix_len=max(self.seq_lens),
            max_extend_len=n,
            req_to_token=req_to_token,
            kv_cache=self.pre.driver.kv_cache,
            tree_mask=tree_mask,
        )
        out = self.target(batch)
        predicts = torch.zeros(self.batch * n, dtype=torch.int32)
        accept_index = torch.full((self.batch, n), -1, dtype=torch.int32)
        accept_num = torch.zeros(self.batch, dtype=torch.int32)
        verify_tree_greedy(
            predicts,
            accept_index,
            accept_num,
            candidates,
            *retrive,
            out.logits.argmax(-1).view(self.batch, n),
            backend="torch",
        )
        self.paths, self.emitted = [], []
        for b, req in enumerate(self.pre.reqs):
            path = [int(g) for g in accept_index[b] if g >= 0]
            nodes = [g - b * n for g in path]
            start = self.seq_lens[b]
            req_to_token[req, start : start + len(path)] = slots[b, nodes].int()
            self.pre.driver.kv_pool.free(slots[b, [i for i in range(1, n) if i not in nodes]])
            self.paths.append(path)
            self.emitted.append([int(predicts[g]) for g in path])
            self.output[b] += self.emitted[-1]
            self.seq_lens[b] += len(path)
            self.bonus[b] = self.emitted[-1][-1]
            self.reserve(b)
        return out.hidden_states

    def accepted(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Padded emitted tokens ``[B, W]``, the accepted nodes' states ``[B, W, H]``, lens."""
        lens = torch.tensor([len(e) for e in self.emitted])
        states = torch.zeros(self.batch, int(lens.max()), hidden.shape[-1])
        for b, path in enumerate(self.paths):
            states[b, : len(path)] = hidden[path]
        return padded(self.emitted), states, lens

    def build(self, tree: DraftTree, topk: int, num_steps: int, n: int) -> torch.Tensor:
        seq_lens = torch.tensor(self.seq_lens)
        built = build_tree(
            torch.tensor(self.bonus),
            tree.parent_list,
            tree.top_scores_index,
            tree.draft_tokens,
            seq_lens,
            sum(self.seq_lens),
            topk,
            num_steps,
            n,
            TreeMaskMode.QLEN_ONLY,
            backend="torch",
        )
        retrive = (built.retrive_index, built.retrive_next_token, built.retrive_next_sibling)
        candidates = built.draft_tokens.view(self.batch, n)
        return self.verify(
            candidates, built.tree_mask.view(self.batch, n, n), built.positions, retrive
        )

    def check(self) -> list[int]:
        for b, prompt in enumerate(PROMPTS):
            got = self.output[b][:NEW_TOKENS]
            assert got == greedy_generate_naive(self.target, prompt, NEW_TOKENS), b
        return self.output[0]


@pytest.fixture(scope="module")
def target() -> LlamaForCausalLM:
    return random_model(SMALL, seed=11)


def eagle_extend(head: EagleHead | MtpDrafter, loop: Loop, kv, ids, states, lens, prefix, topk):  # type: ignore[no-untyped-def]
    return head.extend(
        ids,
        states,
        lens,
        prefix,
        loop.pre.req_pool_indices,
        loop.pre.req_to_token,
        kv,
        topk=topk,
        max_prefix_len=MAX_CONTEXT,
    )


@pytest.mark.parametrize(("topk", "num_steps", "n"), [(1, 3, 4), (4, 3, 8)])
def test_eagle_loop_is_lossless(
    target: LlamaForCausalLM, topk: int, num_steps: int, n: int
) -> None:
    head = EagleHead.random(target, seed=12)
    loop = Loop(target)
    kv = head.make_kv_cache(loop.pre.driver.kv_cache.size)
    prefill_ids = padded([[*p[1:], t] for p, t in zip(PROMPTS, loop.bonus, strict=True)])
    states = torch.zeros(loop.batch, prefill_ids.shape[1], SMALL.hidden_size)
    for b, hidden in enumerate(loop.pre.hidden):
        states[b, : hidden.shape[0]] = hidden
    lens = torch.tensor([len(p) for p in PROMPTS])
    relay = eagle_extend(head, loop, kv, prefill_ids, states, lens, lens * 0, topk)
    while not loop.done():
        scratch = loop.alloc(loop.batch * topk * (num_steps - 1)).view(loop.batch, -1)
        tree = head.draft_tree(
            relay.topk_p,
            relay.topk_index,
            relay.hidden_states,
            torch.tensor(loop.seq_lens),
            loop.pre.req_pool_indices,
            loop.pre.req_to_token,
            kv,
            scratch,
            num_steps=num_steps,
            num_draft_tokens=n,
            max_prefix_len=MAX_CONTEXT,
        )
        loop.pre.driver.kv_pool.free(scratch.flatten())
        ids, states, lens = loop.accepted(loop.build(tree, topk, num_steps, n))
        relay = eagle_extend(
            head, loop, kv, ids, states, lens, torch.tensor(loop.seq_lens) - lens, topk
        )
    loop.check()


def test_eagle_loop_with_a_copying_head_accepts_whole_chains() -> None:
    target, head = copying_head(config_seed=4)
    loop = Loop(target)
    kv = head.make_kv_cache(loop.pre.driver.kv_cache.size)
    ids = padded([[*p[1:], t] for p, t in zip(PROMPTS, loop.bonus, strict=True)])
    states = torch.zeros(loop.batch, ids.shape[1], target.config.hidden_size)
    for b, hidden in enumerate(loop.pre.hidden):
        states[b, : hidden.shape[0]] = hidden
    lens = torch.tensor([len(p) for p in PROMPTS])
    relay = eagle_extend(head, loop, kv, ids, states, lens, lens * 0, 1)
    accepted = []
    while not loop.done():
        scratch = loop.alloc(loop.batch * 2).view(loop.batch, 2)
        tree = head.draft_tree(
            relay.topk_p,
            relay.topk_index,
            relay.hidden_states,
            torch.tensor(loop.seq_lens),
            loop.pre.req_pool_indices,
            loop.pre.req_to_token,
            kv,
            scratch,
            num_steps=3,
            num_draft_tokens=4,
            max_prefix_len=MAX_CONTEXT,
        )
        ids, states, lens = loop.accepted(loop.build(tree, 1, 3, 4))
        accepted += lens.tolist()
        relay = eagle_extend(
            head, loop, kv, ids, states, lens, torch.tensor(loop.seq_lens) - lens, 1
        )
    loop.check()
    assert set(accepted) == {4}  # 3 drafts + the bonus every time


def test_mtp_loop_is_lossless(target: LlamaForCausalLM) -> None:
    topk, num_steps, n = 2, 3, 6
    drafter = MtpDrafter.random(target, num_steps, seed=13)
    loop = Loop(target)
    kv = drafter.make_kv_cache(loop.pre.driver.kv_cache.size)
    ids = padded([[*p[1:], t] for p, t in zip(PROMPTS, loop.bonus, strict=True)])
    states = torch.zeros(loop.batch, ids.shape[1], SMALL.hidden_size)
    for b, hidden in enumerate(loop.pre.hidden):
        states[b, : hidden.shape[0]] = hidden
    lens = torch.tensor([len(p) for p in PROMPTS])
    relay = eagle_extend(drafter, loop, kv, ids, states, lens, lens * 0, topk)
    while not loop.done():
        tree = drafter.select(relay.topk_p, relay.topk_index, n)
        ids, states, lens = loop.accepted(loop.build(tree, topk, num_steps, n))
        relay = eagle_extend(
            drafter, loop, kv, ids, states, lens, torch.tensor(loop.seq_lens) - lens, topk
        )
    loop.check()


@pytest.mark.parametrize("self_draft", [False, True])
def test_standalone_loop_is_lossless(target: LlamaForCausalLM, self_draft: bool) -> None:
    # Drafting with the target itself accepts every chain whole, which only happens when
    # the draft cache holds exactly the target's context one position ahead.
    num_steps = 3
    drafter = (
        StandaloneDrafter(target)
        if self_draft
        else StandaloneDrafter.random(SMALL.replace(num_layers=1), seed=14)
    )
    loop = Loop(target)
    kv = drafter.make_kv_cache(loop.pre.driver.kv_cache.size)

    def extend(ids: torch.Tensor, lens: torch.Tensor, prefix: torch.Tensor):  # type: ignore[no-untyped-def]
        return drafter.extend(
            ids,
            lens,
            prefix,
            loop.pre.req_pool_indices,
            loop.pre.req_to_token,
            kv,
            topk=1,
            max_prefix_len=MAX_CONTEXT,
        )

    lens = torch.tensor([len(p) + 1 for p in PROMPTS])  # prompt + bonus
    relay = extend(
        padded([[*p, t] for p, t in zip(PROMPTS, loop.bonus, strict=True)]), lens, lens * 0
    )
    accepted = []
    while not loop.done():
        scratch = loop.alloc(loop.batch * (num_steps - 1)).view(loop.batch, -1)
        chain = drafter.draft_chain(
            relay.topk_index,
            relay.draft_probs,
            torch.tensor(loop.seq_lens) + 1,
            loop.pre.req_pool_indices,
            loop.pre.req_to_token,
            kv,
            scratch,
            num_steps=num_steps,
            max_prefix_len=MAX_CONTEXT,
        )
        loop.pre.driver.kv_pool.free(scratch.flatten())
        loop.build(chain.tree, 1, num_steps, num_steps + 1)
        ids, _, lens = loop.accepted(torch.zeros(loop.batch * (num_steps + 1), 1))
        accepted += lens.tolist()
        relay = extend(ids, lens, torch.tensor(loop.seq_lens) - lens + 1)
    loop.check()
    if self_draft:
        assert set(accepted) == {num_steps + 1}


def test_ngram_loop_with_a_lagging_host_is_lossless(target: LlamaForCausalLM) -> None:
    n, depth = 5, 3
    loop = Loop(target)
    proposer = NgramProposer(num_draft_tokens=n, max_depth=depth)
    for req, prompt in zip(loop.pre.reqs, PROMPTS, strict=True):
        proposer.add_request(req, prompt)  # the first token is not known to the host yet
    relayed = loop.emitted
    while not loop.done():
        host = [proposer.propose_for_suffixes(req) for req in loop.pre.reqs]
        tokens, parents, valid = splice_proposals(
            padded(relayed),
            torch.tensor([len(e) for e in relayed], dtype=torch.int32),
            torch.stack([h.proposals for h in host]),
            torch.stack([h.proposal_keys for h in host]),
        )
        assert tokens[:, 0].tolist() == loop.bonus
        layout = tree_from_parents(parents, valid, torch.tensor(loop.seq_lens), depth)
        retrive = (layout.retrive_index, layout.retrive_next_token, layout.retrive_next_sibling)
        loop.verify(tokens, layout.tree_mask, layout.positions, retrive)
        for req, tokens_seen in zip(loop.pre.reqs, relayed, strict=True):
            proposer.update(req, tokens_seen)  # one iteration late
        relayed = loop.emitted
    loop.check()
