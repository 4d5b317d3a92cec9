"""One forward as the scheduler prepares it on the host, and its move to the device.

``HostStep.prefill`` / ``HostStep.decode`` read only host-known facts about the
requests (prompt tokens, committed lengths and their bounds, sampling settings)
and build CPU tensors; the KV slots come from the pool (already device tensors).
``to_device`` runs inside the forward job, so on CUDA the host-to-device copies
are enqueued on the forward stream, from pinned memory, without blocking the
scheduler.

A decode step of width ``W > 1`` is a chain-verify batch (``ForwardMode.VERIFY``,
``W`` placeholder tokens per request, a lower-triangular ``tree_mask``) over the
request's window; its positions are the host's guess (see ``StepInputs``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.core.kv_cache import KVCache
from relayc.engine.core.sampling import SamplingBatch
from relayc.engine.serving.algorithms import StepInputs
from relayc.engine.serving.request import Request


class StepKind(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"


def _host(values: Sequence[int] | Sequence[float], dtype: torch.dtype, pin: bool) -> torch.Tensor:
    tensor = torch.tensor(list(values), dtype=dtype)
    return tensor.pin_memory() if pin else tensor


def _chain_mask(batch: int, width: int, device: torch.device | str) -> torch.Tensor:
    """``[batch, width, width]`` bool: each window's tokens see the window's earlier ones."""
    chain = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    return chain.expand(batch, -1, -1)


Lengths = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
HostLengths = tuple[np.ndarray, np.ndarray, np.ndarray]


class LengthRing:
    """The length tensors of a CPU decode batch's steps -- prefix lengths ``[B]``, positions
    ``[B * W]`` (the prefix lengths themselves when ``W`` is 1) and sample positions ``[B]``
    -- in ``SIZE`` sets reused in turn and written through NumPy views: ``torch.tensor``
    from a list costs over 100 us right after a forward has emptied the caches, a NumPy
    store a few.

    A set is rewritten ``SIZE`` steps after it was handed out. A step's job reads its
    tensors (a recorded step copies them into its own buffers, an eager one reads them and
    stashes copies), nothing keeps them past the job, and at most two steps are in flight
    (the overlap scheduler runs one step behind).
    """

    SIZE = 4

    def __init__(self, batch: int, width: int) -> None:
        self.width = width
        self._offsets = np.arange(width, dtype=np.int64)
        self._sets: list[tuple[Lengths, HostLengths]] = []
        for _ in range(self.SIZE):
            prefix = torch.empty(batch, dtype=torch.int64)
            positions = prefix if width == 1 else torch.empty(batch * width, dtype=torch.int64)
            sample = torch.empty(batch, dtype=torch.int64)
            views = (prefix.numpy(), positions.numpy().reshape(batch, width), sample.numpy())
            self._sets.append(((prefix, positions, sample), views))
        self._next = 0

    def fill(self, hints: Sequence[int]) -> tuple[Lengths, HostLengths]:
        """The next set, holding ``hints`` (each request's first position) and what follows
        from them: the tensors (prefix lengths, positions, sample positions) and their NumPy
        views (the positions viewed ``[B, W]``)."""
        tensors, views = self._sets[self._next]
        self._next = (self._next + 1) % self.SIZE
        prefix, positions, sample = views
        prefix[:] = hints
        if self.width > 1:
            np.add(prefix[:, None], self._offsets, out=positions)
        np.add(prefix, self.width, out=sample)
        return tensors, views


@dataclass(frozen=True)
class DecodeRows:
    """The tensors of a decode batch that depend only on which requests it holds, in order.

    A running batch keeps its composition for many steps (one request at a time: its
    whole decode), and only the lengths move, so the scheduler keeps the last one and
    ``HostStep.decode`` rebuilds just the length-derived tensors. Valid while each
    request keeps its request slot and sampling settings, which hold from admission
    to release; nothing writes these tensors (jobs of several steps may read them).
    """

    requests: tuple[Request, ...]
    width: int
    slots: tuple[int, ...]  # each request's request slot
    input_ids: torch.Tensor  # [B * W] int64, -1 placeholders
    req_pool_indices: torch.Tensor  # [B] int64
    extend_lens: torch.Tensor  # [B] int64, all W
    commit_rows: torch.Tensor  # [B * W] int64
    sampling: SamplingBatch  # host tensors
    all_greedy: bool
    chain_mask: torch.Tensor | None  # [B, W, W] bool (expanded), a window's causal mask; W 1: None
    lengths: LengthRing | None  # the CPU's length tensors (not pinned); None: made each step

    @classmethod
    def build(cls, requests: Sequence[Request], width: int, pin: bool) -> DecodeRows:
        slots = [r.req_pool_index for r in requests]
        sampling = SamplingBatch.build(
            [r.params for r in requests], [r.seed for r in requests], "cpu"
        )
        if pin:
            sampling = SamplingBatch(
                sampling.temperatures.pin_memory(),
                sampling.top_ks.pin_memory(),
                sampling.top_ps.pin_memory(),
                sampling.seeds.pin_memory(),
            )
        return cls(
            requests=tuple(requests),
            width=width,
            slots=tuple(slots),
            input_ids=_host([-1] * (len(slots) * width), torch.int64, pin),
            req_pool_indices=_host(slots, torch.int64, pin),
            extend_lens=_host([width] * len(slots), torch.int64, pin),
            commit_rows=_host([s for s in slots for _ in range(width)], torch.int64, pin),
            sampling=sampling,
            all_greedy=not bool((sampling.temperatures > 0).any()),
            chain_mask=None if width == 1 else _chain_mask(len(slots), width, "cpu"),
            lengths=None if pin else LengthRing(len(slots), width),
        )

    def holds(self, requests: Sequence[Request], width: int) -> bool:
        """Whether these are the rows of ``requests`` (the same objects, in order)."""
        return width == self.width and tuple(requests) == self.requests  # identity: eq=False


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
    max_prefix_len: int  # upper bound on the committed lengths (exact for width 1)
    max_extend_len: int
    width: int = 1  # decode: tokens (KV window slots) per request
    samples: list[bool] = field(default_factory=list)  # per request: its token is real
    chain_mask: torch.Tensor | None = None  # decode, width > 1: DecodeRows.chain_mask (host)
    all_greedy: bool = False  # no request samples (host knowledge)
    # Decode on the CPU: ``out_cache_loc`` as a NumPy view, each request's request slot and
    # the LengthRing's views of the step's lengths, so the scheduler commits and frees slots
    # without torch ops (see ``ReqToTokenPool.host_table``). None / empty otherwise.
    host_slots: np.ndarray | None = None
    host_rows: Sequence[int] = ()
    host_lengths: HostLengths | None = None

    @classmethod
    def prefill(
        cls, plan: Sequence[tuple[Request, int]], out_cache_loc: torch.Tensor, pin: bool
    ) -> HostStep:
        """The next ``n`` uncommitted tokens of each ``(request, n)``; KV slots ``[sum n]``.

        A prompt chunk, or a one-token tail step of a request past its last decode window
        (``Request.uncommitted_ids``).
        """
        requests = [r for r, _ in plan]
        chunks = [r.uncommitted_ids(n) for r, n in plan]
        prefix = [r.kv_len for r in requests]
        return cls._build(
            StepKind.PREFILL, requests, chunks, prefix, max(prefix), out_cache_loc, pin
        )

    @classmethod
    def decode(
        cls,
        requests: Sequence[Request],
        width: int,
        out_cache_loc: torch.Tensor,
        pin: bool,
        rows: DecodeRows | None = None,
        host_slots: np.ndarray | None = None,
    ) -> HostStep:
        """One decode step of ``width`` tokens per request; KV windows ``[B * width]``.

        ``rows``: the batch's composition tensors when the caller kept them
        (``DecodeRows.holds``); built here otherwise. ``host_slots``: ``out_cache_loc``
        as a NumPy view, on the CPU.
        """
        if rows is None:
            rows = DecodeRows.build(requests, width, pin)
        hints = [r.kv_len_hint for r in requests]
        host_lengths = None
        if rows.lengths is not None:
            (prefix, positions, sample_positions), host_lengths = rows.lengths.fill(hints)
        else:  # pinned for the copies to the device: three tensors made, none computed
            prefix = torch.tensor(hints, dtype=torch.int64)
            positions = (
                prefix
                if width == 1
                else torch.tensor([p + j for p in hints for j in range(width)], dtype=torch.int64)
            )
            sample_positions = torch.tensor([p + width for p in hints], dtype=torch.int64)
            if pin:
                prefix, sample_positions = prefix.pin_memory(), sample_positions.pin_memory()
                positions = prefix if width == 1 else positions.pin_memory()
        sampling = rows.sampling
        return cls(
            kind=StepKind.DECODE,
            requests=list(requests),
            input_ids=rows.input_ids,
            positions=positions,
            req_pool_indices=rows.req_pool_indices,
            prefix_lens=prefix,
            extend_lens=rows.extend_lens,
            sample_positions=sample_positions,
            commit_rows=rows.commit_rows,
            temperatures=sampling.temperatures,
            top_ks=sampling.top_ks,
            top_ps=sampling.top_ps,
            seeds=sampling.seeds,
            out_cache_loc=out_cache_loc,
            max_prefix_len=max(r.kv_len_bound for r in requests),
            max_extend_len=width,
            width=width,
            samples=[True] * len(requests),
            all_greedy=rows.all_greedy,
            chain_mask=rows.chain_mask,
            host_slots=host_slots,
            host_rows=rows.slots,
            host_lengths=host_lengths,
        )

    @classmethod
    def _build(
        cls,
        kind: StepKind,
        requests: list[Request],
        chunks: Sequence[Sequence[int]],
        prefix: list[int],
        max_prefix_len: int,
        out_cache_loc: torch.Tensor,
        pin: bool,
    ) -> HostStep:
        """``chunks[b]``: the new tokens of request ``b`` (placeholders for decode)."""
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
            max_prefix_len=max_prefix_len,
            max_extend_len=max(lens),
            samples=[True] * len(requests),
            all_greedy=not bool((sampling.temperatures > 0).any()),
        )

    def to_device(
        self, device: torch.device, req_to_token: torch.Tensor, kv_cache: KVCache
    ) -> tuple[StepInputs, torch.Tensor]:
        """The algorithm's inputs, and ``commit_rows`` on the device."""

        on_host = device.type == "cpu"  # the host tensors are already there: no .to per tensor

        def dev(t: torch.Tensor) -> torch.Tensor:
            return t if on_host else t.to(device, non_blocking=True)

        tree_mask = None
        if self.kind is StepKind.PREFILL:
            mode = ForwardMode.EXTEND
        elif self.width == 1:
            mode = ForwardMode.DECODE
        else:
            mode = ForwardMode.VERIFY
            tree_mask = (
                self.chain_mask
                if on_host and self.chain_mask is not None
                else _chain_mask(len(self.requests), self.width, device)
            )
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
            tree_mask=tree_mask,
            equal_extend_lens=self.input_ids.numel() == len(self.requests) * self.max_extend_len,
        )
        sampling = SamplingBatch(
            dev(self.temperatures), dev(self.top_ks), dev(self.top_ps), dev(self.seeds)
        )
        inputs = StepInputs(
            forward,
            sampling,
            dev(self.sample_positions),
            self.max_prefix_len,
            all_greedy=self.all_greedy,
        )
        return inputs, dev(self.commit_rows)
