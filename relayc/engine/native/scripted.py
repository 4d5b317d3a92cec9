"""The decoder layers of a CPU forward as one TorchScript call, with the same ops.

At the demo's sizes a decode forward is about 300 ATen calls of a few microseconds
each, and Python's per-call overhead (argument parsing, module calls, attribute
lookups) is a large part of every one. :func:`_layers` is the eager path of
``LlamaDecoderLayer`` (fused projections, RMSNorm, rotary, the paged K/V write and
gather, SDPA) written out as one function over lists of weights, so TorchScript's
interpreter runs it without returning to Python between ops. Same ATen ops, same
arguments, same order: the logits are bit for bit the eager path's (tested), so
greedy outputs and every losslessness argument are unchanged. torch.compile was
measured and is slower at this size (its guards and wrapper cost more than the fusions
save on two cores, after a 35 s compile), and it would change the bits.

``torch.jit.script`` is deprecated (its warning is silenced here); if scripting fails on
some torch build the model runs eagerly with one warning. Eligible: CPU, float32 weights
and cache, autograd off, fused projections current (``use_cpu_matmul_layout``), paged
attention (:class:`relayc.engine.core.attention.PagedAttend`). Anything else runs eagerly.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F


def _layers(
    x: torch.Tensor,  # [T, hidden]
    cos: torch.Tensor,  # [T, 1, head_dim]
    sin: torch.Tensor,  # [T, 1, head_dim], first half negated
    slots: torch.Tensor,  # [T] KV slots the new tokens write
    kv_loc: torch.Tensor,  # [B * (P + Q)] KV slots each request reads
    mask: torch.Tensor,  # [B, 1, Q, P + Q] additive
    padded_index: torch.Tensor | None,
    token_req: torch.Tensor | None,
    token_row: torch.Tensor | None,
    batch_size: int,
    max_extend_len: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    eps1: list[float],
    eps2: list[float],
    ln1: list[torch.Tensor],
    w_qkv: list[torch.Tensor],
    w_o: list[torch.Tensor],
    ln2: list[torch.Tensor],
    w_gate_up: list[torch.Tensor],
    w_down: list[torch.Tensor],
    k_cache: list[torch.Tensor],
    v_cache: list[torch.Tensor],
) -> torch.Tensor:
    tokens = x.shape[0]
    half = head_dim // 2
    for i in range(len(w_qkv)):
        # input_layernorm (RMSNorm, float32)
        h = ln1[i] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps1[i]))
        # fused q/k/v, q and k rotated together (RopeTables.apply)
        qkv = F.linear(h, w_qkv[i]).view(tokens, heads + 2 * kv_heads, head_dim)
        qk = qkv[:, : heads + kv_heads]
        qk = qk * cos + qk.roll(half, dims=-1) * sin
        q = qk[:, :heads]
        k = qk[:, heads:]
        v = qkv[:, heads + kv_heads :]
        # paged_attention: write the new K/V, gather prefix + new, one masked SDPA
        k_cache[i].index_put_([slots], k)
        v_cache[i].index_put_([slots], v)
        keys = k_cache[i].index_select(0, kv_loc).view(batch_size, -1, kv_heads, head_dim)
        values = v_cache[i].index_select(0, kv_loc).view(batch_size, -1, kv_heads, head_dim)
        if padded_index is None:
            queries = q.view(batch_size, max_extend_len, heads, head_dim).transpose(1, 2)
        else:
            queries = q[padded_index].transpose(1, 2)
        out = F.scaled_dot_product_attention(
            queries, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask, enable_gqa=True
        )
        if token_req is None or token_row is None:
            attn = out.transpose(1, 2).reshape(tokens, heads, head_dim)
        else:
            attn = out.transpose(1, 2)[token_req, token_row]
        x = x + F.linear(attn.reshape(tokens, -1), w_o[i])
        # post_attention_layernorm, then the fused gate/up MLP
        h = ln2[i] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps2[i]))
        gate_up = F.linear(h, w_gate_up[i])
        gate = gate_up[:, :intermediate]
        up = gate_up[:, intermediate:]
        x = x + F.linear(F.silu(gate) * up, w_down[i])
    return x


_lock = threading.Lock()
_compiled: Callable[..., torch.Tensor] | None = None
_failed = False


def scripted_layers() -> Callable[..., torch.Tensor] | None:
    """The scripted :func:`_layers`, made once per process; None where scripting failed."""
    global _compiled, _failed
    if _compiled is not None or _failed:
        return _compiled
    with _lock:
        if _compiled is None and not _failed:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)
                    warnings.simplefilter("ignore", FutureWarning)
                    _compiled = torch.jit.script(_layers)
            except Exception as exc:  # any torch build where TorchScript cannot take it
                _failed = True
                warnings.warn(
                    f"relayc: the scripted CPU decoder is unavailable ({exc!r}); "
                    "running the decoder layers eagerly (same results, slower)",
                    RuntimeWarning,
                    stacklevel=2,
                )
    return _compiled
