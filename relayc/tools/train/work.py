"""Reading back what a ``--work`` folder holds (training checkpoints, feature shards, JSON
records) without trusting it.

A work folder may be shared or copied from elsewhere, so its ``*.pt`` files are loaded with
``torch.load(weights_only=True)``: tensors, dicts, lists, tuples, numbers, strings, never an
object whose unpickling runs code. Everything the training tools save is made of those (a
module's and an optimizer's ``state_dict``, a generator's state as a byte tensor, step
counts and logs), so resuming loses nothing. A file that cannot be loaded that way, is
damaged, or holds another structure is a ``CheckpointError`` naming it and saying how to
go on.
"""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from relayc.engine.errors import CheckpointError

FRESH = "delete it or give a fresh --work folder to start over"


def load_pt(path: Path) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU, every failure a ``CheckpointError``
    naming ``path``."""
    try:
        with warnings.catch_warnings():
            # torch warns about a pickle protocol it did not write before refusing the file
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except OSError as exc:
        raise CheckpointError(f"cannot read: {exc.strerror or exc}", path) from None
    except Exception as exc:
        # torch's parser on foreign bytes: any failure (its refusal of a global, EOFError
        # when empty, RuntimeError from the zip reader when truncated, KeyError or
        # UnpicklingError from the legacy format on other bytes) means we cannot use it
        if isinstance(exc, pickle.UnpicklingError) and "Weights only load failed" in str(exc):
            # torch's message explains how to load it unsafely; say only what it held
            raise CheckpointError(
                f"holds more than tensors and plain data ({_unpickler_detail(str(exc))}); "
                f"relayc does not unpickle objects from a --work folder: {FRESH}",
                path,
            ) from None
        lines = str(exc).strip().splitlines()
        first = lines[0][:200] if lines else type(exc).__name__
        raise CheckpointError(
            f"is damaged or not a relayc training file ({first}); {FRESH}", path
        ) from None


def _unpickler_detail(message: str) -> str:
    """The line of torch's refusal that says what the file holds (a global it would import,
    or an opcode its unpickler does not take), without torch's advice around it."""
    tail = message.split("WeightsUnpickler error:")[-1]
    for line in (line.strip() for line in tail.splitlines()):
        if line and not line.startswith(_TORCH_ADVICE):
            return line[:200]
    return "an object other than tensors and plain data"


_TORCH_ADVICE = ("Weights only load failed", "Please file an issue", "Check the documentation")


def load_state(path: Path, fields: dict[str, type | tuple[type, ...]]) -> dict[str, Any]:
    """The checkpoint dict in ``path`` (:func:`load_pt`), each of ``fields`` present with
    its type; ``CheckpointError`` naming the first that is not."""
    state = load_pt(path)
    if not isinstance(state, dict):
        raise CheckpointError(
            f"holds a {type(state).__name__}, not a training checkpoint's dict: {FRESH}", path
        )
    require(state, fields, path)
    return state


def require(
    mapping: dict[str, Any], fields: dict[str, type | tuple[type, ...]], path: Path, where: str = ""
) -> None:
    """``CheckpointError`` unless each of ``fields`` is in ``mapping`` (the part ``where`` of
    the file ``path``, e.g. ``log.``) with its type."""
    for key, kind in fields.items():
        if key not in mapping:
            raise CheckpointError(
                f"has no `{where}{key}`: not a file this training command wrote; {FRESH}", path
            )
        value = mapping[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _types(kind)):
            raise CheckpointError(
                f"`{where}{key}` is a {type(value).__name__}, not what this training command "
                f"saves; {FRESH}",
                path,
            )


def _types(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def restore_module(module: nn.Module, weights: dict[str, Any], path: Path, flags: str) -> None:
    """``module.load_state_dict(weights)`` after :func:`check_fits`."""
    check_fits(module, weights, path, flags)
    module.load_state_dict(weights)


def check_fits(module: nn.Module, weights: dict[str, Any], path: Path, flags: str) -> None:
    """``CheckpointError`` unless ``weights`` (from ``path``) has ``module``'s tensors and
    shapes; a mismatch means another model shape (other ``flags`` than the run that saved
    it), and the message says which tensors differ."""
    ours = module.state_dict()
    missing = [k for k in ours if k not in weights]
    unexpected = [k for k in weights if k not in ours]
    resized = [
        f"{k}: {_shape(weights[k])} saved, {tuple(ours[k].shape)} here"
        for k in ours
        if k in weights
        and (not isinstance(weights[k], torch.Tensor) or weights[k].shape != ours[k].shape)
    ]
    problems = []
    if missing:
        problems.append(f"{len(missing)} tensor(s) this run needs are missing (e.g. {missing[0]})")
    if unexpected:
        problems.append(f"{len(unexpected)} tensor(s) this run lacks (e.g. {unexpected[0]})")
    if resized:
        problems.append(f"{len(resized)} tensor(s) have another shape (e.g. {resized[0]})")
    if problems:
        raise CheckpointError(
            f"was saved by a run with another model shape: {'; '.join(problems)}; resume "
            f"with the {flags} the run in this --work folder started with, or {FRESH}",
            path,
        )


def _shape(value: Any) -> str:
    return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__


def restore_optimizer(optimizer: torch.optim.Optimizer, state: dict[str, Any], path: Path) -> None:
    """``optimizer.load_state_dict(state)``, a mismatch a ``CheckpointError``."""
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise CheckpointError(
            f"its optimizer state does not fit this run ({str(exc) or type(exc).__name__}); "
            f"{FRESH}",
            path,
        ) from None


def restore_generator(generator: torch.Generator, state: Any, path: Path, key: str) -> None:
    """``generator.set_state(state)``, a state that is not one a ``CheckpointError``."""
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
        raise CheckpointError(
            f"`{key}` is not a random generator's state (a uint8 tensor); {FRESH}", path
        )
    try:
        generator.set_state(state)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "rejected"
        raise CheckpointError(
            f"`{key}` is not a valid generator state ({first}); {FRESH}", path
        ) from None


def check_settings(saved: Any, current: dict[str, Any], path: Path) -> None:
    """``CheckpointError`` naming the flag when a checkpoint's recorded ``saved`` settings
    (flag -> value; None in checkpoints from before they were recorded) differ from this
    run's ``current`` ones."""
    if saved is None:
        return
    if not isinstance(saved, dict):
        raise CheckpointError(f"`settings` is a {type(saved).__name__}, not a dict; {FRESH}", path)
    for flag, value in current.items():
        if flag in saved and saved[flag] != value:
            raise CheckpointError(
                f"was saved by a run with {flag} {_flag_value(saved[flag])}, this run has "
                f"{_flag_value(value)}: resume with the flags the run in this --work folder "
                f"started with, or {FRESH}",
                path,
            )


def _flag_value(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value))
    return "(not given)" if value is False or value is None else str(value)


def read_json(path: Path) -> Any:
    """The JSON value in ``path`` (a record the training tools wrote into ``--work``), or a
    ``CheckpointError`` naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CheckpointError(f"cannot read: {exc.strerror or exc}", path) from None
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"not UTF-8 text (byte {exc.start}); {FRESH}", path) from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}; {FRESH}", path
        ) from None
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"cannot be read as JSON ({exc}); {FRESH}", path) from None
