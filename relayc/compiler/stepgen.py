"""Generate `PrefillStep` and `DecodeStep` of an algorithm from its fx graphs.

A decode iteration is split where the spec splits it: host steps (e.g. n-gram
drafting) run first, outside any CUDA graph; their outputs become static inputs
of the device part, which resolves the relay, runs the device steps in order,
publishes early fields right after the step that produces them and stashes the
rest at the end. The engine passes each op's implementation in ``impls``.

What the steps return is the spec's `outputs:` section, as two dataclasses
(`PrefillOutputs`, `DecodeOutputs`): the engine reads their attributes, so a
renamed step or output changes the spec's `outputs:` and nothing in the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch.fx as fx

from relayc.compiler.output import comment_text
from relayc.graph.builder import IterationGraphs
from relayc.nodes.registry import Op
from relayc.specs.reserved import GENERATED_NAMES

Writer = Callable[[str], None]
_LINE_LENGTH = 100  # the project's (and the generated code's) ruff line length
# (step name, output name) -> the local variable holding that output in a step method
VarNames = dict[tuple[str, str], str]


def _type_comment(op: Op, output: str) -> str:
    tensor_type = op.outputs[output]
    return f"[{', '.join(['bs', *(str(d) for d in tensor_type.shape)])}] {tensor_type.dtype}"


def _impl_attr(op_name: str) -> str:
    return f"self._{op_name}"


def _ops_of(graph: fx.Graph) -> list[str]:
    names: list[str] = []
    for node in graph.nodes:
        if node.meta.get("kind") == "step" and node.target.name not in names:
            names.append(node.target.name)
    return names


def _var_names(graph: fx.Graph, placement: str, inputs: Collection[str]) -> VarNames:
    """Local variable of each output of the steps on ``placement`` (one generated method).

    An output is held in ``<step>_<output>``, except where the output's name already starts
    with ``<step>_`` (`accept.accept_index`, `draft.draft_tokens`): then the output's name
    alone, as long as it clashes with no other name the method defines or reads (the other
    outputs' variables under either spelling, the step results, the inputs and the
    generated module's own names), so doubled names like `accept_accept_index` do not appear.
    """
    steps = [
        n
        for n in graph.nodes
        if n.meta.get("kind") == "step" and n.meta["step"].placement == placement
    ]
    full: VarNames = {}
    short: VarNames = {}
    for node in steps:
        name = node.meta["step"].name
        for item in node.users:
            out = item.args[1]
            full[name, out] = f"{name}_{out}"
            short[name, out] = out if out.startswith(f"{name}_") else f"{name}_{out}"
    taken = {*GENERATED_NAMES, *inputs, *(n.meta["step"].name for n in steps)}
    names: VarNames = {}
    for key, var in short.items():
        others = {v for k, v in [*full.items(), *short.items()] if k != key}
        var = var if var not in taken and var not in others else full[key]
        # `<step>_<output>` can still spell another step's result (`decode` + `logits` and
        # a step `decode_logits`) or another output's (`a` + `b_c`, `a_b` + `c`): one
        # variable would hold both, so the later one gets a number.
        unique, suffix = var, 2
        while unique in taken:
            unique, suffix = f"{var}_{suffix}", suffix + 1
        taken.add(unique)
        names[key] = unique
    return names


def _arg(value: fx.Node, names: VarNames) -> str:
    kind = value.meta["kind"]
    if kind == "relay":
        return f"relay.{value.meta['ident']}"
    if kind == "input":
        return value.meta["ident"]
    step, output = value.meta["step"], value.meta["output"]
    if step.placement == "host":
        return f'host["{step.name}.{output}"]'
    return names[step.name, output]


def call_lines(w: Writer, indent: str, head: str, args: list[str]) -> None:
    """`head(args)` on one line, or one argument per line when that would be long."""
    one_line = f"{indent}{head}({', '.join(args)})"
    if len(one_line) <= 100:
        w(one_line)
        return
    w(f"{indent}{head}(")
    for arg in args:
        w(f"{indent}    {arg},")
    w(f"{indent})")


def _return_dict(w: Writer, indent: str, produced: list[tuple[str, str]]) -> None:
    if not produced:
        w(f"{indent}return {{}}")
        return
    w(f"{indent}return {{")
    for key, var in produced:
        w(f'{indent}    "{key}": {var},')
    w(f"{indent}}}")


def _engine_outputs(graph: fx.Graph) -> dict[str, fx.Node]:
    """`outputs.<phase>` of the spec: name -> value node (the builder put them on the output)."""
    return next(n for n in graph.nodes if n.op == "output").meta["outputs"]


_PHASE_TEXT = {"prefill": "the prefill", "decode": "a decode iteration"}


def _outputs_class(w: Writer, name: str, phase: str, graph: fx.Graph) -> None:
    w("@dataclass")
    w(f"class {name}:")
    w(
        f'    """What the engine reads after {_PHASE_TEXT[phase]} (the spec\'s `outputs.{phase}`)."""\n'
    )
    for field_name, value in _engine_outputs(graph).items():
        step, output = value.meta["step"], value.meta["output"]
        op: Op = value.args[0].target  # type: ignore[union-attr, assignment]
        w(f"    {field_name}: torch.Tensor  # {_type_comment(op, output)} ({step.name}.{output})")
    w("\n")


def _return_outputs(w: Writer, indent: str, name: str, graph: fx.Graph, names: VarNames) -> None:
    args = [
        f"{field_name}={_arg(value, names)}" for field_name, value in _engine_outputs(graph).items()
    ]
    call_lines(w, indent, f"return {name}", args)


def _emit_steps(
    w: Writer, graph: fx.Graph, placement: str, indent: str, early: set[str], names: VarNames
) -> list[tuple[str, str]]:
    """Emit the calls of the steps placed on ``placement``; returns (key, variable) pairs."""
    produced: list[tuple[str, str]] = []
    stashed = next(n for n in graph.nodes if n.op == "output").args[0]
    returned = set(_engine_outputs(graph).values())
    for node in graph.nodes:
        if node.meta.get("kind") != "step" or node.meta["step"].placement != placement:
            continue
        step = node.meta["step"]
        op: Op = node.target  # type: ignore[assignment]
        loc = step.loc
        w(f"{indent}# {comment_text(loc.path)}:{loc.line} step `{step.name}` ({op.name})")
        args = [f"{param}={_arg(value, names)}" for param, value in node.kwargs.items()]
        # Host outputs all go to run_device; device outputs nothing reads (no step, stash or
        # `outputs:` entry) get no variable.
        kept = [
            item for item in node.users if placement == "host" or item.users or item in returned
        ]
        head = f"{step.name} = " if kept else ""
        call_lines(w, indent, f"{head}{_impl_attr(op.name)}", ["ctx", *args])
        for item in kept:
            out = item.args[1]
            var = names[step.name, out]
            line = f'{indent}{var} = {step.name}["{out}"]'
            comment = f"# {_type_comment(op, out)}"
            if len(line) + 2 + len(comment) <= _LINE_LENGTH:
                w(f"{line}  {comment}")
            else:
                # On its own line above: a trailing comment past the line length makes
                # `ruff format` break the subscript over three lines.
                w(f"{indent}{comment}")
                w(line)
            produced.append((f"{step.name}.{out}", var))
        published = [
            f for f, v in stashed.items() if f in early and v.meta["step"].name == step.name
        ]
        if published:
            args = ", ".join(
                f"{f}={names[step.name, stashed[f].meta['output']]}" for f in published
            )
            w(f"{indent}self.relay.publish(req_pool_indices, {args})")
    return produced


def _emit_stash(w: Writer, graph: fx.Graph, indent: str, early: set[str], names: VarNames) -> None:
    stashed = next(n for n in graph.nodes if n.op == "output").args[0]
    late = {f: v for f, v in stashed.items() if f not in early}
    if not late:
        return
    w(f"{indent}self.relay.stash(")
    w(f"{indent}    req_pool_indices,")
    w(f"{indent}    RelayPayload(")
    for field_name, value in late.items():
        w(f"{indent}        {field_name}={_arg(value, names)},")
    w(f"{indent}    ),")
    w(f"{indent})")


def _emit_init(w: Writer, ops: list[str]) -> None:
    w("    def __init__(self, relay: FutureMap, impls: Mapping[str, Callable[..., Any]]) -> None:")
    w("        missing = [op for op in self.OPS if op not in impls]")
    w("        if missing:")
    w("            raise ValueError(")
    w('                f"{type(self).__name__} of `{ALGORITHM}` needs implementations of "')
    w("                f\"{', '.join(missing)} in `impls`\"")
    w("            )")
    w("        self.relay = relay")
    for name in ops:
        w(f"        {_impl_attr(name)} = impls[{name!r}]")
    w("")


def generate_steps(graphs: IterationGraphs) -> str:
    """Source of `PrefillOutputs`, `DecodeOutputs`, `PrefillStep` and `DecodeStep` (appended
    to the relay module)."""
    spec = graphs.spec
    early = {name for name, f in spec.fields.items() if f.publish == "early"}
    inputs = ", ".join(f"{name}: torch.Tensor" for name in spec.inputs)
    passed = ", ".join(f"{name}={name}" for name in spec.inputs)
    lines: list[str] = []
    w = lines.append

    _outputs_class(w, "PrefillOutputs", "prefill", graphs.prefill)
    _outputs_class(w, "DecodeOutputs", "decode", graphs.decode)

    prefill_ops = _ops_of(graphs.prefill)
    w("class PrefillStep:")
    w(
        f'    """Seed the relay of new requests of `{spec.algorithm}` (the spec\'s prefill step)."""\n'
    )
    w(f"    OPS: tuple[str, ...] = {tuple(prefill_ops)!r}\n")
    _emit_init(w, prefill_ops)
    w(f"    def __call__(self, ctx: Any, *, {inputs}) -> PrefillOutputs:")
    w('        """Run the prefill op and seed the relay rows of `req_pool_indices`."""')
    names = _var_names(graphs.prefill, "device", spec.inputs)
    _emit_steps(w, graphs.prefill, "device", "        ", early, names)
    _emit_stash(w, graphs.prefill, "        ", early, names)
    _return_outputs(w, "        ", "PrefillOutputs", graphs.prefill, names)
    w("\n")

    decode_ops = _ops_of(graphs.decode)
    host_steps = [s for s in spec.steps if s.placement == "host"]
    host_outputs = [f"{s.name}.{o}" for s in host_steps for o in s.writes]
    w("class DecodeStep:")
    w(f'    """One decode iteration of `{spec.algorithm}`, generated from its fx graph.\n')
    w("    `run_host` runs the host steps (outside any CUDA graph) and returns their outputs")
    w("    as `step.output`; `run_device` is the part a graph runner captures: resolve the")
    w("    relay, the device steps in spec order, publish early fields right after the step")
    w("    that writes them, stash the rest, and return `DecodeOutputs`. Each op is called")
    w("    as `impls[op](ctx, **inputs) -> dict of outputs`; `ctx` is the engine's and passes")
    w("    through untouched.")
    w('    """\n')
    w(f"    OPS: tuple[str, ...] = {tuple(decode_ops)!r}")
    w(f"    HOST_OUTPUTS: tuple[str, ...] = {tuple(host_outputs)!r}\n")
    _emit_init(w, decode_ops)

    w(f"    def run_host(self, ctx: Any, *, {inputs}) -> dict[str, torch.Tensor]:")
    if host_steps:
        names = _var_names(graphs.decode, "host", spec.inputs)
        produced = _emit_steps(w, graphs.decode, "host", "        ", early, names)
        _return_dict(w, "        ", produced)
    else:
        w("        return {}  # no host steps")
    w("")
    w("    def run_device(")
    w("        self,")
    w("        ctx: Any,")
    w("        *,")
    for name in spec.inputs:
        w(f"        {name}: torch.Tensor,")
    w("        host: Mapping[str, torch.Tensor],")
    w("    ) -> DecodeOutputs:")
    w("        relay = self.relay.resolve(req_pool_indices)")
    names = _var_names(graphs.decode, "device", spec.inputs)
    _emit_steps(w, graphs.decode, "device", "        ", early, names)
    _emit_stash(w, graphs.decode, "        ", early, names)
    _return_outputs(w, "        ", "DecodeOutputs", graphs.decode, names)
    w("")
    w(f"    def __call__(self, ctx: Any, *, {inputs}) -> DecodeOutputs:")
    w('        """Host steps, then the device part, eagerly (the CPU path)."""')
    w(f"        host = self.run_host(ctx, {passed})")
    w(f"        return self.run_device(ctx, {passed}, host=host)")
    return "\n".join(lines) + "\n"
