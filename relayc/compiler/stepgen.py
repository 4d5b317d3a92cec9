"""Generate `PrefillStep` and `DecodeStep` of an algorithm from its fx graphs.

A decode iteration is split where the spec splits it: host steps (e.g. n-gram
drafting) run first, outside any CUDA graph; their outputs become static inputs
of the device part, which resolves the relay, runs the device steps in order,
publishes early fields right after the step that produces them and stashes the
rest at the end. The engine passes each op's implementation in ``impls``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.fx as fx

from relayc.graph.builder import IterationGraphs
from relayc.nodes.registry import Op
from relayc.specs.loader import Spec

Writer = Callable[[str], None]


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


def _arg(value: fx.Node) -> str:
    kind = value.meta["kind"]
    if kind == "relay":
        return f"relay.{value.meta['ident']}"
    if kind == "input":
        return value.meta["ident"]
    step, output = value.meta["step"], value.meta["output"]
    if step.placement == "host":
        return f'host["{step.name}.{output}"]'
    return f"{step.name}_{output}"


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


def _emit_steps(
    w: Writer, spec: Spec, graph: fx.Graph, placement: str, indent: str, early: set[str]
) -> list[tuple[str, str]]:
    """Emit the calls of the steps placed on ``placement``; returns (key, variable) pairs."""
    produced: list[tuple[str, str]] = []
    stashed = next(n for n in graph.nodes if n.op == "output").args[0]
    for node in graph.nodes:
        if node.meta.get("kind") != "step" or node.meta["step"].placement != placement:
            continue
        step = node.meta["step"]
        op: Op = node.target  # type: ignore[assignment]
        loc = step.loc
        w(f"{indent}# {loc.path}:{loc.line} step `{step.name}` ({op.name})")
        args = [f"{param}={_arg(value)}" for param, value in node.kwargs.items()]
        call_lines(w, indent, f"{step.name} = {_impl_attr(op.name)}", ["ctx", *args])
        for out in step.writes:
            var = f"{step.name}_{out}"
            w(f'{indent}{var} = {step.name}["{out}"]  # {_type_comment(op, out)}')
            produced.append((f"{step.name}.{out}", var))
        published = [
            f for f, v in stashed.items() if f in early and v.meta["step"].name == step.name
        ]
        if published:
            args = ", ".join(f"{f}={step.name}_{stashed[f].meta['output']}" for f in published)
            w(f"{indent}self.relay.publish(req_pool_indices, {args})")
    return produced


def _emit_stash(w: Writer, graph: fx.Graph, indent: str, early: set[str]) -> None:
    stashed = next(n for n in graph.nodes if n.op == "output").args[0]
    late = {f: v for f, v in stashed.items() if f not in early}
    if not late:
        return
    w(f"{indent}self.relay.stash(")
    w(f"{indent}    req_pool_indices,")
    w(f"{indent}    RelayPayload(")
    for field_name, value in late.items():
        w(f"{indent}        {field_name}={value.meta['step'].name}_{value.meta['output']},")
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
    """Source of `PrefillStep` and `DecodeStep` (appended to the relay module)."""
    spec = graphs.spec
    early = {name for name, f in spec.fields.items() if f.publish == "early"}
    inputs = ", ".join(f"{name}: torch.Tensor" for name in spec.inputs)
    passed = ", ".join(f"{name}={name}" for name in spec.inputs)
    lines: list[str] = []
    w = lines.append

    prefill_ops = _ops_of(graphs.prefill)
    w("class PrefillStep:")
    w(
        f'    """Seed the relay of new requests of `{spec.algorithm}` (the spec\'s prefill step)."""\n'
    )
    w(f"    OPS: tuple[str, ...] = {tuple(prefill_ops)!r}\n")
    _emit_init(w, prefill_ops)
    w(f"    def __call__(self, ctx: Any, *, {inputs}) -> dict[str, torch.Tensor]:")
    w('        """Run the prefill op and seed the relay rows of `req_pool_indices`."""')
    produced = _emit_steps(w, spec, graphs.prefill, "device", "        ", early)
    _emit_stash(w, graphs.prefill, "        ", early)
    _return_dict(w, "        ", produced)
    w("\n")

    decode_ops = _ops_of(graphs.decode)
    host_steps = [s for s in spec.steps if s.placement == "host"]
    host_outputs = [f"{s.name}.{o}" for s in host_steps for o in s.writes]
    w("class DecodeStep:")
    w(f'    """One decode iteration of `{spec.algorithm}`, generated from its fx graph.\n')
    w("    `run_host` runs the host steps (outside any CUDA graph); `run_device` is the part a")
    w("    graph runner captures: resolve the relay, the device steps in spec order, publish")
    w("    early fields right after the step that writes them, stash the rest. Each op is")
    w("    called as `impls[op](ctx, **inputs) -> dict of outputs`; `ctx` is the engine's")
    w("    and passes through untouched. Both return every step output as `step.output`.")
    w('    """\n')
    w(f"    OPS: tuple[str, ...] = {tuple(decode_ops)!r}")
    w(f"    HOST_OUTPUTS: tuple[str, ...] = {tuple(host_outputs)!r}\n")
    _emit_init(w, decode_ops)

    w(f"    def run_host(self, ctx: Any, *, {inputs}) -> dict[str, torch.Tensor]:")
    if host_steps:
        produced = _emit_steps(w, spec, graphs.decode, "host", "        ", early)
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
    w("    ) -> dict[str, torch.Tensor]:")
    w("        relay = self.relay.resolve(req_pool_indices)")
    produced = _emit_steps(w, spec, graphs.decode, "device", "        ", early)
    _emit_stash(w, graphs.decode, "        ", early)
    _return_dict(w, "        ", produced)
    w("")
    w(f"    def __call__(self, ctx: Any, *, {inputs}) -> dict[str, torch.Tensor]:")
    w('        """Host steps, then the device part, eagerly (the CPU path)."""')
    w(f"        host = self.run_host(ctx, {passed})")
    w(f"        return {{**host, **self.run_device(ctx, {passed}, host=host)}}")
    return "\n".join(lines) + "\n"
