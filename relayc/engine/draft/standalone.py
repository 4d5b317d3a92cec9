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

Dynamic draft length (``Engine(algorithm="standalone", draft_confidence=0.4)``,
transformers' ``assistant_confidence_threshold`` semantics): a request stops drafting
after the first draft whose draft probability is below its threshold (that draft is
kept). Shapes never change: the chain still has ``num_steps`` drafts, and the drafts
past the stop get an all-zero draft distribution. ``accept_chain`` reads that as "not
drafted": greedy rows stop accepting there, and chain rejection sampling rejects a
draft with ``q = 0`` and draws from ``normalize(relu(p - 0)) = p``, exactly what a
chain cut at that length would do, so outputs stay lossless. The draft forwards past
the stop are skipped only when every request of the batch has stopped and the host
may read the device (CPU, outside ``graph_safe_paths``); under CUDA graphs they run
and are masked. :class:`DraftConfidence` adapts each request's threshold from its
acceptance history the way transformers' ``update_candidate_strategy`` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch

from relayc.engine.core.config import ModelConfig
from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.core.kv_cache import KVCache
from relayc.engine.draft.paged import (
    first_column_sampled,
    last_rows,
    padded_extend_batch,
    sample_from,
    top_k_probs,
)
from relayc.engine.draft.tree import ChainDraft, chain_tree
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import load_checkpoint, random_model, save_checkpoint
from relayc.kernels._backend import graph_safe


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
        thresholds: torch.Tensor | None = None,
    ) -> ChainDraft:
        """``num_steps`` drafts per request from the relayed top-1 and its distribution.

        ``draft_lens [B]`` is the draft cache length (draft 1's position);
        ``scratch_cache_loc [B, num_steps - 1]`` receives drafts 1..num_steps-1's
        K/V; ``coins [B, num_steps - 1]`` switch drafts 2.. from argmax to samples.
        Each step is a DECODE forward over a private ``[B, max_prefix_len +
        num_steps - 1]`` table: the request's slots, then its scratch slots.
        ``bonus_cache_loc [B]``: the slot of the bonus position ``draft_lens - 1``
        when ``req_to_token`` does not hold it (the engine's private bonus slots).
        ``thresholds [B]``: dynamic draft length (module docstring); drafts after the
        first one drawn with a probability below the request's threshold get an all-zero
        ``draft_probs`` row (and, when the loop stops early, token 0).
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
        # Breaking out reads the device: only where the host may (no graph being captured).
        stop_at = thresholds if device.type == "cpu" and not graph_safe() else None
        for step in range(num_steps - 1):
            if stop_at is not None and bool(
                (_confidences(tokens, probs) < stop_at[:, None]).any(dim=1).all()
            ):
                break
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
        skipped = num_steps - len(tokens)
        if skipped:
            tokens += [torch.zeros_like(tokens[0])] * skipped
            probs += [torch.zeros_like(probs[0])] * skipped
        stacked = torch.stack(probs, dim=1)
        if thresholds is not None:
            drafted = drafted_mask(_confidences(tokens, probs), thresholds)
            stacked = stacked * drafted[:, :, None].to(stacked.dtype)
        return ChainDraft(chain_tree(torch.stack(tokens, dim=1)), stacked)


def _confidences(tokens: list[torch.Tensor], probs: list[torch.Tensor]) -> torch.Tensor:
    """``[B, len(tokens)]``: each draft's probability under the distribution it came from."""
    return torch.stack(
        [p.gather(1, t[:, None])[:, 0] for t, p in zip(tokens, probs, strict=True)], dim=1
    )


def drafted_mask(confidences: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` bool: the drafts a request keeps, those up to and including its first draft
    below ``thresholds [B]`` (transformers' ``ConfidenceCriteria`` stops after that token)."""
    low = (confidences < thresholds[:, None]).to(torch.int64)
    return (low.cumsum(dim=1) - low) == 0


class DraftConfidence:
    """Per-request-slot confidence thresholds and their adaptation (device tensors only).

    transformers' assisted generation (``AssistedCandidateGenerator.update_candidate_
    strategy``) keeps, per generation, every verified draft's probability with a label:
    1 for each accepted draft, 0 for the first rejected one (later drafts are dropped);
    once it holds more than 5 entries of both labels it sets the threshold to the ROC
    point minimising ``fpr + 3 * fnr`` (a false negative, stopping before a draft that
    would have been accepted, costs three times a false positive). Here each request slot
    keeps the last ``history`` entries in a ring (transformers keeps all), candidates are
    the history's probabilities plus +inf (sklearn's first ROC threshold), and ties go to
    the higher threshold (``np.argmin`` over descending thresholds). Everything is
    fixed-shape and indexed by device tensors, so it runs inside a captured step.
    """

    def __init__(
        self,
        slots: int,
        num_steps: int,
        threshold: float,
        device: torch.device | str,
        history: int = 64,
    ) -> None:
        if history < num_steps:
            raise ValueError(f"`history` ({history}) must hold a chain ({num_steps} drafts)")
        self.initial = float(threshold)
        self.history = history
        self.thresholds = torch.full((slots,), self.initial, dtype=torch.float32, device=device)
        self.probs = torch.zeros(slots, history, dtype=torch.float32, device=device)
        self.labels = torch.zeros(slots, history, dtype=torch.float32, device=device)
        self.count = torch.zeros(slots, dtype=torch.int64, device=device)  # entries ever recorded
        self.drafted = torch.zeros(slots, num_steps, dtype=torch.float32, device=device)
        self.draft_lens = torch.zeros(slots, dtype=torch.int64, device=device)

    def reset(self, rows: torch.Tensor) -> None:
        """A new request in slots ``rows``: the initial threshold, an empty history."""
        rows = rows.long()
        self.thresholds[rows] = self.initial
        self.count[rows] = 0

    def record(self, rows: torch.Tensor, draft_probs: torch.Tensor, tokens: torch.Tensor) -> None:
        """The chain just drafted for ``rows``: each draft's confidence and the kept length
        (``draft_probs [B, S, V]`` zero past the stop, ``tokens [B, S]``)."""
        rows = rows.long()
        confidences = draft_probs.gather(2, tokens.long()[:, :, None])[:, :, 0]
        self.drafted[rows] = confidences
        self.draft_lens[rows] = (draft_probs.sum(dim=-1) > 0).sum(dim=1)

    def update(self, rows: torch.Tensor, accepted: torch.Tensor) -> None:
        """Record ``accepted [B]`` (accepted drafts) for the chains :meth:`record` saw and
        re-fit the thresholds of ``rows``."""
        rows = rows.long()
        accepted = accepted.long()
        draft_lens = self.draft_lens[rows]
        confidences = self.drafted[rows]
        steps = confidences.shape[1]
        cols = torch.arange(steps, device=rows.device)[None, :]
        # Accepted drafts are positives; the first rejected one (if any was drafted) a negative.
        new = cols < (accepted + (accepted < draft_lens).long())[:, None]
        count = self.count[rows]
        ring = (count[:, None] + cols) % self.history
        old_p, old_l = self.probs[rows].gather(1, ring), self.labels[rows].gather(1, ring)
        probs = self.probs[rows].scatter(1, ring, torch.where(new, confidences, old_p))
        label = (cols < accepted[:, None]).to(torch.float32)
        labels = self.labels[rows].scatter(1, ring, torch.where(new, label, old_l))
        count = count + new.sum(dim=1)
        self.probs[rows], self.labels[rows], self.count[rows] = probs, labels, count
        self.thresholds[rows] = self._fit(probs, labels, count, self.thresholds[rows])

    def _fit(
        self, probs: torch.Tensor, labels: torch.Tensor, count: torch.Tensor, current: torch.Tensor
    ) -> torch.Tensor:
        valid = torch.arange(self.history, device=probs.device)[None, :] < count[:, None]
        pos = labels * valid
        neg = (1 - labels) * valid
        num_pos, num_neg = pos.sum(dim=1), neg.sum(dim=1)
        # predicted[b, i, j]: entry j is predicted positive at threshold probs[b, i].
        predicted = (probs[:, None, :] >= probs[:, :, None]).to(torch.float32)
        tpr = (predicted * pos[:, None, :]).sum(dim=2) / num_pos.clamp(min=1)[:, None]
        fpr = (predicted * neg[:, None, :]).sum(dim=2) / num_neg.clamp(min=1)[:, None]
        costs = torch.where(valid, fpr + 3 * (1 - tpr), torch.inf)
        best = costs.min(dim=1).values
        at_best = torch.where(costs == best[:, None], probs, -torch.inf).max(dim=1).values
        # The +inf threshold (stop after one draft) costs fpr 0 + 3 * fnr 1 = 3; it wins ties.
        fitted = torch.where(best < 3, at_best, torch.inf)
        ready = (count > 5) & (num_pos > 0) & (num_neg > 0)
        return torch.where(ready, fitted, current)
