"""``Engine(...)``'s argument checks: a clear ``EngineArgumentError`` (a ``ValueError``; a
``TypeError`` too for a value of the wrong type) before the engine loads a model or allocates
anything.

Types are checked strictly where a loose value would silently mean something else:
``block_verification="no"`` is truthy, ``draft_confidence=True`` is 1.0, a bucket of 2.5
pads batches to a size that does not exist. What needs the model (``topk`` against the
vocabulary) is checked once it is loaded (``relayc.engine.serving.engine``).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from relayc.engine.algorithms import lookup
from relayc.engine.checkpoints.quantize import QUANTIZATIONS
from relayc.engine.serving.algorithms import DecodeAlgorithm, check_generated
from relayc.engine.serving.graphs import check_batch_sizes
from relayc.runtime.rules import DimRule, RuleSyntaxError, check_dim_rules, parse_rule


class EngineArgumentError(ValueError):
    """An argument ``Engine(...)`` cannot run with, found before anything loads: typed, so a
    command line reports it in one line and lets every other ``ValueError`` (a bug) show
    its traceback. A ``ValueError`` still, for callers that catch that."""


class EngineArgumentTypeError(EngineArgumentError, TypeError):
    """An argument of the wrong type (``overlap="no"``); a ``TypeError`` as before."""


def positive_int(name: str, value: object) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise EngineArgumentError(f"`{name}` must be a positive integer; got {value!r}")
    return int(value)


def optional_positive_int(name: str, value: object, default: str) -> int | None:
    """None (``default``) or a positive integer: 0 is not "unset" -- it would silently mean
    the default -- and a bool is not a count."""
    if value is None:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise EngineArgumentError(
            f"`{name}` must be a positive integer, or None for {default}; got {value!r}"
        )
    return int(value)


def check_flag(name: str, value: object) -> bool:
    """A switch must be a bool: ``"no"`` or ``"false"`` would turn it on."""
    if not isinstance(value, bool):
        raise EngineArgumentTypeError(f"`{name}` must be True or False; got {value!r}")
    return value


def check_draft_confidence(value: object) -> float | None:
    """None (off) or a real number in (0, 1]; ``True`` is not 1.0 and ``"0.4"`` is not 0.4."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise EngineArgumentTypeError(
            f"`draft_confidence` must be a number in (0, 1] (e.g. 0.4) or None (off); got {value!r}"
        )
    number = float(value)
    if not (math.isfinite(number) and 0 < number <= 1):
        raise EngineArgumentError(f"`draft_confidence` must lie in (0, 1]; got {value!r}")
    return number


def check_draft_quantization(value: object) -> str | None:
    """None (the drafter's weights as loaded) or a name in ``QUANTIZATIONS``, any case."""
    if value is None:
        return None
    choices = ", ".join(repr(q) for q in QUANTIZATIONS)
    if not isinstance(value, str):
        raise EngineArgumentTypeError(
            f"`draft_quantization` must be one of {choices} or None; got {value!r}"
        )
    name = value.lower()
    if name not in QUANTIZATIONS:
        raise EngineArgumentError(
            f"`draft_quantization` must be one of {choices} or None; got {value!r}"
        )
    return name


def resolve_relay_module(value: object) -> ModuleType | None:
    """``relay_module`` as a module: a module object, or the name or ``.py`` path of one.

    A path (anything ending in ``.py``, or an existing file) is loaded from that file, as
    ``relayc compile -o DIR`` wrote it; other strings are imported as module names.
    """
    if value is None or isinstance(value, ModuleType):
        return value
    if not isinstance(value, (str, os.PathLike)):
        raise EngineArgumentTypeError(
            "`relay_module` must be a module `relayc compile` generated (imported, or its "
            f"module name or .py path); got {type(value).__name__}"
        )
    path = Path(os.fspath(value)).expanduser()
    if path.suffix == ".py" or path.is_file():
        if not path.is_file():
            raise EngineArgumentError(f"`relay_module` {os.fspath(value)!r}: no such file")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise EngineArgumentError(
                f"`relay_module` {os.fspath(value)!r} cannot be loaded as a module"
            )
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise EngineArgumentError(
                f"`relay_module` {os.fspath(value)!r} failed to load: {type(exc).__name__}: {exc}"
            ) from exc
        return module
    name = os.fspath(value)
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise EngineArgumentError(
            f"`relay_module` {name!r}: cannot import it ({exc}); pass the module, its "
            "importable name, or the path of the .py file `relayc compile` wrote"
        ) from exc


@dataclass(frozen=True)
class EngineArgs:
    """The checked arguments ``Engine`` uses in a normalised form."""

    relay_module: ModuleType | None
    capture_batch_sizes: tuple[int, ...] | None
    draft_confidence: float | None
    draft_quantization: str | None = None
    dim_rules: tuple[DimRule, ...] = ()  # the spec's rules, checked again once vocab is known


def check_engine_args(
    algorithm: str | DecodeAlgorithm,
    *,
    overlap: object,
    debug: object,
    block_verification: object,
    draft_confidence: object,
    relay_module: object,
    impls: Mapping[str, Callable[..., Any]] | None,
    max_batch_size: object,
    capture_batch_sizes: Sequence[int] | None,
    draft_quantization: object = None,
    max_context: object = None,
    req_pool_size: object = None,
    kv_pool_tokens: object = 16384,
    max_prefill_tokens: object = 4096,
    num_steps: object = None,
    topk: object = 1,
    num_draft_tokens: object = None,
) -> EngineArgs:
    """Check what ``Engine`` takes besides the model, the decode dims included (against the
    dims rules of the module that runs ``algorithm``); see the module doc."""
    optional_positive_int("max_context", max_context, "the model's context length")
    optional_positive_int("req_pool_size", req_pool_size, "2 * max_batch_size")
    positive_int("kv_pool_tokens", kv_pool_tokens)
    positive_int("max_prefill_tokens", max_prefill_tokens)
    for name, flag in (
        ("overlap", overlap),
        ("debug", debug),
        ("block_verification", block_verification),
    ):
        check_flag(name, flag)
    confidence = check_draft_confidence(draft_confidence)
    quantization = check_draft_quantization(draft_quantization)
    drafts_without_weights = isinstance(algorithm, str) and not lookup(algorithm).drafter_weights
    if quantization is not None and drafts_without_weights:
        raise EngineArgumentError(
            f"`draft_quantization={quantization!r}` quantizes a drafter's weights; "
            f"`{algorithm}` drafts without any: drop it"
        )
    batch = positive_int("max_batch_size", max_batch_size)
    sizes = check_batch_sizes(capture_batch_sizes, batch)
    module = resolve_relay_module(relay_module)
    rules: tuple[DimRule, ...] = ()
    if isinstance(algorithm, DecodeAlgorithm):
        if module is not None or impls is not None:
            raise EngineArgumentError(
                "`relay_module` and `impls` configure an algorithm given by name; a "
                "DecodeAlgorithm instance runs its own steps: drop them"
            )
    else:
        generated = module or importlib.import_module(lookup(algorithm, engine=True).module_name)
        check_generated(
            algorithm,
            generated,
            impls,
            block_verification=bool(block_verification),
            draft_confidence=confidence,
        )
        rules = dim_rules(algorithm, generated)
        check_decode_dims(algorithm, rules, num_steps, topk, num_draft_tokens)
    return EngineArgs(module, sizes, confidence, quantization, rules)


def dim_rules(algorithm: str, module: ModuleType) -> tuple[DimRule, ...]:
    """The dims rules of ``algorithm``'s generated module (its spec's `rules:`)."""
    rules = getattr(module, "DIM_RULES", None)
    if not isinstance(rules, tuple) or not all(isinstance(r, DimRule) for r in rules):
        raise EngineArgumentError(
            f"module `{module.__name__}` lists no dims rules (`DIM_RULES`): it was generated "
            f"by an older relayc; regenerate it (`relayc compile SPEC -o DIR`) to run `{algorithm}`"
        )
    for rule in rules:  # relayc compile only writes rules that parse: this one was edited
        try:
            parse_rule(rule.text)
        except RuleSyntaxError as exc:
            raise EngineArgumentError(
                f"module `{module.__name__}` has a dims rule that does not parse, "
                f"`{rule.text}` ({rule.origin}): {exc.message}; regenerate the module from "
                "its spec (`relayc compile SPEC -o DIR`), which checks its rules"
            ) from None
    return rules


def check_decode_dims(
    algorithm: str,
    rules: Sequence[DimRule],
    num_steps: object,
    topk: object,
    num_draft_tokens: object,
    *,
    vocab_size: int | None = None,
) -> None:
    """Raise ``EngineArgumentError`` when the dims are no counts or break ``algorithm``'s
    dims rules (its spec's `rules:`), before anything is built.

    Otherwise the first decode step fails, with requests already holding KV slots.
    ``num_steps`` / ``num_draft_tokens`` may be None where the drafter decides them when it
    loads (DFlash's block): rules naming them are checked then. ``vocab_size`` (known once
    the model is loaded) binds ``vocab``.
    """
    values = {"topk": positive_int("topk", topk)}
    for name, value in (("num_steps", num_steps), ("num_draft_tokens", num_draft_tokens)):
        if value is not None:
            values[name] = positive_int(name, value)
    if vocab_size is not None:
        values["vocab"] = vocab_size
    check_dim_rules(algorithm, rules, values, error=EngineArgumentError)
