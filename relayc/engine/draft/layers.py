"""The building blocks the EAGLE head and the MTP drafter share.

A draft layer is ``fc(cat(embed(token), hidden))`` followed by one of the
engine's ``LlamaDecoderLayer`` s (attention through whatever ``AttendFn`` the
caller builds: paged extend, scratch tree steps or the dense reference) and an
RMSNorm in front of the target's LM head. The target's embedding and LM head are
held by reference (``TargetParts``), never copied or stored in a draft checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from relayc.engine.config import ModelConfig
from relayc.engine.model import (
    AttendFn,
    Embedding,
    Linear,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    RMSNorm,
    RotaryEmbedding,
)


@dataclass(frozen=True)
class TargetParts:
    """The target's modules a head shares; a plain object, so they stay out of its state_dict."""

    embed_tokens: Embedding
    lm_head: Linear

    @classmethod
    def of(cls, target: LlamaForCausalLM) -> TargetParts:
        return cls(target.model.embed_tokens, target.lm_head)


def check_head_config(config: ModelConfig, target: LlamaForCausalLM) -> None:
    for name in ("hidden_size", "vocab_size"):
        if getattr(config, name) != getattr(target.config, name):
            raise ValueError(
                f"the draft head's `{name}` ({getattr(config, name)}) must equal the target's "
                f"({getattr(target.config, name)}): it shares the target's embedding and LM head"
            )


class DraftLayer(nn.Module):
    """``fc(cat(embedding, hidden))`` then one decoder layer; ``norm`` feeds the shared LM head."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.fc = Linear(2 * config.hidden_size, config.hidden_size, config.dtype)
        self.layer = LlamaDecoderLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.dtype)

    def forward(
        self,
        embeds: torch.Tensor,  # [T, hidden]
        hidden: torch.Tensor,  # [T, hidden]
        positions: torch.Tensor,  # [T]
        rotary: RotaryEmbedding,
        cache_layer: int,
        attend: AttendFn,
    ) -> torch.Tensor:
        x = self.fc(torch.cat([embeds, hidden.to(embeds.dtype)], dim=-1))
        return self.layer(x, positions, rotary, cache_layer, attend)
