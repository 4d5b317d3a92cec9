"""``ngram``: proposals from each request's own token history (host-side suffix matches);
no weights, so it runs on any model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from relayc.engine.algorithms.registry import SPECS_DIR, Algorithm, Demo, DemoRun, DraftingRequest
from relayc.nodes import Op, TensorType
from relayc.nodes.signatures import ACCEPTED, LENS, PREFILLED, SLOTS, TREE, N

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from relayc.engine.draft.speculative import Drafting


def make_drafting(request: DraftingRequest) -> Drafting:
    from relayc.engine.draft.ngram import NgramProposer
    from relayc.engine.draft.speculative import Drafting

    num_steps, _, num_draft_tokens = request.sizes("ngram")
    proposer = NgramProposer(num_draft_tokens=num_draft_tokens, max_depth=num_draft_tokens - 1)
    return Drafting(
        drafter=proposer,
        decode_width=num_draft_tokens,
        max_tokens_per_step=num_draft_tokens,
        num_steps=num_steps,
        num_draft_tokens=num_draft_tokens,
        tracks_history=True,
    )


def impls() -> Mapping[str, Callable[..., Any]]:
    from relayc.engine.ops import draft

    return {"ngram_propose": draft.impl_ngram_propose, "ngram_splice": draft.impl_ngram_splice}


# The ops ngram.yaml names beyond the shared ones (suffix.yaml names them too).
NGRAM_PREFILL = Op(
    "ngram_prefill",
    {**SLOTS, **LENS},
    {
        "next_tokens": PREFILLED["next_tokens"],
        "accept_tokens": ACCEPTED["accept_tokens"],
        "accept_lens": ACCEPTED["accept_lens"],
        "seq_lens": TensorType("int64", ()),
    },
    doc="target prefill; first token, also as a one-token accept row",
)
NGRAM_PROPOSE = Op(
    "ngram_propose",
    dict(SLOTS),
    {"proposals": TensorType("int64", (N, N)), "proposal_keys": TensorType("int64", (N,))},
    placement="host",
    doc="suffix-match proposals from the host's token history",
)
NGRAM_SPLICE = Op(
    "ngram_splice",
    {
        "accept_tokens": ACCEPTED["accept_tokens"],
        "accept_lens": ACCEPTED["accept_lens"],
        "proposals": TensorType("int64", (N, N)),
        "proposal_keys": TensorType("int64", (N,)),
        **LENS,
    },
    TREE,
    doc="pick proposals for the relayed accepted tokens; lay out the tree",
)
OPS = (NGRAM_PREFILL, NGRAM_PROPOSE, NGRAM_SPLICE)

ALGORITHM = Algorithm(
    name="ngram",
    spec=SPECS_DIR / "ngram.yaml",
    summary="n-gram matches in the request's own tokens (no draft weights)",
    make_drafting=make_drafting,
    impls=impls,
    ops=OPS,
    drafter_weights=False,
    demo=Demo(
        toy=(DemoRun({"num_steps": 3, "topk": 1, "num_draft_tokens": 6}),),
        real=(DemoRun({"num_steps": 3, "topk": 1, "num_draft_tokens": 8}),),
    ),
    rank=40,
)
