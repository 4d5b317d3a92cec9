"""Decode algorithms: what one prefill forward and one decode forward do.

The scheduler is algorithm-agnostic. It chooses the requests, hands out KV
slots, builds a ``StepInputs`` and, on the forward runner, calls
``algorithm.prefill(step)`` for new requests and ``algorithm.decode(step)`` for
running ones -- the ``prefill`` and ``steps`` sections of the algorithm's spec.
An algorithm owns its generated relay (``FutureMap``): the prefill seeds it, each
decode resolves what the previous iteration stashed and stashes for the next.

A decode step may emit several tokens per request (speculative decoding). The
scheduler gives each request a window of ``decode_width`` (``W``) KV slots per
decode step; the algorithm verifies up to ``W`` tokens in it, keeps the
accepted KV at the front of the window, records it in ``req_to_token`` itself
(``StepOutput.committed``) and reports ``tokens [B, K]`` with ``counts [B]``
(``K = max_tokens_per_step <= W``). The scheduler frees the rest of each window
once it has processed the step. With ``W == 1`` (``none``) nothing of this
applies: one token per request, committed by the scheduler.

The host hooks (``on_prompt``, ``on_tokens``, ``release``) run on the
scheduler's thread, possibly while a forward job runs on the runner: host state
they update and a decode step reads needs the algorithm's own care (the host's
view lags one iteration; see ``relayc.engine.scheduler``).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from relayc.engine.forward_batch import ForwardBatch
from relayc.engine.graphs import EAGER, DecodeGraphs
from relayc.engine.model import LlamaForCausalLM
from relayc.engine.sampling import SamplingBatch, sample
from relayc.generated import none as none_relay

SPECULATIVE_ALGORITHMS = ("eagle", "eagle_multilayer", "ngram", "standalone")


@dataclass
class StepInputs:
    """One forward's inputs, on the device.

    Decode with ``W = decode_width > 1``: ``forward`` is a chain-verify batch of
    ``W`` placeholder tokens per request whose ``out_cache_loc`` is the windows
    ``[B * W]`` (request-major). Its ``positions``, ``prefix_lens`` and
    ``sample_positions`` are the host's best guess (the committed length it knows
    plus one per step in flight), not the truth: the algorithm computes them on
    the device from its relay. ``max_prefix_len`` is a true upper bound.
    """

    forward: ForwardBatch  # decode: input_ids are -1 placeholders; the relay supplies them
    sampling: SamplingBatch
    sample_positions: torch.Tensor  # [B] int64, where each sampled token will sit
    max_prefix_len: int  # host bound on every request's committed KV length (attention shapes)
    # Host knowledge: no request in the batch samples. Speculative steps then skip the sampled
    # acceptance rule (a CUDA-graph runner must key its graphs by this flag).
    all_greedy: bool = False


@dataclass
class StepOutput:
    """What a step produced, on the device.

    Prefill and single-token decode: ``next_tokens`` only. Multi-token decode:
    ``tokens[b, :counts[b]]`` are request ``b``'s new tokens, and with
    ``committed=True`` the algorithm has already recorded their KV (the first
    ``counts[b]`` window slots) in ``req_to_token`` at the request's committed
    length; the scheduler then commits nothing and frees the other window slots.
    """

    next_tokens: torch.Tensor  # [B] int64, one new token per request (the last, for multi-token)
    tokens: torch.Tensor | None = None  # [B, K] int64, emitted tokens, left-aligned
    counts: torch.Tensor | None = None  # [B] int64 in 1..K, valid entries of ``tokens``
    committed: bool = False  # the algorithm wrote req_to_token for this decode


class DecodeAlgorithm(ABC):
    """The per-algorithm decode step the scheduler calls (on the forward runner)."""

    name: ClassVar[str]
    decode_width: int = 1  # KV slots per request per decode step (the window W)
    max_tokens_per_step: int = 1  # most tokens one decode step emits per request (K <= W)
    # How decode() runs the generated DecodeStep (relayc.engine.graphs); the engine sets it.
    graphs: DecodeGraphs = EAGER
    capture_batch_sizes: tuple[int, ...] = ()  # the spec's graph buckets (CAPTURE_BATCH_SIZES)

    def __init__(self, model: LlamaForCausalLM) -> None:
        self.model = model

    @abstractmethod
    def prefill(self, step: StepInputs) -> StepOutput:
        """Run the prompts, sample the first tokens and seed the relay."""

    @abstractmethod
    def decode(self, step: StepInputs) -> StepOutput:
        """Resolve the relay, run one decode iteration, stash the relay for the next."""

    def draft_modules(self) -> tuple[nn.Module, ...]:
        """The draft model's modules, if any (the engine sets their CPU weight layout)."""
        return ()

    def on_prompt(self, req_pool_index: int, prompt_ids: list[int]) -> None:  # noqa: B027
        """A request was admitted into ``req_pool_index`` with these prompt tokens."""

    def on_tokens(self, req_pool_index: int, tokens: list[int]) -> None:  # noqa: B027
        """The host learned these new output tokens of a request (in order, kept ones only)."""

    def release(self, req_pool_index: int) -> None:  # noqa: B027
        """The request slot is free: no job holds it any more; drop per-request host state."""


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
        if step.all_greedy:  # what `sample` gives greedy rows, without the sampling work
            next_tokens = torch.argmax(logits, dim=-1)
        else:
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


def _speculative_factory(name: str) -> Callable[..., DecodeAlgorithm]:
    """``relayc.engine.speculative.make_speculative``, imported on first use."""
    try:
        from relayc.engine.speculative import make_speculative
    except ImportError as exc:
        raise NotImplementedError(
            f"algorithm `{name}` needs speculative decoding, but `relayc.engine.speculative` "
            f"does not import ({exc}); use algorithm='none'"
        ) from exc
    return make_speculative


def check_algorithm(name: str) -> None:
    """Raise before any allocation when ``name`` cannot run (yet)."""
    if name == PlainDecoding.name:
        return
    if name in SPECULATIVE_ALGORITHMS:
        _speculative_factory(name)
        return
    known = ", ".join([PlainDecoding.name, *SPECULATIVE_ALGORITHMS])
    raise ValueError(f"unknown algorithm `{name}` (known: {known})")


def make_algorithm(
    name: str,
    model: LlamaForCausalLM,
    req_pool_size: int,
    *,
    debug: bool = False,
    num_steps: int = 3,
    topk: int = 1,
    num_draft_tokens: int = 4,
    draft_model: Any = None,
    seed: int = 0,
    block_verification: bool = False,
) -> DecodeAlgorithm:
    """The algorithm ``name`` on ``model``, with relay rows for ``req_pool_size`` slots."""
    check_algorithm(name)
    if name == PlainDecoding.name:
        if block_verification:
            raise ValueError("`block_verification` needs a chain-drafting algorithm, not `none`")
        return PlainDecoding(model, req_pool_size, debug=debug)
    return _speculative_factory(name)(
        name,
        model,
        req_pool_size,
        debug=debug,
        num_steps=num_steps,
        topk=topk,
        num_draft_tokens=num_draft_tokens,
        draft_model=draft_model,
        seed=seed,
        block_verification=block_verification,
    )
