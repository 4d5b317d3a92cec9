"""``standalone``: a small Llama of the target's vocabulary drafts a chain with its own KV
cache; one private draft slot per request slot (``bonus_slots``) holds its bonus token's KV."""

from __future__ import annotations

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
from relayc.nodes.signatures import DRAFTING, EXTEND_INPUTS, FIRST_TOP_K, LENS, PREFILLED, SLOTS

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path
    from typing import Any

    from relayc.engine.draft.speculative import Drafting

CHAIN = {"num_steps": 3, "topk": 1, "num_draft_tokens": 4}


def make_drafting(request: DraftingRequest) -> Drafting:
    from relayc.engine.draft import StandaloneDrafter
    from relayc.engine.draft.speculative import Drafting, check_draft_vocabulary
    from relayc.engine.draft.standalone import default_standalone_config

    num_steps, _, num_draft_tokens = request.sizes("standalone")
    model = request.model
    directory = trained_drafter(ALGORITHM, request)
    if directory is None:
        drafter = StandaloneDrafter.random(
            default_standalone_config(model.config), request.seed + 1, model.device
        )
    else:
        drafter = StandaloneDrafter.load(directory, model.device)
        check_draft_vocabulary(drafter.model.config, model.config, request.draft_model)
    return Drafting(
        drafter=drafter,
        decode_width=num_draft_tokens,
        max_tokens_per_step=num_draft_tokens,
        bonus_slots=request.req_pool_size + 1,
        num_steps=num_steps,
        num_draft_tokens=num_draft_tokens,
    )


def impls() -> Mapping[str, Callable[..., Any]]:
    from relayc.engine.ops import draft

    return {
        "standalone_prefill": draft.impl_standalone_prefill,
        "standalone_draft": draft.impl_standalone_draft,
        "standalone_draft_extend": draft.impl_standalone_draft_extend,
    }


def shipped_drafter(num_steps: int) -> Path:
    return demo_drafter("standalone", "standalone")


# The ops standalone.yaml names beyond the shared ones.
OPS = (
    Op(
        "standalone_prefill",
        {**SLOTS, **LENS},
        {**PREFILLED, **FIRST_TOP_K, "draft_probs": TensorType("float32", ("vocab",))},
        doc="target and draft prefill",
    ),
    Op(
        "standalone_draft",
        {**FIRST_TOP_K, "draft_probs": TensorType("float32", ("vocab",)), **LENS, **SLOTS},
        {**DRAFTING, "chain_draft_probs": TensorType("float32", ("num_steps", "vocab"))},
        doc="continue the chain with num_steps - 1 draft forwards",
    ),
    Op(
        "standalone_draft_extend",
        {
            k: EXTEND_INPUTS[k]
            for k in ("accept_tokens", "accept_lens", "seq_lens", "req_pool_indices")
        },
        {**FIRST_TOP_K, "draft_probs": TensorType("float32", ("vocab",))},
        doc="draft model over the accepted tokens; next top-k",
    ),
)

ALGORITHM = Algorithm(
    name="standalone",
    spec=SPECS_DIR / "standalone.yaml",
    summary="a small draft model of the target's vocabulary drafts a chain",
    make_drafting=make_drafting,
    impls=impls,
    ops=OPS,
    shipped_drafter=shipped_drafter,
    dynamic_draft_length=True,
    demo=Demo(
        toy=(DemoRun(CHAIN),),
        bench_toy=(
            DemoRun(
                {"num_steps": 6, "topk": 1, "num_draft_tokens": 7, "draft_confidence": 0.4},
                "dynamic",
            ),
        ),
    ),
    rank=50,
)
