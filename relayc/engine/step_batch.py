"""One forward as the scheduler prepares it on the host, and its move to the device.

``HostStep.prefill`` / ``HostStep.decode`` read only host-known facts about the
requests (prompt tokens, scheduled lengths, sampling settings) and build CPU
tensors; the KV slots come from the pool (already device tensors). ``to_device``
runs inside the forward job, so on CUDA the host-to-device copies are enqueued
on the forward stream, from pinned memory, without blocking the scheduler.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from relayc.engine.algorithms import StepInputs
from relayc.engine.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.kv_cache import KVCache
from relayc.engine.request import Request
from relayc.engine.sampling import SamplingBatch


class StepKind(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"


def _host(values: Sequence[int] | Sequence[float], dtype: torch.dtype, pin: bool) -> torch.Tensor:
    tensor = torch.tensor(list(values), dtype=dtype)
    return tensor.pin_memory() if pin else tensor


@dataclass
class HostStep:
    kind: StepKind
    requests: list[Request]
    input_ids: torch.Tensor  # [T] int64; -1 where the relay supplies the token (decode)
    positions: torch.Tensor  # [T] int64
    req_pool_indices: torch.Tensor  # [B] int64
    prefix_lens: torch.Tensor  # [B] int64
    extend_lens: torch.Tensor  # [B] int64
    sample_positions: torch.Tensor  # [B] int64
    commit_rows: torch.Tensor  # [T] int64, req_to_token row of each new token
    temperatures: torch.Tensor  # [B] float32
    top_ks: torch.Tensor  # [B] int64
    top_ps: torch.Tensor  # [B] float32
    seeds: torch.Tensor  # [B] int64
    out_cache_loc: torch.Tensor  # [T] int64 on the device, from the KV pool
    max_prefix_len: int
    max_extend_len: int
    samples: list[bool] = field(default_factory=list)  # per request: its token is real

    @classmethod
    def build(
        cls,
        kind: StepKind,
        requests: list[Request],
        chunks: Sequence[Sequence[int]],
        out_cache_loc: torch.Tensor,
        pin: bool,
    ) -> HostStep:
        """``chunks[b]``: the new tokens of request ``b`` (placeholders for decode)."""
        prefix = [r.scheduled_len for r in requests]
        lens = [len(c) for c in chunks]
        params = [r.params for r in requests]
        sampling = SamplingBatch.build(params, [r.seed for r in requests], "cpu")

        def pinned(t: torch.Tensor) -> torch.Tensor:
            return t.pin_memory() if pin else t

        return cls(
            kind=kind,
            requests=requests,
            input_ids=_host([t for c in chunks for t in c], torch.int64, pin),
            positions=_host(
                [p for start, n in zip(prefix, lens, strict=True) for p in range(start, start + n)],
                torch.int64,
                pin,
            ),
            req_pool_indices=_host([r.req_pool_index for r in requests], torch.int64, pin),
            prefix_lens=_host(prefix, torch.int64, pin),
            extend_lens=_host(lens, torch.int64, pin),
            sample_positions=_host(
                [p + n for p, n in zip(prefix, lens, strict=True)], torch.int64, pin
            ),
            commit_rows=_host(
                [r.req_pool_index for r, n in zip(requests, lens, strict=True) for _ in range(n)],
                torch.int64,
                pin,
            ),
            temperatures=pinned(sampling.temperatures),
            top_ks=pinned(sampling.top_ks),
            top_ps=pinned(sampling.top_ps),
            seeds=pinned(sampling.seeds),
            out_cache_loc=out_cache_loc,
            max_prefix_len=max(prefix),
            max_extend_len=max(lens),
            samples=[True] * len(requests),
        )

    def to_device(
        self, device: torch.device, req_to_token: torch.Tensor, kv_cache: KVCache
    ) -> tuple[StepInputs, torch.Tensor]:
        """The algorithm's inputs, and ``commit_rows`` on the device."""

        def dev(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=True)

        mode = ForwardMode.EXTEND if self.kind is StepKind.PREFILL else ForwardMode.DECODE
        forward = ForwardBatch(
            mode=mode,
            input_ids=dev(self.input_ids),
            positions=dev(self.positions),
            out_cache_loc=self.out_cache_loc,
            req_pool_indices=dev(self.req_pool_indices),
            prefix_lens=dev(self.prefix_lens),
            extend_lens=dev(self.extend_lens),
            max_prefix_len=self.max_prefix_len,
            max_extend_len=self.max_extend_len,
            req_to_token=req_to_token,
            kv_cache=kv_cache,
        )
        sampling = SamplingBatch(
            dev(self.temperatures), dev(self.top_ks), dev(self.top_ps), dev(self.seeds)
        )
        return StepInputs(forward, sampling, dev(self.sample_positions)), dev(self.commit_rows)
