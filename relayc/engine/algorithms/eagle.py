"""``eagle``: an EAGLE head (one decoder layer over the target's hidden states) drafting a
tree level by level; its draft steps need scratch KV slots beyond the verify tree."""

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
from relayc.nodes.signatures import DRAFTING, EXTEND_INPUTS, FIRST_TOP_K, LENS, PREFILLED, SLOTS, N

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path
    from typing import Any

    from relayc.engine.draft.speculative import Drafting


def make_drafting(request: DraftingRequest) -> Drafting:
    from relayc.engine.draft import EagleHead

    directory = trained_drafter(ALGORITHM, request)
    if directory is None:
        head = EagleHead.random(request.model, seed=request.seed + 1)
    else:
        head = EagleHead.load(directory, request.model)
    return tree_drafting("eagle", head, request)


def tree_drafting(name: str, head: Any, request: DraftingRequest) -> Drafting:
    """A head drafting a tree: ``topk * (num_steps - 1)`` scratch slots per request for its
    draft steps beyond the ``num_draft_tokens`` of the verify window (EAGLE, EAGLE-3)."""
    from relayc.engine.draft.speculative import Drafting

    num_steps, topk, num_draft_tokens = request.sizes(name)
    return Drafting(
        drafter=head,
        decode_width=num_draft_tokens + topk * (num_steps - 1),
        max_tokens_per_step=num_draft_tokens,
        num_steps=num_steps,
        num_draft_tokens=num_draft_tokens,
    )


def impls() -> Mapping[str, Callable[..., Any]]:
    from relayc.engine.ops import draft

    return {
        "eagle_prefill": draft.impl_eagle_prefill,
        "eagle_draft_extend": draft.impl_eagle_draft_extend,
        "eagle_draft": draft.impl_eagle_draft,
    }


def shipped_drafter(num_steps: int) -> Path:
    return demo_drafter("eagle", "eagle")


# The ops eagle.yaml names beyond the shared ones (relayc.nodes.ops).
OPS = (
    Op(
        "eagle_prefill",
        {**SLOTS, **LENS},
        {
            **PREFILLED,
            **FIRST_TOP_K,
            "hidden_states": TensorType("model", ("hidden",)),
            "draft_probs": TensorType("float32", ("vocab",)),
        },
        doc="target prefill, then the draft head over the prompt",
    ),
    Op(
        "eagle_draft",
        {
            **FIRST_TOP_K,
            "hidden_states": TensorType("model", ("hidden",)),
            "draft_probs": TensorType("float32", ("vocab",), optional=True),
            **LENS,
            **SLOTS,
        },
        {**DRAFTING, "chain_draft_probs": TensorType("float32", ("num_steps", "vocab"))},
        doc="expand the relayed top-k for num_steps draft-head steps",
    ),
    Op(
        "eagle_draft_extend",
        {"hidden_states": TensorType("model", (N, "hidden")), **EXTEND_INPUTS},
        {
            **FIRST_TOP_K,
            "hidden_states": TensorType("model", ("hidden",)),
            "draft_probs": TensorType("float32", ("vocab",)),
        },
        doc="draft head over the accepted tokens; next top-k",
    ),
)

ALGORITHM = Algorithm(
    name="eagle",
    spec=SPECS_DIR / "eagle.yaml",
    summary="an EAGLE head drafts a tree from the target's hidden states",
    make_drafting=make_drafting,
    impls=impls,
    ops=OPS,
    shipped_drafter=shipped_drafter,
    demo=Demo(
        toy=(
            DemoRun({"num_steps": 3, "topk": 1, "num_draft_tokens": 4}, "topk 1"),
            DemoRun({"num_steps": 3, "topk": 4, "num_draft_tokens": 8}, "topk 4"),
        )
    ),
    rank=10,
)
