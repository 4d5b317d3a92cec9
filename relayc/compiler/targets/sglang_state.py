"""The relay's records and the state SGLang keeps beside the FutureMap (SGLang target).

`relayc compile --target sglang` pastes everything below the PASTE_MARKER line into
`relayc_relay_state.py` beside the `overlap_utils.py` it writes; the FutureMap base
(`sglang_base.py`, pasted into `relayc_relay_base.py`) imports it. This file is a real
module only so that ruff and the type checker read it; nothing imports it except the
generator and that template.

What lives here: the relay's errors, `RelayField` (one spec field as the FutureMap sees
it), SGLang's payload and buffer names, `FutureRelayBuffers` (the lengths and bonus-token
buffers a captured verify graph owns before the FutureMap exists) and the confidence relay
to the host. DSPARK's under ragged verify (`needs_confidence_relay=True`) behaves as 0.5.23's:
`publish(..., confidence=)` scatters each request's confidence into a device buffer made at
first use; on CUDA a ring of pinned host copies is filled on the private D2H stream behind
`publish_ready`, and `resolve_confidence_cpu` returns the copy LAG publishes old, never
waiting; without a copy stream it reads the device rows directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

PASTE_MARKER = "# ---- pasted into the generated module from here on ----"
# ---- pasted into the generated module from here on ----


class RelayError(ValueError):
    """A bad call into the relay: a payload that does not fit the spec's fields."""


class RelayDebugError(AssertionError):
    """A debug-mode (`SGLANG_IS_IN_CI`) check failed: a row was read without a fresh write."""


# SGLang's RelayPayload fields, in its order.
SGLANG_PAYLOAD = (
    "bonus_tokens",
    "topk_p",
    "topk_index",
    "hidden_states",
    "draft_probs",
    "dsa_topk_indices",
    "accept_tokens",
    "accept_lens",
)
# SGLang's FutureMap attribute of a relay field whose buffer is not `<field>_buf`.
SGLANG_BUFFER_NAMES = {"bonus_tokens": "output_tokens_buf"}

# SGLang's draft-input flags gating the read of a relayed field: 0.5.23 gathers DSA top-k
# seeds only for a draft input whose seeds are available (a staged one may have none).
SGLANG_GATED_READS = {"dsa_topk_indices": "future_dsa_topk_indices_available"}
# Relay field -> (FutureRelayBuffers attribute of its adopted buffer, attribute of the
# tensor the graph already scattered into it).
SGLANG_ADOPTED_BUFFERS = {
    "new_seq_lens": ("new_seq_lens", "published_seq_lens"),
    "bonus_tokens": ("output_tokens", "published_bonus"),
}


def buffer_name(field_name: str) -> str:
    """SGLang's FutureMap attribute holding relay field `field_name`."""
    return SGLANG_BUFFER_NAMES.get(field_name, f"{field_name}_buf")


@dataclass(frozen=True)
class RelayField:
    """One relay field of one algorithm, as the spec declares it."""

    name: str  # spec field name, also the RelayPayload / draft-input attribute
    dtype: torch.dtype | None  # None: the model dtype, learned from the first payload
    shape: str  # row shape in dims, for messages
    lazy: bool  # allocated by the first stash carrying it, rows shaped like its rows
    init: str | bool | int | float  # `empty`, `zeros` or a fill value
    poison: bool | int | float | None  # debug-mode start value; None: NaN or the int minimum
    consume_once: bool  # debug mode: rows must be rewritten between reads
    origin: str  # spec file:line
    buffer: str = field(init=False)  # SGLang's FutureMap attribute holding it

    def __post_init__(self) -> None:
        object.__setattr__(self, "buffer", buffer_name(self.name))
        if self.poison is None:
            if self.dtype is None or self.dtype.is_floating_point:
                object.__setattr__(self, "poison", float("nan"))
            else:
                object.__setattr__(self, "poison", torch.iinfo(self.dtype).min)


class FutureRelayBuffers:
    """SGLang's relay buffers owned outside the FutureMap: a static verify graph captured
    before the FutureMap exists scatters the new lengths and bonus tokens into them, and
    the FutureMap built after `offer_future_relay_buffers` adopts them. A publish / stash of
    the very tensors the graph already scattered (`published_*`) skips its own write."""

    def __init__(self, *, req_pool_size: int, device: Any) -> None:
        self.new_seq_lens = torch.empty((req_pool_size,), dtype=torch.int64, device=device)
        self.output_tokens = torch.empty((req_pool_size,), dtype=torch.int64, device=device)
        self.adopted = False
        # Strong references, so an id is never recycled while the skip may still match it.
        self.published_seq_lens: torch.Tensor | None = None
        self.published_bonus: torch.Tensor | None = None


@dataclass(frozen=True)
class HostRing:
    """A relay field read on the host `lag` publishes late from a ring of `depth` pinned
    copies (the spec's `host_mirror: {lag, ring, generation_check}`); `generation_check`:
    each copy carries the pool's `req_generation` of its moment, so a reused slot is told
    apart from the request that wrote the row."""

    name: str  # spec field name, also publish()'s keyword
    dtype: torch.dtype
    lag: int
    depth: int
    generation_check: bool
    origin: str  # spec file:line


@dataclass
class ResolvedConfidence:
    """Host confidence rows of a batch and the request generations they belong to (None
    where the spec declares no generation check)."""

    confidence: torch.Tensor
    generation: torch.Tensor | None


class ConfidenceRelay:
    """A field published with the lengths, read on the host `ring.lag` publishes later
    (CUDA: a pinned ring copied on the private D2H stream behind `publish_ready`, each copy
    with an event), or directly where there is no such stream."""

    def __init__(self, device: torch.device, req_pool_size: int, pool: Any, ring: HostRing) -> None:
        self.device = device
        self.req_pool_size = req_pool_size
        self.pool = pool  # its `req_generation` [req_pool_size] tells reused slots apart
        self.ring = ring
        self.confidence_buf: torch.Tensor | None = None  # [pool, *row], first use
        self.conf_ring: torch.Tensor | None = None  # [depth, pool, *row] pinned (CUDA)
        self.gen_ring: torch.Tensor | None = None  # [depth, pool] int64 (CUDA)
        self.copy_done: list[Any] = []
        self.ring_pos = 0  # ring copies issued so far

    def _generation(self, rows: torch.Tensor) -> torch.Tensor | None:
        return self.pool.req_generation[rows].clone() if self.ring.generation_check else None

    def scatter(self, indices: torch.Tensor, confidence: torch.Tensor) -> None:
        ring = self.ring
        if self.confidence_buf is None:
            shape = (self.req_pool_size, *confidence.shape[1:])
            self.confidence_buf = torch.empty(shape, dtype=ring.dtype, device=self.device)
            if self.device.type == "cuda":
                depth = ring.depth
                self.conf_ring = torch.empty((depth, *shape), dtype=ring.dtype, pin_memory=True)
                if ring.generation_check:
                    self.gen_ring = torch.zeros((depth, self.req_pool_size), dtype=torch.int64)
                self.copy_done = [torch.cuda.Event() for _ in range(depth)]
        self.confidence_buf[indices] = confidence.to(ring.dtype)

    def issue_ring_copy(self, stream: Any, publish_ready: Any) -> None:
        """Copy the device rows into the next ring slot once the publish has happened."""
        if self.confidence_buf is None or self.conf_ring is None:
            return
        if stream is None or publish_ready is None:
            return
        slot = self.ring_pos % self.ring.depth
        stream.wait_event(publish_ready)
        with torch.get_device_module(self.device).stream(stream):
            self.conf_ring[slot].copy_(self.confidence_buf, non_blocking=True)
            self.copy_done[slot].record()
        if self.gen_ring is not None:
            self.gen_ring[slot].copy_(self.pool.req_generation)
        self.ring_pos += 1

    def resolve(self, batch: Any, stream: Any, publish_ready: Any) -> ResolvedConfidence | None:
        """The batch's rows `ring.lag` publishes ago (None: not there yet), or read directly
        without a copy stream."""
        if self.confidence_buf is None or batch.spec_info is None:
            return None
        future_indices = batch.spec_info.future_indices
        if future_indices is None or future_indices.shape[0] == 0:
            return None
        rows = batch.req_pool_indices_cpu
        if stream is None or publish_ready is None or self.conf_ring is None:
            return ResolvedConfidence(
                confidence=self.confidence_buf[batch.req_pool_indices].cpu(),
                generation=self._generation(rows),
            )
        lag = self.ring.lag
        if self.ring_pos < lag:
            return None
        slot = (self.ring_pos - lag) % self.ring.depth
        if not self.copy_done[slot].query():
            return None  # never wait: the planner falls back without confidence
        generation = None if self.gen_ring is None else self.gen_ring[slot][rows]
        return ResolvedConfidence(confidence=self.conf_ring[slot][rows], generation=generation)
