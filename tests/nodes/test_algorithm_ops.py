"""Each algorithm's own ops are declared in its module (``Algorithm.ops``) and reach the
compiler through its entry point, as a third-party package's do; relayc/nodes/ops.py holds
only the shared ones."""

from __future__ import annotations

import pytest

from relayc.engine.algorithms import Algorithm, algorithms
from relayc.nodes import get_op
from relayc.nodes.registry import builtin_op_names, plugin_op_package
from relayc.plan import plan_spec_file

SHARED = {
    "target_prefill",
    "target_decode",
    "sample",
    "build_tree",
    "target_verify",
    "accept_tree",
    "compact_accepted_kv",
    "accept_chain",
    "accept_chain_block",
}
# SGLang-only drafting still declared in nodes (relayc/nodes/ops.py says why).
SGLANG_ONLY = {"dspark_draft", "uno_prefill", "uno_draft"}


def test_nodes_declare_only_the_shared_ops() -> None:
    assert builtin_op_names() == SHARED | SGLANG_ONLY


@pytest.mark.parametrize("algorithm", algorithms(), ids=lambda a: a.name)
def test_each_op_a_spec_names_is_shared_or_declared_by_its_algorithm(algorithm: Algorithm) -> None:
    plan = plan_spec_file(algorithm.spec)
    declared = {op.name: op for op in algorithm.ops}
    for step in (plan.prefill, *plan.steps):
        name = step.op.name
        if name in builtin_op_names():
            continue
        assert declared.get(name) is step.op, f"`{algorithm.name}` does not declare `{name}`"


def test_an_algorithm_op_names_the_module_that_declares_it() -> None:
    op = get_op("eagle_draft")
    assert op is not None and op.inputs["topk_p"].shape == ("topk",)
    assert plugin_op_package(op) == "relayc.engine.algorithms.eagle:ALGORITHM"
    # one declaration, listed by both algorithms that name it
    assert (
        plugin_op_package(get_op("dflash_prefill")) == "relayc.engine.algorithms.dflash:ALGORITHM"
    )
