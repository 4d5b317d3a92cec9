"""Multi-layer EAGLE (MTP): one draft layer per draft step, all run inside draft extend.

Layer 0 is an EAGLE layer: at draft position ``t`` its input is
``fc(cat(embed(x[t+1]), h[t]))`` with the target's hidden state ``h``. Layer
``k >= 1`` sees, at the same position, the embedding of layer ``k-1``'s top-1
token there and layer ``k-1``'s output hidden state, so at the last accepted
position layer ``k`` proposes draft step ``k`` (the token ``k + 1`` places after
the bonus) under the top-1 path of the layers before it. Each layer has its own
cache layer (cache layer ``k`` of one ``KVCache`` with ``num_steps`` layers),
addressed like the EAGLE head's (same slots, same positions), and depends only
on earlier positions, so extending in one call or token by token fills the same
cache. The relay then carries ``topk_p`` / ``topk_index [B, num_steps, topk]``
and the next iteration only runs :func:`relayc.engine.draft.tree.mtp_select`.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

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
from relayc.engine.draft.paged import (
    last_rows,
    padded_extend_batch,
    padding_rows_zeroed,
    top_k_probs,
)
from relayc.engine.draft.tree import mtp_select
from relayc.engine.draft.weights import (
    check_draft_tensors,
    init_module_random,
    load_draft_weights,
    read_draft_config,
    save_draft,
)
from relayc.engine.model.llama import LlamaForCausalLM


class MtpExtendOutput(NamedTuple):
    topk_p: torch.Tensor  # [B, num_steps, topk] float32, row k from layer k
    topk_index: torch.Tensor  # [B, num_steps, topk] int64


class MtpDrafter(nn.Module):
    """``num_steps`` draft layers sharing ``target``'s embedding and LM head."""

    DRAFT_TYPE = "mtp"

    def __init__(self, config: ModelConfig, target: LlamaForCausalLM, num_steps: int) -> None:
        super().__init__()
        if num_steps < 1:
            raise ValueError(f"`num_steps` must be >= 1; got {num_steps}")
        check_head_config(config, target)
        self.num_steps = num_steps
        self.config = config.replace(num_layers=num_steps)
        self.target = TargetParts.of(target)
        self.layers = nn.ModuleList(DraftLayer(self.config) for _ in range(num_steps))
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_position)
        self.to(target.device)

    @classmethod
    def random(
        cls,
        target: LlamaForCausalLM,
        num_steps: int,
        seed: int,
        config: ModelConfig | None = None,
    ) -> MtpDrafter:
        drafter = cls(config or target.config, target, num_steps)
        init_module_random(drafter, seed)
        return drafter

    def save(self, directory: str | Path) -> Path:
        return save_draft(
            self, self.config, self.DRAFT_TYPE, directory, {"num_steps": self.num_steps}
        )

    @staticmethod
    def tensor_shapes(config: ModelConfig, num_steps: int) -> dict[str, tuple[int, ...]]:
        """The drafter's state-dict names and shapes, without building it: ``num_steps``
        entries of each, so check the count against the checkpoint first."""
        layer = draft_layer_shapes(config)
        return {
            f"layers.{k}.{name}": shape for k in range(num_steps) for name, shape in layer.items()
        }

    @classmethod
    def load(cls, directory: str | Path, target: LlamaForCausalLM) -> MtpDrafter:
        config, header = read_draft_config(directory, cls.DRAFT_TYPE, target, counts=("num_steps",))
        num_steps = int(header["num_steps"])
        check_draft_tensors(
            directory,
            lambda: cls.tensor_shapes(config, num_steps),
            kind=f"a {num_steps}-step MTP drafter",
            count=("num_steps", num_steps),
        )
        drafter = cls(config, target, num_steps)
        load_draft_weights(drafter, directory)
        return drafter

    @property
    def device(self) -> torch.device:
        return self.layers[0].fc.weight.device

    def make_kv_cache(self, size: int) -> KVCache:
        """One cache layer per draft layer, ``size`` slots (the target cache's size)."""
        return KVCache.for_model(self.config, size, self.device)

    select = staticmethod(mtp_select)

    def _propose(
        self,
        input_ids: torch.Tensor,  # [T]
        hidden: torch.Tensor,  # [T, hidden]
        positions: torch.Tensor,  # [T]
        rows: torch.Tensor,  # [B] flat row whose top-k each request relays
        attend: AttendFn,
        topk: int,
    ) -> MtpExtendOutput:
        tokens = input_ids
        probs_out, index_out = [], []
        for k, layer in enumerate(self.layers):
            hidden = layer(
                self.target.embed_tokens(tokens), hidden, positions, self.rotary, k, attend
            )
            last = k == self.num_steps - 1
            # The next layer needs this layer's top-1 at every position, the relay only at `rows`.
            logits = self.target.lm_head(layer.norm(hidden if not last else hidden[rows])).float()
            at_rows = logits if last else logits[rows]
            topk_p, topk_index, _ = top_k_probs(at_rows, topk)
            probs_out.append(topk_p)
            index_out.append(topk_index)
            if not last:
                tokens = logits.argmax(dim=-1)
        return MtpExtendOutput(torch.stack(probs_out, dim=1), torch.stack(index_out, dim=1))

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
    ) -> MtpExtendOutput:
        """Draft extend + drafting: same inputs and conventions as ``EagleHead.extend``."""
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
        return self._propose(
            batch.input_ids,
            target_hidden.reshape(batch_size * width, -1),
            batch.positions,
            last_rows(lens, width),
            PagedAttend.build(batch),
            topk,
        )

    @torch.no_grad()
    def forward_dense(
        self, input_ids: torch.Tensor, hidden: torch.Tensor, topk: int
    ) -> MtpExtendOutput:
        """One draft sequence ``[S]`` from position 0, no cache; the top-k at its last position."""
        positions = torch.arange(input_ids.numel(), device=input_ids.device)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return dense_causal_attention(q, k, v)

        rows = torch.tensor([input_ids.numel() - 1], device=input_ids.device)
        return self._propose(input_ids, hidden, positions, rows, attend, topk)
