"""`relayc explain` of a library, and the plain-text table every summary uses.

An algorithm is explained from its relay plan (:mod:`relayc.plan.explain`), which sits
above this layer.
"""

from __future__ import annotations

from collections.abc import Sequence

from relayc.specs.document import Library
from relayc.specs.schema import Dim, RelayField


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


def explain_library(document: Library) -> str:
    """`relayc explain` of a library (an algorithm is explained from its relay plan:
    :func:`relayc.plan.explain.explain`)."""
    out: list[str] = [f"library {document.name}  ({document.path})"]
    if document.description:
        out.append(document.description)
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
    rows = [
        [name, fld.dtype, shape_text(fld.shape), _field_flags(fld), fld.doc]
        for name, fld in document.fields.items()
    ]
    out += ["", "fields", table(["name", "dtype", "row shape", "policy", "doc"], rows)]
    return "\n".join(out)
