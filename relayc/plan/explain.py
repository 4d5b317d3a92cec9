"""`relayc explain`: a readable summary of a spec -- dims, inputs, fields, steps.

An algorithm is explained from its relay plan (what every target reads), so what
`explain` says is what gets generated; a library, which has no plan, from its document.
"""

from __future__ import annotations

from relayc.plan.build import build_plan
from relayc.plan.model import Dim, RelayPlan, Step, shape_text
from relayc.runtime.fields import RelayField
from relayc.specs.document import Library, Spec
from relayc.specs.explain import explain_library, table


def explain(document: Spec | Library) -> str:
    """The summary of a validated document (an algorithm is planned first: SpecErrors)."""
    if isinstance(document, Library):
        return explain_library(document)
    return explain_plan(build_plan(document))


def _dim_value(dim: Dim) -> str:
    if dim.default is not None and dim.supplied_by:
        return f"{dim.default} (or {dim.supplied_by})"
    return str(dim.default) if dim.default is not None else f"from {dim.supplied_by}"


def _rules_block(plan: RelayPlan) -> list[str]:
    """The spec's dims rules, each with its line and why it holds."""
    if not plan.rules:
        return []
    rows = [[r.text, r.origin.rpartition(":")[2], r.message or "-"] for r in plan.rules]
    return [
        "",
        "dims rules (checked when an engine binds the dims)",
        table(["rule", "line", "why"], rows),
    ]


def _sglang_lines(plan: RelayPlan) -> list[str]:
    """What the spec's `sglang:` section makes the SGLang target relay it for."""
    lines = []
    if plan.sglang_plugin is not None:
        lines.append(
            f"SGLang plugin: the SGLang target relays it for the algorithm registered as "
            f"{plan.sglang_plugin} (spec_registry.register_algorithm)"
        )
    if plan.sglang_members:
        when = (
            f", when SGLang's speculative config sets `{plan.sglang_when}`"
            if plan.sglang_when
            else ""
        )
        lines.append(f"SGLang members: {', '.join(plan.sglang_members)}{when}")
    if plan.sglang_fallback:
        lines.append(
            f"SGLang fallback: {', '.join(plan.sglang_fallback)}, in a module compiled "
            "without a spec that lists them in `members`"
        )
    return lines


def _field_flags(f: RelayField) -> str:
    flags: list[str] = [f.alloc]
    if f.init != "empty":
        flags.append(f"init={f.init}")
    if f.early:
        flags.append("published early")
    if f.host_mirror is not None:
        flags.append(f.host_mirror.text)
    if f.owner == "graph":
        flags.append("owned by a captured graph (adopted)")
    if f.export:
        flags.append("exported")
    return ", ".join(flags)


def _step_block(number: str, step: Step) -> list[str]:
    reads = ", ".join(
        f"{r.param}={r.value}" if r.param != _value_name(r.value) else str(r.value)
        for r in step.reads
    )
    stash = ", ".join(
        f"{s.field}<-{s.output}" if s.field != s.output else s.field for s in step.stashes
    )
    lines = [f"  {number}{step.name}  ({step.op.name}, on the {step.placement})"]
    if step.doc:
        lines.append(f"      {step.doc}")
    writes = ", ".join(w.output for w in step.writes)
    lines += [f"      reads    {reads or '-'}", f"      writes   {writes or '-'}"]
    if step.effects:  # state the op touches that no tensor carries (the draft KV cache)
        lines.append(f"      effects  {', '.join(e.text for e in step.effects)}")
    if stash:
        lines.append(f"      stashes  {stash}")
    return lines


def _value_name(value: object) -> str:
    """The name part of a value reference (`topk_p` of `relay.topk_p`)."""
    return str(value).rpartition(".")[2]


def explain_plan(plan: RelayPlan) -> str:
    out: list[str] = [f"algorithm {plan.algorithm}  ({plan.spec_path})"]
    if plan.description:
        out.append(plan.description)
    if plan.plugins:
        names = ", ".join(m.name + (" (--ops)" if m.from_cli else "") for m in plan.plugins)
        out.append(f"user ops from: {names}")
    out += _sglang_lines(plan)
    if plan.staging is not None:
        out.append(f"staged inputs: {plan.staging.text}")
    out += [
        "",
        "dims",
        table(["name", "value", "doc"], [[d.name, _dim_value(d), d.doc] for d in plan.dims]),
        *_rules_block(plan),
        "",
        "engine inputs",
        table(
            ["name", "dtype", "shape", "where", "doc"],
            [
                [i.name, i.type.dtype, shape_text(i.type.shape), i.device, i.doc]
                for i in plan.inputs
            ],
        ),
    ]
    rows = []
    for f in plan.fields:
        defined_in = f.origin.rpartition(":")[0]
        origin = f" [{defined_in.rsplit('/', 1)[-1]}]" if defined_in != plan.spec_path else ""
        rows.append([f.name + origin, f.dtype, shape_text(f.shape), _field_flags(f), f.doc])
    out += [
        "",
        "relay fields (per request-pool slot)",
        table(["name", "dtype", "row shape", "policy", "doc"], rows),
        "",
        "prefill",
        *_step_block("", plan.prefill),
        "",
        "decode iteration (in order)",
    ]
    for number, step in enumerate(plan.steps, 1):
        out += _step_block(f"{number}. ", step)
    cap = plan.capture
    out += [
        "",
        f"capture: batch sizes {', '.join(map(str, cap.batch_sizes))}; "
        f"max batch size {cap.max_batch_size}",
    ]
    for phase, outputs in (("prefill", plan.prefill_outputs), ("decode", plan.decode_outputs)):
        listed = ", ".join(f"{o.name}={o.value}" for o in outputs)
        out.append(f"the engine reads after {phase}: {listed}")
    return "\n".join(out)
