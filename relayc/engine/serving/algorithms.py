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
view lags one iteration; see ``relayc.engine.serving.overlap``).

Every bundled algorithm, ``none`` included, is one :class:`GeneratedAlgorithm`: the
``PrefillStep`` / ``DecodeStep`` relayc generated from ``relayc/specs/NAME.yaml``, run
on the engine's op implementations (:mod:`relayc.engine.ops`) with the drafter its
algorithm's module builds (:mod:`relayc.engine.algorithms`). The engine reads what the
spec's ``outputs:`` section names, as attributes of the generated ``PrefillOutputs`` /
``DecodeOutputs``.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from relayc.engine.algorithms.registry import (
    DraftingRequest,
    drafter_of,
    drafting_implementations,
    engine_algorithms,
    lookup,
)
from relayc.engine.algorithms.registry import default_dims as default_dims  # Engine's import
from relayc.engine.core.forward_batch import ForwardBatch
from relayc.engine.core.sampling import SamplingBatch
from relayc.engine.draft.speculative import Drafting
from relayc.engine.draft.standalone import DraftConfidence
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.ops import implementations
from relayc.engine.ops.context import StepContext
from relayc.engine.ops.draft import proposer_lock, proposes_nothing
from relayc.engine.ops.registry import checked, declaration
from relayc.engine.serving.graphs import EAGER, DecodeGraphs
from relayc.runtime.rules import check_dim_rules


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
    counts: torch.Tensor | None = None  # [B] int64 or int32 in 1..K, valid entries of ``tokens``
    committed: bool = False  # the algorithm wrote req_to_token for this decode


class DecodeAlgorithm(ABC):
    """The per-algorithm decode step the scheduler calls (on the forward runner)."""

    name: str
    decode_width: int = 1  # KV slots per request per decode step (the window W)
    max_tokens_per_step: int = 1  # most tokens one decode step emits per request (K <= W)
    # How decode() runs the generated DecodeStep (relayc.engine.serving.graphs); the engine sets it.
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

    def decode_held(
        self,
        req_pool_indices: torch.Tensor,
        all_greedy: bool,
        prefix_lens: Sequence[int],
        slots: Sequence[int],
    ) -> StepOutput | None:
        """The next decode step of the batch the last :meth:`decode` ran (the same
        ``req_pool_indices`` tensor), from its new prefix lengths and KV windows as
        integers (see ``DecodeGraphs.run_held``), without building its inputs; None: call
        :meth:`decode`. Algorithms without a recorded step return None."""
        return None

    def draft_modules(self) -> tuple[nn.Module, ...]:
        """The draft model's modules, if any (the engine sets their CPU weight layout)."""
        return ()

    def drafts_nothing(self, req_pool_indices: Sequence[int]) -> bool:
        """Whether the next decode step of these requests, whose tokens the host has all
        seen (no step of theirs in flight), would verify the root alone for each: then the
        scheduler runs a one-token step instead (:mod:`relayc.engine.serving.undrafted`),
        through :meth:`prefill`, which must leave the relay as such a decode step would.
        False (the default): always decode."""
        return False

    def on_prompt(self, req_pool_index: int, prompt_ids: list[int]) -> None:  # noqa: B027
        """A request was admitted into ``req_pool_index`` with these prompt tokens."""

    def on_tokens(self, req_pool_index: int, tokens: list[int]) -> None:  # noqa: B027
        """The host learned these new output tokens of a request (in order, kept ones only)."""

    def release(self, req_pool_index: int) -> None:  # noqa: B027
        """The request slot is free: no job holds it any more; drop per-request host state."""


Impls = Mapping[str, Callable[..., dict[str, torch.Tensor]]]


class GeneratedAlgorithm(DecodeAlgorithm):
    """An algorithm's generated relay module run on op implementations.

    ``module``: the generated module (the algorithm's own, ``relayc.generated.<name>`` for
    relayc's; a user's own spec compiled with ``relayc compile`` otherwise), run with the
    drafter of ``name``.
    ``impls``: op implementations merged over the engine's own (:mod:`relayc.engine.ops`),
    for user ops or to replace a built-in one.
    """

    def __init__(
        self,
        name: str,
        model: LlamaForCausalLM,
        req_pool_size: int,
        *,
        debug: bool = False,
        num_steps: int | None = 3,
        topk: int = 1,
        num_draft_tokens: int | None = 4,
        draft_model: str | Path | None = None,
        seed: int = 0,
        module: ModuleType | None = None,
        impls: Impls | None = None,
        block_verification: bool = False,
        draft_confidence: float | None = None,
    ) -> None:
        super().__init__(model)
        algorithm = lookup(name, engine=True)
        module = module or importlib.import_module(algorithm.module_name)
        all_impls = check_generated(
            name,
            module,
            impls,
            block_verification=block_verification,
            draft_confidence=draft_confidence,
        )
        self.name = name
        self.module = module
        if num_steps is not None and num_draft_tokens is not None:
            dims = {"num_steps": num_steps, "topk": topk, "num_draft_tokens": num_draft_tokens}
            check_dim_rules(name, module.DIM_RULES, dims)  # the rules of the module it runs
        assert algorithm.make_drafting is not None  # lookup(engine=True) guarantees it
        self.drafting: Drafting = algorithm.make_drafting(
            DraftingRequest(
                model=model,
                req_pool_size=req_pool_size,
                num_steps=num_steps,
                topk=topk,
                num_draft_tokens=num_draft_tokens,
                draft_model=draft_model,
                seed=seed,
            )
        )
        self.drafter = self.drafting.drafter
        # the dims the drafter settled (dflash: its block), where the caller left them open
        if self.drafting.num_draft_tokens is not None:
            num_steps, num_draft_tokens = self.drafting.num_steps, self.drafting.num_draft_tokens
        if num_steps is None or num_draft_tokens is None:
            raise ValueError(f"`{name}` needs `num_steps` and `num_draft_tokens`")
        self.decode_width = self.drafting.decode_width
        self.max_tokens_per_step = self.drafting.max_tokens_per_step
        decode_outputs = {f.name for f in dataclasses.fields(module.DecodeOutputs)}
        # `tokens`/`counts` in the spec's outputs: the step emits several tokens per request
        # and commits their KV itself (the spec checks guarantee both or neither).
        self.multi_token = "tokens" in decode_outputs
        if self.multi_token != (self.decode_width > 1):
            raise ValueError(
                f"module `{module.__name__}` decodes "
                f"{'several tokens' if self.multi_token else 'one token'} per step, but the "
                f"drafter of `{name}` needs {'a window of ' if self.decode_width > 1 else ''}"
                f"{self.decode_width} KV slot(s) per request: pair the module with the "
                "algorithm its spec was written for"
            )
        config = model.config
        self.dims = {
            "topk": topk,
            "num_steps": num_steps,
            "num_draft_tokens": num_draft_tokens,
            "hidden": config.hidden_size,
            "vocab": config.vocab_size,
        }
        self.chain_drafts = chain_drafts(module)
        self.block_verification = block_verification
        self.draft_confidence = None
        if draft_confidence is not None:
            self.draft_confidence = DraftConfidence(
                req_pool_size + 1, num_steps, draft_confidence, model.device
            )
        # Row 0 of the relay is the padding slot, as in ReqToTokenPool: slots 1..size.
        self.relay = module.FutureMap(
            req_pool_size + 1,
            model.device,
            dims={k: v for k, v in self.dims.items() if k in module.DIM_DEFAULTS},
            model_dtype=config.dtype,
            debug=debug,
        )
        all_impls = checked_impls(module, all_impls, {**self.relay.dims, **self.dims}, config.dtype)
        self.prefill_step = module.PrefillStep(self.relay, all_impls)
        self.decode_step = module.DecodeStep(self.relay, all_impls)
        self.capture_batch_sizes = tuple(module.CAPTURE_BATCH_SIZES)
        self.draft_kv: Any = None  # allocated on the first step, sized like the target's
        self.bonus_slots = self.drafting.bonus_slots

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
                "draft_confidence": self.draft_confidence,
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
        return StepOutput(next_tokens=outputs.next_tokens)

    def decode(self, step: StepInputs) -> StepOutput:
        forward = step.forward
        ctx = self._context(
            step,
            forward=forward,
            out_cache_loc=forward.out_cache_loc,
            max_prefix_len=step.max_prefix_len,
        )
        outputs = self.graphs.run(
            self.decode_step,
            ctx,
            req_pool_indices=forward.req_pool_indices,
            seq_lens=forward.prefix_lens,
        )
        return self._decoded(outputs)

    def decode_held(
        self,
        req_pool_indices: torch.Tensor,
        all_greedy: bool,
        prefix_lens: Sequence[int],
        slots: Sequence[int],
    ) -> StepOutput | None:
        outputs = self.graphs.run_held(req_pool_indices, all_greedy, prefix_lens, slots)
        return None if outputs is None else self._decoded(outputs)

    def _decoded(self, outputs: Any) -> StepOutput:
        if not self.multi_token:
            return StepOutput(next_tokens=outputs.next_tokens)
        return StepOutput(
            next_tokens=outputs.next_tokens,
            tokens=outputs.tokens,
            counts=outputs.counts,
            committed=True,
        )

    def draft_modules(self) -> tuple[nn.Module, ...]:
        drafter = self.drafter
        module = drafter if isinstance(drafter, nn.Module) else getattr(drafter, "model", None)
        return (module,) if isinstance(module, nn.Module) else ()

    def drafts_nothing(self, req_pool_indices: Sequence[int]) -> bool:
        # A host drafter's relay is the accepted row alone, which a one-token prefill
        # stashes as a verify of the root alone would (``ngram_prefill``); a draft model's
        # relay (hidden states, draft KV) is not known to come out the same.
        if not (self.multi_token and self.drafting.tracks_history):
            return False
        return proposes_nothing(self.drafter, req_pool_indices)

    # A history-tracking drafter (n-gram) keeps each request's tokens on the host (one
    # iteration behind).
    def on_prompt(self, req_pool_index: int, prompt_ids: list[int]) -> None:
        if self.drafting.tracks_history:
            with proposer_lock():
                self.drafter.add_request(req_pool_index, prompt_ids)

    def on_tokens(self, req_pool_index: int, tokens: list[int]) -> None:
        if self.drafting.tracks_history:
            with proposer_lock():
                self.drafter.update(req_pool_index, tokens)

    def release(self, req_pool_index: int) -> None:
        if self.drafting.tracks_history:
            with proposer_lock():
                self.drafter.remove_request(req_pool_index)


def module_ops(module: ModuleType) -> list[str]:
    """Every op the module's prefill and decode steps run, in order, once each."""
    return list(dict.fromkeys([*module.PrefillStep.OPS, *module.DecodeStep.OPS]))


def merged_impls(module: ModuleType, impls: Impls | None) -> dict[str, Callable[..., Any]]:
    """The engine's op implementations with ``impls`` over them; every op the module's steps
    run must have one, and every op ``impls`` names must be one the module runs (a typo
    would otherwise leave the built-in running, silently)."""
    if impls is not None and not isinstance(impls, Mapping):
        raise TypeError(
            f"`impls` maps op names to functions `fn(ctx, **inputs) -> dict`; got "
            f"{type(impls).__name__}"
        )
    user = dict(impls or {})
    for op_name, fn in user.items():
        if not isinstance(op_name, str) or not callable(fn):
            raise TypeError(
                f"`impls` maps op names to functions `fn(ctx, **inputs) -> dict`; got "
                f"{op_name!r}: {type(fn).__name__}"
            )
    needed = module_ops(module)
    for op_name in user:
        if op_name not in needed:
            close = difflib.get_close_matches(op_name, needed, n=1)
            hint = f"; did you mean `{close[0]}`?" if close else ""
            raise ValueError(
                f"`impls` names op `{op_name}`, which module `{module.__name__}` does not run "
                f"(its ops: {', '.join(f'`{n}`' for n in needed)}){hint}"
            )
    merged = {**implementations(), **drafting_implementations(), **user}
    missing = [op_name for op_name in needed if op_name not in merged]
    if missing:
        listed = ", ".join(f"`{op_name}`" for op_name in missing)
        example = ", ".join(f'"{op_name}": fn' for op_name in missing)
        raise ValueError(
            f"module `{module.__name__}` runs ops with no implementation: {listed}; pass "
            f"them as `impls={{{example}}}` (each `fn(ctx, **inputs) -> dict of outputs`)"
        )
    return merged


def checked_impls(
    module: ModuleType,
    impls: Mapping[str, Callable[..., Any]],
    dims: Mapping[str, int],
    model_dtype: torch.dtype,
) -> dict[str, Callable[..., Any]]:
    """``impls`` with the outputs of every op the module runs checked against the op's
    declaration when it returns (``relayc.engine.ops.registry.checked``); an op whose
    declaration this process does not know (a user op whose module is not imported) runs
    unchecked."""
    wrapped = dict(impls)
    for op_name in module_ops(module):
        op = declaration(op_name)
        if op is not None:
            wrapped[op_name] = checked(op, impls[op_name], dims, model_dtype)
    return wrapped


# What a module `relayc compile` generated provides to the engine.
_GENERATED = ("ALGORITHM", "FIELDS", "FutureMap", "PrefillStep", "DecodeStep", "DecodeOutputs")


def check_pairing(name: str, module: ModuleType, impls: Impls | None = None) -> None:
    """Raise ``ValueError`` unless the generated ``module`` can run with the drafter of ``name``.

    The engine's implementation of a drafting op drives one algorithm's drafter (its
    module's ``Algorithm.impls``): every such op the module runs with the engine's
    implementation must be one of ``name``'s, and a speculative ``name`` needs at least
    one op that drives its drafter (else nothing drafts). Checked when the engine is
    built, so a module compiled for another algorithm fails here, not inside a step.
    """
    ops = module_ops(module)
    own = set(impls or {})
    owners = drafter_of()
    foreign = {op: owners[op] for op in ops if op not in own and owners.get(op, name) != name}
    drives = [op for op in ops if owners.get(op) == name]
    theirs = sorted(op for op, drafter in owners.items() if drafter == name)
    if not foreign and (drives or not theirs):  # no ops of its own: it drafts nothing
        return
    compiled_for = getattr(module, "ALGORITHM", "?")
    head = (
        f"`relay_module` `{module.__name__}` (compiled for `{compiled_for}`) cannot run with "
        f"algorithm `{name}`: "
    )
    if foreign:
        drafters = sorted(set(foreign.values()))
        why = (
            f"its ops {', '.join(f'`{op}`' for op in foreign)} drive the drafter of "
            f"{' and '.join(f'`{d}`' for d in drafters)}, and `{name}` "
            + ("has its own" if theirs else "drafts nothing")
        )
    else:
        why = (
            f"none of its ops drives the drafter of `{name}` "
            f"({', '.join(f'`{op}`' for op in theirs)}), so it would never draft"
        )
    fix = (
        f'pass `algorithm="{compiled_for}"`'
        if compiled_for != name and compiled_for in {a.name for a in engine_algorithms()}
        else "pass the algorithm its spec was written for"
    )
    raise ValueError(f"{head}{why}; {fix}, or a module compiled from a spec for `{name}`")


def chain_drafts(module: ModuleType) -> bool:
    """A relayed draft distribution means chain rejection sampling: first drafts are drawn
    from it rather than taken as the top-1."""
    return any(f.name == "draft_probs" for f in module.FIELDS)


def check_generated(
    name: str,
    module: ModuleType,
    impls: Impls | None,
    *,
    block_verification: bool = False,
    draft_confidence: float | None = None,
) -> dict[str, Callable[..., Any]]:
    """Every check of a generated algorithm that needs no model: the module fits ``name``'s
    drafter, ``impls`` fits the module, the options fit both. Returns the merged impls.

    ``Engine`` calls it before it loads anything; :class:`GeneratedAlgorithm` again, for
    callers that build one directly.
    """
    absent = [attr for attr in _GENERATED if not hasattr(module, attr)]
    if absent:
        raise ValueError(
            f"`relay_module` `{module.__name__}` is not a module `relayc compile` generated "
            f"(it has no {', '.join(f'`{a}`' for a in absent)}); compile your spec with "
            "`relayc compile SPEC -o DIR` and pass the module it writes"
        )
    algorithm = lookup(name, engine=True)
    merged = merged_impls(module, impls)
    check_pairing(name, module, impls)
    if block_verification and not chain_drafts(module):
        raise ValueError(
            "`block_verification` verifies chain drafts with their draft probabilities; "
            f"algorithm `{name}` does not draft a chain (its spec relays no `draft_probs`)"
        )
    dynamic = [f"`{a.name}`" for a in engine_algorithms() if a.dynamic_draft_length]
    if draft_confidence is not None and (
        not algorithm.dynamic_draft_length or not 0 < draft_confidence <= 1
    ):
        raise ValueError(
            "`draft_confidence` (dynamic draft length) is a probability in (0, 1] "
            "for an algorithm that drafts a chain with a draft model "
            f"({', '.join(dynamic) or 'none is installed'}); got {draft_confidence!r} for "
            f"`{name}`"
        )
    return merged


def check_algorithm(name: str) -> None:
    """Raise before any allocation when ``name`` is not an algorithm the engine runs."""
    lookup(name, engine=True)


# What the engine builds for an algorithm name: the constructor takes exactly its arguments,
# so a second signature to keep in step would only repeat them.
make_algorithm = GeneratedAlgorithm
