"""``eagle3``: an EAGLE-3 head (fc over three target layers, its own draft vocabulary)
drafting a tree; ships for SmolLM2 (``assets/smollm2/eagle3``) and the toy model."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from relayc.engine.algorithms.eagle import tree_drafting
from relayc.engine.algorithms.registry import (
    SPECS_DIR,
    Algorithm,
    Demo,
    DemoRun,
    DraftingRequest,
    trained_drafter,
)
from relayc.engine.checkpoints.shipped import demo_drafter
from relayc.nodes import Op, TensorType
from relayc.nodes.signatures import (
    DRAFTING,
    EXTEND_INPUTS,
    FIRST_TOP_K,
    LENS,
    PREFILLED,
    SLOTS,
    VERIFY_INPUTS,
    N,
)
from relayc.runtime.rules import check_dim_rules

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path
    from typing import Any

    from relayc.engine.draft.speculative import Drafting


def make_drafting(request: DraftingRequest) -> Drafting:
    from relayc.engine.draft import Eagle3Head

    directory = trained_drafter(ALGORITHM, request)
    if directory is None:
        # A random head would only ever draft garbage: ask for a real one.
        raise ValueError(
            "no EAGLE-3 head ships for this target: pass draft_model=DIR, a directory "
            "with an EAGLE-3 head's config.json and safetensors (SGLang's layout; "
            "relayc.engine.draft.Eagle3Head.random(target, seed, layer_ids=...).save(DIR) "
            "builds an untrained one for tests)"
        )
    head = Eagle3Head.load(directory, request.model)
    # The spec's rules, now that the head supplies its draft vocabulary (relayc/specs/eagle3.yaml).
    check_dim_rules(
        "eagle3",
        importlib.import_module(ALGORITHM.module_name).DIM_RULES,
        {"topk": request.topk, "draft_vocab": head.draft_vocab_size},
        sources={"draft_vocab": f"the EAGLE-3 head's draft_vocab_size, {directory}"},
    )
    return tree_drafting("eagle3", head, request)


def impls() -> Mapping[str, Callable[..., Any]]:
    from relayc.engine.ops import draft

    return {
        "eagle3_prefill": draft.impl_eagle3_prefill,
        "eagle3_draft_extend": draft.impl_eagle3_draft_extend,
        "draft_to_target": draft.impl_draft_to_target,
        "eagle3_draft": draft.impl_eagle_draft,
    }


def shipped_drafter(num_steps: int) -> Path:
    return demo_drafter("eagle3", "eagle3")


# The ops eagle3.yaml names beyond the shared ones: the inputs of three target layers feed
# the head's fc; it drafts in its own (reduced) vocabulary, whose ids a d2t map takes to
# target ids before the tree is built.
OPS = (
    Op(
        "eagle3_prefill",
        {**SLOTS, **LENS},
        {**PREFILLED, **FIRST_TOP_K, "hidden_states": TensorType("model", ("hidden",))},
        doc="target prefill capturing three layers' inputs, then the head over the prompt",
    ),
    Op(
        "eagle3_draft",
        {**FIRST_TOP_K, "hidden_states": TensorType("model", ("hidden",)), **LENS, **SLOTS},
        dict(DRAFTING),
        doc="expand the relayed top-k for num_steps head steps; draft-vocabulary ids",
    ),
    Op(
        "draft_to_target",
        {"draft_tokens": DRAFTING["draft_tokens"]},
        {"draft_tokens": TensorType("int64", (f"{N}-1",), doc="the same tokens as target ids")},
        doc="map draft-vocabulary ids to target ids (the head's d2t)",
    ),
    Op(
        "target_verify_aux",
        VERIFY_INPUTS,
        {
            "logits": TensorType("float32", (N, "vocab")),
            "aux_hidden_states": TensorType("model", (N, "3*hidden"), doc="three layers' inputs"),
        },
        doc="target_verify, returning the inputs of the three layers the head reads",
    ),
    Op(
        "eagle3_draft_extend",
        {"aux_hidden_states": TensorType("model", (N, "3*hidden")), **EXTEND_INPUTS},
        {**FIRST_TOP_K, "hidden_states": TensorType("model", ("hidden",))},
        doc="head over the accepted tokens and their target features; next top-k",
    ),
)

ALGORITHM = Algorithm(
    name="eagle3",
    spec=SPECS_DIR / "eagle3.yaml",
    summary="an EAGLE-3 head over three target layers drafts a tree in its own vocabulary",
    make_drafting=make_drafting,
    impls=impls,
    ops=OPS,
    shipped_drafter=shipped_drafter,
    named_drafters={"smollm2": "smollm2/eagle3"},
    demo=Demo(
        real=(DemoRun({"num_steps": 3, "topk": 4, "num_draft_tokens": 8}, "topk 4"),),
        bench_real=(
            # A chain verifies 4 rows instead of 8: on this CPU a verify's cost grows with
            # its rows; shorter chains: fewer verify rows and head steps for fewer tokens.
            DemoRun({"num_steps": 3, "topk": 1, "num_draft_tokens": 4}, "chain"),
            DemoRun({"num_steps": 2, "topk": 1, "num_draft_tokens": 3}, "chain 3"),
            DemoRun({"num_steps": 1, "topk": 1, "num_draft_tokens": 2}, "chain 2"),
            # The head read as Q8_0 or Q4_1 (Engine(draft_quantization=...)): a half or a
            # third of the bytes of its bfloat16 words, the same tokens (float32 only: the
            # bfloat16 rows skip them).
            DemoRun(
                {"num_steps": 2, "topk": 1, "num_draft_tokens": 3, "draft_quantization": "q8_0"},
                "chain 3 q8_0 head",
            ),
            DemoRun(
                {"num_steps": 2, "topk": 1, "num_draft_tokens": 3, "draft_quantization": "q4_1"},
                "chain 3 q4_1 head",
            ),
            DemoRun(
                {"num_steps": 3, "topk": 1, "num_draft_tokens": 4, "draft_quantization": "q4_1"},
                "chain q4_1 head",
            ),
        ),
    ),
    rank=20,
)
