"""Build the torch.fx graph of one decode iteration (and of the prefill) from a Spec.

Placeholders stand for engine inputs (`input_<name>`) and for relay fields
resolved at the start of the iteration (`relay_<field>`); each step is one
`call_function` node targeting its op, with one `getitem` node per output it
writes; the output node maps each relay field to the value stashed into it for
the next iteration, and its ``meta["outputs"]`` maps each name of the spec's
`outputs:` section to the value the engine reads back. Every node carries its
spec location in ``node.meta["loc"]``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch.fx as fx

from relayc.nodes.registry import (
    Op,
    OpsImportError,
    TensorType,
    all_ops,
    get_op,
    import_op_module,
)
from relayc.specs.errors import SpecError, SpecErrors, did_you_mean, join_hints, quoted_list
from relayc.specs.loader import Spec
from relayc.specs.schema import Ref, Step

# What the engine does with the `outputs:` it reads: (dtypes, rank of a request's row).
_ENGINE_OUTPUTS: dict[str, tuple[tuple[str, ...], int, str]] = {
    "next_tokens": (("int64",), 0, "one int64 token per request: `int64 []`"),
    "tokens": (("int64",), 1, "a row of int64 tokens per request: `int64 [K]`"),
    "counts": (("int32", "int64"), 0, "one count per request: `int32 []` or `int64 []`"),
}


@dataclass(frozen=True)
class RelayUse:
    """How one relay field crosses the iteration boundary (the relay-inference pass's result)."""

    readers: tuple[str, ...]  # decode steps that read it
    stashed_by: str | None  # decode step whose output is stashed into it
    seeded_by_prefill: bool


@dataclass
class IterationGraphs:
    """The graphs of one algorithm plus the passes' results that belong to no single node,
    as typed attributes (:mod:`relayc.plan` turns all of it into the relay plan)."""

    spec: Spec
    decode: fx.Graph
    prefill: fx.Graph
    uses: dict[str, RelayUse] = field(default_factory=dict)  # relay_inference
    sample_dims: dict[str, int] = field(default_factory=dict)  # propagate_meta


def _placeholder(graph: fx.Graph, name: str, kind: str, ident: str, spec: Spec) -> fx.Node:
    node = graph.placeholder(name)
    node.meta["kind"] = kind
    node.meta["ident"] = ident
    entity = spec.fields[ident] if kind == "relay" else spec.inputs[ident]
    node.meta["loc"] = entity.loc
    return node


def _check_signature(spec: Spec, step: Step, op: Op, errors: list[SpecError]) -> None:
    for param in step.reads:
        if param not in op.inputs:
            errors.append(
                SpecError(
                    spec.locate(step.name, "reads", param),
                    f"op `{op.name}` has no parameter `{param}` (step `{step.name}`)",
                    join_hints(
                        did_you_mean(param, op.inputs), f"its parameters: {quoted_list(op.inputs)}"
                    ),
                )
            )
    missing = [p for p, t in op.inputs.items() if not t.optional and p not in step.reads]
    if missing:
        errors.append(
            SpecError(
                step.loc,
                f"step `{step.name}` does not bind {quoted_list(missing)} of op `{op.name}`",
                "add to `reads:`: " + ", ".join(f"`{p}: ...`" for p in missing),
            )
        )
    for out in step.writes:
        if out not in op.outputs:
            errors.append(
                SpecError(
                    spec.locate(step.name, "writes", out),
                    f"op `{op.name}` has no output `{out}` (step `{step.name}`)",
                    join_hints(
                        did_you_mean(out, op.outputs), f"its outputs: {quoted_list(op.outputs)}"
                    ),
                )
            )
    if op.placement not in ("any", step.placement):
        errors.append(
            SpecError(
                step.loc,
                f"op `{op.name}` runs on the {op.placement}, but step `{step.name}` is "
                f"placed on the {step.placement}",
                f"set `placement: {op.placement}`",
            )
        )


def import_spec_ops(spec: Spec) -> list[SpecError]:
    """Import the spec's user-op modules; errors located at their `ops:` entries."""
    errors: list[SpecError] = []
    owner: dict[str, tuple[str, Op]] = {}  # op name -> the first module registering it
    for module in spec.ops:
        where = "`--ops` module" if module.from_cli else "ops module"
        try:
            registered = import_op_module(module.name, spec.ops_dir)
        except OpsImportError as exc:
            errors.append(
                SpecError(
                    module.loc,
                    f"cannot import {where} `{module.name}`: {exc}",
                    "fix the module, or check the name: a module beside the spec is "
                    "named after its file",
                )
            )
            continue
        for name, op in registered.items():
            first = owner.setdefault(name, (module.name, op))
            if first[0] != module.name and first[1] is not op:  # the same Op twice is fine
                errors.append(
                    SpecError(
                        module.loc,
                        f"{where} `{module.name}` registers op `{name}`, which "
                        f"`{first[0]}` registers too",
                        "rename one of the two ops",
                    )
                )
    return errors


def _build(spec: Spec, steps: tuple[Step, ...], errors: list[SpecError], phase: str) -> fx.Graph:
    graph = fx.Graph()
    values: dict[str, fx.Node] = {}
    for name in spec.inputs:
        values[f"input.{name}"] = _placeholder(graph, f"input_{name}", "input", name, spec)
    if phase == "decode":
        for name in spec.fields:
            values[f"relay.{name}"] = _placeholder(graph, f"relay_{name}", "relay", name, spec)
    stashed: dict[str, fx.Node] = {}
    for step in steps:
        modules = [m.name for m in spec.ops]
        op = get_op(step.op, modules)
        if op is None:
            errors.append(
                SpecError(
                    step.loc,
                    f"unknown op `{step.op}` in step `{step.name}`",
                    join_hints(
                        did_you_mean(step.op, all_ops(modules)),
                        "built-in ops are in relayc/nodes/ops.py; register your own with "
                        "`relayc.nodes.register` in a module listed under `ops:`",
                    ),
                )
            )
            continue
        _check_signature(spec, step, op, errors)
        kwargs = {p: values[str(ref)] for p, ref in step.reads.items() if str(ref) in values}
        call = graph.call_function(op, kwargs=kwargs)
        call._rename(step.name)
        call.meta.update(kind="step", step=step, op=op, loc=step.loc, phase=phase)
        for out in step.writes:
            item = graph.call_function(operator.getitem, (call, out))
            item._rename(f"{step.name}_{out}")
            item.meta.update(
                kind="value", step=step, output=out, loc=spec.locate(step.name, "writes", out)
            )
            values[f"{step.name}.{out}"] = item
        for field_name, out in step.stash.items():
            if f"{step.name}.{out}" in values:
                stashed[field_name] = values[f"{step.name}.{out}"]
    out_node = graph.output(stashed)
    out_node.meta.update(kind="stash", phase=phase)
    out_node.meta["outputs"] = _engine_outputs(spec, phase, values, errors)
    return graph


def _engine_outputs(
    spec: Spec, phase: str, values: dict[str, fx.Node], errors: list[SpecError]
) -> dict[str, fx.Node]:
    """The values `outputs.<phase>` names; what the engine reads must have its type."""
    chosen: dict[str, fx.Node] = {}
    entries: dict[str, Ref] = getattr(spec.outputs, phase)
    for name, ref in entries.items():
        node = values.get(str(ref))
        if node is None:
            continue  # an unknown op or output, reported where the step is
        chosen[name] = node
        if name not in _ENGINE_OUTPUTS:
            continue
        dtypes, rank, what = _ENGINE_OUTPUTS[name]
        op: Op = node.args[0].target  # type: ignore[union-attr, assignment]
        tensor_type: TensorType | None = op.outputs.get(ref.name)
        if tensor_type is None:
            continue  # the op has no such output: reported at the step's `writes:`
        if tensor_type.dtype not in dtypes or len(tensor_type.shape) != rank:
            errors.append(
                SpecError(
                    spec.locate_output(phase, name),
                    f"`outputs.{phase}.{name}` is `{ref}`, which is "
                    f"`{tensor_type.dtype} [{', '.join(str(d) for d in tensor_type.shape)}]` "
                    "per request",
                    f"the engine reads `{name}` as {what}; name another output",
                )
            )
    return chosen


def build_graphs(spec: Spec) -> IterationGraphs:
    """The decode-iteration and prefill graphs of ``spec``; raises located SpecErrors."""
    errors = import_spec_ops(spec)
    if errors:
        raise SpecErrors(errors)  # unknown-op errors would only echo the failed import
    decode = _build(spec, spec.steps, errors, "decode")
    prefill = _build(spec, (spec.prefill,), errors, "prefill")
    if errors:
        raise SpecErrors(errors)
    decode.lint()
    prefill.lint()
    return IterationGraphs(spec=spec, decode=decode, prefill=prefill)
