"""Fixed-shape forwards of the draft models on their own paged KV caches.

A draft cache is a separate ``KVCache`` addressed through the *target's*
``req_to_token`` table: a token's draft K/V live at the same KV slot id as its
target K/V, in other buffers, so the scheduler allocates once for both.

Two kinds of forward, both with shapes fixed by host ints only (no ``.item()``):

* **padded extend** (:func:`padded_extend_batch`): ``W`` tokens per request, the
  first ``lens[b]`` real. Rows past ``lens`` write their K/V to the padding slot 0
  and come after the real rows, so causal attention keeps them out of every real
  row; their outputs are dropped. This is draft extend over accepted tokens.
* **scratch steps** (:class:`ScratchAttention`): ``Q`` new tokens per request that
  attend the cached prefix plus a caller-chosen subset of ``scratch_cache_loc``,
  slots that hold earlier draft steps' K/V and are discarded after drafting (the
  EAGLE tree: each beam sees its ancestors; a chain: every earlier step).
"""

from __future__ import annotations

import torch

from relayc.engine.core.attention import PagedAttend, PagedAttentionMetadata, additive_mask
from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.core.kv_cache import KVCache


def extend_cache_loc(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    lens: torch.Tensor,
    width: int,
) -> torch.Tensor:
    """``[B, width]`` KV slots of positions ``prefix_lens + i`` (already in ``req_to_token``);
    0 (the padding slot) for ``i >= lens``."""
    cols = prefix_lens[:, None] + torch.arange(width, device=prefix_lens.device)
    cols = cols.clamp(max=req_to_token.shape[1] - 1)
    slots = req_to_token[req_pool_indices[:, None], cols].long()
    valid = torch.arange(width, device=lens.device)[None, :] < lens[:, None]
    return torch.where(valid, slots, 0)


def padded_extend_batch(
    input_ids: torch.Tensor,
    lens: torch.Tensor,
    prefix_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    kv_cache: KVCache,
    max_prefix_len: int,
    out_cache_loc: torch.Tensor | None = None,
    max_position: int | None = None,
) -> ForwardBatch:
    """An EXTEND batch of ``input_ids [B, W]`` at positions ``prefix_lens + i``.

    ``out_cache_loc [B, W]`` defaults to the slots ``req_to_token`` already holds
    for those positions (:func:`extend_cache_loc`); padded rows must point at 0.
    """
    batch, width = input_ids.shape
    device = input_ids.device
    if out_cache_loc is None:
        out_cache_loc = extend_cache_loc(req_to_token, req_pool_indices, prefix_lens, lens, width)
    positions = prefix_lens[:, None] + torch.arange(width, device=device)
    if max_position is not None:
        positions = positions.clamp(max=max_position - 1)
    return ForwardBatch(
        mode=ForwardMode.EXTEND,
        input_ids=input_ids.reshape(-1).long(),
        positions=positions.reshape(-1),
        out_cache_loc=out_cache_loc.reshape(-1).long(),
        req_pool_indices=req_pool_indices.long(),
        prefix_lens=prefix_lens.long(),
        extend_lens=torch.full((batch,), width, dtype=torch.int64, device=device),
        max_prefix_len=max_prefix_len,
        max_extend_len=width,
        req_to_token=req_to_token,
        kv_cache=kv_cache,
        return_all_logits=True,
        equal_extend_lens=True,
    )


def padding_rows_zeroed(
    lens: torch.Tensor, input_ids: torch.Tensor, states: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids [B, W]`` and ``states [B, W, hidden]`` with rows ``i >= lens`` zeroed.

    Padding rows write their K/V to slot 0, which masked columns of every other
    row read (with weight 0): a non-finite padding state (e.g. gathered from an
    unwritten verify row) would turn those reads into NaN.
    """
    valid = torch.arange(input_ids.shape[1], device=lens.device)[None, :] < lens[:, None]
    return torch.where(valid, input_ids, 0), torch.where(valid[:, :, None], states, 0)


def gather_rows(states: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``states [..., hidden]``' rows (flattened to ``[R, hidden]``) at ``rows [B, W]``:
    ``[B, W, hidden]``, zero where ``rows`` is negative (never NaN)."""
    flat = states.reshape(-1, states.shape[-1])
    return torch.where((rows >= 0)[:, :, None], flat[rows.clamp(min=0)], 0)


def last_rows(lens: torch.Tensor, width: int) -> torch.Tensor:
    """Flat row of each request's last real token in a padded ``[B, width]`` batch."""
    batch = lens.shape[0]
    return torch.arange(batch, device=lens.device) * width + (lens - 1).clamp(min=0)


class ScratchAttention:
    """Attention for ``Q`` new tokens per request over the cached prefix plus a chosen
    subset of the scratch slots ``scratch_cache_loc [B, S]``, for every step of one
    drafting run. New tokens lie request-major: token ``b*Q + q``.

    The key slots (the cached prefix, then ``scratch_cache_loc [B, S]``) and the
    prefix's part of the mask are the same at every step; only which scratch slots a
    new token sees and where its K/V go change. Built once per drafting run, each
    :meth:`step` then costs a handful of small ops (every op between two forwards runs
    with cold caches).
    """

    def __init__(
        self,
        kv_cache: KVCache,
        req_to_token: torch.Tensor,
        req_pool_indices: torch.Tensor,
        prefix_lens: torch.Tensor,
        max_prefix_len: int,
        scratch_cache_loc: torch.Tensor,
        *,
        queries: int,
    ) -> None:
        batch = scratch_cache_loc.shape[0]
        device = scratch_cache_loc.device
        self.dtype = kv_cache.k[0].dtype
        prefix_loc = req_to_token[req_pool_indices, :max_prefix_len].long()  # [B, P]
        self.kv_loc = torch.cat([prefix_loc, scratch_cache_loc.long()], dim=1).reshape(-1)
        see_prefix = torch.arange(max_prefix_len, device=device)[None, :] < prefix_lens[:, None]
        self.prefix_mask = additive_mask(
            see_prefix[:, None, :].expand(batch, queries, -1), self.dtype
        )
        self.batch, self.queries = batch, queries
        # paged_attention reads only the cache and the write slots off the batch.
        self.req_pool_indices, self.prefix_lens = req_pool_indices, prefix_lens
        self.max_prefix_len, self.req_to_token, self.kv_cache = (
            max_prefix_len,
            req_to_token,
            kv_cache,
        )
        self.extend_lens = torch.full((batch,), queries, dtype=torch.int64, device=device)

    def step(self, visible: torch.Tensor, out_cache_loc: torch.Tensor) -> PagedAttend:
        """``visible [B, Q, S]``: which scratch slots each new token sees (its own
        included); ``out_cache_loc [B, Q]``: where the new tokens' K/V go."""
        if tuple(visible.shape[:2]) != (self.batch, self.queries):
            raise ValueError(
                f"`visible` must be [B, Q, S] = [{self.batch}, {self.queries}, S]; "
                f"got {list(visible.shape)}"
            )
        mask = torch.cat([self.prefix_mask, additive_mask(visible, self.dtype)], dim=3)
        slots = out_cache_loc.reshape(-1).long()
        meta = PagedAttentionMetadata(self.kv_loc, mask, self.batch, self.queries, None, None, None)
        batch_view = ForwardBatch(
            mode=ForwardMode.DECODE,
            input_ids=slots,
            positions=slots,
            out_cache_loc=slots,
            req_pool_indices=self.req_pool_indices,
            prefix_lens=self.prefix_lens,
            extend_lens=self.extend_lens,
            max_prefix_len=self.max_prefix_len,
            max_extend_len=self.queries,
            req_to_token=self.req_to_token,
            kv_cache=self.kv_cache,
        )
        return PagedAttend(batch_view, meta)


def top_k_probs(logits: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax over the vocabulary; its top-k ``(p [R, topk], index [R, topk])`` and ``probs``."""
    probs = torch.softmax(logits.float(), dim=-1)
    topk_p, topk_index = probs.topk(topk, dim=-1)
    return topk_p, topk_index, probs


def first_column_sampled(
    topk_p: torch.Tensor, topk_index: torch.Tensor, probs: torch.Tensor, coins: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k with column 0 replaced by a sample of ``probs`` (what a sampled chain relays)."""
    first = sample_from(probs, coins)
    index = torch.cat([first[:, None], topk_index[:, 1:]], dim=1)
    return torch.cat([probs.gather(1, first[:, None]), topk_p[:, 1:]], dim=1), index


def sample_from(probs: torch.Tensor, coins: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw of one token per row of ``probs [R, V]`` with ``coins [R]`` in [0, 1);
    a negative coin takes the argmax instead (a greedy request's draft)."""
    cdf = probs.cumsum(-1)
    target = (coins.to(cdf.dtype) * cdf[:, -1])[:, None].contiguous()
    token = torch.searchsorted(cdf.contiguous(), target, right=True)[:, 0]
    token = token.clamp(max=probs.shape[-1] - 1)
    return torch.where(coins < 0, probs.argmax(dim=-1), token)
