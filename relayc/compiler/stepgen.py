"""Generate `PrefillStep` and `DecodeStep` of an algorithm from its relay plan.

Reads the relay plan only (:mod:`relayc.plan`). A decode iteration is split where the
spec splits it: host steps (e.g. n-gram drafting) run first, outside any CUDA graph;
their outputs become static inputs of the device part, which resolves the relay, runs
the device steps in order, publishes early fields right after the step that produces
them and stashes the rest at the end. The engine passes each op's implementation in
``impls``.

What the steps return is the spec's `outputs:` section, as two dataclasses
(`PrefillOutputs`, `DecodeOutputs`): the engine reads their attributes, so a
renamed step or output changes the spec's `outputs:` and nothing in the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from relayc.compiler.output import comment_text
from relayc.plan.model import (
    EngineOutput,
    InputValue,
    RelayPlan,
    RelayValue,
    Step,
    Value,
)
from relayc.specs.reserved import GENERATED_NAMES

Writer = Callable[[str], None]
_LINE_LENGTH = 100  # the project's (and the generated code's) ruff line length
# (step name, output name) -> the local variable holding that output in a step method
VarNames = dict[tuple[str, str], str]


def _impl_attr(op_name: str) -> str:
    return f"self._{op_name}"


def _ops_of(steps: Sequence[Step]) -> list[str]:
    names: list[str] = []
    for step in steps:
        if step.op.name not in names:
            names.append(step.op.name)
    return names


def _var_names(steps: Sequence[Step], placement: str, inputs: Collection[str]) -> VarNames:
    """Local variable of each output of the steps on ``placement`` (one generated method).

    An output is held in ``<step>_<output>``, except where the output's name already starts
    with ``<step>_`` (`accept.accept_index`, `draft.draft_tokens`): then the output's name
    alone, as long as it clashes with no other name the method defines or reads (the other
    outputs' variables under either spelling, the step results, the inputs and the
    generated module's own names), so doubled names like `accept_accept_index` do not appear.
    """
    placed = [s for s in steps if s.placement == placement]
    full: VarNames = {}
    short: VarNames = {}
    for step in placed:
        for write in step.writes:
            out = write.output
            full[step.name, out] = f"{step.name}_{out}"
            short[step.name, out] = out if out.startswith(f"{step.name}_") else f"{step.name}_{out}"
    taken = {*GENERATED_NAMES, *inputs, *(s.name for s in placed)}
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


def _arg(value: Value, plan: RelayPlan, names: VarNames) -> str:
    if isinstance(value, RelayValue):
        return f"relay.{value.field}"
    if isinstance(value, InputValue):
        return value.input
    if plan.step(value.step).placement == "host":
        return f'host["{value.step}.{value.output}"]'
    return names[value.step, value.output]


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


_PHASE_TEXT = {"prefill": "the prefill", "decode": "a decode iteration"}


def _outputs_class(w: Writer, name: str, phase: str, outputs: Sequence[EngineOutput]) -> None:
    w("@dataclass")
    w(f"class {name}:")
    w(
        f'    """What the engine reads after {_PHASE_TEXT[phase]} (the spec\'s `outputs.{phase}`)."""\n'
    )
    for out in outputs:
        w(f"    {out.name}: torch.Tensor  # {out.type.rows_text()} ({out.value})")
    w("\n")


def _return_outputs(
    w: Writer,
    indent: str,
    name: str,
    outputs: Sequence[EngineOutput],
    plan: RelayPlan,
    names: VarNames,
) -> None:
    args = [f"{out.name}={_arg(out.value, plan, names)}" for out in outputs]
    call_lines(w, indent, f"return {name}", args)


def _emit_steps(
    w: Writer,
    plan: RelayPlan,
    steps: Sequence[Step],
    placement: str,
    indent: str,
    names: VarNames,
) -> list[tuple[str, str]]:
    """Emit the calls of the steps placed on ``placement``; returns (key, variable) pairs."""
    produced: list[tuple[str, str]] = []
    for step in steps:
        if step.placement != placement:
            continue
        loc = step.loc
        w(f"{indent}# {comment_text(loc.path)}:{loc.line} step `{step.name}` ({step.op.name})")
        for effect in step.effects:
            w(f"{indent}# effect: {effect.text}")
        args = [f"{read.param}={_arg(read.value, plan, names)}" for read in step.reads]
        # Host outputs all go to run_device; device outputs nothing reads (no step, stash or
        # `outputs:` entry) get no variable.
        kept = [write for write in step.writes if placement == "host" or write.used]
        head = f"{step.name} = " if kept else ""
        call_lines(w, indent, f"{head}{_impl_attr(step.op.name)}", ["ctx", *args])
        for write in kept:
            var = names[step.name, write.output]
            line = f'{indent}{var} = {step.name}["{write.output}"]'
            comment = f"# {write.type.rows_text()}"
            if len(line) + 2 + len(comment) <= _LINE_LENGTH:
                w(f"{line}  {comment}")
            else:
                # On its own line above: a trailing comment past the line length makes
                # `ruff format` break the subscript over three lines.
                w(f"{indent}{comment}")
                w(line)
            produced.append((f"{step.name}.{write.output}", var))
        published = [stash for stash in step.stashes if stash.early]
        if published:
            args_text = ", ".join(
                f"{stash.field}={names[step.name, stash.output]}" for stash in published
            )
            w(f"{indent}self.relay.publish(req_pool_indices, {args_text})")
    return produced


def _emit_stash(w: Writer, steps: Sequence[Step], indent: str, names: VarNames) -> None:
    late = [(step, stash) for step in steps for stash in step.stashes if not stash.early]
    if not late:
        return
    w(f"{indent}self.relay.stash(")
    w(f"{indent}    req_pool_indices,")
    w(f"{indent}    RelayPayload(")
    for step, stash in late:
        w(f"{indent}        {stash.field}={names[step.name, stash.output]},")
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


def generate_steps(plan: RelayPlan) -> str:
    """Source of `PrefillOutputs`, `DecodeOutputs`, `PrefillStep` and `DecodeStep` (appended
    to the relay module)."""
    input_names = [i.name for i in plan.inputs]
    inputs = ", ".join(f"{name}: torch.Tensor" for name in input_names)
    passed = ", ".join(f"{name}={name}" for name in input_names)
    lines: list[str] = []
    w = lines.append

    _outputs_class(w, "PrefillOutputs", "prefill", plan.prefill_outputs)
    _outputs_class(w, "DecodeOutputs", "decode", plan.decode_outputs)

    prefill = (plan.prefill,)
    prefill_ops = _ops_of(prefill)
    w("class PrefillStep:")
    w(
        f'    """Seed the relay of new requests of `{plan.algorithm}` (the spec\'s prefill step)."""\n'
    )
    w(f"    OPS: tuple[str, ...] = {tuple(prefill_ops)!r}\n")
    _emit_init(w, prefill_ops)
    w(f"    def __call__(self, ctx: Any, *, {inputs}) -> PrefillOutputs:")
    w('        """Run the prefill op and seed the relay rows of `req_pool_indices`."""')
    names = _var_names(prefill, "device", input_names)
    _emit_steps(w, plan, prefill, "device", "        ", names)
    _emit_stash(w, prefill, "        ", names)
    _return_outputs(w, "        ", "PrefillOutputs", plan.prefill_outputs, plan, names)
    w("\n")

    decode_ops = _ops_of(plan.steps)
    host_outputs = [f"{s.name}.{o.output}" for s in plan.host_steps for o in s.writes]
    w("class DecodeStep:")
    w(f'    """One decode iteration of `{plan.algorithm}`, generated from its relay plan.\n')
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
    if plan.host_steps:
        names = _var_names(plan.steps, "host", input_names)
        produced = _emit_steps(w, plan, plan.steps, "host", "        ", names)
        _return_dict(w, "        ", produced)
    else:
        w("        return {}  # no host steps")
    w("")
    w("    def run_device(")
    w("        self,")
    w("        ctx: Any,")
    w("        *,")
    for name in input_names:
        w(f"        {name}: torch.Tensor,")
    w("        host: Mapping[str, torch.Tensor],")
    w("    ) -> DecodeOutputs:")
    w("        relay = self.relay.resolve(req_pool_indices)")
    names = _var_names(plan.steps, "device", input_names)
    _emit_steps(w, plan, plan.steps, "device", "        ", names)
    _emit_stash(w, plan.steps, "        ", names)
    _return_outputs(w, "        ", "DecodeOutputs", plan.decode_outputs, plan, names)
    w("")
    w(f"    def __call__(self, ctx: Any, *, {inputs}) -> DecodeOutputs:")
    w('        """Host steps, then the device part, eagerly (the CPU path)."""')
    w(f"        host = self.run_host(ctx, {passed})")
    w(f"        return self.run_device(ctx, {passed}, host=host)")
    return "\n".join(lines) + "\n"
