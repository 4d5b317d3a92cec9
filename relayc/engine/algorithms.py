"""Decode algorithms: what one prefill forward and one decode forward do.

The scheduler is algorithm-agnostic. It chooses the requests, hands out KV
slots, builds a ``StepInputs`` and, on the forward runner, calls
``algorithm.prefill(step)`` for new requests and ``algorithm.decode(step)`` for
running ones -- the ``prefill`` and ``steps`` sections of the algorithm's spec.
An algorithm owns its generated relay (``FutureMap``): the prefill seeds it, each
decode resolves what the previous iteration stashed and stashes for the next.

Speculative algorithms (EAGLE, n-gram, standalone draft) are the later issue
"speculative decoding": they plug in here with their own generated module and
hooks, and will report several tokens per request through ``StepOutput``.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from relayc.engine.forward_batch import ForwardBatch
from relayc.engine.model import LlamaForCausalLM
from relayc.engine.sampling import SamplingBatch, sample
from relayc.generated import none as none_relay

SPECULATIVE_ALGORITHMS = ("eagle", "eagle_multilayer", "ngram", "standalone")


@dataclass
class StepInputs:
    """One forward's inputs, on the device."""

    forward: ForwardBatch  # decode: input_ids are -1 placeholders; the relay supplies them
    sampling: SamplingBatch
    sample_positions: torch.Tensor  # [B] int64, where each sampled token will sit


@dataclass
class StepOutput:
    next_tokens: torch.Tensor  # [B] int64 on the device, one new token per request


class DecodeAlgorithm(ABC):
    """The per-algorithm decode step the scheduler calls (on the forward runner)."""

    name: ClassVar[str]

    def __init__(self, model: LlamaForCausalLM) -> None:
        self.model = model

    @abstractmethod
    def prefill(self, step: StepInputs) -> StepOutput:
        """Run the prompts, sample the first tokens and seed the relay."""

    @abstractmethod
    def decode(self, step: StepInputs) -> StepOutput:
        """Resolve the relay, run one decode iteration, stash the relay for the next."""


class PlainDecoding(DecodeAlgorithm):
    """``algorithm="none"``: one token per request per iteration, relayed as ``bonus_tokens``."""

    name = "none"

    def __init__(self, model: LlamaForCausalLM, req_pool_size: int, *, debug: bool = False) -> None:
        super().__init__(model)
        config = model.config
        # Row 0 of the relay is the padding slot, as in ReqToTokenPool: slots 1..size.
        self.future_map = none_relay.FutureMap(
            req_pool_size + 1,
            model.device,
            dims={"hidden": config.hidden_size, "vocab": config.vocab_size},
            model_dtype=config.dtype,
            debug=debug,
        )

    def _sample_and_stash(self, forward: ForwardBatch, step: StepInputs) -> StepOutput:
        logits = self.model(forward).logits
        next_tokens = sample(logits, step.sampling, step.sample_positions)
        self.future_map.stash(
            forward.req_pool_indices, none_relay.RelayPayload(bonus_tokens=next_tokens)
        )
        return StepOutput(next_tokens)

    def prefill(self, step: StepInputs) -> StepOutput:
        return self._sample_and_stash(step.forward, step)

    def decode(self, step: StepInputs) -> StepOutput:
        relayed = self.future_map.resolve(step.forward.req_pool_indices)
        forward = dataclasses.replace(step.forward, input_ids=relayed.bonus_tokens)
        return self._sample_and_stash(forward, step)


def check_algorithm(name: str) -> None:
    """Raise before any allocation when ``name`` cannot run (yet)."""
    if name == PlainDecoding.name:
        return
    if name in SPECULATIVE_ALGORITHMS:
        raise NotImplementedError(
            f"algorithm `{name}` needs speculative decoding, which the reference engine does "
            "not run yet (issue: speculative decoding); use algorithm='none'"
        )
    known = ", ".join([PlainDecoding.name, *SPECULATIVE_ALGORITHMS])
    raise ValueError(f"unknown algorithm `{name}` (known: {known})")


def make_algorithm(
    name: str, model: LlamaForCausalLM, req_pool_size: int, *, debug: bool = False
) -> DecodeAlgorithm:
    check_algorithm(name)
    return PlainDecoding(model, req_pool_size, debug=debug)
