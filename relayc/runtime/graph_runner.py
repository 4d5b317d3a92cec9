"""Run the device part of a generated DecodeStep from static buffers, captured as CUDA graphs.

The contract (what the engine must uphold):

- One graph per batch-size bucket (the spec's `capture.batch_sizes`, exported by the
  generated module as `CAPTURE_BATCH_SIZES`), all in one shared memory pool, each after
  warm-up runs on a side stream (which also allocate lazy relay buffers). `capture`
  captures every bucket largest first; `run` captures a bucket it has not seen yet.
- Each bucket has static input buffers: the engine inputs (`req_pool_indices`,
  `seq_lens`, ...) and the outputs of host steps. A batch of n rows is copied into
  rows [:n]; rows [n:] are padding: `req_pool_indices` = 0, the padding slot every
  relay buffer and KV pool reserves, other inputs their pad value (0 by default).
- Padding rows resolve the relay's slot 0 and stash into it. So that what they read
  never drifts (a length that grows each step would index past the KV table), the
  captured step first zeroes slot 0 of every relay buffer: padding rows always see a
  zero-length request.
- Per-row tensors the ops read from `ctx` (the KV windows, sampling parameters) are
  static inputs too (`ctx_inputs`): `bind_ctx(ctx, static)` returns the context a
  bucket's graph is captured with, its tensors the bucket's static buffers; `run`
  copies the batch's values (`ctx_values`) into them. Everything else in `ctx` is
  captured by reference and must stay at the same addresses.
- A replayed graph does not record the relay's publish event again; the runner records it
  after each replay (so host readers of early-published fields wait for the whole step).
- Outputs are row slices of the graph's static outputs, valid until the next replay.
  The step may return a mapping or a dataclass of tensors.
- Batches larger than the largest bucket run eagerly, and so does everything with
  `mode="off"`. `mode="static"` runs the same static-buffer path without CUDA graphs,
  so the padding and slicing are tested on any device; `"auto"` is `"graph"` on CUDA
  and `"off"` elsewhere.
- `mode="tape"` is the CPU's counterpart of `"graph"` (``relayc.runtime.tape``): each
  bucket's step is run once on padding and recorded -- its ATen ops and native calls,
  none of the Python around them -- and a batch replays the recording. A step the
  recorder refuses (`tape_refusals` says why) runs from its static buffers as with
  `"static"`. As with CUDA graphs, a replay's outputs are the recording's tensors,
  valid until the next replay: on the CPU a host copy (`.to("cpu")`) is the tensor
  itself, so a caller that keeps them past the next step copies them.
- `replay_held(key, batch, values)` (mode `tape`) replays the batch `run` last ran with the
  same `key` object after writing only `values`, the inputs that moved since, into the
  static buffers through memoryviews: the engine's steady decode batch, whose other
  per-request tensors stay those of its `key`. Anything else (another batch ran since, a
  recording that writes its inputs, host steps, a declined native call) goes through `run`.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from relayc.runtime.outputs import output_items
from relayc.runtime.tape import Recorder

MODES: tuple[str, ...] = ("auto", "graph", "tape", "static", "off")

# the markers of ``replay_held``'s memoryview of a static input not made yet, and of an
# input that has none (not an integer buffer on the CPU)
_NOT_MADE, _NO_VIEW = object(), object()

Outputs = TypeVar("Outputs")


@dataclass(frozen=True)
class StaticInput:
    """A per-request input of the device part: dtype, row shape and the padding value."""

    dtype: torch.dtype
    row: tuple[int, ...] = ()
    pad: int | float = 0


def resolve_mode(mode: str, device: torch.device | str) -> str:
    """``mode`` with ``"auto"`` decided for ``device``; a clear error for a bad one."""
    if mode not in MODES:
        raise ValueError(f"graphs mode must be one of {', '.join(MODES)}; got {mode!r}")
    device = torch.device(device)
    if mode == "auto":
        return "graph" if device.type == "cuda" else "off"
    if mode == "graph" and device.type != "cuda":
        raise ValueError(
            f"graphs mode 'graph' needs a CUDA device, not {device.type}; "
            "use 'tape' for the CPU's recorded steps, or 'static' to run the static-buffer "
            "path without graphs"
        )
    if mode == "tape" and device.type != "cpu":
        raise ValueError(
            f"graphs mode 'tape' records CPU steps, not {device.type} ones; use 'graph' on CUDA"
        )
    return mode


def slice_rows(outputs: Outputs, batch: int) -> Outputs:
    """The first ``batch`` rows of every tensor of a step's outputs (a mapping or dataclass)."""
    rows = {key: _rows(value, batch) for key, value in output_items(outputs)}
    if isinstance(outputs, Mapping):
        return rows  # type: ignore[return-value]
    return dataclasses.replace(outputs, **rows)  # type: ignore[type-var]


def _rows(value: Any, batch: int) -> Any:
    return value[:batch] if isinstance(value, torch.Tensor) and value.dim() > 0 else value


def _source_file(step: Any) -> str | None:
    """The file of ``step``'s class, to name the generated line an error comes from; None
    for a module without one (compiled from a spec in memory)."""
    try:
        return inspect.getsourcefile(type(step))
    except (TypeError, OSError):
        return None


def reset_padding_slot(relay: Any) -> None:
    """Zero slot 0 of every allocated relay buffer (what padding rows resolve)."""
    for buffer in relay.buffers.values():
        if buffer is not None:  # a lazy field not stashed yet
            buffer[0].zero_()


class GraphRunner:
    """Replay ``step.run_device`` per batch-size bucket from static buffers (see the module)."""

    def __init__(
        self,
        step: Any,
        *,
        device: torch.device | str,
        batch_sizes: Sequence[int],
        inputs: Mapping[str, StaticInput],
        host_inputs: Mapping[str, StaticInput] | None = None,
        ctx_inputs: Mapping[str, StaticInput] | None = None,
        bind_ctx: Callable[[Any, Mapping[str, torch.Tensor]], Any] | None = None,
        mode: str = "auto",
        pool: Any = None,
    ) -> None:
        """``pool``: a CUDA graph memory pool to share with other runners (graph mode)."""
        self.step = step
        self.device = torch.device(device)
        self.mode = resolve_mode(mode, self.device)
        if any(int(b) <= 0 for b in batch_sizes):
            raise ValueError(f"batch sizes must be positive; got {list(batch_sizes)}")
        self.batch_sizes = sorted({int(b) for b in batch_sizes})
        self.inputs = dict(inputs)
        self.host_inputs = dict(host_inputs or {})
        self.ctx_inputs = dict(ctx_inputs or {})
        self.bind_ctx = bind_ctx or (lambda ctx, static: ctx)
        self._static: dict[int, dict[str, torch.Tensor]] = {}
        self._replay: dict[int, Callable[[], Any]] = {}
        self.tapes: dict[int, Any] = {}  # bucket -> its relayc.runtime.tape.Tape (mode tape)
        # per (bucket, batch): each static input's rows [:batch], rows [batch:], its pad
        self._rows: dict[tuple[int, int], list[tuple[str, torch.Tensor, torch.Tensor, Any]]] = {}
        self._filled: dict[int, int] = {}  # bucket -> rows past which its inputs hold pads
        self._pads_kept: set[int] = set()  # buckets whose recorded step writes no input
        self._unread: dict[int, set[str]] = {}  # bucket -> inputs its recording never reads
        # the batch being replayed: its size, inputs, host outputs and ctx values
        self._last: tuple[int, Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]] = (
            0,
            {},
            {},
            {},
        )
        self.pool = pool
        self.replays = 0  # batches run from static buffers (for tests and benchmarks)
        self.eager_runs = 0  # batches run eagerly (off, or above the largest bucket)
        self.tape_refusals: dict[int, str] = {}  # bucket -> why it runs from static buffers
        self.tape_reruns = 0  # replays a native call declined, run eagerly instead
        self.held_replays = 0  # replays through replay_held (for tests and benchmarks)
        self._outputs: dict[int, Any] = {}  # bucket -> its recording's outputs (mode tape)
        # (key, batch, bucket) of the last batch run through ``run``: its inputs are in the
        # bucket's static buffers (see ``replay_held``)
        self._held: tuple[Any, int, int] | None = None
        self._views: dict[int, dict[str, Any]] = {}  # bucket -> memoryviews of read inputs

    def _all_inputs(self) -> dict[str, StaticInput]:
        return {**self.inputs, **self.host_inputs, **self.ctx_inputs}

    def _allocate(self, bucket: int) -> dict[str, torch.Tensor]:
        return {
            name: torch.full((bucket, *spec.row), spec.pad, dtype=spec.dtype, device=self.device)
            for name, spec in self._all_inputs().items()
        }

    def _run_static(self, ctx: Any, static: Mapping[str, torch.Tensor]) -> Any:
        reset_padding_slot(self.step.relay)
        engine_inputs = {name: static[name] for name in self.inputs}
        host = {name: static[name] for name in self.host_inputs}
        return self.step.run_device(ctx, **engine_inputs, host=host)

    def capture(self, ctx: Any, buckets: Sequence[int] | None = None) -> None:
        """Capture (mode `graph`), record (mode `tape`) or prepare (mode `static`) buckets,
        largest first."""
        if self.mode == "off":
            return
        for bucket in sorted(self.batch_sizes if buckets is None else buckets, reverse=True):
            if bucket not in self.batch_sizes:
                raise ValueError(f"{bucket} is not a capture bucket ({self.batch_sizes})")
            if bucket in self._replay:
                continue
            static = self._allocate(bucket)
            bound = self.bind_ctx(ctx, static)
            self._static[bucket] = static
            if self.mode == "static":
                self._replay[bucket] = self._static_replay(bound, static)
            elif self.mode == "tape":
                self._replay[bucket] = self._record_tape(bucket, bound, static)
            else:
                self._replay[bucket] = self._capture_graph(bound, static)

    def _static_replay(self, ctx: Any, static: Mapping[str, torch.Tensor]) -> Callable[[], Any]:
        return lambda: self._run_static(ctx, static)

    def _record_tape(
        self, bucket: int, ctx: Any, static: Mapping[str, torch.Tensor]
    ) -> Callable[[], Any]:
        self._run_static(ctx, static)  # warm-up: lazy relay buffers, packed weights
        recorder = Recorder(_source_file(self.step))
        try:
            with recorder:
                outputs = self._run_static(ctx, static)
        except Exception:
            if recorder.refused is None:  # not a refusal: the step's own error
                raise
            self.tape_refusals[bucket] = str(recorder.refused)
            return self._static_replay(ctx, static)
        tape = recorder.tape()
        self.tapes[bucket] = tape
        self._outputs[bucket] = outputs
        if not any(recorder.writes(t) for t in static.values()):
            self._pads_kept.add(bucket)
            # inputs no recorded call reads need no copy (a rerun copies them first)
            self._unread[bucket] = {n for n, t in static.items() if not recorder.reads(t)}

        def replay() -> Any:
            if tape.replay():
                return outputs
            self.tape_reruns += 1  # a native call declined: the step's own way, eagerly
            batch, inputs, host, ctx_values = self._last
            self._copy_in(bucket, batch, inputs, host, ctx_values, every=True)
            return self._run_static(ctx, static)

        return replay

    def _capture_graph(self, ctx: Any, static: Mapping[str, torch.Tensor]) -> Callable[[], Any]:
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: lazy buffers, autotuning, allocator caching
                self._run_static(ctx, static)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        # thread_local: another host thread may use CUDA meanwhile (it is not captured).
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            outputs = self._run_static(ctx, static)

        relay = self.step.relay

        def replay() -> Any:
            graph.replay()
            # An event recorded during capture is not recorded again by a replay: record the
            # publish event here, after the whole step (later than the step's own publish
            # point, so a host reader waiting on it is still correct).
            relay.record_publish()
            return outputs

        return replay

    def bucket_for(self, batch: int) -> int | None:
        """The smallest bucket holding ``batch`` rows; None: the batch runs eagerly."""
        if self.mode == "off":
            return None
        return next((b for b in self.batch_sizes if b >= batch), None)

    def run(
        self,
        ctx: Any,
        inputs: Mapping[str, torch.Tensor],
        host: Mapping[str, torch.Tensor] | None = None,
        ctx_values: Mapping[str, torch.Tensor] | None = None,
        key: Any = None,
    ) -> Any:
        """The device part for one batch: replayed from its bucket, or eagerly with ``ctx``.
        ``key``: an object standing for the batch's unchanging inputs, for ``replay_held``."""
        host, ctx_values = host or {}, ctx_values or {}
        batch = inputs["req_pool_indices"].shape[0]
        bucket = self.bucket_for(batch)
        if bucket is None:
            self.eager_runs += 1
            return self.step.run_device(ctx, **inputs, host=host)
        if bucket not in self._replay:
            self.capture(ctx, [bucket])
        self._held = None
        self._last = (batch, inputs, host, ctx_values)
        self._copy_in(bucket, batch, inputs, host, ctx_values)
        self.replays += 1
        outputs = self._replay[bucket]()
        if key is not None:
            self._held = (key, batch, bucket)
        return outputs if batch == bucket else slice_rows(outputs, batch)

    def replay_held(self, key: Any, batch: int, values: Mapping[str, Sequence[int]]) -> Any | None:
        """Mode ``tape``: replay the batch ``run`` last ran with this ``key`` (the same
        object) and ``batch``, after writing ``values`` -- the inputs that changed since, each
        its rows' integers flat, row after row -- straight into the bucket's static buffers;
        None: this does not apply (another batch ran since, the recording writes its inputs
        or was refused, the step has host steps, an input is not an integer buffer) or a
        native call declined, and the caller runs the batch through ``run``.

        The caller vouches that every other input is what ``run`` copied in: its scheduler
        keeps a batch's per-request tensors unchanged while it holds the same requests (the
        ``key``). What this skips is the Python around the replay: the step's context, the
        inputs' dictionaries and their copies, each a few cold microseconds after a forward.
        The values are written through memoryviews of the buffers, a few CPython
        instructions each where a torch or NumPy call costs tens of microseconds there.
        """
        held = self._held
        if held is None or held[0] is not key or held[1] != batch or self.host_inputs:
            return None
        bucket = held[2]
        tape = self.tapes.get(bucket)
        if tape is None or bucket not in self._pads_kept:
            return None
        views = self._views.setdefault(bucket, {})
        for name, value in values.items():
            view = views.get(name, _NOT_MADE)
            if view is _NOT_MADE:
                view = views[name] = self._word_view(bucket, name)
            if view is None:  # never read
                continue
            if view is _NO_VIEW or len(value) != batch * view[1]:
                return None
            words = view[0]
            for i, word in enumerate(value):
                words[i] = word
        if not tape.replay():
            return None  # declined before any lasting write: ``run`` reruns it eagerly
        self.replays += 1
        self.held_replays += 1
        outputs = self._outputs[bucket]
        return outputs if batch == bucket else slice_rows(outputs, batch)

    def _word_view(self, bucket: int, name: str) -> Any:
        """The static input ``name`` of ``bucket`` as a flat memoryview of its integers and
        its row's length; None: its recording never reads it (or there is none);
        ``_NO_VIEW``: it cannot be written this way."""
        static = self._static[bucket].get(name)
        if static is None or name in self._unread.get(bucket, ()):
            return None
        if static.device.type != "cpu" or not static.is_contiguous():
            return _NO_VIEW
        row = static[0].numel() if static.dim() > 1 else 1
        if static.dtype == torch.int64:
            return static.numpy().data.cast("B").cast("q"), row
        if static.dtype == torch.int32:
            return static.numpy().data.cast("B").cast("i"), row
        return _NO_VIEW

    def _copy_in(
        self,
        bucket: int,
        batch: int,
        inputs: Mapping[str, torch.Tensor],
        host: Mapping[str, torch.Tensor],
        ctx_values: Mapping[str, torch.Tensor],
        every: bool = False,
    ) -> None:
        """The batch's values into rows [:batch] of the bucket's static inputs, the padding
        value into the rows past it. A recorded step that writes none of its inputs keeps
        its padding rows (only rows an earlier, larger batch filled are padded again), and
        the inputs its recording never reads are left alone unless ``every``."""
        rows = self._rows.get((bucket, batch))
        if rows is None:
            static = self._static[bucket]
            rows = self._rows[(bucket, batch)] = [
                (name, static[name][:batch], static[name][batch:], spec.pad)
                for name, spec in self._all_inputs().items()
            ]
        skip = () if every else self._unread.get(bucket, ())
        for name, head, _, _ in rows:
            if name in skip:
                continue
            value = inputs.get(name)
            if value is None:
                value = host.get(name)
                if value is None:
                    value = ctx_values.get(name)
                    if value is None:
                        raise KeyError(
                            f"no value for the static input `{name}` of the graph runner"
                        )
            head.copy_(value)
        filled = self._filled.get(bucket, bucket)
        if bucket in self._pads_kept and filled <= batch and not every:
            self._filled[bucket] = max(filled, batch)
            return
        for name, _, tail, pad in rows:
            if tail.numel() and name not in skip:
                tail.fill_(pad)
        self._filled[bucket] = batch
