# Hand-written: part of relayc's SGLang drop-in, not generated. `relayc compile --target
# sglang` copies this file unchanged beside the overlap_utils.py it generates, as
# relayc_relay_runtime.py; the generated module checks RUNTIME_VERSION when imported.
"""The SGLang drop-in's runtime: what the generated relays share (needs only torch).

The generated overlap_utils.py holds a FutureMap subclass per algorithm whose
`_make_buffers`, `_stash` and `_resolve` name that algorithm's buffers. This module holds what
depends on no spec: the factory, SGLang's hooks on the lengths (`new_seq_lens_buf`: publish,
its host mirror, the length resolves), the input tokens (`output_tokens_buf`), the host ring
and the buffers a captured graph owns; allocation and the checks that name a misfit field;
`install`. Nothing here loops over fields. As in SGLang 0.5.23: slot 0 is the padding slot;
`publish_ready` is recorded by speculative publishes and waited for by the host reads; under
`_DEBUG_ASSERT` buffers start poisoned and consume-once rows are re-poisoned when read. The
flags are read from `FLAGS` when used: the generated module, or SGLang's overlap_utils once
`install()` ran, so that patching them there is honoured as SGLang honours it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

RUNTIME_VERSION = 2


def check_version(generated_for: int, module: str) -> None:
    """Refuse to run generated code against a runtime of another version."""
    if generated_for != RUNTIME_VERSION:
        raise ImportError(
            f"{module} was generated for relayc_relay_runtime version {generated_for}, but the "
            f"runtime beside it is version {RUNTIME_VERSION} ({__file__}): copy both files from "
            "one `relayc compile --target sglang` run"
        )


def env_flag(name: str) -> bool:
    """SGLang's boolean environment parsing (`EnvBool`): unset is False."""
    value = os.environ.get(name, "false").lower()
    if value in ("true", "1", "yes", "y", "false", "0", "no", "n"):
        return value in ("true", "1", "yes", "y")
    raise ValueError(f'{name}="{value}" is not a valid boolean value')


class RelayError(ValueError):
    """A bad call into the relay: a payload that does not fit the spec's fields."""


class RelayDebugError(AssertionError):
    """A debug-mode check failed: a row was read without a fresh write."""


class FutureRelayBuffers:
    """Lengths and bonus-token buffers a verify graph captured before the FutureMap scatters
    into; the next FutureMap adopts them (`owner: graph`). A publish / stash of the very
    tensors the graph scattered (`published_*`) skips its write."""

    def __init__(self, *, req_pool_size: int, device: Any) -> None:
        self.new_seq_lens = torch.empty((req_pool_size,), dtype=torch.int64, device=device)
        self.output_tokens = torch.empty((req_pool_size,), dtype=torch.int64, device=device)
        self.adopted = False  # strong references below: an id never recycles under the skip
        self.published_seq_lens: torch.Tensor | None = None
        self.published_bonus: torch.Tensor | None = None


_offered_relay: FutureRelayBuffers | None = None


def offer_future_relay_buffers(relay: FutureRelayBuffers) -> None:
    """Offer `relay` to the next FutureMap built with its pool size."""
    global _offered_relay
    _offered_relay = relay


@dataclass
class ResolvedConfidence:
    """A batch's host rows of a ring field and their requests' generations (or None)."""

    confidence: torch.Tensor
    generation: torch.Tensor | None


class HostRing:
    """A field published with the lengths, read on the host `lag` publishes later: on CUDA
    from a ring of `depth` pinned copies made on the D2H stream behind `publish_ready` (an
    event and the pool's `req_generation` each); without that stream, from the device."""

    def __init__(
        self, fmap: Any, dtype: torch.dtype, lag: int, depth: int, generation_check: bool
    ) -> None:
        self.device, self.req_pool_size = fmap.device, fmap.req_pool_size
        self.pool = fmap.req_to_token_pool  # its req_generation tells reused slots apart
        self.dtype, self.lag, self.depth = dtype, lag, depth
        self.generation_check = generation_check
        self.buf: Any = None  # [pool, *row], made by the first publish
        self.ring: Any = None  # [depth, pool, *row] pinned, and [depth, pool] generations
        self.gen_ring: Any = None
        self.copy_done: list[Any] = []
        self.ring_pos = 0  # ring copies issued so far

    def scatter(self, indices: torch.Tensor, rows: torch.Tensor, on_cuda: bool) -> None:
        if self.buf is None:
            shape = (self.req_pool_size, *rows.shape[1:])
            self.buf = torch.empty(shape, dtype=self.dtype, device=self.device)
            if on_cuda:
                self.ring = torch.empty((self.depth, *shape), dtype=self.dtype, pin_memory=True)
                if self.generation_check:
                    self.gen_ring = torch.zeros((self.depth, self.req_pool_size), dtype=torch.int64)
                self.copy_done = [torch.cuda.Event() for _ in range(self.depth)]
        self.buf.index_copy_(0, indices.long(), rows.to(self.dtype))

    def issue_ring_copy(self, stream: Any, publish_ready: Any) -> None:
        if self.ring is None or stream is None or publish_ready is None:
            return
        slot = self.ring_pos % self.depth
        stream.wait_event(publish_ready)
        with torch.get_device_module(self.device).stream(stream):
            self.ring[slot].copy_(self.buf, non_blocking=True)
            self.copy_done[slot].record()
        if self.gen_ring is not None:
            self.gen_ring[slot].copy_(self.pool.req_generation)
        self.ring_pos += 1

    def resolve(self, batch: Any, stream: Any, publish_ready: Any) -> ResolvedConfidence | None:
        if self.buf is None or batch.spec_info is None:
            return None
        future_indices = batch.spec_info.future_indices
        if future_indices is None or future_indices.shape[0] == 0:
            return None
        rows = batch.req_pool_indices_cpu
        if stream is None or publish_ready is None or self.ring is None:
            generation = (
                self.pool.req_generation.index_select(0, rows) if self.generation_check else None
            )
            return ResolvedConfidence(
                self.buf.index_select(0, batch.req_pool_indices).cpu(), generation
            )
        if self.ring_pos < self.lag:
            return None
        slot = (self.ring_pos - self.lag) % self.depth
        if not self.copy_done[slot].query():
            return None  # the planner falls back without it
        generation = None if self.gen_ring is None else self.gen_ring[slot][rows]
        return ResolvedConfidence(self.ring[slot][rows], generation)


def relay_algorithm(spec_algo: Any, algorithms: dict[str, Any]) -> str:
    """The relayc algorithm that relays for SGLang's `SpeculativeAlgorithm` `spec_algo`: the
    class naming it in `SGLANG` (its spec's `sglang:` section), one relaying under a set
    `SGLANG_WHEN` flag of SGLang's speculative config before one relaying always."""
    name = str(getattr(spec_algo, "name", spec_algo)).upper()
    relaying = [c for c in algorithms.values() if name in c.SGLANG]
    for cls in sorted(relaying, key=lambda c: not c.SGLANG_WHEN):
        if not cls.SGLANG_WHEN or _config_flag(cls.SGLANG_WHEN):
            return str(cls.ALGORITHM)
    raise NotImplementedError(
        f"no relayc spec covers SGLang's speculative algorithm {name}; this module relays "
        f"{', '.join(sorted(algorithms))} (compile a spec with `sglang: {{members: [{name}]}}`, "
        f"or for a plugin registered with SGLang `sglang: {{plugin: {name}}}`, into the module)"
    )


def _config_flag(name: str) -> bool:
    from sglang.srt.runtime_context import get_spec

    return bool(getattr(get_spec(), name))


def _host_sum(lengths: torch.Tensor) -> int:
    # Summing a small batch's host lengths in Python skips two aten ops (sum, item), a few
    # microseconds on a CPU; past ~100 rows the tensor sum is faster (measured, 1 thread).
    return sum(lengths.tolist()) if lengths.shape[0] <= 128 else int(lengths.sum())


def _poison(dtype: torch.dtype) -> Any:
    return float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min


class RelayMap:
    """What every generated FutureMap shares; `FutureMap(device, spec_algo, pool, ...)`
    returns the class generated for the algorithm `spec_algo` maps to."""

    ALGORITHMS: ClassVar[dict[str, type]] = {}  # relayc algorithm -> generated class
    FLAGS: ClassVar[Any] = None  # the module whose _is_cuda, _is_hip, _DEBUG_ASSERT rule
    ALGORITHM = SPEC = SGLANG_WHEN = ""
    SGLANG: tuple[str, ...] = ()  # the SpeculativeAlgorithm members (or plugin) relayed
    STAGING = ""  # CaptureHiddenMode member of a staged draft input (`staging:`); "": refused
    TOKENS_POISON = LENGTHS_POISON = None  # the spec's debug poison (None: dtype's minimum)
    # SGLang's hooks' buffers (None where the algorithm does not relay the field) and ring.
    new_seq_lens_buf: Any = None
    output_tokens_buf: Any = None
    dsa_topk_indices_buf: Any = None
    confidence_relay: Any = None
    _relay: FutureRelayBuffers | None = None  # adopted (_adopt); also on object.__new__ maps

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.ALGORITHM:
            cls.ALGORITHMS[cls.ALGORITHM] = cls

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if not cls.ALGORITHM:  # the factory: SGLang builds FutureMap(...)
            spec_algo = kwargs["spec_algo"] if "spec_algo" in kwargs else args[1]
            name = kwargs.get("algorithm") or relay_algorithm(spec_algo, cls.ALGORITHMS)
            if name not in cls.ALGORITHMS:
                raise NotImplementedError(
                    f"this module was compiled without a spec for `{name}` (it relays "
                    f"{', '.join(sorted(cls.ALGORITHMS))}); add the spec to "
                    "`relayc compile --target sglang`"
                )
            cls = cls.ALGORITHMS[name]
        return super().__new__(cls)

    def __init__(
        self,
        device: torch.device | str,
        spec_algo: Any,
        req_to_token_pool: Any,
        needs_cpu_seq_lens: bool = True,
        needs_confidence_relay: bool = False,
        *,
        algorithm: str | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.spec_algo = spec_algo
        self.needs_cpu_seq_lens = needs_cpu_seq_lens
        self.needs_confidence_relay = needs_confidence_relay
        self.req_to_token_pool = req_to_token_pool
        self.req_pool_size = int(req_to_token_pool.req_to_token.shape[0])
        self.req_to_token = req_to_token_pool.req_to_token  # the mixed-tail KV slots
        self.model_dtype: torch.dtype | None = None  # learned from the first payload
        self._dims: dict[str, int] = {}  # row shape -> elements, fixed by its first stash
        self.publish_ready: Any = None  # lazy device Event; speculative algorithms only
        self._publish_fresh = False  # debug: armed by a publish, consumed by a resolve
        self.new_seq_lens_cpu_pinned: Any = None  # CUDA only, like the private D2H stream
        self.fwd_prepare_d2h_stream: Any = None
        if self.FLAGS._is_cuda:
            self.new_seq_lens_cpu_pinned = torch.empty(
                (self.req_pool_size,), dtype=torch.int64, pin_memory=True
            )
            self.fwd_prepare_d2h_stream = torch.get_device_module(self.device).Stream()
        self._make_buffers()

    def _buffer(self, dtype: Any, init: Any, poison: Any, row: Any = ()) -> Any:
        """A [pool, *row] buffer: `init` ("empty", "zeros" or a fill value), or `poison`
        in debug mode (None: NaN or the dtype's minimum)."""
        shape, dtype = (self.req_pool_size, *row), dtype or self.model_dtype
        if self.FLAGS._DEBUG_ASSERT:
            init = poison if poison is not None else _poison(dtype)
        if init == "empty":
            return torch.empty(shape, dtype=dtype, device=self.device)
        if init == "zeros":
            return torch.zeros(shape, dtype=dtype, device=self.device)
        return torch.full(shape, init, dtype=dtype, device=self.device)

    def _store(
        self,
        buf: Any,
        i: Any,
        rows: Any,
        name: str,
        dtype: Any,
        dims: str = "",
        init: Any = "empty",
    ) -> Any:
        """`_write` into field `name`'s lazy buffer `buf`, made first if this is the first stash
        carrying the field: rows shaped like `rows`, agreeing with earlier fields of its row
        shape `dims` (given where several fields share one); returns the buffer (None: still
        not carried)."""
        if buf is None and rows is not None:
            if not isinstance(rows, torch.Tensor) or rows.dim() == 0:
                self._check_rows(name, rows, -1)
            if dtype is None:
                self.model_dtype = self.model_dtype or rows.dtype
            # Fields of one row shape agree on its element count (SGLang may hold them flat).
            row = tuple(rows.shape[1:])
            numel = self._dims.setdefault(dims or f"field {name}", int(torch.Size(row).numel()))
            if numel != torch.Size(row).numel():
                raise RelayError(
                    f"payload field `{name}` has rows of {list(row)}, but another field of row "
                    f"shape [{dims}] was stashed with {numel} elements per row"
                )
            buf = self._buffer(dtype, init, None, row)
        self._write(buf, i, rows, name)
        return buf

    def _check_rows(self, name: str, value: Any, n: int) -> None:
        if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != n:
            got = getattr(value, "shape", type(value).__name__)
            rows = "rows" if n < 0 else f"{n} rows (one per index)"
            raise RelayError(f"payload field `{name}` must be a tensor with {rows}, got {got}")

    def _write(self, buf: Any, indices: torch.Tensor, rows: Any, name: str) -> None:
        """`buf[indices] = rows` in the buffer's dtype (None: not written); a misfit names
        the field."""
        if rows is None:
            return
        try:
            buf.index_copy_(0, indices, rows if rows.dtype is buf.dtype else rows.to(buf.dtype))
        except (AttributeError, IndexError, RuntimeError) as exc:
            self._check_rows(name, rows, indices.shape[0])
            if rows.shape[1:] != buf.shape[1:]:
                raise RelayError(
                    f"payload field `{name}` rows must be {list(buf.shape[1:])} (fixed by the "
                    f"first stash), got {list(rows.shape[1:])}"
                ) from exc
            bad = indices[(indices < 0) | (indices >= self.req_pool_size)][:4].tolist()
            why = (
                f"indices {bad} out of range for req_pool_size {self.req_pool_size}" if bad else exc
            )
            raise RelayError(f"stash of `{name}` failed: {why}") from exc

    def _refuse(self, name: str, rows: Any) -> None:
        """A payload field SGLang reads back for this algorithm that its spec does not relay
        is refused (None: absent), rather than silently lost."""
        if rows is not None:
            raise RelayError(
                f"payload carries `{name}`, which SGLang relays for `{self.ALGORITHM}` but "
                f"{self.SPEC} does not: add the field to the spec"
            )

    def _consume_once(
        self, name: str, buf: torch.Tensor, rows: torch.Tensor, indices: Any, poison: Any
    ) -> None:
        """Debug mode: every row read must have been written since its last read."""
        if not self.FLAGS._DEBUG_ASSERT:
            return
        poison = _poison(buf.dtype) if poison is None else poison
        fresh = rows != poison
        if rows.device.type == "cpu" and not bool(fresh.all()):
            raise RelayDebugError(
                f"resolve reads `{name}` of slot {int(indices[~fresh][0])}, which was not "
                "stashed since it was last read (SGLANG_IS_IN_CI consume-once check)"
            )
        if rows.device.type != "cpu":
            torch._assert_async(fresh.all())  # no host sync, as in SGLang
        buf.index_fill_(0, indices.to(self.device).long(), poison)

    def _adopt(self) -> FutureRelayBuffers | None:
        """The FutureRelayBuffers offered for this pool size, now this map's (or None)."""
        relay = _offered_relay
        if relay is None or relay.new_seq_lens.shape[0] != self.req_pool_size:
            return None
        relay.adopted = True
        self._relay = relay
        return relay

    def _adopted(self, buf: torch.Tensor, poison: Any) -> torch.Tensor:
        if self.FLAGS._DEBUG_ASSERT:
            buf.fill_(_poison(buf.dtype) if poison is None else poison)
        return buf

    def _gated(self, buf: torch.Tensor | None, indices: torch.Tensor, name: str) -> torch.Tensor:
        if buf is None:
            raise RelayError(f"resolve of `{name}` before any stash carried it")
        return buf.index_select(0, indices)

    def _seeds(self, draft_input: Any, indices: Any, relayed: bool) -> Any:
        """DSA seeds, which SGLang reads only for a draft input flagged as having them
        (`relayed`: whether the spec relays `dsa_topk_indices`)."""
        if not getattr(draft_input, "future_dsa_topk_indices_available", False):
            return None
        if not relayed:
            raise RelayError(
                f"the draft input has `future_dsa_topk_indices_available` set, but {self.SPEC} "
                "does not relay `dsa_topk_indices`: add the field to the spec"
            )
        return self._gated(self.dsa_topk_indices_buf, indices, "dsa_topk_indices")

    def publish(
        self,
        future_indices: torch.Tensor,
        new_seq_lens: torch.Tensor,
        confidence: torch.Tensor | None = None,
    ) -> None:
        """Write the new lengths (`new_seq_lens_buf`) and the host-ring field `confidence=`
        feeds, then record `publish_ready` (speculative algorithms only)."""
        if future_indices.shape[0] == 0:
            return  # DP idle
        to_host = self.needs_confidence_relay and confidence is not None
        if to_host and self.confidence_relay is None:
            raise RelayError(
                f"publish carries `confidence`, which {self.SPEC} does not relay to the host: "
                "declare a `confidence` field with `host_mirror: {lag: 2, ring: 3, "
                "generation_check: true}` and `publish: early` (as dspark.yaml does)"
            )
        buf, relay = self.new_seq_lens_buf, self._relay
        if relay is not None and buf is relay.new_seq_lens:
            if new_seq_lens is relay.published_seq_lens:
                relay.published_seq_lens = buf = None  # the captured graph scattered them
        if buf is not None:  # None: lengths SGLang never reads back (non-speculative)
            i = future_indices if future_indices.dtype is torch.int64 else future_indices.long()
            self._write(buf, i, new_seq_lens, "new_seq_lens")
        if to_host:
            self.confidence_relay.scatter(future_indices, confidence, self.FLAGS._is_cuda)
        if self.spec_algo.is_some():  # only the speculative resolves wait for it
            if self.publish_ready is None:
                self.publish_ready = torch.get_device_module(self.device).Event()
            self.publish_ready.record()
            self._publish_fresh = True
        if to_host:
            self.confidence_relay.issue_ring_copy(self.fwd_prepare_d2h_stream, self.publish_ready)

    def _wait_publish(self) -> None:
        if self.FLAGS._is_hip:
            self.publish_ready.synchronize()  # Event.wait() regresses TPOT on MI355 (SGLang)
        else:
            self.publish_ready.wait()

    def _host_lengths(self, fresh: torch.Tensor, indices_cpu: Any) -> torch.Tensor:
        """Host copy of published lengths: `.cpu()` off CUDA (bootstrap), else the pinned
        mirror filled on the private stream once the publish event fired."""
        if self.fwd_prepare_d2h_stream is None or self.publish_ready is None:
            return fresh.cpu()
        self.fwd_prepare_d2h_stream.wait_event(self.publish_ready)
        with torch.get_device_module(self.device).stream(self.fwd_prepare_d2h_stream):
            self.new_seq_lens_cpu_pinned.copy_(self.new_seq_lens_buf, non_blocking=True)
        self.fwd_prepare_d2h_stream.synchronize()
        return self.new_seq_lens_cpu_pinned[indices_cpu]

    def resolve_seq_lens_cpu(self, batch: Any, stream_ordered: bool = False) -> None:
        """batch.seq_lens (device) and, unless opted out, seq_lens_cpu / seq_lens_sum from
        the lengths published for the batch's future indices."""
        draft_input = batch.spec_info
        if draft_input is None or draft_input.future_indices is None:
            return
        fi = draft_input.future_indices
        if self.publish_ready is not None and stream_ordered:
            self._publish_fresh = False
        elif self.publish_ready is not None:
            if self.FLAGS._DEBUG_ASSERT and not self._publish_fresh:
                raise RelayDebugError("resolve without a fresh forward publish")
            self._publish_fresh = False
            self._wait_publish()
        batch.seq_lens = self.new_seq_lens_buf.index_select(0, fi)
        if not self.needs_cpu_seq_lens:
            batch.seq_lens_cpu = batch.seq_lens_sum = None
        else:
            batch.seq_lens_cpu = self._host_lengths(batch.seq_lens, batch.req_pool_indices_cpu)
            batch.seq_lens_sum = _host_sum(batch.seq_lens_cpu)
        if self.FLAGS._DEBUG_ASSERT:
            poison = self.LENGTHS_POISON
            self._consume_once("new_seq_lens", self.new_seq_lens_buf, batch.seq_lens, fi, poison)

    def resolve_mixed_spec_tails(self, batch: Any) -> None:
        """Late-bind a speculative mixed batch's decode tails: their lengths (and KV slots)
        come from the published lengths, behind the publish event."""
        idx = batch.mix_running_indices
        n = int(idx.shape[0])
        if n == 0:
            return
        if self.publish_ready is not None:
            self._wait_publish()
        fresh = self.new_seq_lens_buf.index_select(0, idx)
        seq_lens = batch.seq_lens.clone()
        seq_lens[-n:] = fresh + 1
        batch.seq_lens = seq_lens
        out_cache_loc = batch.out_cache_loc.clone()
        out_cache_loc[-n:] = self.req_to_token[idx.long(), fresh.long()].to(out_cache_loc.dtype)
        batch.out_cache_loc = out_cache_loc
        fresh_cpu = self._host_lengths(fresh, getattr(batch, "mix_running_indices_cpu", None))
        if batch.seq_lens_cpu is not None:
            seq_lens_cpu = batch.seq_lens_cpu.clone()
            seq_lens_cpu[-n:] = fresh_cpu + 1
            batch.seq_lens_cpu = seq_lens_cpu
            batch.seq_lens_sum = _host_sum(batch.seq_lens_cpu)
        batch.prefix_lens = batch.prefix_lens[:-n] + [int(x) for x in fresh_cpu.tolist()]

    def _input_tokens(self, indices: torch.Tensor) -> torch.Tensor:
        """The relayed next input token of each request (`output_tokens_buf`)."""
        if self.output_tokens_buf is None:
            raise RelayError(
                f"`{self.ALGORITHM}` relays no bonus tokens, so its decode inputs cannot come "
                "from the relay (SGLang: mixed chunk prefill is unsupported for it)"
            )
        tokens = self.output_tokens_buf.index_select(0, indices)
        self._consume_tokens(tokens, indices)
        return tokens

    def _consume_tokens(self, tokens: torch.Tensor, indices: Any) -> None:
        poison = self.TOKENS_POISON
        self._consume_once("bonus_tokens", self.output_tokens_buf, tokens, indices, poison)

    def stash_bonus_tokens(self, indices: torch.Tensor, bonus_tokens: torch.Tensor) -> None:
        """Write only the bonus-token rows (the relay carries no draft extras)."""
        if self.output_tokens_buf is not None and indices.shape[0]:
            self._write(self.output_tokens_buf, indices.long(), bonus_tokens, "bonus_tokens")

    def resolve_confidence_cpu(self, batch: Any) -> ResolvedConfidence | None:
        """The batch's host rows of the field `publish(..., confidence=)` feeds (None: not
        enabled, not relayed, or not there yet)."""
        if not self.needs_confidence_relay or self.confidence_relay is None:
            return None
        return self.confidence_relay.resolve(batch, self.fwd_prepare_d2h_stream, self.publish_ready)

    def make_staged_spec_input(self, future_indices: torch.Tensor) -> Any:
        """The draft input of a request leaving HiSparse staging: only its future indices,
        so the next overlap resolve fills it from the relay (SGLang's EagleDraftInput)."""
        if not self.STAGING:
            raise RuntimeError(
                "HiSparse staging only supports EAGLE-family speculative inputs "
                f"({self.SPEC} declares no `staging:`)."
            )
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        return EagleDraftInput(
            capture_hidden_mode=CaptureHiddenMode[self.STAGING],
            future_indices=future_indices,
            future_dsa_topk_indices_available=self.dsa_topk_indices_buf is not None,
        )

    def stash(self, future_indices: torch.Tensor, payload: Any) -> None:
        """Write the payload's relayed rows (`_stash`, generated per algorithm), but not bonus
        tokens an adopted buffer's graph already scattered (as `publish` skips lengths)."""
        if future_indices.shape[0]:  # else DP idle: the payload is an empty stub
            i = future_indices if future_indices.dtype is torch.int64 else future_indices.long()
            relay = self._relay
            if relay is not None and self.output_tokens_buf is relay.output_tokens:
                if payload.bonus_tokens is relay.published_bonus:  # consumed: the next writes
                    relay.published_bonus = None
                    payload = replace(payload, bonus_tokens=None)
            self._stash(i, payload)

    def _resolve_spec_extras(self, batch: Any) -> None:
        """Read the relayed draft state into `batch.spec_info` (`_resolve`, generated)."""
        draft_input = batch.spec_info
        if draft_input is None or draft_input.future_indices is None:
            return  # a prefill
        indices = draft_input.future_indices
        if indices.shape[0]:  # else DP idle
            if indices.device.type != "cpu":
                indices.record_stream(torch.get_device_module(self.device).current_stream())
            self._resolve(draft_input, indices)

    def _make_buffers(self) -> None:
        """Allocate the buffers the spec makes eagerly (generated)."""

    def _stash(self, i: torch.Tensor, payload: Any) -> None:
        """Write each relayed payload field (generated)."""

    def _resolve(self, draft_input: Any, i: torch.Tensor) -> None:
        """Read each relayed field into the draft input (generated)."""


def resolve_forward_inputs(batch: Any, future_map: Any) -> None:
    """Materialize input_ids at forward entry: the prefill's host tokens (H2D), plus the
    relayed tokens of a mixed batch's decode tails; a decode's relayed tokens; and, under
    overlapped speculation, the relayed spec extras into `batch.spec_info`."""
    if batch.prefill_input_ids_cpu is not None:
        prefill = batch.prefill_input_ids_cpu.to(batch.device, non_blocking=True)
        if batch.mix_running_indices is not None:
            # Keep the mixed-in batch's indices alive on the forward stream until the
            # gather completes (CPU tensors have no stream to record).
            if batch.mix_running_indices.device.type != "cpu":
                batch.mix_running_indices.record_stream(
                    torch.get_device_module(batch.device).current_stream()
                )
            if batch.enable_overlap and not batch.spec_algorithm.is_none():
                future_map.resolve_mixed_spec_tails(batch)
            decode = future_map._input_tokens(batch.mix_running_indices)
            batch.input_ids = torch.cat([prefill, decode])
        else:
            batch.input_ids = prefill
        batch.prefill_input_ids_cpu = None
        batch.mix_running_indices = None
    elif batch.input_ids is None and future_map.spec_algo.is_none():
        batch.input_ids = future_map._input_tokens(batch.req_pool_indices)
    # Only the overlap path relays spec extras; the synchronous path installs them itself.
    if batch.enable_overlap and not batch.spec_algorithm.is_none():
        future_map._resolve_spec_extras(batch)


def install_relay(names: dict[str, Any], future_map: type[RelayMap]) -> None:
    """Swap SGLang's relay names (`names`: SGLang's name -> the drop-in's) in
    `sglang.srt.managers.overlap_utils` and every SGLang module already holding them, and
    read SGLang's platform and debug flags from then on (`future_map.FLAGS`)."""
    from sglang.srt.managers import overlap_utils as original

    replaced = {id(vars(original)[name]): value for name, value in names.items()}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "sglang" or name.startswith("sglang.")):
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in replaced:
                setattr(module, attr, replaced[id(value)])
    future_map.FLAGS = original
