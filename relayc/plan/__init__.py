"""The relay plan: one typed description of an algorithm that every target reads.

Built once per algorithm from the validated spec and the graph passes
(:func:`build_plan`, :func:`plan_spec_file`); frozen dataclasses (:mod:`.model`):

* ``RelayPlan.fields``: one :class:`relayc.runtime.fields.RelayField` per relay field, in
  spec order -- name, dtype, row shape in named dims, lifetime (``alloc`` eager/lazy),
  ``init``/``poison``, host mirror (none, or lag / ring depth / generation check), owner
  (relay or a captured graph), publish (at the stash or early), export, doc and
  ``origin`` (``path:line``). The runtime and generated modules use the same class, so
  a field is described by one record from the plan to the buffer.
* ``RelayPlan.uses``: per field, the decode steps reading it, the step stashing it,
  and whether the prefill seeds it (the state a vLLM-style target updates after each
  step, slot by slot); ``RelayPlan.absent``: library fields the algorithm leaves out.
* ``RelayPlan.prefill`` / ``steps``: :class:`Step` with typed ``reads`` (a
  :class:`RelayValue`, :class:`InputValue` or :class:`StepValue` and its
  :class:`ValueType`), ``writes`` (with whether anything uses them), ``stashes`` (early
  or at the end) and the op's declared ``effects`` (:class:`relayc.nodes.registry.Effect`,
  e.g. the draft KV cache); ``op`` is the declaration, built in or brought by a plugin
  module (``RelayPlan.op_modules``).
* ``dims`` (:class:`Dim` with :class:`DimConstraint`), ``rules`` (the spec's conditions
  between dims, :class:`relayc.runtime.rules.DimRule`: the generated module lists them and
  the engine checks them when it binds the dims), ``inputs``, the engine outputs of each
  phase, ``capture`` buckets, ``staging`` and the SGLang plugin name.

Every record keeps its spec location, so a target refusing a construct points at the
line that asked for it: a target declares a :class:`TargetSupport` (the constructs of
:data:`CONSTRUCTS` and the built-in ops it implements) and raises the located errors
:func:`unsupported` returns (the engine target's: ``relayc.compiler.codegen.ENGINE_TARGET``).
"""

from __future__ import annotations

from relayc.plan.build import build_plan, plan_from_graphs, plan_spec_file
from relayc.plan.model import (
    AbsentField,
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
    Stash,
    Step,
    StepValue,
    Value,
    ValueType,
    Write,
)
from relayc.plan.support import CONSTRUCTS, ConstructUse, TargetSupport, construct_uses, unsupported
from relayc.runtime.fields import HostMirror, RelayField
from relayc.runtime.rules import DimRule

__all__ = [
    "CONSTRUCTS",
    "AbsentField",
    "ConstructUse",
    "Dim",
    "DimConstraint",
    "DimRule",
    "EngineInput",
    "EngineOutput",
    "FieldUse",
    "HostMirror",
    "InputValue",
    "PluginModule",
    "Read",
    "RelayField",
    "RelayPlan",
    "RelayValue",
    "Stash",
    "Step",
    "StepValue",
    "TargetSupport",
    "Value",
    "ValueType",
    "Write",
    "build_plan",
    "construct_uses",
    "plan_from_graphs",
    "plan_spec_file",
    "unsupported",
]
