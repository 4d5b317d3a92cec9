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

from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.native import library as native


@dataclass
class PagedAttentionMetadata:
    """Shared by every layer of one forward."""

    kv_loc: torch.Tensor  # [B * (P + Q)] int64, KV slot of each key column, request-major
    # [B, 1, Q, P + Q] float, 0 = attend, -inf = not: what SDPA turns a bool mask into on
    # every call, made once per forward instead of once per layer
    mask: torch.Tensor
    batch_size: int
    max_extend_len: int  # Q
    # None when every request has exactly Q new tokens (decode, verify, padded extend):
    # the flat tokens then are the padded rows and need no gather either way.
    padded_index: torch.Tensor | None  # [B, Q] int64, flat token behind each query row (clamped)
    token_req: torch.Tensor | None  # [T] int64, request of each flat token
    token_row: torch.Tensor | None  # [T] int64, query row of each flat token

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
        uniform = batch.uniform_extend
        if uniform and num_tokens != bs * q_max:
            raise ValueError(
                f"{batch.mode.value} needs max_extend_len ({q_max}) tokens per request: "
                f"{bs} requests have {num_tokens}"
            )
        if batch.mode is ForwardMode.VERIFY and (
            batch.tree_mask is None or batch.tree_mask.shape != (bs, q_max, q_max)
        ):
            got = None if batch.tree_mask is None else list(batch.tree_mask.shape)
            raise ValueError(
                f"verify needs tree_mask [B, N, N] = [{bs}, {q_max}, {q_max}]; got {got}"
            )
        if uniform and device.type == "cpu":
            made = cls._native_uniform(batch)
            if made is not None:
                return made
        prefix_loc = batch.req_to_token[batch.req_pool_indices, :p_max].long()  # [B, P]
        if uniform:
            padded_index = token_req = token_row = row_valid = None
            new_loc = batch.out_cache_loc.view(bs, q_max)
        else:
            starts = torch.cumsum(ext, 0) - ext  # [B]
            rows = torch.arange(q_max, device=device)
            row_valid = rows[None, :] < ext[:, None]  # [B, Q]
            padded_index = (starts[:, None] + rows[None, :]).clamp(max=num_tokens - 1)
            token_req = torch.repeat_interleave(
                torch.arange(bs, device=device), ext, output_size=num_tokens
            )
            token_row = torch.arange(num_tokens, device=device) - starts[token_req]
            new_loc = torch.where(row_valid, batch.out_cache_loc[padded_index], 0)  # [B, Q]
        kv_loc = torch.cat([prefix_loc, new_loc], dim=1).view(-1)

        see_prefix = (torch.arange(p_max, device=device)[None, :] < pre[:, None])[:, None, :]
        if batch.mode is ForwardMode.VERIFY:
            assert batch.tree_mask is not None, "checked above"
            see_new = batch.tree_mask
        else:
            see_new = torch.ones(q_max, q_max, dtype=torch.bool, device=device).tril()[None]
        if row_valid is not None:
            see_new = see_new & row_valid[:, None, :]
        mask = torch.cat([see_prefix.expand(bs, q_max, p_max), see_new.expand(bs, -1, -1)], dim=2)
        if row_valid is not None:
            # Padding query rows would have no key and SDPA would return NaN; let them
            # see everything instead, their output is dropped.
            mask = mask | ~row_valid[:, :, None]
        # Every row sees at least its own token, so no row is all -inf.
        return cls(
            kv_loc,
            additive_mask(mask, batch.kv_cache.k[0].dtype),
            bs,
            q_max,
            padded_index,
            token_req,
            token_row,
        )

    @classmethod
    def _native_uniform(cls, batch: ForwardBatch) -> PagedAttentionMetadata | None:
        """:meth:`build`'s result for a CPU batch of ``max_extend_len`` new tokens per
        request, made by one native call (paged_meta.c's ``relayc_paged_meta``): the same
        values, where the torch calls cost some 20 us each right after a forward has
        streamed its weights. None (the torch path) without the library, for other index
        types or layouts, or for bad indices (the torch path raises their error)."""
        lib = native.native_decoder()
        if lib is None:
            return None
        table, rows, slots = batch.req_to_token, batch.req_pool_indices, batch.out_cache_loc
        lens, tree = batch.prefix_lens, batch.tree_mask
        if batch.mode is not ForwardMode.VERIFY:
            tree = None  # decode / padded extend: causal among the new tokens
        if not (
            table.dtype == torch.int32
            and rows.dtype == lens.dtype == slots.dtype == torch.int64
            and (tree is None or tree.dtype == torch.bool)
            and all(t.is_contiguous() for t in (table, rows, lens, slots))
            and table.dim() == 2
        ):
            return None
        if tree is not None and not tree.is_contiguous():
            tree = tree.contiguous()
        bs, p_max, q_max = batch.batch_size, batch.max_prefix_len, batch.max_extend_len
        kv_loc = torch.empty(bs * (p_max + q_max), dtype=torch.int64)
        mask = torch.empty(bs, 1, q_max, p_max + q_max, dtype=torch.float32)
        code = lib.relayc_paged_meta(
            bs,
            q_max,
            p_max,
            table.data_ptr(),
            table.shape[0],
            table.shape[1],
            rows.data_ptr(),
            lens.data_ptr(),
            slots.data_ptr(),
            None if tree is None else tree.data_ptr(),
            kv_loc.data_ptr(),
            mask.data_ptr(),
        )
        if code != 0:
            return None
        dtype = batch.kv_cache.k[0].dtype
        # 0 and -inf are exact in every float type
        return cls(
            kv_loc, mask if dtype == torch.float32 else mask.to(dtype), bs, q_max, None, None, None
        )

    @classmethod
    def uniform(
        cls, kv_loc: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype
    ) -> PagedAttentionMetadata:
        """``Q`` new tokens per request, request-major, over key slots ``kv_loc [B, S]``;
        ``mask [B, Q, S]`` bool, True = attend."""
        bs, q_max, _ = mask.shape
        return cls(
            kv_loc.reshape(-1).long(), additive_mask(mask, dtype), bs, q_max, None, None, None
        )


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``mask [B, Q, S]`` bool -> ``[B, 1, Q, S]``: 0 where True, -inf where False."""
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return zeros.masked_fill_(~mask, float("-inf"))[:, None]


@dataclass(frozen=True)
class PagedAttend:
    """The attention callback of one paged forward (``AttendFn``): ``paged_attention`` over
    ``batch`` and ``meta``. A value rather than a closure, so a decoder that runs its
    layers in one call (relayc.engine.native.scripted) can read what it attends over."""

    batch: ForwardBatch  # read: kv_cache and out_cache_loc
    meta: PagedAttentionMetadata

    @classmethod
    def build(cls, batch: ForwardBatch) -> PagedAttend:
        return cls(batch, PagedAttentionMetadata.build(batch))

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        return paged_attention(q, k, v, layer, self.batch, self.meta)


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
    bs, q_max = meta.batch_size, meta.max_extend_len
    # index_select on the flat slot list: a plain row gather, about twice as fast on the
    # CPU as advanced indexing with a [B, P+Q] index.
    shape = (bs, -1, k.shape[1], k.shape[2])
    keys = cache.k[layer].index_select(0, meta.kv_loc).view(shape).transpose(1, 2)
    values = cache.v[layer].index_select(0, meta.kv_loc).view(shape).transpose(1, 2)
    if keys.dtype != q.dtype:
        keys, values = keys.to(q.dtype), values.to(q.dtype)
    if meta.padded_index is None:
        queries = q.view(bs, q_max, q.shape[1], q.shape[2]).transpose(1, 2)  # [B, H, Q, D]
    else:
        queries = q[meta.padded_index].transpose(1, 2)
    mask = meta.mask if meta.mask.dtype == q.dtype else meta.mask.to(q.dtype)
    out = F.scaled_dot_product_attention(
        queries, keys, values, attn_mask=mask, enable_gqa=True
    )  # [B, H, Q, D]
    if meta.token_req is None:
        return out.transpose(1, 2).reshape(q.shape)
    return out.transpose(1, 2)[meta.token_req, meta.token_row]


def dense_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One sequence, no cache: ``q [S, H, D]``, ``k/v [S, Hkv, D]`` -> ``[S, H, D]``."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
    )
    return out.transpose(0, 1)
