"""What speculation adds to an algorithm: its drafter and the KV window of a decode step.

The generated steps of every algorithm run the same way (`relayc.engine.serving.algorithms`);
what differs is the drafter the draft ops read as ``ctx.drafter`` and how many KV slots
a decode step needs per request. :func:`make_drafting` builds both for an algorithm
name; ``none`` drafts nothing and decodes one token per request in a one-slot window.
This module sits below ``algorithms``: it knows the drafters, not the algorithm class.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relayc.engine.checkpoints.shipped import named_drafter, refuse_untrained_drafter
from relayc.engine.core.config import ModelConfig
from relayc.engine.draft import (
    Eagle3Head,
    EagleHead,
    MtpDrafter,
    NgramProposer,
    StandaloneDrafter,
)
from relayc.engine.draft.dflash import DFlashDrafter
from relayc.engine.draft.standalone import default_standalone_config
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.runtime.rules import DimRule, check_dim_rules

ALGORITHMS = ("none", "eagle", "eagle3", "eagle_multilayer", "ngram", "standalone", "dflash")
# Bundled specs the reference engine has no drafter for yet (SGLang-target specs), with
# what running them here would take.
NO_ENGINE_DRAFTER = {
    "dspark": "a DSpark drafter (the DFlash drafter plus a Markov head)",
    "uno": "an UNO LoRA self-drafter",
}
TREE_DRAFTING = ("eagle", "eagle3")  # a head drafting a tree level by level in scratch slots


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

    @property
    def tracks_history(self) -> bool:
        """n-gram proposes from each request's token history, kept on the host."""
        return isinstance(self.drafter, NgramProposer)


def check_sizes(name: str, *, num_steps: int, topk: int, num_draft_tokens: int) -> None:
    """Raise before any allocation when the sizes do not fit algorithm ``name``."""
    if name in NO_ENGINE_DRAFTER:
        raise ValueError(
            f"the reference engine cannot run `{name}` yet: relayc/specs/{name}.yaml needs "
            f"{NO_ENGINE_DRAFTER[name]}, which the engine does not have; compile the spec for "
            "SGLang (`relayc compile --target sglang`), or pick one of " + ", ".join(ALGORITHMS)
        )
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm `{name}` (known: {', '.join(ALGORITHMS)})")
    dims = {"num_steps": num_steps, "topk": topk, "num_draft_tokens": num_draft_tokens}
    check_dim_rules(name, spec_rules(name), dims)


def spec_rules(name: str) -> tuple[DimRule, ...]:
    """The dims rules of the bundled spec of ``name``: what its drafter was written for."""
    rules: tuple[DimRule, ...] = importlib.import_module(f"relayc.generated.{name}").DIM_RULES
    return rules


def check_draft_vocabulary(draft: ModelConfig, target: ModelConfig, source: object) -> None:
    """A standalone draft model proposes token ids the target verifies: both must share one
    vocabulary, else the first step fails deep inside (or drafts another tokenizer's ids)."""
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"the standalone draft model {source} has a vocabulary of {draft.vocab_size} "
            f"tokens but the target has {target.vocab_size}: a draft model must share the "
            "target's tokenizer and vocabulary (e.g. a smaller model of the same family)"
        )


def make_drafting(
    name: str,
    model: LlamaForCausalLM,
    req_pool_size: int,
    *,
    num_steps: int,
    topk: int,
    num_draft_tokens: int,
    draft_model: str | Path | None,
    seed: int,
) -> Drafting:
    """The drafter of ``name`` (seeded random weights, or loaded from ``draft_model``)."""
    if name == "dflash":
        return _block_drafting(model, draft_model, num_steps, num_draft_tokens, seed)
    check_sizes(name, num_steps=num_steps, topk=topk, num_draft_tokens=num_draft_tokens)
    if name == "none":
        return Drafting(drafter=None, decode_width=1, max_tokens_per_step=1)
    drafter = _make_drafter(
        name,
        model,
        draft_model,
        num_steps=num_steps,
        topk=topk,
        num_draft_tokens=num_draft_tokens,
        seed=seed,
    )
    # EAGLE drafts a tree: its draft steps need scratch KV slots beyond the verify tree.
    scratch = topk * (num_steps - 1) if name in TREE_DRAFTING else 0
    return Drafting(
        drafter=drafter,
        decode_width=num_draft_tokens + scratch,
        max_tokens_per_step=num_draft_tokens,
        bonus_slots=req_pool_size + 1 if name == "standalone" else 0,
        num_steps=num_steps,
        num_draft_tokens=num_draft_tokens,
    )


def _block_drafting(
    model: LlamaForCausalLM,
    draft_model: str | Path | None,
    num_steps: int | None,
    num_draft_tokens: int | None,
    seed: int,
) -> Drafting:
    """DFlash: the drafter (shipped, loaded or seeded random), and a verify window of its
    block unless ``num_draft_tokens`` names another width."""
    if draft_model is None:
        draft_model = named_drafter(model, "dflash")
    if draft_model is None:
        refuse_untrained_drafter(model, "dflash")
        drafter = DFlashDrafter.random(model, seed + 1)
    else:
        drafter = DFlashDrafter.load(draft_model, model)
    width = drafter.block_size if num_draft_tokens is None else num_draft_tokens
    check_dim_rules(
        "dflash",
        spec_rules("dflash"),
        {
            "num_steps": width - 1 if num_steps is None else num_steps,
            "num_draft_tokens": width,
            "block_size": drafter.block_size,
        },
        sources={"num_draft_tokens": "the drafter's block_size"}
        if num_draft_tokens is None
        else None,
    )
    return Drafting(
        drafter=drafter,
        decode_width=width,
        max_tokens_per_step=width,
        num_steps=width - 1,
        num_draft_tokens=width,
    )


def _make_drafter(
    name: str,
    model: LlamaForCausalLM,
    draft_model: str | Path | None,
    *,
    num_steps: int,
    topk: int,
    num_draft_tokens: int,
    seed: int,
) -> Any:
    if draft_model is None and name in ("standalone", "eagle", "eagle_multilayer"):
        refuse_untrained_drafter(model, name)  # a named model: random weights draft garbage
    if name == "standalone":
        if draft_model is not None:
            drafter = StandaloneDrafter.load(draft_model, model.device)
            check_draft_vocabulary(drafter.model.config, model.config, draft_model)
            return drafter
        return StandaloneDrafter.random(
            default_standalone_config(model.config), seed + 1, model.device
        )
    if name == "ngram":
        return NgramProposer(num_draft_tokens=num_draft_tokens, max_depth=num_draft_tokens - 1)
    if name == "eagle":
        if draft_model is not None:
            return EagleHead.load(draft_model, model)
        return EagleHead.random(model, seed=seed + 1)
    if name == "eagle3":
        if draft_model is None:
            draft_model = named_drafter(model, "eagle3")
        if draft_model is None:
            # A random head would only ever draft garbage: ask for a real one.
            raise ValueError(
                "no EAGLE-3 head ships for this target: pass draft_model=DIR, a directory "
                "with an EAGLE-3 head's config.json and safetensors (SGLang's layout; "
                "relayc.engine.draft.Eagle3Head.random(target, seed, layer_ids=...).save(DIR) "
                "builds an untrained one for tests)"
            )
        head = Eagle3Head.load(draft_model, model)
        if topk > head.draft_vocab_size:
            raise ValueError(
                f"`topk` ({topk}) exceeds the EAGLE-3 head's draft vocabulary "
                f"({head.draft_vocab_size} tokens, {draft_model})"
            )
        return head
    if draft_model is not None:
        return MtpDrafter.load(draft_model, model)
    return MtpDrafter.random(model, num_steps, seed=seed + 1)
