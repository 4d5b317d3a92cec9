"""A standalone draft model: a small ``LlamaForCausalLM`` with its own KV cache, chain drafting.

Unlike an EAGLE head the draft model reads plain tokens, so draft position
``t`` holds ``x[t]``; to propose the token after the bonus it must have read
the bonus. The draft cache therefore runs one ahead of the target's: it covers
``new_seq_len + 1`` positions (through the bonus), and draft extend over the
emitted tokens ``a_1..a_m, bonus`` writes positions ``new_seq_len - m + 1 ..
new_seq_len``. Draft and target caches are separate buffers addressed by the
same KV slot ids, except the bonus position, which has no target slot yet:
the engine gives each request slot ``r`` a private draft slot (``bonus_slot``)
that holds the bonus's draft K/V until the next verify commits that position;
the next draft extend first copies it to the committed slot
(``KVCache.copy_slots``). A caller that reserves the bonus
position's slot in ``req_to_token`` itself can skip both.

Drafting is a chain (topk 1): the relayed top-1 (from the last extend) is draft
1; ``num_steps - 1`` one-token forwards give drafts 2..num_steps, each writing to
a scratch slot that later steps attend. Drafts are the argmax, or with
``coins`` an inverse-CDF sample of the draft distribution, which chain
rejection sampling needs to be lossless with the real ``draft_probs``.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch

from relayc.engine.config import ModelConfig
from relayc.engine.draft.paged import (
    first_column_sampled,
    last_rows,
    padded_extend_batch,
    sample_from,
    top_k_probs,
)
from relayc.engine.draft.tree import ChainDraft, chain_tree
from relayc.engine.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.kv_cache import KVCache
from relayc.engine.model import LlamaForCausalLM
from relayc.engine.weights import load_checkpoint, random_model, save_checkpoint


def default_standalone_config(target: ModelConfig) -> ModelConfig:
    """The random default draft model: the target's vocabulary and context, a quarter of its
    width and two layers."""
    hidden = max(32, target.hidden_size // 4)
    return target.replace(
        hidden_size=hidden,
        intermediate_size=max(64, target.intermediate_size // 4),
        num_layers=min(2, target.num_layers),
        num_heads=max(1, hidden // 32),
        num_kv_heads=1,
        head_dim=32,
    )


class StandaloneExtendOutput(NamedTuple):
    topk_p: torch.Tensor  # [B, topk] float32; column 0 is draft 1 (sampled when coins are given)
    topk_index: torch.Tensor  # [B, topk] int64
    draft_probs: torch.Tensor  # [B, vocab] float32, draft 1's distribution


class StandaloneDrafter:
    """Drafting with ``model``, a target-architecture Llama (usually much smaller)."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        self.model = model

    @classmethod
    def random(
        cls, config: ModelConfig, seed: int, device: torch.device | str = "cpu"
    ) -> StandaloneDrafter:
        return cls(random_model(config, seed, device))

    def save(self, directory: str | Path) -> Path:
        return save_checkpoint(self.model, directory)

    @classmethod
    def load(cls, directory: str | Path, device: torch.device | str = "cpu") -> StandaloneDrafter:
        return cls(load_checkpoint(directory, device))

    def make_kv_cache(self, size: int) -> KVCache:
        return KVCache.for_model(self.model.config, size, self.model.device)

    @torch.no_grad()
    def extend(
        self,
        input_ids: torch.Tensor,
        lens: torch.Tensor,
        prefix_lens: torch.Tensor,
        req_pool_indices: torch.Tensor,
        req_to_token: torch.Tensor,
        kv_cache: KVCache,
        *,
        topk: int,
        max_prefix_len: int,
        out_cache_loc: torch.Tensor | None = None,
        coins: torch.Tensor | None = None,
    ) -> StandaloneExtendOutput:
        """Append ``input_ids [B, W]`` (``lens[b]`` real) at draft positions ``prefix_lens + i``.

        Slots default to what ``req_to_token`` holds there. The distribution after
        the last real token gives the top-k; with ``coins [B]`` its column 0 is
        replaced by a sample (and its probability).
        """
        width = input_ids.shape[1]
        batch = padded_extend_batch(
            input_ids,
            lens,
            prefix_lens,
            req_pool_indices,
            req_to_token,
            kv_cache,
            max_prefix_len,
            out_cache_loc,
            self.model.config.max_position,
        )
        logits = self.model(batch).logits[last_rows(lens, width)]
        topk_p, topk_index, probs = top_k_probs(logits, topk)
        if coins is not None:
            topk_p, topk_index = first_column_sampled(topk_p, topk_index, probs, coins)
        return StandaloneExtendOutput(topk_p, topk_index, probs)

    @torch.no_grad()
    def draft_chain(
        self,
        topk_index: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_lens: torch.Tensor,
        req_pool_indices: torch.Tensor,
        req_to_token: torch.Tensor,
        kv_cache: KVCache,
        scratch_cache_loc: torch.Tensor,
        *,
        num_steps: int,
        max_prefix_len: int,
        coins: torch.Tensor | None = None,
        bonus_cache_loc: torch.Tensor | None = None,
    ) -> ChainDraft:
        """``num_steps`` drafts per request from the relayed top-1 and its distribution.

        ``draft_lens [B]`` is the draft cache length (draft 1's position);
        ``scratch_cache_loc [B, num_steps - 1]`` receives drafts 1..num_steps-1's
        K/V; ``coins [B, num_steps - 1]`` switch drafts 2.. from argmax to samples.
        Each step is a DECODE forward over a private ``[B, max_prefix_len +
        num_steps - 1]`` table: the request's slots, then its scratch slots.
        ``bonus_cache_loc [B]``: the slot of the bonus position ``draft_lens - 1``
        when ``req_to_token`` does not hold it (the engine's private bonus slots).
        """
        batch_size = topk_index.shape[0]
        device = topk_index.device
        if tuple(scratch_cache_loc.shape) != (batch_size, num_steps - 1):
            raise ValueError(
                f"`scratch_cache_loc` must be [B, num_steps-1] = [{batch_size}, {num_steps - 1}]; "
                f"got {list(scratch_cache_loc.shape)}"
            )
        table = torch.cat(
            [
                req_to_token[req_pool_indices, :max_prefix_len],
                torch.zeros(batch_size, num_steps - 1, dtype=req_to_token.dtype, device=device),
            ],
            dim=1,
        )
        if bonus_cache_loc is not None:
            table.scatter_(1, (draft_lens - 1)[:, None], bonus_cache_loc[:, None].to(table.dtype))
        scratch_cols = draft_lens[:, None] + torch.arange(num_steps - 1, device=device)
        table.scatter_(1, scratch_cols, scratch_cache_loc.to(table.dtype))
        rows = torch.arange(batch_size, device=device)
        tokens = [topk_index[:, 0]]
        probs = [draft_probs]
        for step in range(num_steps - 1):
            batch = ForwardBatch(
                mode=ForwardMode.DECODE,
                input_ids=tokens[-1],
                positions=draft_lens + step,
                out_cache_loc=scratch_cache_loc[:, step].long(),
                req_pool_indices=rows,
                prefix_lens=draft_lens + step,
                extend_lens=torch.ones(batch_size, dtype=torch.int64, device=device),
                max_prefix_len=max_prefix_len + step,
                max_extend_len=1,
                req_to_token=table,
                kv_cache=kv_cache,
            )
            step_probs = torch.softmax(self.model(batch).logits, dim=-1)
            if coins is None:
                tokens.append(step_probs.argmax(dim=-1))
            else:
                tokens.append(sample_from(step_probs, coins[:, step]))
            probs.append(step_probs)
        return ChainDraft(chain_tree(torch.stack(tokens, dim=1)), torch.stack(probs, dim=1))
