"""The Llama layers in plain torch: linear, embedding, RMSNorm, rotary tables, attention,
MLP and the decoder layer, with the fused projection weights the CPU path uses.

They sit below the native CPU decoder (``relayc.engine.decoder``), which packs their weights
and runs them as one call; ``relayc.engine.model.llama`` puts them together into
``LlamaForCausalLM`` and decides which path a forward takes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from relayc.engine.core.config import ModelConfig

# (layer index, q [T, H, D], k [T, Hkv, D], v [T, Hkv, D]) -> [T, H, D]
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def batched_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch_size: int
) -> torch.Tensor:
    """``batch_size`` equal-length sequences flattened to tokens, no cache: ``q [B*S, H, D]``,
    ``k/v [B*S, Hkv, D]`` -> ``[B*S, H, D]``, causal within each sequence (training)."""
    tokens, heads, dim = q.shape
    seq = tokens // batch_size

    def split(x: torch.Tensor) -> torch.Tensor:
        return x.view(batch_size, seq, x.shape[1], dim).transpose(1, 2)

    out = F.scaled_dot_product_attention(
        split(q), split(k), split(v), is_causal=True, enable_gqa=True
    )
    return out.transpose(1, 2).reshape(tokens, heads, dim)


def _empty(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype))


class Linear(nn.Module):
    """``nn.Linear`` without bias or its random init; weights come from weights.py."""

    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = _empty(out_features, in_features, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


def _column_major(weight: torch.Tensor) -> torch.Tensor:
    """``weight [out, in]`` with the same values, stored as the transpose of ``[in, out]``."""
    return weight if weight.stride(0) == 1 else weight.t().contiguous().t()


class FusedWeight:
    """One column-major ``[sum out, in]`` weight whose row blocks are ``linears``' weights,
    each linear's weight re-pointed to its block (a view), so the parameters, the
    state_dict and in-place updates stay as they were.

    ``get()`` returns the fused weight while it is current -- no linear's weight has been
    replaced since (``.to(device)``, ``load_state_dict(assign=True)``, a new ``.data``) --
    and autograd is off (the gradient would reach the fused tensor, not the parameters);
    else None, and the caller runs the linears one by one."""

    def __init__(self, linears: list[Linear]) -> None:
        self.linears = linears
        weights = [linear.weight.data for linear in linears]
        self.weight = _column_major(torch.cat(weights, dim=0))
        self.splits = [w.shape[0] for w in weights]
        offset = 0
        for linear, rows in zip(linears, self.splits, strict=True):
            linear.weight.data = self.weight[offset : offset + rows]
            offset += rows
        self._ptrs = [linear.weight.data_ptr() for linear in linears]

    def __deepcopy__(self, memo: dict[int, object]) -> FusedWeight:
        """A copy over the copied linears: their weights stay views of the copied fused
        weight (a deep copy keeps tensors that share storage sharing it), so the copy is
        current exactly when this one is."""
        twin = copy.copy(self)
        twin.linears = copy.deepcopy(self.linears, memo)
        twin.weight = copy.deepcopy(self.weight, memo)
        twin._ptrs = (
            [linear.weight.data_ptr() for linear in twin.linears]
            if self.current()
            else [-1] * len(self._ptrs)
        )
        return twin

    def current(self) -> bool:
        # Read the parameter dicts directly: nn.Module attribute lookup would cost more
        # than the fused GEMM saves, once per layer and forward.
        return all(
            linear._parameters["weight"].data_ptr() == ptr  # type: ignore[union-attr]
            for linear, ptr in zip(self.linears, self._ptrs, strict=True)
        )

    def get(self) -> torch.Tensor | None:
        if torch.is_grad_enabled() or not self.current():
            return None
        return self.weight


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = _empty(num_embeddings, dim, dtype=dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _empty(size, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            # The formula below without its two no-op casts (same ops, same bits): six ops.
            # (F.rms_norm is no fused kernel on the CPU: about fifteen.)
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))
        # Normalise in float32 and scale after casting back, as transformers does,
        # so half-precision checkpoints give the logits they were trained with.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RopeTables(NamedTuple):
    """One forward's rotary factors, gathered once for every layer: ``[T, 1, head_dim]``."""

    cos: torch.Tensor
    sin: torch.Tensor  # first half negated: rotate_half(x) * sin == roll(x, half) * this

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate ``x [T, heads, head_dim]`` (the rotate-half convention of HF Llama)."""
        # rotate_half(x) = cat(-x2, x1) = roll(x, half) with the first half negated; the
        # sign rides on the sine table instead (negation is exact: same bits).
        return x * self.cos + x.roll(x.shape[-1] // 2, dims=-1) * self.sin


class LayerCall(Protocol):
    """Decoder layers run as one call (the native decoder's ``ScriptedLayers``, which
    ``use_cpu_matmul_layout`` sets on a layer): the output, or None where the call declines
    and the eager layers run instead."""

    def __call__(
        self, x: torch.Tensor, rope: RopeTables, cache_layers: Sequence[int], attend: object
    ) -> torch.Tensor | None: ...


class RotaryEmbedding(nn.Module):
    """cos/sin tables ``[max_position, head_dim]`` in float32, indexed by position."""

    cos: torch.Tensor  # buffers (register_buffer), typed for the checker
    sin: torch.Tensor
    signed_sin: torch.Tensor

    def __init__(self, head_dim: int, theta: float, max_position: int) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (
            torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        )
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        angles = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        half = head_dim // 2
        signed = torch.cat([-angles[:, :half].sin(), angles[:, half:].sin()], dim=-1)
        self.register_buffer("signed_sin", signed, persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> RopeTables:
        cos = self.cos.index_select(0, positions)[:, None, :]
        sin = self.signed_sin.index_select(0, positions)[:, None, :]
        if dtype != torch.float32:
            cos, sin = cos.to(dtype), sin.to(dtype)
        return RopeTables(cos, sin)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x [T, heads, head_dim]`` at ``positions [T]``."""
        return self.tables(positions, x.dtype).apply(x)


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c, dt = config, config.dtype
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = Linear(c.hidden_size, c.num_heads * c.head_dim, dt)
        self.k_proj = Linear(c.hidden_size, c.num_kv_heads * c.head_dim, dt)
        self.v_proj = Linear(c.hidden_size, c.num_kv_heads * c.head_dim, dt)
        self.o_proj = Linear(c.num_heads * c.head_dim, c.hidden_size, dt)
        self.qkv: FusedWeight | None = None

    def fuse_projections(self) -> None:
        if self.qkv is None or not self.qkv.current():
            self.qkv = FusedWeight([self.q_proj, self.k_proj, self.v_proj])

    def forward(
        self,
        x: torch.Tensor,
        rope: RopeTables,
        layer: int,
        attend: AttendFn,
    ) -> torch.Tensor:
        tokens, heads, kv_heads, dim = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        fused = None if self.qkv is None else self.qkv.get()
        if fused is not None:
            qkv = F.linear(x, fused).view(tokens, heads + 2 * kv_heads, dim)
            # q and k rotate together: one set of elementwise ops for both.
            qk = rope.apply(qkv[:, : heads + kv_heads])
            q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads :]
        else:
            q = rope.apply(self.q_proj(x).view(tokens, heads, dim))
            k = rope.apply(self.k_proj(x).view(tokens, kv_heads, dim))
            v = self.v_proj(x).view(tokens, kv_heads, dim)
        return F.linear(attend(layer, q, k, v).reshape(tokens, -1), self.o_proj.weight)


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, i, dt = config.hidden_size, config.intermediate_size, config.dtype
        self.gate_proj = Linear(h, i, dt)
        self.up_proj = Linear(h, i, dt)
        self.down_proj = Linear(i, h, dt)
        self.gate_up: FusedWeight | None = None

    def fuse_projections(self) -> None:
        if self.gate_up is None or not self.gate_up.current():
            self.gate_up = FusedWeight([self.gate_proj, self.up_proj])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = None if self.gate_up is None else self.gate_up.get()
        if fused is not None:
            gate, up = F.linear(x, fused).split(self.gate_up.splits, dim=-1)  # type: ignore[union-attr]
            return F.linear(F.silu(gate) * up, self.down_proj.weight)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.dtype)
        self.post_attention_layernorm = RMSNorm(
            config.hidden_size, config.rms_norm_eps, config.dtype
        )
        # Set by use_cpu_matmul_layout: this layer alone as one scripted call (draft heads).
        self.scripted: LayerCall | None = None

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | RopeTables,
        rotary: RotaryEmbedding,
        layer: int,
        attend: AttendFn,
    ) -> torch.Tensor:
        """``positions``: the tokens' positions ``[T]``, or their rotary tables when the
        caller gathered them once for several layers."""
        rope = positions if isinstance(positions, RopeTables) else rotary.tables(positions, x.dtype)
        if self.scripted is not None:
            out = self.scripted(x, rope, [layer], attend)
            if out is not None:
                return out
        x = x + self.self_attn(self.input_layernorm(x), rope, layer, attend)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, config.dtype)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.dtype)
