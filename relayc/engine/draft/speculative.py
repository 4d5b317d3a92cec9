"""What speculation adds to an algorithm: its drafter and the KV window of a decode step.

The generated steps of every algorithm run the same way (`relayc.engine.serving.algorithms`);
what differs is the drafter the draft ops read as ``ctx.drafter`` and how many KV slots
a decode step needs per request: a :class:`Drafting`, which each algorithm's module
(:mod:`relayc.engine.algorithms`) builds. ``none`` drafts nothing and decodes one token per
request in a one-slot window. This module sits below them: it knows the drafters' shared
types, not the algorithms (their dims rules live in their specs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relayc.engine.core.config import ModelConfig


@dataclass(frozen=True)
class Drafting:
    """The drafter of an algorithm and the shape of its decode step."""

    drafter: Any  # None for `none`; a draft model or proposer otherwise
    decode_width: int  # KV slots per request per decode step (the window W)
    max_tokens_per_step: int  # most tokens one decode step emits per request (K <= W)
    # standalone: one private draft slot per request slot, after the target-sized ones
    bonus_slots: int = 0
    num_steps: int | None = None  # the dims the step runs with (dflash: from the block)
    num_draft_tokens: int | None = None
    # The drafter proposes from each request's token history, kept on the host: the engine
    # feeds it (`add_request(slot, prompt_ids)`, `update(slot, tokens)`, `remove_request`).
    tracks_history: bool = False


def check_draft_vocabulary(draft: ModelConfig, target: ModelConfig, source: object) -> None:
    """A standalone draft model proposes token ids the target verifies: both must share one
    vocabulary, else the first step fails deep inside (or drafts another tokenizer's ids)."""
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"the standalone draft model {source} has a vocabulary of {draft.vocab_size} "
            f"tokens but the target has {target.vocab_size}: a draft model must share the "
            "target's tokenizer and vocabulary (e.g. a smaller model of the same family)"
        )
