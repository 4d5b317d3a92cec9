"""``dflash``: one non-causal draft forward over ``[bonus, masks]`` drafts a block; the
verify window is the drafter's block unless ``num_draft_tokens`` names another width, so
its dims default to None (the drafter settles them when it loads)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

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
from relayc.nodes.registry import Effect
from relayc.nodes.signatures import ACCEPTED, DRAFTING, LENS, PREFILLED, SLOTS, VERIFY_INPUTS, N
from relayc.runtime.rules import check_dim_rules

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path
    from typing import Any

    from relayc.engine.draft.speculative import Drafting


def make_drafting(request: DraftingRequest) -> Drafting:
    from relayc.engine.draft.dflash import DFlashDrafter
    from relayc.engine.draft.speculative import Drafting

    directory = trained_drafter(ALGORITHM, request)
    if directory is None:
        drafter = DFlashDrafter.random(request.model, request.seed + 1)
    else:
        drafter = DFlashDrafter.load(directory, request.model)
    width = drafter.block_size if request.num_draft_tokens is None else request.num_draft_tokens
    # The spec's rules, now that the drafter supplies its block size (relayc/specs/dflash.yaml).
    check_dim_rules(
        "dflash",
        importlib.import_module(ALGORITHM.module_name).DIM_RULES,
        {
            "num_steps": width - 1 if request.num_steps is None else request.num_steps,
            "num_draft_tokens": width,
            "block_size": drafter.block_size,
        },
        sources={"num_draft_tokens": "the drafter's block_size"}
        if request.num_draft_tokens is None
        else None,
    )
    return Drafting(
        drafter=drafter,
        decode_width=width,
        max_tokens_per_step=width,
        num_steps=width - 1,
        num_draft_tokens=width,
    )


def impls() -> Mapping[str, Callable[..., Any]]:
    from relayc.engine.ops import block_draft

    return {
        "dflash_prefill": block_draft.impl_dflash_prefill,
        "dflash_draft": block_draft.impl_dflash_draft,
        "dflash_verify": block_draft.impl_dflash_verify,
        "dflash_inject_kv": block_draft.impl_dflash_inject_kv,
    }


def shipped_drafter(num_steps: int) -> Path:
    return demo_drafter("dflash", "dflash")


# The ops dflash.yaml names beyond the shared ones (dspark.yaml names the prefill and the
# KV injection too). SGLang 0.5.23's block drafters: the whole draft chain comes from one
# draft forward, and only the bonus token and the lengths cross iterations. The draft KV
# cache: the prefill and inject_kv write the target's tapped context into it, the draft
# forward attends to it; no tensor of theirs carries it, so it is a declared effect.
WRITES_DRAFT_KV = (Effect("draft_kv_cache", "writes", "the tapped target context"),)
READS_DRAFT_KV = (Effect("draft_kv_cache", "reads", "the context the block attends to"),)
DFLASH_PREFILL = Op(
    "dflash_prefill",
    {**SLOTS, **LENS},
    PREFILLED,
    doc="target prefill; its layer features go straight into the draft KV cache",
    effects=WRITES_DRAFT_KV,
)
DFLASH_INJECT_KV = Op(
    "dflash_inject_kv",
    {
        "hidden_states": TensorType("model", (N, "hidden")),
        "accept_index": ACCEPTED["accept_index"],
        "accept_lens": ACCEPTED["accept_lens"],
        **LENS,
        **SLOTS,
    },
    {"draft_seq_lens": TensorType("int64", (), doc="the draft KV cache's length after the write")},
    doc="write the accepted positions' draft context (dflash_verify's) into the draft KV cache",
    effects=WRITES_DRAFT_KV,
)
OPS = (
    DFLASH_PREFILL,
    Op(
        "dflash_draft",
        {"bonus_tokens": TensorType("int64", ()), **LENS, **SLOTS},
        DRAFTING,
        doc="one draft forward over a block (the bonus token, then masks): the whole chain",
        effects=READS_DRAFT_KV,
    ),
    Op(
        "dflash_verify",
        VERIFY_INPUTS,
        {
            "logits": TensorType("float32", (N, "vocab")),
            "hidden_states": TensorType(
                "model",
                (N, "hidden"),
                doc="the draft context: fc + hidden_norm of the tapped layers",
            ),
        },
        doc="target_verify, returning each node's draft context (the drafter's projection "
        "of the target layers it reads) instead of the last hidden state",
    ),
    DFLASH_INJECT_KV,
)

ALGORITHM = Algorithm(
    name="dflash",
    spec=SPECS_DIR / "dflash.yaml",
    summary="one draft forward over a block drafts the chain (DFlash)",
    make_drafting=make_drafting,
    impls=impls,
    ops=OPS,
    shipped_drafter=shipped_drafter,
    named_drafters={"smollm2": "smollm2/dflash"},
    default_dims=(None, None),
    demo=Demo(
        toy=(DemoRun({"topk": 1}),),  # the shipped drafter's block of 8
        real=(DemoRun({"topk": 1, "num_draft_tokens": 4}),),  # the shipped drafter: a block of 4
        bench_toy=(DemoRun({"num_draft_tokens": 4}, "block 4"),),
        # its block size is the shipped drafter's, or a shorter verify window (fewer rows,
        # the same one draft forward)
        bench_real=(DemoRun({"num_draft_tokens": 3}, "block 3"),),
    ),
    rank=60,
)
