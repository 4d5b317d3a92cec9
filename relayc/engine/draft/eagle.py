"""The EAGLE draft head: one Llama decoder layer over the target's embedding and hidden state.

Draft position ``t`` pairs the *next* token with the target's hidden state at
``t`` (EAGLE-1/2): its input is ``fc(cat(embed(x[t+1]), h[t]))``, its output
``g[t]`` goes through the head's own RMSNorm and the target's LM head and
predicts ``x[t+2]``. The embedding and LM head are the target's (shared, not
stored). ``h`` is the target's last-layer output before the final norm, as
``ForwardOutput.hidden_states`` returns it. Unlike SGLang's EAGLE-1 head the
decoder layer keeps its input RMSNorm and the head has a final norm, so a head
built from a target's own layer reproduces that layer exactly.

Because of the shift the draft cache has exactly as many entries as the
target's: after a verify with ``m`` accepted drafts, the emitted tokens
``a_1..a_m, bonus`` pair with the target hidden states of the accepted nodes
``root, a_1..a_m`` at positions ``new_seq_len - (m+1) .. new_seq_len - 1``, whose
KV slots ``req_to_token`` already holds (:meth:`EagleHead.extend`). The
relayed ``hidden_states`` is the head's own ``g`` at the last position; tree
drafting continues from it (:meth:`EagleHead.draft_tree`), or chain drafting
with the full draft distributions (:meth:`EagleHead.draft_chain`, topk 1).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, cast

import torch
from torch import nn

from relayc.engine.core.attention import PagedAttend, dense_causal_attention
from relayc.engine.core.config import ModelConfig
from relayc.engine.core.kv_cache import KVCache
from relayc.engine.core.layers import AttendFn, RotaryEmbedding
from relayc.engine.draft.layers import (
    DraftLayer,
    TargetParts,
    check_head_config,
    draft_layer_shapes,
)
from relayc.engine.draft.native_draft import NativeDraft, NativeDraftHead
from relayc.engine.draft.paged import (
    ScratchAttention,
    first_column_sampled,
    last_rows,
    padded_extend_batch,
    padding_rows_zeroed,
    sample_from,
    top_k_probs,
)
from relayc.engine.draft.tree import (
    ChainDraft,
    DraftTree,
    chain_tree,
    keeps_every_draft,
    organize_draft_results,
    select_level,
)
from relayc.engine.draft.weights import (
    check_draft_tensors,
    init_module_random,
    load_draft_weights,
    read_draft_config,
    save_draft,
)
from relayc.engine.model.llama import LlamaForCausalLM


class EagleExtendOutput(NamedTuple):
    """What draft extend relays: the next top-k and the head's last hidden state."""

    topk_p: torch.Tensor  # [B, topk] float32
    topk_index: torch.Tensor  # [B, topk] int64
    hidden_states: torch.Tensor  # [B, hidden] model dtype, the head's g at the last position
    draft_probs: torch.Tensor  # [B, vocab] float32, the full distribution topk_p comes from


class EagleHead(nn.Module):
    """A one-layer EAGLE head sharing ``target``'s embedding and LM head.

    ``config`` describes the head's layer (its ``num_layers`` is ignored);
    ``hidden_size`` and ``vocab_size`` must match the target's. Weights start
    uninitialised: use :meth:`random` or :meth:`load`.
    """

    DRAFT_TYPE = "eagle"
    # draft_tree drafts a chain that keeps every draft (topk 1) without the beam search's
    # bookkeeping (the same tree); False: through the beam search (tests compare the two)
    chain_shortcut = True
    # the head's draft extend and greedy chain in one native call each, where it has them
    # (an EAGLE-3 head: relayc.engine.draft.native_draft); None: step by step
    native_draft: NativeDraft | None = None

    def __init__(self, config: ModelConfig, target: LlamaForCausalLM) -> None:
        super().__init__()
        check_head_config(config, target)
        self.config = config.replace(num_layers=1)
        self.target = TargetParts.of(target)
        self.layers = nn.ModuleList([DraftLayer(self.config)])
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_position)
        self.to(target.device)

    @classmethod
    def random(
        cls, target: LlamaForCausalLM, seed: int, config: ModelConfig | None = None
    ) -> EagleHead:
        """A seeded random head; ``config`` defaults to the target's."""
        head = cls(config or target.config, target)
        init_module_random(head, seed)
        return head

    def save(self, directory: str | Path) -> Path:
        return save_draft(self, self.config, self.DRAFT_TYPE, directory)

    @staticmethod
    def tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
        """The head's state-dict names and shapes for ``config``, without building it."""
        return {f"layers.0.{name}": shape for name, shape in draft_layer_shapes(config).items()}

    @classmethod
    def load(cls, directory: str | Path, target: LlamaForCausalLM) -> EagleHead:
        config, _ = read_draft_config(directory, cls.DRAFT_TYPE, target)
        check_draft_tensors(directory, lambda: cls.tensor_shapes(config), kind="an EAGLE head")
        head = cls(config, target)
        load_draft_weights(head, directory)
        return head

    @property
    def device(self) -> torch.device:
        return self.layers[0].fc.weight.device

    def make_kv_cache(self, size: int) -> KVCache:
        """The head's cache: one layer, ``size`` slots (the target cache's size)."""
        return KVCache.for_model(self.config, size, self.device)

    def step(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        attend: AttendFn,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One head forward over flat tokens: ``(logits [T, vocab] float32, g [T, hidden])``.

        Tree drafting calls it once per level (one-step decode); extend once over
        the accepted tokens.
        """
        out = self.layers[0](
            self.target.embed_tokens(input_ids), hidden, positions, self.rotary, 0, attend
        )
        return self.logits(out), out

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        return self.target.lm_head(self.layers[0].norm(g)).float()

    @torch.no_grad()
    def extend(
        self,
        input_ids: torch.Tensor,
        target_hidden: torch.Tensor,
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
    ) -> EagleExtendOutput:
        """Draft extend: append ``lens[b]`` tokens per request and relay the next top-k.

        ``input_ids [B, W]`` are the tokens *after* the ones ``target_hidden [B, W,
        hidden]`` was computed at (prefill: prompt[1:] + first sampled token with
        the prompt's hidden states; decode: the emitted tokens with the accepted
        nodes' hidden states). They go to draft positions ``prefix_lens + i`` and,
        unless ``out_cache_loc [B, W]`` says otherwise, to the KV slots
        ``req_to_token`` holds there. Rows ``i >= lens[b]`` are padding.
        ``max_prefix_len`` is a static host bound on ``prefix_lens``. With ``coins
        [B]`` column 0 of the top-k is a sample of ``draft_probs`` instead (the
        first draft of a sampled chain, see :meth:`draft_chain`).
        """
        batch_size, width = input_ids.shape
        input_ids, target_hidden = padding_rows_zeroed(lens, input_ids, target_hidden)
        batch = padded_extend_batch(
            input_ids,
            lens,
            prefix_lens,
            req_pool_indices,
            req_to_token,
            kv_cache,
            max_prefix_len,
            out_cache_loc,
            self.config.max_position,
        )
        hidden = target_hidden.reshape(batch_size * width, -1)
        last = last_rows(lens, width)
        out = self.layers[0](
            self.target.embed_tokens(batch.input_ids),
            hidden,
            batch.positions,
            self.rotary,
            0,
            PagedAttend.build(batch),
        )[last]
        topk_p, topk_index, probs = top_k_probs(self.logits(out), topk)
        if coins is not None:
            topk_p, topk_index = first_column_sampled(topk_p, topk_index, probs, coins)
        return EagleExtendOutput(topk_p, topk_index, out, probs)

    @torch.no_grad()
    def draft_tree(
        self,
        topk_p: torch.Tensor,
        topk_index: torch.Tensor,
        hidden_states: torch.Tensor,
        seq_lens: torch.Tensor,
        req_pool_indices: torch.Tensor,
        req_to_token: torch.Tensor,
        kv_cache: KVCache,
        scratch_cache_loc: torch.Tensor,
        *,
        num_steps: int,
        num_draft_tokens: int,
        max_prefix_len: int,
    ) -> DraftTree:
        """EAGLE-2 beam drafting (SGLang's ``draft_forward`` + ``organize_draft_results``).

        From the relayed ``topk_p`` / ``topk_index [B, topk]`` and ``hidden_states
        [B, hidden]`` run ``num_steps - 1`` head forwards, each over the ``topk``
        kept beams of every request, and return the ``build_tree`` inputs for the
        best ``num_draft_tokens - 1`` candidates. ``seq_lens [B]`` is the draft
        cache length (the target's sequence length): level ``s``'s beams sit at
        position ``seq_lens + s``. Their K/V go to ``scratch_cache_loc [B,
        topk*(num_steps-1)]`` (column ``s*topk + j``: level s, beam j), discarded
        afterwards; each beam attends the cached prefix and its own ancestors
        only, so every candidate's distribution is exactly the head's on its path.
        """
        batch_size, topk = topk_p.shape
        width = topk * (num_steps - 1)
        if num_steps < 1 or tuple(scratch_cache_loc.shape) != (batch_size, width):
            raise ValueError(
                f"`scratch_cache_loc` must be [B, topk*(num_steps-1)] = [{batch_size}, {width}] "
                f"with num_steps >= 1; got {list(scratch_cache_loc.shape)}, num_steps={num_steps}"
            )
        chain = self.chain_shortcut and keeps_every_draft(topk, num_steps, num_draft_tokens)
        if chain and num_steps == 1:
            return chain_tree(topk_index[:, :1])  # the relayed top-1 is the whole chain
        if chain and self.native_draft is not None:
            made = self.native_draft.chain(
                cast("NativeDraftHead", self),  # only an EAGLE-3 head has a NativeDraft
                topk_index[:, 0],
                hidden_states,
                seq_lens,
                req_pool_indices,
                req_to_token,
                kv_cache,
                scratch_cache_loc,
                max_prefix_len,
            )
            if made is not None:
                return chain_tree(made)
        scratch = ScratchAttention(
            kv_cache,
            req_to_token,
            req_pool_indices,
            seq_lens,
            max_prefix_len,
            scratch_cache_loc,
            queries=topk,
        )
        if chain:
            # One beam a level, every candidate kept in order: the chain is the tree (the same
            # forwards, each step's top-1 of the same probabilities), without the beam
            # bookkeeping -- some thirty small ops an iteration, each slow after a forward.
            drafts = self._chain_tokens(
                topk_index[:, 0],
                hidden_states,
                scratch,
                seq_lens,
                scratch_cache_loc,
                lambda logits, step: top_k_probs(logits, 1)[1][:, 0],
            )
            return chain_tree(torch.stack(drafts, dim=1))
        device = topk_p.device
        level = select_level(0, topk_p, topk_index, None, topk)
        levels = [level]
        # Per beam of the previous level: output hidden state and visible scratch columns.
        hidden = hidden_states.repeat_interleave(topk, dim=0)
        ancestors = torch.zeros(batch_size, topk, width, dtype=torch.bool, device=device)
        beams = torch.arange(topk, device=device)
        columns = torch.arange(width, device=device)
        for step in range(num_steps - 1):
            parent = level.parent_beam  # [B, topk]
            hidden = torch.gather(
                hidden.view(batch_size, topk, -1),
                1,
                parent[:, :, None].expand(-1, -1, hidden.shape[-1]),
            ).reshape(batch_size * topk, -1)
            ancestors = torch.gather(ancestors, 1, parent[:, :, None].expand(-1, -1, width))
            ancestors = ancestors | (columns[None, :] == step * topk + beams[:, None])
            attend = scratch.step(ancestors, scratch_cache_loc[:, step * topk : (step + 1) * topk])
            positions = (seq_lens + step).repeat_interleave(topk)
            logits, hidden = self.step(level.input_ids, hidden, positions, attend)
            probs, tokens, _ = top_k_probs(logits, topk)
            level = select_level(step + 1, probs, tokens, level.scores, topk)
            levels.append(level)
        return organize_draft_results(levels, num_draft_tokens)

    def _chain_tokens(
        self,
        first: torch.Tensor,
        hidden: torch.Tensor,
        scratch: ScratchAttention,
        seq_lens: torch.Tensor,
        scratch_cache_loc: torch.Tensor,
        pick: Callable[[torch.Tensor, int], torch.Tensor],
    ) -> list[torch.Tensor]:
        """A chain's tokens ``[B]`` each: ``first``, then one head step per scratch column
        ``[B, S]`` (each seeing the cached prefix and the steps before it), whose token is
        ``pick(logits, step)``."""
        batch_size, width = scratch_cache_loc.shape
        tokens = [first]
        columns = torch.arange(width, device=first.device)
        for step in range(width):
            attend = scratch.step(
                (columns <= step).expand(batch_size, 1, width),
                scratch_cache_loc[:, step : step + 1],
            )
            logits, hidden = self.step(tokens[-1], hidden, seq_lens + step, attend)
            tokens.append(pick(logits, step))
        return tokens

    @torch.no_grad()
    def draft_chain(
        self,
        topk_index: torch.Tensor,
        draft_probs: torch.Tensor,
        hidden_states: torch.Tensor,
        seq_lens: torch.Tensor,
        req_pool_indices: torch.Tensor,
        req_to_token: torch.Tensor,
        kv_cache: KVCache,
        scratch_cache_loc: torch.Tensor,
        *,
        num_steps: int,
        max_prefix_len: int,
        coins: torch.Tensor | None = None,
    ) -> ChainDraft:
        """A chain (topk 1) with the distribution of every draft, for chain rejection sampling.

        Draft 1 is the relayed ``topk_index[:, 0]`` drawn from ``draft_probs [B,
        vocab]``; drafts 2..num_steps come from ``num_steps - 1`` head forwards,
        argmax (then the tokens equal :meth:`draft_tree`'s with topk 1) or, with
        ``coins [B, num_steps - 1]``, inverse-CDF samples, which makes rejection
        sampling with these probabilities lossless. Positions, scratch slots
        ``[B, num_steps - 1]`` and attention are as in :meth:`draft_tree`.
        """
        batch_size = topk_index.shape[0]
        width = num_steps - 1
        if tuple(scratch_cache_loc.shape) != (batch_size, width):
            raise ValueError(
                f"`scratch_cache_loc` must be [B, num_steps-1] = [{batch_size}, {width}]; "
                f"got {list(scratch_cache_loc.shape)}"
            )
        probs = [draft_probs]

        def pick(logits: torch.Tensor, step: int) -> torch.Tensor:
            step_probs = torch.softmax(logits, dim=-1)
            probs.append(step_probs)
            if coins is None:
                return step_probs.argmax(dim=-1)
            return sample_from(step_probs, coins[:, step])

        scratch = ScratchAttention(
            kv_cache,
            req_to_token,
            req_pool_indices,
            seq_lens,
            max_prefix_len,
            scratch_cache_loc,
            queries=1,
        )
        tokens = self._chain_tokens(
            topk_index[:, 0], hidden_states, scratch, seq_lens, scratch_cache_loc, pick
        )
        return ChainDraft(chain_tree(torch.stack(tokens, dim=1)), torch.stack(probs, dim=1))

    @torch.no_grad()
    def forward_dense(
        self, input_ids: torch.Tensor, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft sequence ``[S]`` from position 0, no cache: ``(logits [S, vocab], g [S, hidden])``."""
        positions = torch.arange(input_ids.numel(), device=input_ids.device)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return dense_causal_attention(q, k, v)

        return self.step(input_ids, hidden, positions, attend)
