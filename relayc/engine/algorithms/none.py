"""``none``: no drafter; one token per request per step in a one-slot KV window."""

from __future__ import annotations

from typing import TYPE_CHECKING

from relayc.engine.algorithms.registry import SPECS_DIR, Algorithm, Demo, DemoRun, DraftingRequest

if TYPE_CHECKING:
    from relayc.engine.draft.speculative import Drafting


def make_drafting(request: DraftingRequest) -> Drafting:
    from relayc.engine.draft.speculative import Drafting

    return Drafting(drafter=None, decode_width=1, max_tokens_per_step=1)


ALGORITHM = Algorithm(
    name="none",
    spec=SPECS_DIR / "none.yaml",
    summary="one token per step, the baseline every other algorithm must equal greedily",
    make_drafting=make_drafting,
    drafter_weights=False,
    demo=Demo(toy=(DemoRun(),), real=(DemoRun(),)),
    rank=0,
)
