"""What a target implements, and located errors for what a plan asks beyond it.

Each target declares a :class:`TargetSupport`: the spec constructs it implements (the
names in :data:`CONSTRUCTS`) and the built-in ops it has implementations of. Compiling a
plan for a target that lacks something is a located error naming the construct, the spec
line that uses it and the target -- never a silent drop (the engine target once compiled
`owner: graph` and host rings as plain device fields).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from relayc.plan.model import RelayPlan
from relayc.specs.errors import SourceLoc, SpecError

# The constructs a spec may use, as `relayc explain` and the errors name them.
CONSTRUCTS: tuple[str, ...] = (
    "alloc: lazy",
    "publish: early",
    "host_mirror: true",  # one pinned copy a host read waits for
    "host_mirror lag",  # a host read of the copy `lag` publishes old, never waiting
    "host_mirror ring",  # more than one pinned copy
    "host_mirror generation_check",
    "owner: graph",
    "staging",
    "placement: host",
    "export",
)


@dataclass(frozen=True)
class ConstructUse:
    """One place a plan uses a construct: where, and what (`field `confidence``)."""

    construct: str
    subject: str
    loc: SourceLoc


@dataclass(frozen=True)
class TargetSupport:
    """What one target implements.

    ``ops``: the built-in ops it has implementations of (None: every op); ops a plugin
    module brings are implemented by whoever brings them (the engine takes them in
    ``impls``), so they count as supported when ``plugin_ops``. ``notes`` says, per
    construct, how the target implements it where that is not obvious (`relayc explain`
    and the generated module quote it).
    """

    target: str
    constructs: frozenset[str]
    ops: frozenset[str] | None = None
    plugin_ops: bool = True
    notes: Mapping[str, str] = field(default_factory=dict)
    alternative: str = ""  # what to do instead, for the hint (`compile with --target sglang`)

    def __post_init__(self) -> None:
        unknown = sorted(self.constructs - set(CONSTRUCTS))
        if unknown:
            raise ValueError(f"target `{self.target}` declares unknown constructs {unknown}")


def construct_uses(plan: RelayPlan) -> list[ConstructUse]:
    """Every construct ``plan`` uses, in spec order."""
    uses: list[ConstructUse] = []
    for f in plan.fields:
        loc = plan.field_locs[f.name]
        subject = f"field `{f.name}`"
        if f.lazy:
            uses.append(ConstructUse("alloc: lazy", subject, loc))
        if f.early:
            uses.append(ConstructUse("publish: early", subject, loc))
        mirror = f.host_mirror
        if mirror is not None:
            if mirror.waits:
                uses.append(ConstructUse("host_mirror: true", subject, loc))
            if mirror.lag:
                uses.append(ConstructUse("host_mirror lag", subject, loc))
            if mirror.depth > 1:
                uses.append(ConstructUse("host_mirror ring", subject, loc))
            if mirror.generation_check:
                uses.append(ConstructUse("host_mirror generation_check", subject, loc))
        if f.owner == "graph":
            uses.append(ConstructUse("owner: graph", subject, loc))
        if f.export:
            uses.append(ConstructUse("export", subject, loc))
    if plan.staging is not None:
        uses.append(ConstructUse("staging", "the algorithm", plan.staging.loc))
    for step in plan.host_steps:
        uses.append(ConstructUse("placement: host", f"step `{step.name}`", step.loc))
    return uses


def unsupported(plan: RelayPlan, support: TargetSupport) -> list[SpecError]:
    """Located errors for every construct and op of ``plan`` that ``support`` lacks."""
    instead = f"; or {support.alternative}" if support.alternative else ""
    errors = [
        SpecError(
            use.loc,
            f"the {support.target} target does not implement `{use.construct}` "
            f"({use.subject} of `{plan.algorithm}`)",
            f"drop `{use.construct}` from {use.subject}{instead}",
        )
        for use in construct_uses(plan)
        if use.construct not in support.constructs
    ]
    if support.ops is not None:
        for step in (plan.prefill, *plan.steps):
            plugin = plan.op_modules.get(step.op.name) is not None
            if step.op.name in support.ops or (plugin and support.plugin_ops):
                continue
            errors.append(
                SpecError(
                    step.loc,
                    f"the {support.target} target has no implementation of op "
                    f"`{step.op.name}` (step `{step.name}` of `{plan.algorithm}`)",
                    f"use an op the {support.target} target implements, or bring the op "
                    f"from a plugin module listed under `ops:`{instead}",
                )
            )
    return errors
