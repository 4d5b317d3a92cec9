"""`relayc explain`: a readable summary of a spec -- dims, inputs, fields, steps."""

from __future__ import annotations

from collections.abc import Sequence

from relayc.specs.document import Library, Spec
from relayc.specs.schema import Dim, RelayField, Step, staging_text


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table with aligned columns."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = [
        "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(),
        "  ".join("-" * w for w in widths),
    ]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return "\n".join(lines)


def shape_text(shape: Sequence[str | int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _dim_value(dim: Dim) -> str:
    if dim.default is not None and dim.supplied_by:
        return f"{dim.default} (or {dim.supplied_by})"
    return str(dim.default) if dim.default is not None else f"from {dim.supplied_by}"


def _field_flags(fld: RelayField) -> str:
    flags = [fld.alloc]
    if fld.init != "empty":
        flags.append(f"init={fld.init}")
    if fld.publish == "early":
        flags.append("published early")
    if fld.host_mirror:
        flags.append(fld.host_mirror.text)
    if fld.owner == "graph":
        flags.append("owned by a captured graph (adopted)")
    if fld.export:
        flags.append("exported")
    return ", ".join(flags)


def _step_block(number: str, step: Step) -> list[str]:
    reads = ", ".join(f"{p}={r}" if p != r.name else str(r) for p, r in step.reads.items())
    stash = ", ".join(f"{f}<-{o}" if f != o else f for f, o in step.stash.items())
    lines = [f"  {number}{step.name}  ({step.op}, on the {step.placement})"]
    if step.doc:
        lines.append(f"      {step.doc}")
    lines += [f"      reads    {reads or '-'}", f"      writes   {', '.join(step.writes) or '-'}"]
    if stash:
        lines.append(f"      stashes  {stash}")
    return lines


def explain(document: Spec | Library) -> str:
    out: list[str] = []
    if isinstance(document, Spec):
        out.append(f"algorithm {document.algorithm}  ({document.path})")
    else:
        out.append(f"library {document.name}  ({document.path})")
    if document.description:
        out.append(document.description)
    if isinstance(document, Spec) and document.ops:
        names = ", ".join(m.name + (" (--ops)" if m.from_cli else "") for m in document.ops)
        out.append(f"user ops from: {names}")
    if isinstance(document, Spec) and document.sglang is not None:
        out.append(
            f"SGLang plugin: the SGLang target relays it for the algorithm registered as "
            f"{document.sglang.plugin} (spec_registry.register_algorithm)"
        )
    if isinstance(document, Spec) and document.staging is not None:
        out.append(f"staged inputs: {staging_text(document.staging)}")
    out += [
        "",
        "dims",
        table(
            ["name", "value", "doc"], [[n, _dim_value(d), d.doc] for n, d in document.dims.items()]
        ),
    ]
    out += [
        "",
        "engine inputs",
        table(
            ["name", "dtype", "shape", "where", "doc"],
            [
                [n, i.dtype, shape_text(i.shape), i.device, i.doc]
                for n, i in document.inputs.items()
            ],
        ),
    ]
    rows = []
    for name, fld in document.fields.items():
        origin = ""
        if isinstance(document, Spec) and document.origin[name] != document.path:
            origin = f" [{document.origin[name].rsplit('/', 1)[-1]}]"
        rows.append([name + origin, fld.dtype, shape_text(fld.shape), _field_flags(fld), fld.doc])
    out += [
        "",
        "relay fields (per request-pool slot)" if isinstance(document, Spec) else "fields",
        table(["name", "dtype", "row shape", "policy", "doc"], rows),
    ]
    if isinstance(document, Spec):
        out += ["", "prefill", *_step_block("", document.prefill)]
        out += ["", "decode iteration (in order)"]
        for number, step in enumerate(document.steps, 1):
            out += _step_block(f"{number}. ", step)
        cap = document.capture
        out += [
            "",
            f"capture: batch sizes {', '.join(map(str, cap.batch_sizes))}; "
            f"max batch size {cap.max_batch_size}",
        ]
        for phase in ("prefill", "decode"):
            entries = getattr(document.outputs, phase)
            listed = ", ".join(f"{name}={ref}" for name, ref in entries.items())
            out.append(f"the engine reads after {phase}: {listed}")
    return "\n".join(out)
