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
) -> EngineArgs:
    """Check what ``Engine`` takes besides the model and the decode dims; see the module doc."""
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
    if isinstance(algorithm, DecodeAlgorithm):
        if module is not None or impls is not None:
            raise EngineArgumentError(
                "`relay_module` and `impls` configure an algorithm given by name; a "
                "DecodeAlgorithm instance runs its own steps: drop them"
            )
    else:
        check_generated(
            algorithm,
            module or importlib.import_module(lookup(algorithm, engine=True).module_name),
            impls,
            block_verification=bool(block_verification),
            draft_confidence=confidence,
        )
    return EngineArgs(module, sizes, confidence, quantization)


def check_decode_dims(
    algorithm: str,
    num_steps: object,
    topk: object,
    num_draft_tokens: object,
    *,
    vocab_size: int | None = None,
) -> None:
    """Raise ``ValueError`` when the dims cannot run ``algorithm``, before anything is built.

    Otherwise the first decode step fails, with requests already holding KV slots.
    ``vocab_size`` (known once the model is loaded) bounds ``topk`` too.
    """
    if algorithm == "none":
        return  # no drafts: the dims are unused
    if algorithm == "dflash":
        _check_block_dims(num_steps, topk, num_draft_tokens)
        return
    steps = positive_int("num_steps", num_steps)
    k = positive_int("topk", topk)
    n = positive_int("num_draft_tokens", num_draft_tokens)
    # The root plus the candidates drafting produces (drafts beyond them have no source);
    # eagle's count is relayc.engine.draft.tree.max_candidates, kept out of this import.
    most = {"eagle": k + (steps - 1) * k * k + 1, "eagle_multilayer": k * steps + 1}
    most["eagle3"] = most["eagle"]  # EAGLE-3 drafts the same tree
    if algorithm in most and n > most[algorithm]:
        tree = algorithm in ("eagle", "eagle3")
        shape = "topk + (num_steps - 1) * topk**2" if tree else "topk * num_steps"
        raise EngineArgumentError(
            f"`num_draft_tokens` must lie in 1..{most[algorithm]} for `{algorithm}` with "
            f"topk={k}, num_steps={steps} (the root plus {shape} drafted candidates); "
            f"got {n}: lower it or raise `topk` / `num_steps`"
        )
    if algorithm == "ngram" and n < 2:
        raise EngineArgumentError(
            f"`num_draft_tokens` must be >= 2 for `ngram` (root + drafts); got {n}"
        )
    if algorithm == "standalone" and (k != 1 or n != steps + 1):
        raise EngineArgumentError(
            "`standalone` drafts a chain: it needs topk=1 and num_draft_tokens = "
            f"num_steps + 1 = {steps + 1}; got topk={k}, num_draft_tokens={n}"
        )
    if vocab_size is not None and algorithm in most and k > vocab_size:
        raise EngineArgumentError(
            f"`topk` must not exceed the vocabulary size {vocab_size}; got {k}"
        )


def _check_block_dims(num_steps: object, topk: object, num_draft_tokens: object) -> None:
    """DFlash drafts one chain of ``num_draft_tokens - 1`` tokens (None: the drafter's
    ``block_size`` decides, once it is loaded)."""
    if positive_int("topk", topk) != 1:
        raise EngineArgumentError(f"`dflash` drafts a chain: it needs topk=1; got topk={topk}")
    n = None if num_draft_tokens is None else positive_int("num_draft_tokens", num_draft_tokens)
    if n is not None and n < 2:
        raise EngineArgumentError(
            f"`num_draft_tokens` must be >= 2 for `dflash` (bonus + drafts); got {n}"
        )
    if num_steps is not None:
        steps = positive_int("num_steps", num_steps)
        if n is not None and steps != n - 1:
            raise EngineArgumentError(
                "`dflash` drafts num_draft_tokens - 1 tokens in one block forward: leave "
                f"`num_steps` out or set it to {n - 1}; got num_steps={steps}"
            )
