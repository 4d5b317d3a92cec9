"""What one model forward reads: the new tokens, where their K/V go, what they attend.

Tokens of all requests lie back to back (``[T]``, request ``b`` owns
``extend_lens[b]`` of them). The three modes differ only in the new tokens'
attention among themselves; every new token also sees its request's whole
cached prefix ``req_to_token[req_pool_indices[b], :prefix_lens[b]]``:

* ``EXTEND``: prefill or a prefill chunk, any number of tokens, causal.
* ``DECODE``: one token per request.
* ``VERIFY``: ``N`` draft-tree tokens per request, attending each other through
  ``tree_mask[b, i, j]`` (token i sees token j; the diagonal must be set).

``max_prefix_len`` and ``max_extend_len`` are host-side bounds that fix the
padded attention shapes; a CUDA-graph runner passes static bucket values so the
forward never reads a device value on the host.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from relayc.engine.core.kv_cache import KVCache


class ForwardMode(enum.Enum):
    EXTEND = "extend"
    DECODE = "decode"
    VERIFY = "verify"


@dataclass
class ForwardBatch:
    mode: ForwardMode
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, RoPE position of each new token
    out_cache_loc: torch.Tensor  # [T] int64, KV slot each new token's K/V is written to
    req_pool_indices: torch.Tensor  # [B] int64
    prefix_lens: torch.Tensor  # [B] int64, cached tokens before this forward
    extend_lens: torch.Tensor  # [B] int64, new tokens per request; sums to T
    max_prefix_len: int  # >= max(prefix_lens), <= req_to_token width
    max_extend_len: int  # >= max(extend_lens)
    req_to_token: torch.Tensor  # [req_pool_size + 1, max_context] int32
    kv_cache: KVCache
    tree_mask: torch.Tensor | None = None  # [B, N, N] bool, VERIFY only
    return_all_logits: bool = False  # EXTEND: logits for every token, not only the last
    # EXTEND: the host knows every request has exactly max_extend_len new tokens (a padded
    # extend, or equal chunks), so attention needs no gather between flat tokens and padded
    # rows. Decode and verify always have this shape.
    equal_extend_lens: bool = False

    @property
    def batch_size(self) -> int:
        return self.req_pool_indices.numel()

    @property
    def uniform_extend(self) -> bool:
        """Every request has exactly ``max_extend_len`` new tokens."""
        return self.equal_extend_lens or self.mode is not ForwardMode.EXTEND

    @classmethod
    def build(
        cls,
        mode: ForwardMode,
        input_ids: Sequence[Sequence[int]],
        req_pool_indices: Sequence[int],
        prefix_lens: Sequence[int],
        out_cache_loc: torch.Tensor | Sequence[int],
        req_to_token: torch.Tensor,
        kv_cache: KVCache,
        *,
        positions: Sequence[Sequence[int]] | None = None,
        tree_mask: torch.Tensor | None = None,
        return_all_logits: bool = False,
    ) -> ForwardBatch:
        """Pack per-request host lists into a batch; positions default to ``prefix + i``."""
        extend_lens = [len(ids) for ids in input_ids]
        if not len(req_pool_indices) == len(prefix_lens) == len(extend_lens) > 0:
            raise ValueError(
                "input_ids, req_pool_indices and prefix_lens need one entry per request"
            )
        if min(extend_lens) == 0:
            raise ValueError("every request needs at least one new token")
        if mode is not ForwardMode.EXTEND and len(set(extend_lens)) != 1:
            raise ValueError(
                f"{mode.value} needs the same token count per request; got {extend_lens}"
            )
        if mode is ForwardMode.DECODE and extend_lens[0] != 1:
            raise ValueError("decode takes exactly one token per request; use extend or verify")
        if (mode is ForwardMode.VERIFY) != (tree_mask is not None):
            raise ValueError("tree_mask is required for verify and only for verify")
        if positions is None:
            positions = [range(p, p + n) for p, n in zip(prefix_lens, extend_lens, strict=True)]
        device = req_to_token.device
        flat_positions = [p for row in positions for p in row]
        if len(flat_positions) != sum(extend_lens):
            raise ValueError("positions need one entry per input token")

        def tensor(values: Sequence[int]) -> torch.Tensor:
            return torch.tensor(list(values), dtype=torch.int64, device=device)

        loc = torch.as_tensor(out_cache_loc, dtype=torch.int64).to(device)
        if loc.numel() != sum(extend_lens):
            raise ValueError(f"out_cache_loc has {loc.numel()} slots for {sum(extend_lens)} tokens")
        return cls(
            mode=mode,
            input_ids=tensor([t for ids in input_ids for t in ids]),
            positions=tensor(flat_positions),
            out_cache_loc=loc,
            req_pool_indices=tensor(req_pool_indices),
            prefix_lens=tensor(prefix_lens),
            extend_lens=tensor(extend_lens),
            max_prefix_len=max(prefix_lens),
            max_extend_len=max(extend_lens),
            req_to_token=req_to_token,
            kv_cache=kv_cache,
            tree_mask=None if tree_mask is None else tree_mask.to(device=device, dtype=torch.bool),
            return_all_logits=return_all_logits,
            equal_extend_lens=len(set(extend_lens)) == 1,
        )
