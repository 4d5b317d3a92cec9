"""The relay plan's records: frozen dataclasses, built once per algorithm by :mod:`.build`.

Every record keeps the spec location it comes from (``loc``), so a target that refuses
something points at the line that asked for it. Names are the spec's; order is the spec's
(the order of everything generated).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from relayc.nodes.registry import Effect, Op
from relayc.runtime.fields import RelayField
from relayc.runtime.rules import DimRule
from relayc.specs.errors import SourceLoc

Phase = Literal["prefill", "decode"]
Placement = Literal["device", "host"]


def shape_text(shape: tuple[str | int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


@dataclass(frozen=True)
class ValueType:
    """A per-request tensor type: a dtype name and a row shape in dims (batch implied)."""

    dtype: str  # a spec dtype name, `model`, or `any` (an op parameter taking any dtype)
    shape: tuple[str | int, ...] = ()

    def rows_text(self, rows: str = "bs") -> str:
        """``[bs, topk] float32``: how generated comments say it."""
        return f"[{', '.join([rows, *(str(d) for d in self.shape)])}] {self.dtype}"

    @property
    def text(self) -> str:
        """``float32 [topk]``: how error messages and `relayc explain` say it."""
        return f"{self.dtype} {shape_text(self.shape)}"


@dataclass(frozen=True)
class DimConstraint:
    """A condition a dim's bound value must meet, checked when the engine binds it.

    The plan gives each dim ``minimum >= 1``; a later spec syntax (the plugins issue) lets
    a spec or an op declaration add bounds: ``maximum``, ``multiple_of`` (a kernel's block
    size) or ``power_of_two``. ``reason`` says who needs it, for the error message.
    """

    minimum: int = 1
    maximum: int | None = None
    multiple_of: int = 1
    power_of_two: bool = False
    reason: str = ""

    def violation(self, dim: str, value: int) -> str | None:
        """Why ``value`` breaks this constraint for ``dim``, or None when it holds."""
        why = f" ({self.reason})" if self.reason else ""
        if value < self.minimum:
            return f"dim `{dim}` must be at least {self.minimum}{why}, got {value}"
        if self.maximum is not None and value > self.maximum:
            return f"dim `{dim}` must be at most {self.maximum}{why}, got {value}"
        if value % self.multiple_of:
            return f"dim `{dim}` must be a multiple of {self.multiple_of}{why}, got {value}"
        if self.power_of_two and value & (value - 1):
            return f"dim `{dim}` must be a power of two{why}, got {value}"
        return None


@dataclass(frozen=True)
class Dim:
    """A symbolic size bound at run time: a default, or who supplies it."""

    name: str
    default: int | None
    supplied_by: str | None
    doc: str
    constraints: tuple[DimConstraint, ...]
    loc: SourceLoc

    def violations(self, value: int) -> list[str]:
        return [v for c in self.constraints if (v := c.violation(self.name, value))]


@dataclass(frozen=True)
class EngineInput:
    """A per-iteration value the engine provides (`seq_lens`, `req_pool_indices`)."""

    name: str
    type: ValueType
    device: Placement
    doc: str
    loc: SourceLoc


@dataclass(frozen=True)
class RelayValue:
    """`relay.<field>`: a relay field as resolved at the start of the iteration."""

    field: str

    def __str__(self) -> str:
        return f"relay.{self.field}"


@dataclass(frozen=True)
class InputValue:
    """`input.<name>`: an engine input."""

    input: str

    def __str__(self) -> str:
        return f"input.{self.input}"


@dataclass(frozen=True)
class StepValue:
    """`<step>.<output>`: an output of an earlier step."""

    step: str
    output: str

    def __str__(self) -> str:
        return f"{self.step}.{self.output}"


Value = RelayValue | InputValue | StepValue


@dataclass(frozen=True)
class Read:
    """An op parameter bound to a value, with the value's type."""

    param: str
    value: Value
    type: ValueType
    loc: SourceLoc


@dataclass(frozen=True)
class Write:
    """An op output a step writes; ``used``: a later step, a stash or the engine reads it."""

    output: str
    type: ValueType
    used: bool
    loc: SourceLoc


@dataclass(frozen=True)
class Stash:
    """A step output written into a relay field (at the step when the field is early)."""

    field: str
    output: str
    early: bool
    loc: SourceLoc


@dataclass(frozen=True)
class Step:
    """One step of the prefill or of a decode iteration: an op with typed reads, writes,
    stashes and the op's declared effects."""

    name: str
    op: Op  # the declaration (built-in, or a plugin's: see RelayPlan.op_modules)
    phase: Phase
    placement: Placement
    reads: tuple[Read, ...]
    writes: tuple[Write, ...]
    stashes: tuple[Stash, ...]
    effects: tuple[Effect, ...]
    doc: str
    loc: SourceLoc

    def write(self, output: str) -> Write:
        return next(w for w in self.writes if w.output == output)


@dataclass(frozen=True)
class FieldUse:
    """How one relay field crosses the iteration boundary: who reads and who writes it."""

    field: str
    readers: tuple[str, ...]  # decode steps reading `relay.<field>`, in order
    stashed_by: str | None  # the decode step whose output is stashed into it
    seeded_by_prefill: bool


@dataclass(frozen=True)
class AbsentField:
    """A field an imported library defines that this algorithm does not relay."""

    name: str
    library: str  # the library file's path
    loc: SourceLoc  # the `fields:` list of the import that leaves it out


@dataclass(frozen=True)
class EngineOutput:
    """A value the engine reads back after a phase (the spec's `outputs:` entries)."""

    name: str
    value: StepValue
    type: ValueType
    loc: SourceLoc


@dataclass(frozen=True)
class Capture:
    batch_sizes: tuple[int, ...]
    max_batch_size: int
    loc: SourceLoc


@dataclass(frozen=True)
class Staging:
    """`staging:`: a request may enter decode with only its relay slot."""

    capture_hidden: str  # `last` or `none`
    doc: str
    text: str  # how `relayc explain` says it
    loc: SourceLoc


@dataclass(frozen=True)
class PluginModule:
    """A module of plugin ops the spec names (`ops:`, or `--ops` on the command line)."""

    name: str
    from_cli: bool
    loc: SourceLoc


@dataclass(frozen=True)
class RelayPlan:
    """Everything a target needs to emit one algorithm's relay and decode step.

    Built once by :func:`relayc.plan.build_plan` from the validated spec and the graph
    passes; targets, ``relayc explain`` and ``relayc graph`` read this and nothing else.
    """

    algorithm: str
    algorithm_loc: SourceLoc  # the `algorithm:` name, for errors about it
    description: str
    spec_path: str  # as the user named it (shown in generated headers)
    spec_hash: str
    loc: SourceLoc  # the spec file's first line
    dims: tuple[Dim, ...]
    rules: tuple[DimRule, ...]  # the spec's `rules:` between dims, in spec order
    inputs: tuple[EngineInput, ...]
    fields: tuple[RelayField, ...]
    field_locs: Mapping[str, SourceLoc]  # field -> where it is defined
    uses: tuple[FieldUse, ...]
    absent: tuple[AbsentField, ...]
    prefill: Step
    steps: tuple[Step, ...]  # the decode iteration, in order
    prefill_outputs: tuple[EngineOutput, ...]
    decode_outputs: tuple[EngineOutput, ...]
    capture: Capture
    staging: Staging | None
    sglang_plugin: str | None
    sglang_plugin_loc: SourceLoc | None  # the `sglang:` section (its `plugin:` when named)
    sglang_hooks: Mapping[str, str]  # SGLang's fixed-name call site -> the field it reaches
    sglang_members: tuple[str, ...]  # SpeculativeAlgorithm members relayed (`sglang:`)
    sglang_when: str | None  # the SGLang config flag they are relayed under
    sglang_fallback: tuple[str, ...]  # members relayed when no spec lists them
    op_modules: Mapping[str, str | None]  # op name -> plugin module (None: built in)
    plugins: tuple[PluginModule, ...]  # the plugin-op modules, in the order they are asked
    sample_dims: Mapping[str, int]  # the sizes the passes checked shapes with
    vllm_method: str | None = None  # vLLM's speculative method (`vllm: {method:}`); None: none
    vllm_loc: SourceLoc | None = None  # the `vllm:` section, for errors about it
    vllm_hooks: Mapping[str, str] = dataclasses.field(
        default_factory=dict
    )  # vLLM state -> relay field

    def field(self, name: str) -> RelayField:
        return next(f for f in self.fields if f.name == name)

    def use(self, name: str) -> FieldUse:
        return next(u for u in self.uses if u.field == name)

    def step(self, name: str) -> Step:
        return next(s for s in (self.prefill, *self.steps) if s.name == name)

    @property
    def early(self) -> tuple[RelayField, ...]:
        """Fields published right after the step that writes them."""
        return tuple(f for f in self.fields if f.early)

    @property
    def mirrored(self) -> tuple[RelayField, ...]:
        """Fields with a host copy that a host read waits for (`host_mirror: true`)."""
        return tuple(f for f in self.fields if f.host_mirror is not None and f.host_mirror.waits)

    @property
    def host_steps(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.placement == "host")

    @property
    def ops(self) -> tuple[Op, ...]:
        """Every op the algorithm calls, in first-use order (prefill first)."""
        seen: dict[str, Op] = {}
        for step in (self.prefill, *self.steps):
            seen.setdefault(step.op.name, step.op)
        return tuple(seen.values())
