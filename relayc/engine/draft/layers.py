"""The building blocks the EAGLE heads and the MTP drafter share.

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

from relayc.engine.core.config import ModelConfig
from relayc.engine.core.layers import (
    AttendFn,
    Embedding,
    Linear,
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaMLP,
    RMSNorm,
    RotaryEmbedding,
)
from relayc.engine.core.limits import decoder_layer_shapes
from relayc.engine.decoder.draft_layer import NativeDraftLayer
from relayc.engine.model.llama import LlamaForCausalLM


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


def draft_layer_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The names and shapes of a :class:`DraftLayer`'s state dict, without building it (a
    loader checks them against the checkpoint first)."""
    hidden = config.hidden_size
    layer = {f"layer.{name}": shape for name, shape in decoder_layer_shapes(config).items()}
    return {"fc.weight": (hidden, 2 * hidden), **layer, "norm.weight": (hidden,)}


def eagle3_layer_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The names and shapes of an :class:`Eagle3Layer`'s state dict, without building it."""
    c = config
    shapes = decoder_layer_shapes(config)
    shapes["self_attn.q_proj.weight"] = (c.num_heads * c.head_dim, 2 * c.hidden_size)
    shapes["self_attn.k_proj.weight"] = (c.num_kv_heads * c.head_dim, 2 * c.hidden_size)
    shapes["self_attn.v_proj.weight"] = (c.num_kv_heads * c.head_dim, 2 * c.hidden_size)
    shapes["hidden_norm.weight"] = (c.hidden_size,)
    return shapes


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


class Eagle3Layer(nn.Module):
    """SGLang's EAGLE-3 input layer: attention over ``[norm(embed); hidden_norm(hidden)]``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c, dt = config, config.dtype
        self.self_attn = LlamaAttention(config)
        # q/k/v read the concatenation [embed; hidden]: twice the hidden size.
        self.self_attn.q_proj = Linear(2 * c.hidden_size, c.num_heads * c.head_dim, dt)
        self.self_attn.k_proj = Linear(2 * c.hidden_size, c.num_kv_heads * c.head_dim, dt)
        self.self_attn.v_proj = Linear(2 * c.hidden_size, c.num_kv_heads * c.head_dim, dt)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dt)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, dt)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dt)
        self.native = NativeDraftLayer(self)

    def prepare_native(self) -> bool:
        """Pack the layer for the native decoder now (``prepare_cpu_decoders``)."""
        return self.native.prepare()

    def forward(
        self,
        embeds: torch.Tensor,  # [T, hidden]
        hidden: torch.Tensor,  # [T, hidden]: fc(target features) or the head's previous g
        positions: torch.Tensor,  # [T]
        rotary: RotaryEmbedding,
        attend: AttendFn,
    ) -> torch.Tensor:
        hidden = hidden.to(embeds.dtype)
        x = self.native.attn_in(embeds, hidden, attend)  # both norms in one native call
        if x is None:
            x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        # On the CPU with paged attention and autograd off: one native call (float32 rotary
        # tables, as the target's native layers take them); else the modules.
        out = self.native(x, hidden, rotary.tables(positions, torch.float32), attend)
        if out is not None:
            return out
        rope = rotary.tables(positions, embeds.dtype)
        residual = hidden + self.self_attn(x, rope, 0, attend)
        return residual + self.mlp(self.post_attention_layernorm(residual))
