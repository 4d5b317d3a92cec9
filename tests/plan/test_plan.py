"""The relay plan: what it records, that it is the one field record, and targets' support."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from relayc.compiler.codegen import ENGINE_TARGET, generate_relay_module
from relayc.compiler.writer import compile_spec, engine_specs
from relayc.plan import (
    DimConstraint,
    InputValue,
    RelayField,
    RelayValue,
    StepValue,
    ValueType,
    plan_spec_file,
)
from relayc.plan.explain import explain_plan
from relayc.plan.support import TargetSupport, construct_uses, unsupported
from relayc.specs.errors import SpecErrors
from relayc.specs.loader import BUNDLED_DIR


def test_the_plan_types_reads_writes_and_uses() -> None:
    plan = plan_spec_file(BUNDLED_DIR / "eagle.yaml")
    assert [f.name for f in plan.fields][:3] == ["bonus_tokens", "new_seq_lens", "topk_p"]
    topk_p = plan.field("topk_p")
    assert (topk_p.dtype, topk_p.shape, topk_p.alloc) == ("float32", ("topk",), "lazy")
    assert topk_p.origin.startswith("relayc/specs/common.yaml:")
    seq = plan.field("new_seq_lens")
    assert seq.early and seq.host_mirror is not None and seq.host_mirror.waits
    assert plan.mirrored == (seq,) and plan.early == (seq,)
    draft = plan.step("draft")
    reads = {r.param: r for r in draft.reads}
    assert reads["topk_p"].value == RelayValue("topk_p")
    assert reads["topk_p"].type == ValueType("float32", ("topk",))
    assert reads["req_pool_indices"].value == InputValue("req_pool_indices")
    use = plan.use("topk_p")
    assert use.readers == ("draft",) and use.stashed_by == "draft_extend"
    assert use.seeded_by_prefill
    assert plan.decode_outputs[0].value == StepValue("accept", "bonus_tokens")
    assert plan.staging is not None and plan.staging.capture_hidden == "last"
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.algorithm = "other"  # type: ignore[misc]


def test_effects_are_declared_not_dummy_outputs() -> None:
    plan = plan_spec_file(BUNDLED_DIR / "dflash.yaml")
    inject = plan.step("inject_kv")
    assert [e.text for e in inject.effects] == ["writes draft_kv_cache"]
    assert [e.text for e in plan.step("draft").effects] == ["reads draft_kv_cache"]
    assert [e.text for e in plan.prefill.effects] == ["writes draft_kv_cache"]
    assert "# effect: writes draft_kv_cache" in generate_relay_module(plan)
    assert not inject.writes  # no dummy output keeps the step alive
    explained = explain_plan(plan)
    assert "      writes   -\n      effects  writes draft_kv_cache" in explained


def test_the_plan_says_which_library_fields_are_left_out() -> None:
    plan = plan_spec_file(BUNDLED_DIR / "none.yaml")
    absent = [a.name for a in plan.absent]
    assert "topk_p" in absent and "bonus_tokens" not in absent
    assert all(a.library == "relayc/specs/common.yaml" for a in plan.absent)


@pytest.mark.parametrize("path", engine_specs(), ids=lambda p: p.stem)
def test_generated_fields_are_the_plans_records(path) -> None:
    """One class describes a field: the generated FIELDS are the plan's RelayField records
    (less the doc, which the module keeps in RelayPayload's comments)."""
    plan = plan_spec_file(path)
    module = importlib.import_module(f"relayc.generated.{plan.algorithm}")
    assert all(type(f) is RelayField for f in module.FIELDS)
    assert module.FIELDS == tuple(dataclasses.replace(f, doc="") for f in plan.fields)


def test_dim_constraints_say_what_is_wrong() -> None:
    block = DimConstraint(minimum=1, maximum=64, multiple_of=2, reason="the verify kernel")
    assert block.violation("topk", 8) is None
    assert block.violation("topk", 0) == "dim `topk` must be at least 1 (the verify kernel), got 0"
    assert "at most 64" in (block.violation("topk", 128) or "")
    assert "a multiple of 2" in (block.violation("topk", 3) or "")
    assert "power of two" in (DimConstraint(power_of_two=True).violation("k", 6) or "")
    plan = plan_spec_file(BUNDLED_DIR / "eagle.yaml")
    topk = next(d for d in plan.dims if d.name == "topk")
    assert topk.violations(0) and not topk.violations(4)


def test_the_engine_refuses_what_it_does_not_implement_located() -> None:
    plan = plan_spec_file(BUNDLED_DIR / "dspark.yaml")
    errors = unsupported(plan, ENGINE_TARGET)
    text = "\n".join(e.render() for e in errors)
    assert "relayc/specs/dspark.yaml:" in text
    assert "the engine target does not implement `owner: graph` (field `new_seq_lens`" in text
    assert "does not implement `host_mirror ring` (field `confidence`" in text
    assert "has no implementation of op `dspark_draft` (step `draft`" in text
    with pytest.raises(SpecErrors) as caught:
        compile_spec(BUNDLED_DIR / "uno.yaml", "out")
    assert "op `uno_draft`" in caught.value.render()
    assert all(e.loc.path == "relayc/specs/uno.yaml" for e in caught.value.errors)


def test_a_target_without_a_construct_refuses_it() -> None:
    plan = plan_spec_file(BUNDLED_DIR / "eagle.yaml")
    bare = TargetSupport("bare", frozenset({"alloc: lazy"}))
    refused = {(e.loc.line, e.message.split("`")[1]) for e in unsupported(plan, bare)}
    used = {u.construct for u in construct_uses(plan)}
    assert used == {"alloc: lazy", "publish: early", "host_mirror: true", "staging", "export"}
    assert {c for _, c in refused} == used - {"alloc: lazy"}
    assert not unsupported(plan, ENGINE_TARGET)
    with pytest.raises(ValueError, match="unknown constructs"):
        TargetSupport("typo", frozenset({"owner: grpah"}))


def test_the_engine_target_lists_the_ops_the_engine_implements() -> None:
    importlib.import_module("relayc.engine.ops")
    from relayc.engine.algorithms.registry import drafting_implementations
    from relayc.engine.ops.registry import IMPLS
    from relayc.nodes.registry import builtin_op_names

    # The shared ops, and the built-in ops that drive an algorithm's drafter (its module's
    # impls); an op an algorithm declares itself (Algorithm.ops) is a plugin op.
    drafting = {op for op in drafting_implementations() if op in builtin_op_names()}
    assert ENGINE_TARGET.ops == frozenset(IMPLS) | drafting
