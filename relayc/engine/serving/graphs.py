"""How the engine runs an algorithm's generated decode step: eagerly, or through GraphRunner.

``Engine(graphs=...)`` picks the mode (``relayc.runtime.graph_runner``):

* ``"auto"``: CUDA graphs on CUDA, ``"tape"`` on the CPU when the native decoder is
  built (its one-call forward is what a recording replays; TorchScript's attention has
  no ``out=`` form, so without it every bucket would be refused), eager otherwise; eager
  with ``debug=True``, whose relay checks read device values on the host, which neither
  a graph nor a recording can hold;
* ``"graph"``: CUDA graphs (CUDA only);
* ``"tape"``: the CPU's counterpart of ``"graph"``: each bucket's step recorded once
  on its static buffers -- its ATen ops and native calls -- and replayed without the
  Python around them (``relayc.runtime.tape``); weights changed between calls are
  recorded again (:meth:`DecodeGraphs.check_weights`);
* ``"static"``: the same static-buffer path without CUDA graphs: batches padded to
  their bucket with slot-0 rows, inputs copied into static buffers, the step run on
  those. The CPU tests run the capture path this way;
* ``"off"``: the generated ``DecodeStep`` called directly.

Buckets: the spec's ``capture.batch_sizes`` (the generated module's
``CAPTURE_BATCH_SIZES``; ``Engine(capture_batch_sizes=...)`` overrides them) up to
the engine's ``max_batch_size``, plus the smallest bucket above it if the kept ones
stop short of it, so every batch the scheduler forms has a bucket whenever the
spec captures one that large. A batch above the largest bucket runs eagerly.

On the CPU (``"tape"``) a padding row is not free as on a GPU: it is a row of every
GEMM, 15-25% of a one-request decode of SmolLM2. Unless ``capture_batch_sizes`` says
otherwise, the buckets there are every batch size up to ``TAPE_BUCKETS`` (each
recorded when a batch of that size first runs), and larger batches, whose forwards
dwarf the host's work a recording saves, run eagerly.

What a graph's static inputs are, for this engine: the step's inputs
(``req_pool_indices``, ``seq_lens``), its host steps' outputs, and the per-row
tensors of the :class:`StepContext` the ops read -- the KV windows
(``out_cache_loc`` viewed ``[B, W]``), the sampling tensors and
``sample_positions``. ``max_prefix_len``, a host bound fixing the attention
shapes, becomes the largest one the scheduler can hand out
(``max_context - W``). The model, KV caches, ``req_to_token``, drafter and draft
KV are captured by reference. A request-free padding row reads slot 0 of
``req_to_token``, the KV pools and the relay (all reserved for it), with
temperature 0. Greedy-only batches (``ctx.sampling is None``) skip the sampled
acceptance work, so graphs are keyed by that flag: one runner per flag.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from relayc.engine.core.forward_batch import ForwardBatch
from relayc.engine.core.sampling import SamplingBatch
from relayc.engine.core.walk import parameter_stamps
from relayc.engine.native.library import native_decoder
from relayc.runtime import tape
from relayc.runtime.graph_runner import GraphRunner, StaticInput, resolve_mode

if TYPE_CHECKING:  # the ops package imports every op implementation; only the type is used
    from relayc.engine.ops.context import StepContext

STEP_INPUTS = {"req_pool_indices": StaticInput(torch.int64), "seq_lens": StaticInput(torch.int64)}
TAPE_BUCKETS = 8  # the CPU records every batch size up to this one (see the module)
EXTRAS = ("sample_positions",)  # per-row tensors in ctx.extras, static inputs when present
SAMPLING_INPUTS = {
    "temperatures": StaticInput(torch.float32),  # 0 (greedy) on padding rows
    "top_ks": StaticInput(torch.int64),
    "top_ps": StaticInput(torch.float32, (), 1.0),
    "seeds": StaticInput(torch.int64),
}


# Per-row tensors of the decode ForwardBatch (`ctx.forward`, read by one-token ops) and the
# padding of each: a padding row decodes its W window tokens (extend_lens, set per runner)
# at position 0 of slot 0, each seeing the whole window (tree_mask), so no row is empty.
FORWARD_PADS: dict[str, int | bool] = {
    "input_ids": 0,
    "positions": 0,
    "prefix_lens": 0,
    "extend_lens": 0,
    "tree_mask": True,
}
TOKEN_FIELDS = ("input_ids", "positions")  # [B * W] flat, request-major


def forward_values(forward: ForwardBatch, batch: int) -> dict[str, torch.Tensor]:
    """The per-row tensors of a decode batch, each viewed ``[batch, ...]``."""
    values = {}
    for name in FORWARD_PADS:
        value = getattr(forward, name)
        if value is not None:
            rows = value.view(batch, -1) if name in TOKEN_FIELDS else value
            values[f"forward.{name}"] = rows
    return values


def capture_buckets(spec_sizes: Sequence[int], max_batch_size: int) -> tuple[int, ...]:
    """The buckets an engine of ``max_batch_size`` captures (see the module docstring)."""
    sizes = sorted(set(spec_sizes))
    kept = [b for b in sizes if b <= max_batch_size]
    above = [b for b in sizes if b > max_batch_size]
    if above and (not kept or kept[-1] < max_batch_size):
        kept.append(above[0])
    return tuple(kept)


def check_batch_sizes(batch_sizes: object, max_batch_size: int) -> tuple[int, ...] | None:
    """``Engine(capture_batch_sizes=...)`` as a tuple of buckets, or a clear error.

    A bucket above ``max_batch_size`` is refused: no batch is ever that large, and
    ``capture_buckets`` would keep it as the bucket every batch above the others pads to.
    (The spec's own buckets above it are trimmed instead; these are the user's choice.)
    """
    if batch_sizes is None:
        return None
    if isinstance(batch_sizes, (str, bytes, Mapping)) or not isinstance(batch_sizes, Iterable):
        raise TypeError(
            "`capture_batch_sizes` must be a list of batch sizes (whole numbers), e.g. "
            f"[1, 2, 4, 8]; got {batch_sizes!r}"
        )
    sizes = list(batch_sizes)
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, numbers.Integral):
            raise TypeError(
                f"`capture_batch_sizes` holds batch sizes (whole numbers); got {size!r} "
                f"in {sizes!r}"
            )
    if any(size < 1 for size in sizes):
        raise ValueError(f"capture_batch_sizes must be positive; got {sizes}")
    above = [int(size) for size in sizes if size > max_batch_size]
    if above:
        raise ValueError(
            f"`capture_batch_sizes` {sizes} has buckets above max_batch_size={max_batch_size} "
            f"({', '.join(map(str, above))}): no batch is that large, and every batch would be "
            "padded up to them; drop them or raise `max_batch_size`"
        )
    return tuple(int(size) for size in sizes)


class DecodeGraphs:
    """Runs generated decode steps in one mode; algorithms call :meth:`run`."""

    def __init__(self, mode: str, device: torch.device | str, batch_sizes: Sequence[int]) -> None:
        self.device = torch.device(device)
        self.mode = resolve_mode(mode, self.device)
        self.batch_sizes = tuple(batch_sizes)
        self._step: Any = None
        self._runners: dict[bool, GraphRunner] = {}  # keyed by all-greedy
        self._pool: Any = None  # one CUDA graph memory pool for every runner
        self._weights: tuple[tuple[int, int], ...] | None = None  # check_weights' stamps
        if self.mode == "tape":
            tape.warm_up()  # at the engine's build, not inside the first request

    @classmethod
    def build(
        cls,
        mode: str,
        device: torch.device | str,
        spec_sizes: Sequence[int],
        *,
        max_batch_size: int,
        batch_sizes: Sequence[int] | None = None,
        debug: bool = False,
    ) -> DecodeGraphs:
        """What ``Engine(graphs=mode, capture_batch_sizes=batch_sizes)`` runs with."""
        resolved = resolve_mode(mode, device)
        if debug and resolved == "graph":
            if mode != "auto":
                raise ValueError(
                    "graphs='graph' cannot run with debug=True: the debug relay checks read "
                    "device values on the host; use graphs='static' or 'off'"
                )
            resolved = "off"
        cpu = torch.device(device).type == "cpu"
        if mode == "auto" and cpu and not debug and native_decoder() is not None:
            resolved = "tape"
        given = check_batch_sizes(batch_sizes, max_batch_size)
        if given is not None:
            return cls(resolved, device, capture_buckets(given, max_batch_size))
        if resolved == "tape":
            return cls(resolved, device, tuple(range(1, min(TAPE_BUCKETS, max_batch_size) + 1)))
        return cls(resolved, device, capture_buckets(spec_sizes, max_batch_size))

    def reset(self) -> None:
        """Drop every captured or recorded bucket: the next batch of each captures again.
        Needed after what a capture holds by reference moves -- the model's weights edited
        or repacked, the caches replaced -- and by a benchmark that wraps the native calls."""
        self._runners.clear()
        self._weights = None

    def check_weights(self, modules: Iterable[torch.nn.Module]) -> None:
        """Mode ``tape``: :meth:`reset` when a parameter of ``modules`` was replaced or
        changed in place since the buckets were recorded (a recording holds the native
        decoder's packs of them; ``Engine.generate`` checks once per call, as it checks the
        packs themselves)."""
        if self.mode != "tape":
            return
        stamps = parameter_stamps(*modules)
        if self._weights is not None and stamps != self._weights:
            self.reset()
        self._weights = stamps

    @property
    def runners(self) -> dict[bool, GraphRunner]:
        """The graph runners made so far, keyed by all-greedy (for tests and benchmarks)."""
        return dict(self._runners)

    def run(
        self, step: Any, ctx: StepContext, *, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
    ) -> Any:
        """What ``step(ctx, req_pool_indices=..., seq_lens=...)`` returns, run in this mode."""
        if self.mode == "off" or not self.batch_sizes:
            return step(ctx, req_pool_indices=req_pool_indices, seq_lens=seq_lens)
        if self._step is None:
            self._step = step
        elif step is not self._step:
            raise ValueError("one DecodeGraphs serves one decode step; build another for this one")
        inputs = {"req_pool_indices": req_pool_indices, "seq_lens": seq_lens}
        host = step.run_host(ctx, **inputs)
        batch = req_pool_indices.shape[0]
        if ctx.out_cache_loc is None:
            raise ValueError("a decode step's context needs its KV windows (`out_cache_loc`)")
        ctx_values: dict[str, torch.Tensor] = {"out_cache_loc": ctx.out_cache_loc.view(batch, -1)}
        sample_positions = (ctx.extras or {}).get("sample_positions")
        if sample_positions is not None:
            ctx_values["sample_positions"] = sample_positions
        if ctx.sampling is not None:
            ctx_values.update(
                temperatures=ctx.sampling.temperatures,
                top_ks=ctx.sampling.top_ks,
                top_ps=ctx.sampling.top_ps,
                seeds=ctx.sampling.seeds,
            )
        forward = getattr(ctx, "forward", None)  # the scheduler's batch, when ops read it
        if forward is not None:
            ctx_values.update(forward_values(forward, batch))
        greedy = ctx.sampling is None
        runner = self._runners.get(greedy)
        if runner is None:
            runner = self._runners[greedy] = self._make_runner(step, host, ctx_values, greedy)
        # the scheduler's decode batch keeps its req_pool_indices tensor while it holds the
        # same requests, and with it every per-request tensor but the lengths and slots
        outputs = runner.run(ctx, inputs, host, ctx_values, key=req_pool_indices)
        runner_pool = runner.pool
        if runner_pool is not None:
            self._pool = runner_pool
        if isinstance(outputs, Mapping):  # the step's __call__ returns host and device outputs
            return {**host, **outputs}
        return outputs

    def run_held(
        self,
        req_pool_indices: torch.Tensor,
        all_greedy: bool,
        prefix_lens: Sequence[int],
        slots: Sequence[int],
    ) -> Any | None:
        """The outputs of the batch :meth:`run` last ran with this ``req_pool_indices``
        tensor, its lengths and KV windows moved on: ``prefix_lens`` each request's
        committed length (its window's first position), ``slots`` its ``out_cache_loc``
        ``[B * W]``, as integers. Mode ``tape`` only (the scheduler's steady decode batch
        on the CPU); None: run the step through :meth:`run` (``GraphRunner.replay_held``
        says when)."""
        runner = self._runners.get(all_greedy)
        if runner is None:  # replay_held answers for the modes without a recording
            return None
        batch = len(prefix_lens)
        width = len(slots) // batch
        positions = (
            prefix_lens if width == 1 else [p + j for p in prefix_lens for j in range(width)]
        )
        values = {
            "seq_lens": prefix_lens,
            "forward.prefix_lens": prefix_lens,
            "forward.positions": positions,
            "sample_positions": [p + width for p in prefix_lens],
            "out_cache_loc": slots,
        }
        return runner.replay_held(req_pool_indices, batch, values)

    def _make_runner(
        self,
        step: Any,
        host: Mapping[str, torch.Tensor],
        ctx_values: Mapping[str, torch.Tensor],
        greedy: bool,
    ) -> GraphRunner:
        width = ctx_values["out_cache_loc"].shape[1]
        ctx_inputs = {"out_cache_loc": StaticInput(torch.int64, (width,))}
        if "sample_positions" in ctx_values:
            ctx_inputs["sample_positions"] = StaticInput(torch.int64)
        if not greedy:
            ctx_inputs.update(SAMPLING_INPUTS)
        for key, value in ctx_values.items():
            if key.startswith("forward."):
                name = key.removeprefix("forward.")
                pad = width if name == "extend_lens" else FORWARD_PADS[name]
                ctx_inputs[key] = StaticInput(value.dtype, tuple(value.shape[1:]), pad)

        def bind_ctx(ctx: StepContext, static: Mapping[str, torch.Tensor]) -> StepContext:
            sampling = None
            if not greedy:
                sampling = SamplingBatch(
                    static["temperatures"], static["top_ks"], static["top_ps"], static["seeds"]
                )
            # The largest bound the scheduler hands out: kv_len_bound + W <= max_context.
            max_prefix_len = ctx.req_to_token.shape[1] - width
            changes: dict[str, Any] = {}
            forward = getattr(ctx, "forward", None)
            if forward is not None:
                changes["forward"] = dataclasses.replace(
                    forward,
                    out_cache_loc=static["out_cache_loc"].view(-1),
                    req_pool_indices=static["req_pool_indices"],
                    max_prefix_len=max_prefix_len,
                    **{
                        name: static[f"forward.{name}"].view(-1)
                        if name in TOKEN_FIELDS
                        else static[f"forward.{name}"]
                        for name in FORWARD_PADS
                        if f"forward.{name}" in static
                    },
                )
            return dataclasses.replace(
                ctx,
                out_cache_loc=static["out_cache_loc"].view(-1),
                max_prefix_len=max_prefix_len,
                sampling=sampling,
                extras={**(ctx.extras or {}), **{k: static[k] for k in EXTRAS if k in static}},
                **changes,
            )

        return GraphRunner(
            step,
            device=self.device,
            batch_sizes=self.batch_sizes,
            inputs=STEP_INPUTS,
            host_inputs={k: StaticInput(v.dtype, tuple(v.shape[1:])) for k, v in host.items()},
            ctx_inputs=ctx_inputs,
            bind_ctx=bind_ctx,
            mode=self.mode,
            pool=self._pool,
        )


# Until an engine sets its own: decode steps run eagerly.
EAGER = DecodeGraphs("off", "cpu", ())
