"""Attention over the paged KV cache, batched by padding, plus the cache-free dense path.

The paged path gathers each request's keys into one padded row, prefix first
(``P = max_prefix_len`` columns read through ``req_to_token``) then its new
tokens (``Q = max_extend_len`` columns read back from ``out_cache_loc`` after the
write), and runs one masked SDPA for the whole batch. Everything is built from
device tensors and the two host bounds, so nothing synchronises and the shapes
are static for a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from relayc.engine.forward_batch import ForwardBatch, ForwardMode


@dataclass
class PagedAttentionMetadata:
    """Shared by every layer of one forward."""

    kv_loc: torch.Tensor  # [B, P + Q] int64, KV slot of each key column
    mask: torch.Tensor  # [B, 1, Q, P + Q] bool, True = attend
    padded_index: torch.Tensor  # [B, Q] int64, flat token behind each query row (clamped)
    token_req: torch.Tensor  # [T] int64, request of each flat token
    token_row: torch.Tensor  # [T] int64, query row of each flat token

    @classmethod
    def build(cls, batch: ForwardBatch) -> PagedAttentionMetadata:
        num_tokens, bs = batch.input_ids.numel(), batch.batch_size
        p_max, q_max = batch.max_prefix_len, batch.max_extend_len
        if p_max > batch.req_to_token.shape[1]:
            raise ValueError(
                f"max_prefix_len {p_max} exceeds the req_to_token width {batch.req_to_token.shape[1]}"
            )
        device = batch.input_ids.device
        ext, pre = batch.extend_lens, batch.prefix_lens
        starts = torch.cumsum(ext, 0) - ext  # [B]
        rows = torch.arange(q_max, device=device)
        row_valid = rows[None, :] < ext[:, None]  # [B, Q]
        padded_index = (starts[:, None] + rows[None, :]).clamp(max=num_tokens - 1)
        token_req = torch.repeat_interleave(
            torch.arange(bs, device=device), ext, output_size=num_tokens
        )
        token_row = torch.arange(num_tokens, device=device) - starts[token_req]

        prefix_loc = batch.req_to_token[batch.req_pool_indices, :p_max].long()  # [B, P]
        new_loc = torch.where(row_valid, batch.out_cache_loc[padded_index], 0)  # [B, Q]
        kv_loc = torch.cat([prefix_loc, new_loc], dim=1)

        see_prefix = (torch.arange(p_max, device=device)[None, :] < pre[:, None])[:, None, :]
        if batch.mode is ForwardMode.VERIFY:
            if batch.tree_mask is None or batch.tree_mask.shape != (bs, q_max, q_max):
                got = None if batch.tree_mask is None else list(batch.tree_mask.shape)
                raise ValueError(
                    f"verify needs tree_mask [B, N, N] = [{bs}, {q_max}, {q_max}]; got {got}"
                )
            see_new = batch.tree_mask
        else:
            see_new = torch.ones(q_max, q_max, dtype=torch.bool, device=device).tril()[None]
        see_new = see_new & row_valid[:, None, :]
        mask = torch.cat([see_prefix.expand(bs, q_max, p_max), see_new.expand(bs, -1, -1)], dim=2)
        # Padding query rows would have no key and SDPA would return NaN; let them
        # see everything instead, their output is dropped.
        mask = mask | ~row_valid[:, :, None]
        return cls(kv_loc, mask[:, None], padded_index, token_req, token_row)


def paged_attention(
    q: torch.Tensor,  # [T, H, D]
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    layer: int,
    batch: ForwardBatch,
    meta: PagedAttentionMetadata,
) -> torch.Tensor:  # [T, H, D]
    """Write the new K/V at ``out_cache_loc``, then attend prefix + new tokens."""
    cache = batch.kv_cache
    cache.write(layer, batch.out_cache_loc, k, v)
    keys = cache.k[layer][meta.kv_loc].transpose(1, 2).to(q.dtype)  # [B, Hkv, P+Q, D]
    values = cache.v[layer][meta.kv_loc].transpose(1, 2).to(q.dtype)
    queries = q[meta.padded_index].transpose(1, 2)  # [B, H, Q, D]
    out = F.scaled_dot_product_attention(
        queries, keys, values, attn_mask=meta.mask, enable_gqa=True
    )  # [B, H, Q, D]
    return out.transpose(1, 2)[meta.token_req, meta.token_row]


def dense_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One sequence, no cache: ``q [S, H, D]``, ``k/v [S, Hkv, D]`` -> ``[S, H, D]``."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
    )
    return out.transpose(0, 1)
