"""Analysis passes over the iteration graphs.

Each pass takes the graphs and returns ``(graphs, modified)``; the graphs are
linted after every pass. Errors are located at the spec entry they come from
and raised together as :class:`SpecErrors` once all passes ran.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
import torch.fx as fx

from relayc.graph.builder import IterationGraphs, RelayUse, build_graphs
from relayc.nodes.registry import Op
from relayc.runtime.dims import (
    MAX_BUFFER_BYTES,
    MAX_BUFFER_TEXT,
    buffer_bytes,
    dims_of,
    dtype_name,
    eval_dim,
    torch_dtype,
)
from relayc.specs.errors import SpecError, SpecErrors
from relayc.specs.loader import Spec
from relayc.specs.schema import Ref, RelayField

# Distinct sample sizes per dim, so a shape that only matches because two dims
# happen to be equal is still caught; bfloat16 stands in for the model dtype so
# `model` and `float32` are told apart.
_SAMPLE_SIZES = (5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53)
SAMPLE_MODEL_DTYPE = torch.bfloat16
_SAMPLE_BATCH = 3
_MAX_ELEMENTS = 2**62  # below int64's limit on a tensor's element count


def _sample_dims(spec: Spec) -> dict[str, int]:
    return {
        name: _SAMPLE_SIZES[i % len(_SAMPLE_SIZES)] + 60 * (i // len(_SAMPLE_SIZES))
        for i, name in enumerate(spec.dims)
    }


def _field_row(fld: RelayField, dims: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(eval_dim(d, dims) for d in fld.shape)


def _type_text(dtype: str, shape: tuple | list) -> str:
    return f"{dtype} [{', '.join(str(d) for d in shape)}]"


def relay_inference(
    graphs: IterationGraphs, errors: list[SpecError]
) -> tuple[IterationGraphs, bool]:
    """Every relay field read is stashed (or seeded by prefill); none is stashed unread."""
    spec = graphs.spec
    readers: dict[str, list[fx.Node]] = {name: [] for name in spec.fields}
    for node in graphs.decode.nodes:
        if node.op == "placeholder" and node.meta["kind"] == "relay":
            readers[node.meta["ident"]] = list(node.users)
    uses: dict[str, RelayUse] = {}
    for name, fld in spec.fields.items():
        stasher = next((s for s in spec.steps if name in s.stash), None)
        seeded = name in spec.prefill.stash
        reading_steps = tuple(n.meta["step"].name for n in readers[name])
        uses[name] = RelayUse(reading_steps, stasher.name if stasher else None, seeded)
        if reading_steps and stasher is None and not seeded:
            step = reading_steps[0]
            param = next(
                p
                for p, r in spec.steps[_index(spec, step)].reads.items()
                if r == Ref("relay", name)
            )
            errors.append(
                SpecError(
                    spec.locate(step, "reads", param),
                    f"step `{step}` reads relay field `{name}`, but no step stashes it and the "
                    "prefill does not seed it",
                    f"add `stash: {{{name}: <output>}}` to the step that produces it, or stop "
                    "reading it",
                )
            )
        elif reading_steps and not seeded and fld.init == "empty" and stasher is not None:
            step = reading_steps[0]
            # An `init:` defines the first read only of a buffer that exists from the start:
            # a lazy field's rows read None until its first stash.
            fill = "give the field an `init:` of zeros or a fill value"
            if fld.alloc == "lazy":
                fill = "drop its `alloc: lazy` and give it an `init:` of zeros or a fill value"
            errors.append(
                SpecError(
                    spec.prefill.loc,
                    f"the prefill does not seed relay field `{name}`, which step `{step}` reads "
                    "in a request's first decode iteration",
                    f"stash it in the prefill step, or {fill} so the first read is defined",
                )
            )
        elif not reading_steps and not fld.export:
            where = (
                spec.locate(stasher.name, "stash", name)
                if stasher
                else spec.locate("prefill", "stash", name)
                if seeded
                else fld.loc
            )
            what = "is stashed but never read" if (stasher or seeded) else "is never used"
            errors.append(
                SpecError(
                    where,
                    f"dead relay field: `{name}` {what} by a decode step",
                    "read it in a step, drop it from the spec, or mark it `export: true` if the "
                    "engine reads it",
                )
            )
    graphs.uses = uses
    return graphs, True


def _index(spec: Spec, step_name: str) -> int:
    return next(i for i, s in enumerate(spec.steps) if s.name == step_name)


def propagate_meta(
    graphs: IterationGraphs, errors: list[SpecError]
) -> tuple[IterationGraphs, bool]:
    """Dtypes and shapes through every step with meta tensors; check reads and stashes."""
    spec = graphs.spec
    dims = _sample_dims(spec)
    for graph in (graphs.prefill, graphs.decode):
        for node in graph.nodes:
            if node.op == "placeholder":
                entity = (spec.fields if node.meta["kind"] == "relay" else spec.inputs)[
                    node.meta["ident"]
                ]
                row = tuple(eval_dim(d, dims) for d in entity.shape)
                if math.prod(row) * _SAMPLE_BATCH > _MAX_ELEMENTS:
                    kind = "relay field" if node.meta["kind"] == "relay" else "engine input"
                    errors.append(
                        SpecError(
                            entity.loc,
                            f"{kind} `{node.meta['ident']}` of shape "
                            f"[{', '.join(str(d) for d in entity.shape)}] has more elements per "
                            "request than a tensor can index",
                            "use smaller literal sizes",
                        )
                    )
                    node.meta["val"] = None
                    continue
                node.meta["val"] = torch.empty(
                    (_SAMPLE_BATCH, *row),
                    dtype=torch_dtype(entity.dtype, SAMPLE_MODEL_DTYPE),
                    device="meta",
                )
            elif node.op == "call_function" and node.meta["kind"] == "step":
                node.meta["val"] = (
                    _run_meta(spec, node, dims, errors)
                    if _op_dims_declared(spec, node, dims, errors)
                    else {}
                )
            elif node.op == "call_function":
                outputs = node.args[0].meta.get("val") or {}
                node.meta["val"] = outputs.get(node.args[1])
            elif node.op == "output":
                _check_stash(spec, node, dims, errors)
    graphs.sample_dims = dims
    return graphs, True


def _op_dims_declared(
    spec: Spec, node: fx.Node, dims: Mapping[str, int], errors: list[SpecError]
) -> bool:
    """Whether the spec declares every dim the step's op sizes its tensors with; a
    located error naming the missing ones when not."""
    op: Op = node.target  # type: ignore[assignment]
    step = node.meta["step"]
    needed: dict[str, str] = {}  # dim -> the op parameter or output that needs it
    for kind, types in (("parameter", op.inputs), ("output", op.outputs)):
        for name, tensor_type in types.items():
            for entry in tensor_type.shape:
                for dim in sorted(dims_of(entry)):
                    needed.setdefault(dim, f"{kind} `{name}`")
    missing = [d for d in needed if d not in dims]
    if not missing:
        return True
    errors.append(
        SpecError(
            step.loc,
            f"op `{op.name}` of step `{step.name}` sizes its tensors with "
            + ", ".join(f"dim `{d}` ({needed[d]})" for d in missing)
            + ", which the spec does not declare",
            "declare "
            + (" and ".join(f"`{d}`" for d in missing))
            + " under `dims:` with a `default:` or `supplied_by:`, or import a library "
            "that does",
        )
    )
    return False


def _run_meta(
    spec: Spec, node: fx.Node, dims: Mapping[str, int], errors: list[SpecError]
) -> dict[str, torch.Tensor]:
    op: Op = node.target  # type: ignore[assignment]
    step = node.meta["step"]
    inputs: dict[str, torch.Tensor] = {}
    for param, value in node.kwargs.items():
        val = value.meta.get("val") if isinstance(value, fx.Node) else None
        if val is None:
            continue
        want = op.inputs[param]
        want_row = want.row(dims)
        want_dtype = torch_dtype(want.dtype, SAMPLE_MODEL_DTYPE) if want.dtype != "any" else None
        got_row = tuple(val.shape[1:])
        if (want_dtype is not None and val.dtype != want_dtype) or got_row != want_row:
            errors.append(
                SpecError(
                    spec.locate(step.name, "reads", param),
                    f"step `{step.name}` passes `{step.reads[param]}` as `{param}` of op "
                    f"`{op.name}`: expected {want.text()}, got "
                    f"{_described(val, spec, dims)}",
                    "read a value of the expected dtype and row shape, or fix the field "
                    "declaration",
                )
            )
        inputs[param] = val
    return op.meta(inputs, dims, SAMPLE_MODEL_DTYPE)


def _described(val: torch.Tensor, spec: Spec, dims: Mapping[str, int]) -> str:
    names = {v: k for k, v in dims.items()}
    shape = [names.get(int(d), str(int(d))) for d in val.shape[1:]]
    return _type_text(dtype_name(val.dtype, SAMPLE_MODEL_DTYPE), shape)


def _check_stash(
    spec: Spec, node: fx.Node, dims: Mapping[str, int], errors: list[SpecError]
) -> None:
    stashed: dict[str, fx.Node] = node.args[0]  # type: ignore[assignment]
    for field_name, value in stashed.items():
        val = value.meta.get("val")
        if val is None:
            continue
        fld = spec.fields[field_name]
        want_dtype = torch_dtype(fld.dtype, SAMPLE_MODEL_DTYPE)
        if val.dtype != want_dtype or tuple(val.shape[1:]) != _field_row(fld, dims):
            step = value.meta["step"]
            errors.append(
                SpecError(
                    spec.locate(step.name, "stash", field_name),
                    f"step `{step.name}` stashes `{value.meta['output']}` "
                    f"({_described(val, spec, dims)}) into relay field `{field_name}`, declared "
                    f"{_type_text(fld.dtype, fld.shape)}",
                    f"make the declaration match what op `{step.op}` writes, or stash another "
                    "output",
                )
            )


def _check_buffer_size(
    spec: Spec, name: str, fld: RelayField, sample: Mapping[str, int], errors: list[SpecError]
) -> None:
    """A located error when field ``name``'s buffer would pass MAX_BUFFER_BYTES in the
    smallest relay that runs the spec: `capture.max_batch_size` requests and the padding
    slot, dims at their defaults (a dim the engine supplies counts as 1 here; the engine
    checks again with the real sizes), the model dtype as float32."""
    defaults = {d: 1 if dim.default is None else dim.default for d, dim in spec.dims.items()}
    pool = spec.capture.max_batch_size + 1
    shape = (pool, *(eval_dim(d, defaults) for d in fld.shape))
    if math.prod(_field_row(fld, sample)) * _SAMPLE_BATCH > _MAX_ELEMENTS:
        return  # propagate_meta already said the row alone is too large
    size = buffer_bytes(shape, torch_dtype(fld.dtype, torch.float32))
    if size <= MAX_BUFFER_BYTES:
        return
    used = sorted({d for entry in fld.shape for d in dims_of(entry)})
    at = ", ".join(f"{d}={defaults[d]}" for d in used)
    errors.append(
        SpecError(
            fld.loc,
            f"relay field `{name}` ({_type_text(fld.dtype, fld.shape)}) needs a buffer of "
            f"{size:.3g} bytes ({math.prod(shape):.3g} elements) for {pool} request slots "
            f"(capture.max_batch_size + 1){f', dims at their defaults ({at})' if at else ''}: "
            f"more than the {MAX_BUFFER_TEXT} a relay buffer may take",
            "use smaller sizes in its shape or smaller dim defaults",
        )
    )


def bound_buffers(graphs: IterationGraphs, errors: list[SpecError]) -> tuple[IterationGraphs, bool]:
    """Every relay field's buffer fits MAX_BUFFER_BYTES at compile time (a check, no result)."""
    spec = graphs.spec
    for name, fld in spec.fields.items():
        _check_buffer_size(spec, name, fld, graphs.sample_dims, errors)
    return graphs, False


Pass = Callable[[IterationGraphs, list[SpecError]], tuple[IterationGraphs, bool]]
PASSES: tuple[Pass, ...] = (relay_inference, propagate_meta, bound_buffers)


def analyse(spec: Spec) -> IterationGraphs:
    """Build the graphs of ``spec`` and run every pass; raises located SpecErrors."""
    graphs = build_graphs(spec)
    errors: list[SpecError] = []
    for run_pass in PASSES:
        graphs, _ = run_pass(graphs, errors)
        graphs.decode.lint()
        graphs.prefill.lint()
    if errors:
        raise SpecErrors(errors)
    return graphs
