"""Speculative decoding in the reference engine: the generated decode steps, run on real ops.

For algorithm NAME the engine imports `relayc.generated.NAME` -- the relay
(`FutureMap`) and the `PrefillStep` / `DecodeStep` relayc generated from
`relayc/specs/NAME.yaml` -- and hands them the op implementations of
:mod:`relayc.nodes` bound to this engine's target model and drafter. The
scheduler calls `prefill` and `decode`; each decode step drafts, verifies one
tree, accepts, commits the accepted KV itself (moving it to the front of the
request's KV window and recording it in `req_to_token`) and relays what the
next iteration needs, so the host only learns the accepted tokens one
iteration later.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from relayc.engine.algorithms import DecodeAlgorithm, StepInputs, StepOutput
from relayc.engine.draft.standalone import default_standalone_config
from relayc.engine.model import LlamaForCausalLM
from relayc.engine.ops import implementations
from relayc.engine.ops.context import StepContext
from relayc.engine.ops.draft import proposer_lock

# Default drafters: seeded random weights, or a local directory (`draft_model=`).
_DRAFTERS = ("eagle", "eagle_multilayer", "ngram", "standalone")


def _make_drafter(
    name: str,
    model: LlamaForCausalLM,
    draft_model: str | Path | None,
    *,
    num_steps: int,
    num_draft_tokens: int,
    seed: int,
) -> Any:
    from relayc.engine.draft import EagleHead, MtpDrafter, NgramProposer, StandaloneDrafter

    if name == "standalone":
        if draft_model is not None:
            return StandaloneDrafter.load(draft_model, model.device)
        return StandaloneDrafter.random(
            default_standalone_config(model.config), seed + 1, model.device
        )
    if name == "ngram":
        return NgramProposer(num_draft_tokens=num_draft_tokens, max_depth=num_draft_tokens - 1)
    if name == "eagle":
        if draft_model is not None:
            return EagleHead.load(draft_model, model)
        return EagleHead.random(model, seed=seed + 1)
    if draft_model is not None:
        return MtpDrafter.load(draft_model, model)
    return MtpDrafter.random(model, num_steps, seed=seed + 1)


class SpeculativeDecoding(DecodeAlgorithm):
    """One speculative algorithm on its generated module and the shared ops."""

    def __init__(
        self,
        name: str,
        model: LlamaForCausalLM,
        req_pool_size: int,
        *,
        debug: bool,
        num_steps: int,
        topk: int,
        num_draft_tokens: int,
        draft_model: str | Path | None,
        seed: int,
        module: Any = None,
        block_verification: bool = False,
    ) -> None:
        """``module``: a generated module to run instead of ``relayc.generated.<name>`` (a
        user's own spec compiled with `relayc compile`), with the drafter of ``name``."""
        super().__init__(model)
        if name not in _DRAFTERS:
            raise ValueError(f"no drafter for algorithm `{name}`; use one of {_DRAFTERS}")
        if name == "standalone" and (topk != 1 or num_draft_tokens != num_steps + 1):
            raise ValueError(
                "the standalone draft model drafts a chain: it needs topk=1 and "
                f"num_draft_tokens = num_steps + 1 = {num_steps + 1}; got topk={topk}, "
                f"num_draft_tokens={num_draft_tokens}"
            )
        if name == "eagle_multilayer" and num_draft_tokens - 1 > topk * num_steps:
            raise ValueError(
                f"eagle_multilayer drafts at most topk*num_steps = "
                f"{topk * num_steps} tokens; num_draft_tokens={num_draft_tokens}"
            )
        self.name = name
        config = model.config
        self.dims = {
            "topk": topk,
            "num_steps": num_steps,
            "num_draft_tokens": num_draft_tokens,
            "hidden": config.hidden_size,
            "vocab": config.vocab_size,
        }
        module = module or importlib.import_module(f"relayc.generated.{name}")
        # A relayed draft distribution means chain rejection sampling: first drafts are drawn
        # from it rather than taken as the top-1.
        self.chain_drafts = any(f.name == "draft_probs" for f in module.FIELDS)
        if block_verification and not self.chain_drafts:
            raise ValueError(
                f"`block_verification` verifies chain drafts with their draft probabilities; "
                f"algorithm `{name}` does not draft a chain (use `standalone`)"
            )
        self.block_verification = block_verification
        self.relay = module.FutureMap(
            req_pool_size + 1,
            model.device,
            dims={k: v for k, v in self.dims.items() if k in module.DIM_DEFAULTS},
            model_dtype=config.dtype,
            debug=debug,
        )
        impls = implementations()
        self.prefill_step = module.PrefillStep(self.relay, impls)
        self.decode_step = module.DecodeStep(self.relay, impls)
        self.capture_batch_sizes = tuple(module.CAPTURE_BATCH_SIZES)
        self.drafter = _make_drafter(
            name,
            model,
            draft_model,
            num_steps=num_steps,
            num_draft_tokens=num_draft_tokens,
            seed=seed,
        )
        scratch = topk * (num_steps - 1) if name == "eagle" else 0
        self.decode_width = num_draft_tokens + scratch
        self.max_tokens_per_step = num_draft_tokens
        self.draft_kv: Any = None  # allocated on the first step, sized like the target's
        # standalone: one private draft slot per request slot, after the target-sized ones
        self.bonus_slots = req_pool_size + 1 if name == "standalone" else 0

    def _context(self, step: StepInputs, **kwargs: Any) -> StepContext:
        forward = step.forward
        if self.draft_kv is None and hasattr(self.drafter, "make_kv_cache"):
            self.draft_kv = self.drafter.make_kv_cache(forward.kv_cache.size + self.bonus_slots)
        return StepContext(
            model=self.model,
            kv_cache=forward.kv_cache,
            req_to_token=forward.req_to_token,
            dims=self.dims,
            sampling=None if step.all_greedy else step.sampling,  # None: greedy rules only
            drafter=self.drafter,
            block_verification=self.block_verification,
            extras={
                "draft_kv": self.draft_kv,
                "sample_positions": step.sample_positions,
                "chain_drafts": self.chain_drafts,
                "bonus_slot_base": forward.kv_cache.size + 1,
            },
            **kwargs,
        )

    def prefill(self, step: StepInputs) -> StepOutput:
        forward = step.forward
        ctx = self._context(step, prefill=forward, max_prefix_len=forward.max_prefix_len)
        outputs = self.prefill_step(
            ctx,
            req_pool_indices=forward.req_pool_indices,
            seq_lens=forward.prefix_lens + forward.extend_lens,
        )
        first = outputs.get("prefill.next_tokens")
        if first is None:  # n-gram seeds an accept row instead of a bonus token
            first = outputs["prefill.accept_tokens"][:, 0]
        return StepOutput(next_tokens=first)

    def decode(self, step: StepInputs) -> StepOutput:
        forward = step.forward
        ctx = self._context(
            step, out_cache_loc=forward.out_cache_loc, max_prefix_len=step.max_prefix_len
        )
        outputs = self.graphs.run(
            self.decode_step,
            ctx,
            req_pool_indices=forward.req_pool_indices,
            seq_lens=forward.prefix_lens,
        )
        counts = outputs["accept.accept_lens"].to(torch.int64)
        return StepOutput(
            next_tokens=outputs["accept.bonus_tokens"],
            tokens=outputs["accept.accept_tokens"],
            counts=counts,
            committed=True,
        )

    def draft_modules(self) -> tuple[nn.Module, ...]:
        drafter = self.drafter
        module = drafter if isinstance(drafter, nn.Module) else getattr(drafter, "model", None)
        return (module,) if isinstance(module, nn.Module) else ()

    # n-gram keeps each request's token history on the host (one iteration behind).
    def on_prompt(self, req_pool_index: int, prompt_ids: list[int]) -> None:
        if self.name == "ngram":
            with proposer_lock():
                self.drafter.add_request(req_pool_index, prompt_ids)

    def on_tokens(self, req_pool_index: int, tokens: list[int]) -> None:
        if self.name == "ngram":
            with proposer_lock():
                self.drafter.update(req_pool_index, tokens)

    def release(self, req_pool_index: int) -> None:
        if self.name == "ngram":
            with proposer_lock():
                self.drafter.remove_request(req_pool_index)


# What `relayc.engine.algorithms.make_algorithm` calls for the speculative names; the
# class takes exactly those arguments.
make_speculative = SpeculativeDecoding
