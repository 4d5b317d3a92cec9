"""Build the relay plan of one algorithm: spec -> fx graphs -> passes -> :class:`RelayPlan`.

The fx graphs are where the dataflow is checked (every relay read stashed or seeded, no dead
field, dtypes and shapes through each op's meta function on meta tensors); once the passes
accept them, this module reads the annotated graphs once and hands targets frozen records.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch.fx as fx

from relayc.graph.builder import IterationGraphs
from relayc.graph.passes import analyse
from relayc.nodes.registry import (
    Op,
    TensorType,
    builtin_op_names,
    plugin_op_package,
    user_ops,
)
from relayc.plan.model import (
    AbsentField,
    Capture,
    Dim,
    DimConstraint,
    EngineInput,
    EngineOutput,
    FieldUse,
    InputValue,
    PluginModule,
    Read,
    RelayPlan,
    RelayValue,
    Staging,
    Stash,
    Step,
    StepValue,
    Value,
    ValueType,
    Write,
)
from relayc.runtime.fields import HostMirror, RelayField
from relayc.specs import schema
from relayc.specs.errors import SourceLoc, SpecErrors
from relayc.specs.loader import BUNDLED_DIR, Library, Spec, load_document, load_spec
from relayc.specs.rules import dim_rule

# Every dim sizes tensors, so a bound value below 1 is never meaningful.
_POSITIVE = DimConstraint(minimum=1, reason="dims size tensors")


def plan_spec_file(path: str | Path, *, ops: tuple[str, ...] | list[str] = ()) -> RelayPlan:
    """Load, check and plan the algorithm spec at ``path``; raises located SpecErrors."""
    return build_plan(load_spec(path, ops=ops))


def build_plan(spec: Spec) -> RelayPlan:
    """The relay plan of a validated spec (runs the graph passes; raises SpecErrors)."""
    return plan_from_graphs(analyse(spec))


def relay_field(name: str, fld: schema.RelayField, origin: SourceLoc) -> RelayField:
    """The plan's (and the runtime's) record of a spec field."""
    mirror = fld.host_mirror
    return RelayField(
        name=name,
        dtype=fld.dtype,
        shape=tuple(fld.shape),
        alloc=fld.alloc,
        init=fld.init,
        poison=fld.poison,
        host_mirror=None
        if mirror is None
        else HostMirror(mirror.lag, mirror.depth, mirror.generation_check),
        owner=fld.owner,
        publish=fld.publish,
        export=fld.export,
        doc=fld.doc,
        origin=f"{origin.path}:{origin.line}",
    )


def plan_from_graphs(graphs: IterationGraphs) -> RelayPlan:
    """The relay plan of graphs that passed :func:`relayc.graph.passes.analyse`."""
    spec = graphs.spec
    fields = tuple(relay_field(name, fld, fld.loc) for name, fld in spec.fields.items())
    prefill_outputs = _engine_outputs(spec, graphs.prefill, "prefill")
    decode_outputs = _engine_outputs(spec, graphs.decode, "decode")
    prefill = _steps(spec, graphs.prefill, "prefill", prefill_outputs)
    steps = _steps(spec, graphs.decode, "decode", decode_outputs)
    user_modules = [m.name for m in spec.ops]
    op_modules = {step.op.name: _op_module(step.op, user_modules) for step in (*prefill, *steps)}
    staging = spec.staging
    return RelayPlan(
        algorithm=spec.algorithm,
        algorithm_loc=spec.algorithm_loc,
        description=spec.description,
        spec_path=spec.path,
        spec_hash=spec.content_hash,
        loc=SourceLoc(spec.path, 1, 1),
        dims=tuple(
            Dim(name, d.default, d.supplied_by, d.doc, (_POSITIVE,), d.loc)
            for name, d in spec.dims.items()
        ),
        rules=tuple(dim_rule(rule) for rule in spec.rules),
        inputs=tuple(
            EngineInput(name, ValueType(i.dtype, tuple(i.shape)), i.device, i.doc, i.loc)
            for name, i in spec.inputs.items()
        ),
        fields=fields,
        field_locs={name: fld.loc for name, fld in spec.fields.items()},
        uses=tuple(
            FieldUse(name, use.readers, use.stashed_by, use.seeded_by_prefill)
            for name, use in graphs.uses.items()
        ),
        absent=_absent_fields(spec),
        prefill=prefill[0],
        steps=steps,
        prefill_outputs=prefill_outputs,
        decode_outputs=decode_outputs,
        capture=Capture(
            tuple(spec.capture.batch_sizes), spec.capture.max_batch_size, spec.capture.loc
        ),
        staging=None
        if staging is None
        else Staging(
            staging.capture_hidden, staging.doc, schema.staging_text(staging), staging.loc
        ),
        sglang_plugin=spec.sglang.plugin if spec.sglang else None,
        sglang_plugin_loc=spec.sglang.loc if spec.sglang else None,
        sglang_hooks={str(k): v for k, v in spec.sglang.hooks.items()} if spec.sglang else {},
        sglang_members=tuple(spec.sglang.members) if spec.sglang else (),
        sglang_when=spec.sglang.when if spec.sglang else None,
        sglang_fallback=tuple(spec.sglang.fallback) if spec.sglang else (),
        op_modules=op_modules,
        plugins=tuple(PluginModule(m.name, m.from_cli, m.loc) for m in spec.ops),
        sample_dims=dict(graphs.sample_dims),
        vllm_method=spec.vllm.method if spec.vllm else None,
        vllm_loc=spec.vllm.loc if spec.vllm else None,
        vllm_hooks={str(k): v for k, v in spec.vllm.hooks.items()} if spec.vllm else {},
    )


def _op_module(op: Op, user_modules: list[str]) -> str | None:
    """The module that brings ``op``: an `ops:` module, or an installed algorithm package
    (its entry point); None for a built-in op."""
    if op.name in builtin_op_names():
        return None
    found = next((m for m in user_modules if user_ops(m).get(op.name) is op), None)
    return found or plugin_op_package(op)


def _type(tensor_type: TensorType) -> ValueType:
    return ValueType(tensor_type.dtype, tuple(tensor_type.shape))


def _typed(spec: Spec, node: fx.Node) -> tuple[Value, ValueType]:
    """What a value node of the graph stands for, and its per-request type."""
    kind = node.meta["kind"]
    if kind == "relay":
        fld = spec.fields[node.meta["ident"]]
        return RelayValue(node.meta["ident"]), ValueType(fld.dtype, tuple(fld.shape))
    if kind == "input":
        entity = spec.inputs[node.meta["ident"]]
        return InputValue(node.meta["ident"]), ValueType(entity.dtype, tuple(entity.shape))
    op: Op = node.args[0].target  # type: ignore[union-attr, assignment]
    output = node.meta["output"]
    return StepValue(node.meta["step"].name, output), _type(op.outputs[output])


def _steps(
    spec: Spec, graph: fx.Graph, phase: str, outputs: tuple[EngineOutput, ...]
) -> tuple[Step, ...]:
    returned = {o.value for o in outputs}
    early = {name for name, f in spec.fields.items() if f.publish == "early"}
    steps: list[Step] = []
    for node in graph.nodes:
        if node.meta.get("kind") != "step":
            continue
        step = node.meta["step"]
        op: Op = node.target
        reads = tuple(
            Read(param, *_typed(spec, value), spec.locate(step.name, "reads", param))
            for param, value in node.kwargs.items()
            if isinstance(value, fx.Node)
        )
        stashed = set(step.stash.values())
        writes = tuple(
            Write(
                output=item.args[1],
                type=_type(op.outputs[item.args[1]]),
                used=bool(item.users)
                or item.args[1] in stashed
                or StepValue(step.name, item.args[1]) in returned,
                loc=spec.locate(step.name, "writes", item.args[1]),
            )
            for item in node.users
        )
        stashes = tuple(
            Stash(fld, out, fld in early, spec.locate(step.name, "stash", fld))
            for fld, out in step.stash.items()
        )
        steps.append(
            Step(
                name=step.name,
                op=op,
                phase=phase,  # type: ignore[arg-type]
                placement=step.placement,
                reads=reads,
                writes=writes,
                stashes=stashes,
                effects=tuple(op.effects),
                doc=step.doc,
                loc=step.loc,
            )
        )
    return tuple(steps)


def _engine_outputs(spec: Spec, graph: fx.Graph, phase: str) -> tuple[EngineOutput, ...]:
    chosen: Mapping[str, fx.Node] = next(n for n in graph.nodes if n.op == "output").meta["outputs"]
    outputs = []
    for name, node in chosen.items():
        value, value_type = _typed(spec, node)
        assert isinstance(value, StepValue)  # `outputs:` names step outputs only
        outputs.append(EngineOutput(name, value, value_type, spec.locate_output(phase, name)))
    return tuple(outputs)


def _absent_fields(spec: Spec) -> tuple[AbsentField, ...]:
    """Fields of the imported libraries that ``spec`` does not relay, so the generated
    module can say why a field is missing (it was not imported)."""
    libraries = sorted({path for path in spec.origin.values() if path != spec.path})
    absent: list[AbsentField] = []
    for shown in libraries:
        try:
            library = load_document(_library_file(shown))
        except SpecErrors:  # it loaded a moment ago, as an import; nothing to add then
            continue
        if not isinstance(library, Library):
            continue
        for name, fld in library.fields.items():
            if name not in spec.fields:
                absent.append(AbsentField(name, shown, fld.loc))
    return tuple(absent)


def _library_file(shown: str) -> Path:
    """The file behind a library's display path (bundled ones are shown as relayc/specs/X)."""
    bundled = BUNDLED_DIR / Path(shown).name
    if shown == f"relayc/specs/{Path(shown).name}" and bundled.is_file():
        return bundled
    return Path(shown)
