"""``ngram``: proposals from each request's own token history (host-side suffix matches);
no weights, so it runs on any model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from relayc.engine.algorithms.registry import SPECS_DIR, Algorithm, Demo, DemoRun, DraftingRequest

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


ALGORITHM = Algorithm(
    name="ngram",
    spec=SPECS_DIR / "ngram.yaml",
    summary="n-gram matches in the request's own tokens (no draft weights)",
    make_drafting=make_drafting,
    impls=impls,
    drafter_weights=False,
    demo=Demo(
        toy=(DemoRun({"num_steps": 3, "topk": 1, "num_draft_tokens": 6}),),
        real=(DemoRun({"num_steps": 3, "topk": 1, "num_draft_tokens": 8}),),
    ),
    rank=40,
)
