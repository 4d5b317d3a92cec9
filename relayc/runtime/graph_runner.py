"""Run the device part of a generated DecodeStep, captured as CUDA graphs on GPUs.

The contract (what the engine must uphold):

- One graph per batch-size bucket (the spec's `capture.batch_sizes`), captured
  largest first into one shared memory pool, after warm-up runs on a side stream
  (which also allocates lazy relay buffers before capture).
- Each bucket has static input buffers: the engine inputs (`req_pool_indices`,
  `seq_lens`, ...) and the outputs of host steps. A batch of n rows is copied into
  rows [:n]; rows [n:] are padding: `req_pool_indices` = 0, the padding slot every
  relay buffer and KV pool reserves, other inputs their pad value (0 by default).
- Per-row tensors the ops read from `ctx` (the KV windows, sampling parameters) are
  static inputs too (`ctx_inputs`): `bind_ctx(ctx, static)` returns the context a
  bucket's graph is captured with, its tensors the bucket's static buffers; `run`
  copies the batch's values (`ctx_values`) into them. Everything else in `ctx` is
  captured by reference and must stay at the same addresses.
- Outputs are views of the graph's static outputs, valid until the next replay.
- On the CPU, or for batches larger than the largest bucket, the step runs eagerly.
  `mode="static"` runs the same static-buffer path without CUDA graphs, so the
  padding and slicing are tested on any device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class StaticInput:
    """A per-request input of the device part: dtype, row shape and the padding value."""

    dtype: torch.dtype
    row: tuple[int, ...] = ()
    pad: int | float = 0


class GraphRunner:
    """Capture `step.run_device` per batch-size bucket and replay it."""

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
    ) -> None:
        if mode not in ("auto", "graph", "static", "eager"):
            raise ValueError(f"mode must be auto, graph, static or eager; got {mode!r}")
        self.step = step
        self.device = torch.device(device)
        if mode == "auto":
            mode = "graph" if self.device.type == "cuda" else "eager"
        if mode == "graph" and self.device.type != "cuda":
            raise ValueError("mode='graph' needs a CUDA device (use 'static' to test padding)")
        self.mode = mode
        self.batch_sizes = sorted(set(batch_sizes))
        self.inputs = dict(inputs)
        self.host_inputs = dict(host_inputs or {})
        self.ctx_inputs = dict(ctx_inputs or {})
        self.bind_ctx = bind_ctx or (lambda ctx, static: ctx)
        self._static: dict[int, dict[str, torch.Tensor]] = {}
        self._replay: dict[int, Callable[[], dict[str, torch.Tensor]]] = {}
        self._pool: Any = None

    def _allocate(self, bucket: int) -> dict[str, torch.Tensor]:
        return {
            name: torch.full((bucket, *spec.row), spec.pad, dtype=spec.dtype, device=self.device)
            for name, spec in self._all_inputs().items()
        }

    def _all_inputs(self) -> dict[str, StaticInput]:
        return {**self.inputs, **self.host_inputs, **self.ctx_inputs}

    def _run_static(self, ctx: Any, static: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        engine_inputs = {name: static[name] for name in self.inputs}
        host = {name: static[name] for name in self.host_inputs}
        return self.step.run_device(ctx, **engine_inputs, host=host)

    def capture(self, ctx: Any) -> None:
        """Capture (mode `graph`) or prepare (mode `static`) every bucket, largest first."""
        if self.mode == "eager":
            return
        for bucket in sorted(self.batch_sizes, reverse=True):
            static = self._allocate(bucket)
            self._static[bucket] = static
            bound = self.bind_ctx(ctx, static)
            if self.mode == "static":
                self._replay[bucket] = lambda ctx=bound, s=static: self._run_static(ctx, s)
                continue
            self._replay[bucket] = self._capture_graph(bound, static)

    def _capture_graph(
        self, ctx: Any, static: Mapping[str, torch.Tensor]
    ) -> Callable[[], dict[str, torch.Tensor]]:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: lazy buffers, autotuning, allocator caching
                self._run_static(ctx, static)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = self._run_static(ctx, static)

        def replay() -> dict[str, torch.Tensor]:
            graph.replay()
            return outputs

        return replay

    def bucket_for(self, batch: int) -> int | None:
        return next((b for b in self.batch_sizes if b >= batch), None)

    def run(
        self,
        ctx: Any,
        inputs: Mapping[str, torch.Tensor],
        host: Mapping[str, torch.Tensor] | None = None,
        ctx_values: Mapping[str, torch.Tensor] | None = None,
    ) -> Any:
        """The device part for one batch: replayed from its bucket, or eagerly with ``ctx``."""
        host, ctx_values = host or {}, ctx_values or {}
        batch = inputs["req_pool_indices"].shape[0]
        bucket = self.bucket_for(batch) if self._replay else None
        if bucket is None:
            return self.step.run_device(ctx, **inputs, host=host)
        static = self._static[bucket]
        for name, spec in self._all_inputs().items():
            value = inputs.get(name, host.get(name, ctx_values.get(name)))
            static[name][:batch].copy_(value)
            static[name][batch:].fill_(spec.pad)
        return first_rows(self._replay[bucket](), batch)


def first_rows(outputs: Any, n: int) -> Any:
    """The first ``n`` rows of every tensor of a step's outputs: the generated
    `DecodeOutputs` dataclass, or a mapping of tensors."""
    if isinstance(outputs, Mapping):
        return {key: value[:n] for key, value in outputs.items()}
    return dataclasses.replace(outputs, **{k: v[:n] for k, v in vars(outputs).items()})
