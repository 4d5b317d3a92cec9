"""``eagle_multilayer``: an MTP drafter, one draft layer per step, all steps drafted in
draft extend; its shipped drafter serves only the number of steps it was trained for."""

from __future__ import annotations

import json
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
from relayc.nodes.signatures import DRAFTING, EXTEND_INPUTS, LENS, PREFILLED, SLOTS, STEP_TOP_K, N

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path
    from typing import Any

    from relayc.engine.draft.speculative import Drafting


def make_drafting(request: DraftingRequest) -> Drafting:
    from relayc.engine.draft import MtpDrafter
    from relayc.engine.draft.speculative import Drafting

    num_steps, _, num_draft_tokens = request.sizes("eagle_multilayer")
    directory = trained_drafter(ALGORITHM, request)
    if directory is None:
        drafter = MtpDrafter.random(request.model, num_steps, seed=request.seed + 1)
    else:
        drafter = MtpDrafter.load(directory, request.model)
    return Drafting(
        drafter=drafter,
        decode_width=num_draft_tokens,
        max_tokens_per_step=num_draft_tokens,
        num_steps=num_steps,
        num_draft_tokens=num_draft_tokens,
    )


def impls() -> Mapping[str, Callable[..., Any]]:
    from relayc.engine.ops import draft

    return {
        "mtp_prefill": draft.impl_eagle_prefill,
        "mtp_draft_extend": draft.impl_mtp_draft_extend,
    }


def shipped_drafter(num_steps: int) -> Path:
    """The shipped MTP drafter, which has one layer per draft step: it serves only its own
    ``num_steps`` (ValueError otherwise)."""
    directory = demo_drafter("eagle_multilayer", "eagle_multilayer")
    config = directory / "config.json"
    layers = json.loads(config.read_text()).get("num_steps") if config.is_file() else None
    if isinstance(layers, int) and layers != num_steps:
        raise ValueError(
            f"the shipped eagle_multilayer drafter has {layers} layers, one per draft step: "
            f"use num_steps={layers}, or pass draft_model=DIR (a drafter trained for "
            f"num_steps={num_steps})"
        )
    return directory


# The ops eagle_multilayer.yaml names beyond the shared ones.
OPS = (
    Op(
        "mtp_prefill",
        {**SLOTS, **LENS},
        {**PREFILLED, **STEP_TOP_K},
        doc="target prefill, then every draft layer proposes its step",
    ),
    Op(
        "mtp_select",
        dict(STEP_TOP_K),
        dict(DRAFTING),
        doc="drafting results from the relayed per-step top-k",
    ),
    Op(
        "mtp_draft_extend",
        {"hidden_states": TensorType("model", (N, "hidden")), **EXTEND_INPUTS},
        dict(STEP_TOP_K),
        doc="draft layers over the accepted tokens",
    ),
)

ALGORITHM = Algorithm(
    name="eagle_multilayer",
    spec=SPECS_DIR / "eagle_multilayer.yaml",
    summary="an MTP drafter, one draft layer per step, all drafted in draft extend",
    make_drafting=make_drafting,
    impls=impls,
    ops=OPS,
    shipped_drafter=shipped_drafter,
    demo=Demo(toy=(DemoRun({"num_steps": 3, "topk": 1, "num_draft_tokens": 4}),)),
    rank=30,
)
