"""The spec-independent base of the SGLang target's drop-in: the FutureMap behaviour.

`relayc compile --target sglang` pastes everything below the PASTE_MARKER line into
`relayc_relay_base.py` beside the `overlap_utils.py` it writes (which holds the
per-algorithm classes generated from the specs and re-exports SGLang's names from here).
The drop-in therefore needs nothing from relayc at run time: its files can be copied next
to an SGLang install. This file is a real module only so that ruff and the type checker
read it; nothing imports it except the generator. Its imports above the marker become
the generated base's imports of its siblings: `relay_kernels` (the generated fused Triton
kernels over the specs' fields, `relayc_relay_kernels.py`) and the relay's records
(`sglang_state.py`, pasted into `relayc_relay_state.py`).

The contract with SGLang 0.5.23 (`sglang/srt/managers/overlap_utils.py`), in one place:

- Buffers are indexed by request-pool slot; slot 0 is the padding slot that CUDA-graph
  padded rows write to, so padded stashes never touch a live request.
- A field whose row names a dim, or that the spec allocates lazily, gets its buffer at
  the first stash that carries it, shaped after that payload's rows (SGLang's
  constructor learns no dims either). Scalar eager fields are allocated here.
- `publish` writes `new_seq_lens` and, for speculative algorithms only, records the
  `publish_ready` event on the current stream; `resolve_seq_lens_cpu` waits for that
  event before it reads the lengths, and on CUDA copies them to a pinned host mirror
  on a private stream (`fwd_prepare_d2h_stream`) instead of syncing the schedule stream.
- Debug mode is SGLang's CI flag (`SGLANG_IS_IN_CI`): buffers start poisoned, and the
  consume-once fields (eager fields whose unwritten rows read as their poison:
  `bonus_tokens`, `new_seq_lens`) are checked non-poisoned on every resolve and poisoned
  again, so a resolve with no stash/publish in between fails. `resolve_seq_lens_cpu`
  also asserts a fresh publish before each event wait, as SGLang does.
- On CUDA with Triton, a stash is one fused launch over every field it carries and a
  spec-extras resolve one launch over every relayed field; elsewhere per-field
  `index_copy_` / `index_select`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from relayc.compiler.targets.sglang_state import (
    SGLANG_ADOPTED_BUFFERS,
    SGLANG_GATED_READS,
    SGLANG_PAYLOAD,
    ConfidenceRelay,
    FutureRelayBuffers,
    HostRing,
    RelayDebugError,
    RelayError,
    RelayField,
    ResolvedConfidence,
    buffer_name,
)

# The generated relayc_relay_kernels module: `_HAVE_TRITON`, and where it is True,
# `_RELAY_FIELDS`, `triton_stash` and `triton_resolve` over the specs' fields.
relay_kernels: Any = None

PASTE_MARKER = "# ---- pasted into the generated module from here on ----"
# ---- pasted into the generated module from here on ----


def _env_flag(name: str) -> bool:
    """SGLang's boolean environment parsing (`EnvBool`): unset is False."""
    value = os.environ.get(name)
    if value is None:
        return False
    value = value.lower()
    if value in ("true", "1", "yes", "y"):
        return True
    if value in ("false", "0", "no", "n"):
        return False
    raise ValueError(f'{name}="{value}" is not a valid boolean value')


# SGLang's consume-once debug checks run under its CI flag; read once, like SGLang does.
_DEBUG_ASSERT = _env_flag("SGLANG_IS_IN_CI")
_IS_HIP = torch.version.hip is not None

_offered_relay: FutureRelayBuffers | None = None


def offer_future_relay_buffers(relay: FutureRelayBuffers) -> None:
    """Offer `relay` to the next FutureMap built with its pool size."""
    global _offered_relay
    _offered_relay = relay


# SGLang 0.5.23's SpeculativeAlgorithm members and the relayc algorithms relaying them;
# `is_eagle()` members (NEXTN parses as EAGLE) are resolved in relay_algorithm.
_SGLANG_ALGORITHMS = {
    "NONE": "none",
    "STANDALONE": "standalone",
    "NGRAM": "ngram",
    "DFLASH": "dflash",
    "UNO": "uno",
    "DSPARK": "dspark",
}
_EAGLE_FAMILY = ("EAGLE", "EAGLE3", "FROZEN_KV_MTP")


def relay_algorithm(spec_algo: Any) -> str:
    """The relayc algorithm that relays for SGLang's `SpeculativeAlgorithm` `spec_algo`."""
    name = str(getattr(spec_algo, "name", spec_algo)).upper()
    if name in _EAGLE_FAMILY:
        # Multi-layer EAGLE relays [num_steps, topk] top-k and no hidden states.
        from sglang.srt.runtime_context import get_spec

        if get_spec().enable_multi_layer_eagle:
            return "eagle_multilayer"
        # SGLang relays EAGLE3 (and FROZEN_KV_MTP) with EAGLE's buffers: a module compiled
        # without an eagle3 spec serves EAGLE3 with the eagle one.
        return "eagle3" if name == "EAGLE3" and "eagle3" in FutureMap.ALGORITHMS else "eagle"
    if name in _SGLANG_ALGORITHMS:
        return _SGLANG_ALGORITHMS[name]
    if name in FutureMap.PLUGINS:  # registered with SGLang's spec_registry
        return FutureMap.PLUGINS[name]
    raise NotImplementedError(
        f"no relayc spec covers SGLang's speculative algorithm {name}; this module relays "
        f"{', '.join(sorted(FutureMap.ALGORITHMS))} (a plugin registered with SGLang needs a "
        f"spec with `sglang: {{plugin: {name}}}` compiled into the module)"
    )


class FutureMap:
    """SGLang's FutureMap, generated: `FutureMap(device, spec_algo, req_to_token_pool, ...)`
    returns the generated relay of the algorithm `spec_algo` maps to (`algorithm=` picks
    one by relayc name, for use without SGLang's runtime config)."""

    ALGORITHMS: ClassVar[dict[str, type[FutureMap]]] = {}  # relayc algorithm -> generated class
    PLUGINS: ClassVar[dict[str, str]] = {}  # SGLang plugin name -> relayc algorithm
    # What a generated subclass sets; the methods below read only these.
    ALGORITHM = ""
    DESCRIPTION = ""  # the spec's description
    SPEC = ""  # spec path
    SPEC_HASH = ""  # spec content hash
    SGLANG_PLUGIN = ""  # the name a plugin algorithm is registered under with SGLang
    FIELDS: tuple[RelayField, ...] = ()
    STASHED: tuple[str, ...] = ()  # fields `stash` writes, in the spec's order
    SPEC_EXTRAS: tuple[str, ...] = ()  # fields the overlap resolve gathers into spec_info
    # Payload fields SGLang reads back for this algorithm that the spec does not relay:
    # a stash carrying one is refused rather than silently losing it.
    REFUSED: tuple[str, ...] = ()
    # Fields the draft input holds flat ([bs * row], NgramVerifyInput), each with the
    # draft-input attribute of its row width. Such a draft input has no DSA seeds and may
    # carry no future indices.
    FLAT_ROWS: ClassVar[dict[str, str]] = {}
    # The spec's `confidence` field relayed to the host (`host_mirror: {lag, ring, ...}`):
    # what `publish(..., confidence=)` feeds and `resolve_confidence_cpu` reads.
    CONFIDENCE_RELAY: ClassVar[HostRing | None] = None
    # The spec's fields whose buffers a captured graph owns (`owner: graph`): adopted from
    # offered FutureRelayBuffers, with the identity skip.
    ADOPTED: tuple[str, ...] = ()
    # The spec's `staging:` (staged inputs, HiSparse): the CaptureHiddenMode member a staged
    # draft input asks for; None: the spec declares no staging, which is refused.
    STAGING_CAPTURE_HIDDEN: str | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        FutureMap.ALGORITHMS[cls.ALGORITHM] = cls
        if cls.SGLANG_PLUGIN:
            FutureMap.PLUGINS[cls.SGLANG_PLUGIN] = cls.ALGORITHM
        # (field, buffer attribute) pairs, resolved once: the per-iteration paths below
        # touch no field table.
        buffers = {f.name: f.buffer for f in cls.FIELDS}
        cls._stash_plan = tuple((name, buffers[name]) for name in cls.STASHED)
        cls._extras_plan = tuple(buffers[name] for name in cls.SPEC_EXTRAS)
        FutureMap.BUFFERS.update(dict.fromkeys(buffers.values()))

    _stash_plan: ClassVar[tuple[tuple[str, str], ...]] = ()
    _extras_plan: ClassVar[tuple[str, ...]] = ()
    # Every buffer attribute SGLang's FutureMap has, and those of every field the generated
    # algorithms relay; those an algorithm does not relay are None on its maps.
    BUFFERS: ClassVar[dict[str, None]] = dict.fromkeys(
        buffer_name(name) for name in (*SGLANG_PAYLOAD, "new_seq_lens")
    )

    def __new__(cls, *args: Any, **kwargs: Any) -> FutureMap:
        if cls is FutureMap:
            algorithm = kwargs.get("algorithm") or relay_algorithm(
                kwargs["spec_algo"] if "spec_algo" in kwargs else args[1]
            )
            if algorithm not in FutureMap.ALGORITHMS:
                raise NotImplementedError(
                    f"this module was compiled without a spec for `{algorithm}` (it relays "
                    f"{', '.join(sorted(FutureMap.ALGORITHMS))}); add the spec to "
                    "`relayc compile --target sglang`"
                )
            cls = FutureMap.ALGORITHMS[algorithm]
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
        self.req_pool_size = int(req_to_token_pool.req_to_token.shape[0])
        # Kept for the mixed-tail late binding (reserved-slot gather).
        self.req_to_token = req_to_token_pool.req_to_token
        self.model_dtype: torch.dtype | None = None
        self._fields = {f.name: f for f in self.FIELDS}
        # Row element count per shape expression: fields with one shape agree on it.
        self._row_numel: dict[str, int] = {}
        for name in FutureMap.BUFFERS:
            setattr(self, name, None)
        for f in self.FIELDS:
            if not f.lazy:
                setattr(self, f.buffer, self._allocate(f, ()))
        self._fused = relay_kernels._HAVE_TRITON and self.device.type == "cuda"
        # Pinned host mirror of new_seq_lens and the private D2H stream: CUDA only, like
        # SGLang (elsewhere there is no write-after-read barrier to hide).
        if self._host_mirrored and self.device.type == "cuda" and not _IS_HIP:
            self.new_seq_lens_cpu_pinned = torch.empty(
                (self.req_pool_size,), dtype=torch.int64, pin_memory=True
            )
            self.fwd_prepare_d2h_stream = torch.get_device_module(self.device).Stream()
        else:
            self.new_seq_lens_cpu_pinned = None
            self.fwd_prepare_d2h_stream = None
        self.publish_ready: Any = None  # lazy device Event; speculative algorithms only
        self.confidence_relay = (
            None
            if self.CONFIDENCE_RELAY is None
            else ConfidenceRelay(
                self.device, self.req_pool_size, req_to_token_pool, self.CONFIDENCE_RELAY
            )
        )
        self._relay: FutureRelayBuffers | None = None
        offered = _offered_relay
        if (
            self.ADOPTED
            and offered is not None
            and offered.new_seq_lens.shape[0] == self.req_pool_size
        ):
            self._adopt_relay(offered)
        # Debug consume-once state: armed by a recording publish, consumed by a resolve.
        self._publish_fresh = False

    _host_mirrored = False  # generated: whether the spec mirrors new_seq_lens on the host
    # Fused Triton stash/resolve (set in __init__); unfused, length resolves read only SGLang's
    # attributes, which SGLang's unit tests set on a map made with `object.__new__`.
    _fused = False

    # -- buffers ---------------------------------------------------------------------
    def _adopt_relay(self, relay: FutureRelayBuffers) -> None:
        """Relay the spec's graph-owned fields in the offered buffers (debug: poisoned)."""
        for name in self.ADOPTED:
            f = self._fields[name]
            buf = getattr(relay, SGLANG_ADOPTED_BUFFERS[name][0])
            if _DEBUG_ASSERT:
                buf.fill_(f.poison)
            setattr(self, f.buffer, buf)
        relay.adopted = True
        self._relay = relay

    def _already_scattered(self, name: str, value: Any) -> bool:
        """Whether `value` is the tensor the adopted buffers' graph already scattered for
        field `name` (consumed: the next write of the field is a real one)."""
        relay = self._relay
        if relay is None or name not in self.ADOPTED:
            return False
        published = SGLANG_ADOPTED_BUFFERS[name][1]
        if value is not getattr(relay, published):
            return False
        setattr(relay, published, None)
        return True

    def _allocate(self, f: RelayField, row: tuple[int, ...]) -> torch.Tensor:
        shape = (self.req_pool_size, *row)
        dtype = f.dtype or self.model_dtype
        if _DEBUG_ASSERT:
            return torch.full(shape, f.poison, dtype=dtype, device=self.device)
        if f.init == "empty":
            return torch.empty(shape, dtype=dtype, device=self.device)
        if f.init == "zeros":
            return torch.zeros(shape, dtype=dtype, device=self.device)
        return torch.full(shape, f.init, dtype=dtype, device=self.device)

    def _prepare(self, name: str, value: torch.Tensor | None, n: int) -> torch.Tensor | None:
        """`value` ready to scatter into field `name`'s buffer (allocated on first use)."""
        if value is None:
            return None
        f = self._fields[name]
        if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != n:
            raise RelayError(
                f"payload field `{name}` must be a tensor with {n} rows (one per index), got "
                f"{getattr(value, 'shape', type(value).__name__)}"
            )
        buf = getattr(self, f.buffer)
        if buf is None:
            if f.dtype is None and self.model_dtype is None:
                self.model_dtype = value.dtype
            row = tuple(value.shape[1:])
            numel = self._row_numel.setdefault(f.shape, int(torch.Size(row).numel()))
            if int(torch.Size(row).numel()) != numel:
                raise RelayError(
                    f"payload field `{name}` has rows of {list(row)}, but another field of row "
                    f"shape [{f.shape}] was stashed with {numel} elements per row ({f.origin})"
                )
            buf = self._allocate(f, row)
            setattr(self, f.buffer, buf)
        if value.shape[1:] != buf.shape[1:]:
            raise RelayError(
                f"payload field `{name}` rows must be {list(buf.shape[1:])} ([{f.shape}], "
                f"{f.origin}; fixed by the first stash), got {list(value.shape[1:])}"
            )
        if value.dtype != buf.dtype:
            value = value.to(buf.dtype)
        return value if value.is_contiguous() else value.contiguous()

    def _stash_error(self, name: str, value: Any, indices: torch.Tensor) -> Exception:
        """Why a scatter into field `name` failed, in the spec's terms."""
        try:
            self._prepare(name, value, indices.shape[0])
        except RelayError as exc:
            return exc
        bad = indices[(indices < 0) | (indices >= self.req_pool_size)]
        if bad.numel():
            return RelayError(
                f"indices out of range for req_pool_size {self.req_pool_size}: "
                f"{bad[:4].tolist()} (0 is the padding slot)"
            )
        return RelayError(f"stash of `{name}` failed")

    def _scatter(self, indices: torch.Tensor, values: dict[str, torch.Tensor | None]) -> None:
        """`buffer[indices] = value` for every non-None value, in one launch where fused."""
        if self._fused:
            bufs, srcs = self._kernel_operands(values)
            # the kernel reads indices[i]
            relay_kernels.triton_stash(indices.contiguous(), bufs, srcs)
            return
        if indices.dtype != torch.int64:
            indices = indices.long()
        if indices.device != self.device:
            indices = indices.to(self.device)
        for name, value in values.items():
            if value is not None:
                try:
                    getattr(self, self._fields[name].buffer).index_copy_(0, indices, value)
                except (IndexError, RuntimeError) as exc:
                    raise self._stash_error(name, value, indices) from exc

    def _gather(self, indices: torch.Tensor, names: Sequence[str]) -> list[torch.Tensor | None]:
        """Rows `indices` of each field in `names` (None where its buffer is unallocated)."""
        bufs = [getattr(self, self._fields[name].buffer) for name in names]
        if self._fused:
            outs = {
                name: None if buf is None else buf.new_empty((indices.shape[0], *buf.shape[1:]))
                for name, buf in zip(names, bufs, strict=True)
            }
            kernel_bufs, kernel_outs = self._kernel_operands(outs)
            relay_kernels.triton_resolve(indices.contiguous(), kernel_bufs, kernel_outs)
            return list(outs.values())
        if indices.dtype != torch.int64:
            indices = indices.long()
        if indices.device != self.device:
            indices = indices.to(self.device)
        return [None if buf is None else buf.index_select(0, indices) for buf in bufs]

    def _kernel_operands(
        self, rows: dict[str, torch.Tensor | None]
    ) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
        """Buffers and row tensors in the kernels' field order (None: not in this call)."""
        bufs: list[torch.Tensor | None] = []
        outs: list[torch.Tensor | None] = []
        for name, _ in relay_kernels._RELAY_FIELDS:
            value = rows.get(name)
            f = self._fields.get(name)
            bufs.append(None if value is None or f is None else getattr(self, f.buffer))
            outs.append(None if f is None else value)
        return bufs, outs

    def _consume_once(self, name: str, values: torch.Tensor, indices: torch.Tensor) -> None:
        """Debug mode: every row read must have been written since its last read."""
        f = self._fields[name]
        fresh = values != f.poison
        if values.device.type == "cpu":
            if not bool(fresh.all()):
                slot = int(indices[~fresh][0])
                raise RelayDebugError(
                    f"resolve reads `{name}` of slot {slot}, which was not stashed since it "
                    "was last read (SGLANG_IS_IN_CI consume-once check)"
                )
        else:
            torch._assert_async(fresh.all())  # no host sync, as in SGLang
        getattr(self, f.buffer).index_fill_(0, indices.to(self.device).long(), f.poison)

    # -- what SGLang calls -----------------------------------------------------------
    def stash(self, future_indices: torch.Tensor, payload: Any) -> None:
        """Write the payload's non-None STASHED fields into rows `future_indices` (one
        launch where fused); SGLang never reads back the other fields for this algorithm."""
        n = future_indices.shape[0]
        if n == 0:
            return  # DP idle: the payload is an empty stub
        for name in self.REFUSED:
            if getattr(payload, name) is not None:
                raise RelayError(
                    f"payload carries `{name}`, which SGLang relays for `{self.ALGORITHM}` but "
                    f"{self.SPEC} does not: add the field to the spec"
                )
        skip = self._relay is not None and self._already_scattered(
            "bonus_tokens", payload.bonus_tokens
        )
        if self._fused:  # one launch for every field the payload carries
            values = {name: getattr(payload, name) for name in self.STASHED}
            if skip:
                values["bonus_tokens"] = None
            self._scatter(
                future_indices,
                {name: self._prepare(name, value, n) for name, value in values.items()},
            )
            return
        indices = future_indices if future_indices.dtype is torch.int64 else future_indices.long()
        for name, buffer in self._stash_plan:
            value = getattr(payload, name)
            if value is None or (skip and name == "bonus_tokens"):
                continue
            buf = getattr(self, buffer)
            if buf is None or value.dtype is not buf.dtype:  # allocate or cast
                value = self._prepare(name, value, n)
                buf = getattr(self, buffer)
            try:
                buf.index_copy_(0, indices, value)
            except (IndexError, RuntimeError) as exc:
                raise self._stash_error(name, value, indices) from exc

    def _resolve_spec_extras(self, batch: Any) -> None:
        """Gather the SPEC_EXTRAS rows of `batch.spec_info.future_indices` into
        `batch.spec_info` (one launch where fused)."""
        names = self.SPEC_EXTRAS
        draft_input = batch.spec_info
        if not names or draft_input is None:
            return  # non-speculative, or a prefill: nothing relayed yet
        indices = draft_input.future_indices
        if indices is None and self.FLAT_ROWS:
            return
        if indices.shape[0] == 0:
            return
        gates = (
            {}
            if self.FLAT_ROWS
            else {n: getattr(draft_input, f, False) for n, f in SGLANG_GATED_READS.items()}
        )
        for name, available in gates.items():
            if available and name not in self._fields:
                raise RelayError(
                    f"the draft input has `{SGLANG_GATED_READS[name]}` set, but {self.SPEC} does not "
                    f"relay `{name}`: add the field to the spec"
                )
        if indices.device.type != "cpu":
            indices.record_stream(torch.get_device_module(self.device).current_stream())
        if self._fused:
            values = self._gather(indices, names)
        else:
            bufs = [getattr(self, buffer) for buffer in self._extras_plan]
            values = [None if buf is None else buf.index_select(0, indices) for buf in bufs]
        for name, value in zip(names, values, strict=True):
            if name in self.FLAT_ROWS:
                if value is None:
                    raise RelayError(f"resolve of `{name}` before any stash carried it")
                setattr(draft_input, name, value.flatten())  # SGLang holds these rows flat
            elif name in gates:
                if gates[name] and value is None:
                    raise RelayError(f"resolve of `{name}` before any stash carried it")
                setattr(draft_input, name, value if gates[name] else None)
            elif value is not None or name == "bonus_tokens":  # SGLang always sets the bonus
                setattr(draft_input, name, value)  # a lazy field no stash carried stays as is
        for name in gates:
            if name not in self._fields:
                setattr(draft_input, name, None)
        if _DEBUG_ASSERT:
            for name, value in zip(names, values, strict=True):
                if self._fields[name].consume_once:
                    self._consume_once(name, value, indices)

    def stash_bonus_tokens(self, indices: torch.Tensor, bonus_tokens: torch.Tensor) -> None:
        """Write only the bonus-token rows (the relay carries no draft extras)."""
        if "bonus_tokens" not in self._fields:
            return  # SGLang writes a buffer this algorithm never reads
        if indices.shape[0] == 0:
            return
        value = self._prepare("bonus_tokens", bonus_tokens, indices.shape[0])
        self._scatter(indices, {"bonus_tokens": value})

    def publish(
        self,
        future_indices: torch.Tensor,
        new_seq_lens: torch.Tensor,
        confidence: torch.Tensor | None = None,
    ) -> None:
        """Write the new sequence lengths, then record `publish_ready` (speculative only)."""
        indices = future_indices
        if indices.shape[0] == 0:
            return  # DP idle
        publish_confidence = self.needs_confidence_relay and confidence is not None
        if publish_confidence and self.confidence_relay is None:
            raise RelayError(
                f"publish carries `confidence`, which {self.SPEC} does not relay to the host: "
                "declare a `confidence` field with `host_mirror: {lag: 2, ring: 3, "
                "generation_check: true}` and `publish: early` (as dspark.yaml does)"
            )
        buf = self.new_seq_lens_buf  # None: non-speculative lengths SGLang never reads back
        if buf is not None and not self._already_scattered("new_seq_lens", new_seq_lens):
            if self._fused or new_seq_lens.dtype is not buf.dtype:
                new_seq_lens = self._prepare("new_seq_lens", new_seq_lens, indices.shape[0])
                self._scatter(indices, {"new_seq_lens": new_seq_lens})
            else:
                if indices.dtype is not torch.int64:
                    indices = indices.long()
                try:
                    buf.index_copy_(0, indices, new_seq_lens)
                except (IndexError, RuntimeError) as exc:
                    raise self._stash_error("new_seq_lens", new_seq_lens, indices) from exc
        if publish_confidence:
            self.confidence_relay.scatter(indices, confidence)
        if self.spec_algo.is_some():
            if self.publish_ready is None:
                self.publish_ready = torch.get_device_module(self.device).Event()
            self.publish_ready.record()
            self._publish_fresh = True
        if publish_confidence:
            self.confidence_relay.issue_ring_copy(self.fwd_prepare_d2h_stream, self.publish_ready)

    def _wait_publish(self) -> None:
        if _IS_HIP:
            self.publish_ready.synchronize()  # Event.wait() regresses TPOT on MI355 (SGLang)
        else:
            self.publish_ready.wait()

    def _host_lengths(self, fresh: torch.Tensor, indices_cpu: torch.Tensor) -> torch.Tensor:
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
        if draft_input is None:
            return
        fi = draft_input.future_indices
        if fi is None:
            return
        if self.publish_ready is not None and stream_ordered:
            self._publish_fresh = False
        elif self.publish_ready is not None:
            if _DEBUG_ASSERT and not self._publish_fresh:
                raise RelayDebugError("resolve without a fresh forward publish")
            self._publish_fresh = False
            self._wait_publish()
        if self._fused:
            (batch.seq_lens,) = self._gather(fi, ("new_seq_lens",))
        else:
            batch.seq_lens = self.new_seq_lens_buf.index_select(0, fi)
        if not self.needs_cpu_seq_lens:
            batch.seq_lens_cpu = None
            batch.seq_lens_sum = None
        else:
            batch.seq_lens_cpu = self._host_lengths(batch.seq_lens, batch.req_pool_indices_cpu)
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        if _DEBUG_ASSERT:
            self._consume_once("new_seq_lens", batch.seq_lens, fi)

    def resolve_mixed_spec_tails(self, batch: Any) -> None:
        """Late-bind a speculative mixed batch's decode tails: their lengths (and KV slots)
        come from the published lengths, behind the publish event."""
        idx = batch.mix_running_indices
        n = int(idx.shape[0])
        if n == 0:
            return
        if self.publish_ready is not None:
            self._wait_publish()
        if self._fused:
            (fresh,) = self._gather(idx, ("new_seq_lens",))
        else:
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
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        batch.prefix_lens = batch.prefix_lens[:-n] + [int(x) for x in fresh_cpu.tolist()]

    def _input_tokens(self, indices: torch.Tensor) -> torch.Tensor:
        """The relayed next input token of each request (SGLang's `output_tokens_buf`)."""
        if "bonus_tokens" not in self._fields:
            raise RelayError(
                f"`{self.ALGORITHM}` relays no bonus tokens, so its decode inputs cannot come "
                "from the relay (SGLang: mixed chunk prefill is unsupported for it)"
            )
        if self._fused:
            (tokens,) = self._gather(indices, ("bonus_tokens",))
        else:
            tokens = self.output_tokens_buf.index_select(0, indices)
        if _DEBUG_ASSERT:
            self._consume_once("bonus_tokens", tokens, indices)
        return tokens

    def resolve_confidence_cpu(self, batch: Any) -> ResolvedConfidence | None:
        """The batch's published confidence on the host (None: not enabled or not yet)."""
        if not self.needs_confidence_relay or self.confidence_relay is None:
            return None
        return self.confidence_relay.resolve(batch, self.fwd_prepare_d2h_stream, self.publish_ready)

    def make_staged_spec_input(self, future_indices: torch.Tensor) -> Any:
        """The draft input of a request leaving HiSparse staging: only its future indices,
        so the next overlap resolve fills it from the relay (SGLang's EagleDraftInput)."""
        mode = self.STAGING_CAPTURE_HIDDEN
        if mode is None:
            raise RuntimeError(
                "HiSparse staging only supports EAGLE-family speculative inputs "
                f"({self.SPEC} declares no `staging:`)."
            )
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        return EagleDraftInput(
            capture_hidden_mode=getattr(CaptureHiddenMode, mode),
            future_indices=future_indices,
            future_dsa_topk_indices_available=self.dsa_topk_indices_buf is not None,
        )


def resolve_forward_inputs(batch: Any, future_map: FutureMap) -> None:
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


def install_relay(payload: type) -> None:
    """Point SGLang at this relay (`install()` of the overlap_utils.py beside this module,
    with its `RelayPayload`): FutureMap, RelayPayload, resolve_forward_inputs,
    FutureRelayBuffers and offer_future_relay_buffers replace SGLang's in
    `sglang.srt.managers.overlap_utils` and in every SGLang module that already imported
    them. Run it in each SGLang process before the scheduler starts (docs/sglang.md: a
    sitecustomize does that for spawned processes too)."""
    import sys

    from sglang.srt.managers import overlap_utils as original

    ours = {
        "FutureMap": FutureMap,
        "RelayPayload": payload,
        "resolve_forward_inputs": resolve_forward_inputs,
        "FutureRelayBuffers": FutureRelayBuffers,
        "offer_future_relay_buffers": offer_future_relay_buffers,
    }
    replaced = {id(getattr(original, name)): value for name, value in ours.items()}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "sglang" or name.startswith("sglang.")):
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in replaced:
                setattr(module, attr, replaced[id(value)])
