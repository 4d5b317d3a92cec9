"""`relayc graph`: a picture of one decode iteration, as Mermaid, DOT or SVG.

The picture is built once as a small neutral graph (:class:`Picture`) and then
rendered, so Mermaid and DOT always show the same nodes and edges:

* each decode step is a node (name and op); device steps sit in a "captured
  graph" cluster, host steps outside it with a distinct shape and "on the host";
* each value a step reads from an earlier step is an edge labelled with the
  value's name (several values between the same two steps share one edge);
* engine inputs are small source nodes;
* relay fields cross the iteration boundary through two nodes: *resolve* (start
  of iteration i) feeds the steps that read ``relay.<field>``, and the steps that
  stash a field feed *stash* (end of iteration i, read by i+1). Those edges are
  dashed and labelled ``<field> [<shape>] <dtype>``; early-published fields are
  drawn thick and say "published early".

Output is byte-for-byte deterministic: everything is emitted in spec order
(steps, reads, stashes, inputs), never in set or hash order.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from relayc.specs.errors import (
    EXIT_OK,
    EXIT_SPEC_ERRORS,
    EXIT_USAGE,
    SpecErrors,
    add_ops_option,
    one_line,
)

if TYPE_CHECKING:
    # Imported lazily at run time: the CLI imports this module while building its
    # parser, and `relayc --help` should not pay for pydantic, YAML and torch.fx.
    from relayc.plan.model import RelayPlan
    from relayc.runtime.fields import RelayField
    from relayc.specs.loader import Spec

FORMATS = ("mermaid", "dot", "svg")
GRAPHVIZ_MISSING = (
    "svg needs Graphviz's `dot`: apt-get install graphviz (Debian/Ubuntu), "
    "brew install graphviz (macOS); or use --format mermaid|dot"
)

NodeKind = Literal["input", "device", "host", "resolve", "stash"]
# value: step output -> step; input: engine input -> step; relay: across the
# iteration boundary; early: a stash of an early-published field.
EdgeKind = Literal["value", "input", "relay", "early"]

RESOLVE_ID = "relay_resolve"
STASH_ID = "relay_stash"
CAPTURED_ID = "captured"
CAPTURED_LABEL = "captured graph (device steps)"


class GraphvizError(RuntimeError):
    """Graphviz's `dot` is missing or failed; the CLI reports it as a usage error."""


@dataclass(frozen=True)
class Node:
    id: str
    lines: tuple[str, ...]
    kind: NodeKind


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    lines: tuple[str, ...]
    kind: EdgeKind


@dataclass(frozen=True)
class Picture:
    """One decode iteration as nodes and edges, in the order they are drawn."""

    algorithm: str
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]


def step_id(name: str) -> str:
    # Prefixed so that no step name (e.g. `end`, a Mermaid keyword) can clash
    # with a keyword or with the fixed resolve/stash/input ids.
    return f"step_{name}"


def input_id(name: str) -> str:
    return f"input_{name}"


def field_text(fld: RelayField) -> str:
    """``topk_p [topk] float32``; a one-value-per-row field has no shape part."""
    shape = f" [{', '.join(str(d) for d in fld.shape)}]" if fld.shape else ""
    return f"{fld.name}{shape} {fld.dtype}"


def _stash_text(output: str, fld: RelayField) -> str:
    text = field_text(fld)
    if output != fld.name:
        text += f" (from {output})"
    if fld.early:
        text += ", published early"
    if fld.host_mirror is not None:
        text += ", " + fld.host_mirror.text
    if fld.owner == "graph":
        text += ", owned by a captured graph (adopted)"
    return text


def _plan(source: Spec | RelayPlan) -> RelayPlan:
    """The relay plan to draw: ``source`` itself, or the plan of a validated spec."""
    from relayc.plan.build import build_plan
    from relayc.plan.model import RelayPlan

    return source if isinstance(source, RelayPlan) else build_plan(source)


def build_picture(source: Spec | RelayPlan) -> Picture:
    """The nodes and edges of one decode iteration, read from the relay plan, in spec order."""
    from relayc.plan.model import InputValue, RelayValue

    plan = _plan(source)
    # Dicts keep insertion order, so grouping values by (source, target, kind)
    # keeps the spec's order of first appearance.
    grouped: dict[tuple[str, str, EdgeKind], list[str]] = {}
    inputs_read: dict[str, None] = {}

    def add(source: str, target: str, kind: EdgeKind, line: str | None) -> None:
        lines = grouped.setdefault((source, target, kind), [])
        if line is not None and line not in lines:
            lines.append(line)

    for step in plan.steps:
        target = step_id(step.name)
        for read in step.reads:
            value = read.value
            if isinstance(value, RelayValue):
                add(RESOLVE_ID, target, "relay", field_text(plan.field(value.field)))
            elif isinstance(value, InputValue):
                inputs_read[value.input] = None
                add(input_id(value.input), target, "input", None)
            else:
                add(step_id(value.step), target, "value", value.output)
        for stash in step.stashes:
            fld = plan.field(stash.field)
            kind: EdgeKind = "early" if stash.early else "relay"
            add(target, STASH_ID, kind, _stash_text(stash.output, fld))

    nodes = [
        Node(input_id(i.name), ("input", i.name), "input")
        for i in plan.inputs
        if i.name in inputs_read
    ]
    resolve: tuple[str, ...] = ("resolve relay", "start of iteration i")
    if plan.staging is not None:  # `staging:`: a staged request's draft input comes from here
        resolve += ("staged requests: relay slot only",)
    nodes.append(Node(RESOLVE_ID, resolve, "resolve"))
    for step in plan.steps:
        if step.placement == "host":
            nodes.append(Node(step_id(step.name), (step.name, step.op.name, "on the host"), "host"))
        else:
            nodes.append(Node(step_id(step.name), (step.name, step.op.name), "device"))
    nodes.append(Node(STASH_ID, ("stash relay", "end of iteration i → i+1"), "stash"))
    edges = tuple(
        Edge(source, target, tuple(lines), kind)
        for (source, target, kind), lines in grouped.items()
    )
    return Picture(plan.algorithm, tuple(nodes), edges)


def _mermaid_text(lines: Iterable[str]) -> str:
    # Mermaid labels are HTML: entity codes keep quotes, angle brackets and `&`
    # from ending the label or being read as markup.
    codes = {"&": "#amp;", '"': "#quot;", "<": "#lt;", ">": "#gt;", "#": "#35;"}
    return "<br>".join("".join(codes.get(c, c) for c in line) for line in lines)


_MERMAID_SHAPES: dict[NodeKind, tuple[str, str]] = {
    "input": ("([", "])"),
    "device": ("[", "]"),
    "host": ("{{", "}}"),
    "resolve": ("[(", ")]"),
    "stash": ("[(", ")]"),
}
_MERMAID_ARROWS: dict[EdgeKind, str] = {
    "value": "-->",
    "input": "-->",
    "relay": "-.->",
    "early": "==>",
}
_MERMAID_CLASSES = (
    "classDef input fill:#f5f5f5,stroke:#9e9e9e,color:#424242",
    "classDef device fill:#e3f2fd,stroke:#1565c0",
    "classDef host fill:#fff3e0,stroke:#e65100,stroke-width:2px",
    "classDef relay fill:#ede7f6,stroke:#5e35b1",
)
_MERMAID_CLASS_OF: dict[NodeKind, str] = {
    "input": "input",
    "device": "device",
    "host": "host",
    "resolve": "relay",
    "stash": "relay",
}


def _mermaid_node(node: Node) -> str:
    left, right = _MERMAID_SHAPES[node.kind]
    label = _mermaid_text(node.lines)
    return f'{node.id}{left}"{label}"{right}:::{_MERMAID_CLASS_OF[node.kind]}'


def to_mermaid(source: Spec | RelayPlan) -> str:
    """A Mermaid flowchart of one decode iteration (of a plan, or of a spec's plan)."""
    return render_mermaid(build_picture(source))


def render_mermaid(picture: Picture) -> str:
    out = [
        f"%% relayc graph: one decode iteration of `{picture.algorithm}`",
        "flowchart LR",
    ]
    out += [f"  {line}" for line in _MERMAID_CLASSES]
    device = [n for n in picture.nodes if n.kind == "device"]
    for node in picture.nodes:
        if node.kind == "device":
            if node is device[0]:
                out.append(f'  subgraph {CAPTURED_ID}["{_mermaid_text([CAPTURED_LABEL])}"]')
                out += [f"    {_mermaid_node(n)}" for n in device]
                out.append("  end")
            continue
        out.append(f"  {_mermaid_node(node)}")
    for edge in picture.edges:
        arrow = _MERMAID_ARROWS[edge.kind]
        label = f'|"{_mermaid_text(edge.lines)}"|' if edge.lines else ""
        out.append(f"  {edge.source} {arrow}{label} {edge.target}")
    return "\n".join(out) + "\n"


def _dot_string(lines: Sequence[str]) -> str:
    r"""A quoted DOT string; ``\n`` between lines is Graphviz's centred line break."""
    escaped = (line.replace("\\", "\\\\").replace('"', '\\"') for line in lines)
    return '"' + "\\n".join(escaped) + '"'


_DOT_NODE_ATTRS: dict[NodeKind, str] = {
    "input": 'shape=ellipse, style=filled, fillcolor="#f5f5f5", color="#9e9e9e", fontsize=10',
    "device": 'shape=box, style="rounded,filled", fillcolor="#e3f2fd", color="#1565c0"',
    "host": 'shape=hexagon, style="filled,bold", fillcolor="#fff3e0", color="#e65100"',
    "resolve": 'shape=cylinder, style=filled, fillcolor="#ede7f6", color="#5e35b1"',
    "stash": 'shape=cylinder, style=filled, fillcolor="#ede7f6", color="#5e35b1"',
}
_DOT_EDGE_ATTRS: dict[EdgeKind, str] = {
    "value": "",
    "input": 'color="#9e9e9e"',
    "relay": 'style=dashed, color="#5e35b1", fontcolor="#5e35b1"',
    "early": 'style=bold, penwidth=2.5, color="#5e35b1", fontcolor="#5e35b1"',
}


def _dot_node(node: Node) -> str:
    return f"{node.id} [label={_dot_string(node.lines)}, {_DOT_NODE_ATTRS[node.kind]}];"


def to_dot(source: Spec | RelayPlan) -> str:
    """A Graphviz DOT digraph of one decode iteration (of a plan, or of a spec's plan)."""
    return render_dot(build_picture(source))


def render_dot(picture: Picture) -> str:
    out = [
        f"// relayc graph: one decode iteration of `{picture.algorithm}`",
        f"digraph {_dot_string([picture.algorithm])} {{",
        "  rankdir=LR;",
        '  node [fontname="Helvetica", fontsize=11];',
        '  edge [fontname="Helvetica", fontsize=9];',
    ]
    device = [n for n in picture.nodes if n.kind == "device"]
    for node in picture.nodes:
        if node.kind == "device":
            if node is device[0]:
                out += [
                    f"  subgraph cluster_{CAPTURED_ID} {{",
                    f"    label={_dot_string([CAPTURED_LABEL])};",
                    '    style="rounded,dashed"; color="#1565c0"; fontname="Helvetica";',
                ]
                out += [f"    {_dot_node(n)}" for n in device]
                out.append("  }")
            continue
        out.append(f"  {_dot_node(node)}")
    for edge in picture.edges:
        attrs = [f"label={_dot_string(edge.lines)}"] if edge.lines else []
        if _DOT_EDGE_ATTRS[edge.kind]:
            attrs.append(_DOT_EDGE_ATTRS[edge.kind])
        suffix = f" [{', '.join(attrs)}]" if attrs else ""
        out.append(f"  {edge.source} -> {edge.target}{suffix};")
    out.append("}")
    return "\n".join(out) + "\n"


def to_svg(source: Spec | RelayPlan) -> bytes:
    """SVG of one decode iteration, drawn by Graphviz's `dot`.

    Raises :class:`GraphvizError` when `dot` is not installed or fails.
    """
    dot = shutil.which("dot")
    if dot is None:
        raise GraphvizError(GRAPHVIZ_MISSING)
    result = subprocess.run(
        [dot, "-Tsvg"], input=to_dot(source).encode("utf-8"), capture_output=True, check=False
    )
    if result.returncode != 0:
        why = result.stderr.decode("utf-8", "replace").strip()
        raise GraphvizError(f"`dot -Tsvg` failed (exit {result.returncode}): {why}")
    return result.stdout


def add_graph_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``relayc graph`` on the CLI's subparsers."""
    p = subparsers.add_parser(
        "graph",
        help="draw one decode iteration of a spec (Mermaid, DOT or SVG)",
        description="Draw one decode iteration: steps (device steps in the captured graph, "
        "host steps marked), the values between them, engine inputs, and the relay fields "
        "resolved at the start of the iteration and stashed for the next one.",
        epilog="Exit codes: 0 ok, 1 spec errors, 2 usage errors (svg without -o or without "
        "Graphviz).",
    )
    p.add_argument("spec", metavar="SPEC", help="algorithm spec YAML file")
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="mermaid",
        help="mermaid (default) or dot: text; svg: needs Graphviz's `dot` and -o",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write to FILE instead of stdout (required for svg)",
    )
    add_ops_option(p)
    p.set_defaults(func=cmd_graph)


def cmd_graph(args: argparse.Namespace) -> int:
    """``relayc graph``: 0 ok, 1 spec errors, 2 usage errors."""
    from relayc.plan.build import plan_spec_file

    def usage(message: str) -> int:
        print(one_line(f"relayc graph: error: {message}"), file=sys.stderr)
        return EXIT_USAGE

    if args.format == "svg" and not args.output:
        return usage("--format svg needs -o FILE (svg is not written to stdout)")
    if not Path(args.spec).is_file():
        return usage(f"no such spec file: {args.spec}")
    try:
        # The same checks as `relayc compile`: draw only a spec that compiles.
        plan = plan_spec_file(args.spec, ops=args.ops)
    except SpecErrors as exc:
        print(exc.render(), file=sys.stderr)
        return EXIT_SPEC_ERRORS
    try:
        if args.format == "svg":
            Path(args.output).write_bytes(to_svg(plan))
            return EXIT_OK
        text = to_mermaid(plan) if args.format == "mermaid" else to_dot(plan)
        if args.output:
            Path(args.output).write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
    except GraphvizError as exc:
        return usage(str(exc))
    except OSError as exc:
        return usage(f"cannot write {args.output}: {exc.strerror or exc}")
    return EXIT_OK
