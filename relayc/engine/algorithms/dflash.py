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


ALGORITHM = Algorithm(
    name="dflash",
    spec=SPECS_DIR / "dflash.yaml",
    summary="one draft forward over a block drafts the chain (DFlash)",
    make_drafting=make_drafting,
    impls=impls,
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
