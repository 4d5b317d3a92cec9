"""``Engine(model=...)``'s one entry point: a name, a file or a folder -> model and tokenizer.

- ``None``: the shipped byte-level demo target (``relayc.engine.checkpoints.shipped``), or the tiny
  random model in an install without it; ``"random"``: the tiny random model;
- a name from ``relayc.engine.checkpoints.named`` (``"smollm2"``);
- a ``.gguf`` file (``relayc.engine.checkpoints.gguf``), with the tokenizer in its metadata;
- a Hugging Face checkpoint folder (``relayc.engine.model.weights``), with its ``tokenizer.json``
  when it has one.

The byte-level tokenizer serves the byte-level vocabulary (the demo models). A model
whose tokenizer cannot be built still loads -- token-id prompts run -- and the reason is
kept in ``tokenizer_error`` for the request that brings a string.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from os import PathLike, fspath
from pathlib import Path
from typing import Union

import torch

from relayc.engine.checkpoints.gguf import load_gguf_model, open_gguf
from relayc.engine.checkpoints.named import NAMED_MODELS, named_model_file
from relayc.engine.checkpoints.shipped import RANDOM, mark_named_target, shipped_target
from relayc.engine.core.config import PRECISIONS, ModelConfig, dtype_from_name
from relayc.engine.errors import CheckpointError
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import load_checkpoint, random_model
from relayc.engine.text.bytes import VOCAB_SIZE, ByteTokenizer
from relayc.engine.text.tokenizer import (
    Tokenizer,
    TokenizerError,
    tokenizer_from_dir,
    tokenizer_from_gguf,
)

AnyTokenizer = Union[Tokenizer, ByteTokenizer]  # noqa: UP007 - a runtime alias
ModelArg = str | PathLike[str] | LlamaForCausalLM | None
Progress = Callable[[str], None]
DTYPES = ("float32", "bfloat16", "int8")  # what `dtype=` / `--dtype` take by name


@dataclass
class LoadedModel:
    model: LlamaForCausalLM
    tokenizer: AnyTokenizer | None
    source: str  # what was loaded, for messages: "shipped demo target", a path, a name
    shipped: bool = False  # the demo target: `draft_model=None` means the shipped drafter
    tokenizer_error: str | None = None  # why `tokenizer` is None, when it should not be
    name: str | None = (
        None  # the named model loaded (its drafters: each algorithm's `named_drafters`)
    )


def resolve_dtype(dtype: object) -> torch.dtype | None:
    """``dtype=`` as given to ``Engine``: None, a name, or a torch dtype."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if not isinstance(dtype, str):
        raise TypeError(f"`dtype` must be one of {', '.join(DTYPES)} or None; got {dtype!r}")
    if dtype in PRECISIONS:  # "int8": float32 tensors, the products set by the engine
        return PRECISIONS[dtype]
    return dtype_from_name(dtype)


def load_model(
    model: ModelArg,
    *,
    device: torch.device,
    dtype: torch.dtype | None = None,
    seed: int = 0,
    progress: Progress | None = None,
) -> LoadedModel:
    """Load what ``model`` names; ``CheckpointError`` (a ``ValueError``) names what failed."""
    if isinstance(model, LlamaForCausalLM):
        return LoadedModel(model, _byte_tokenizer(model.config), "a LlamaForCausalLM")
    if model is None and (target := shipped_target()) is not None:
        loaded = load_checkpoint(target, device=device, dtype=dtype)
        return LoadedModel(loaded, ByteTokenizer(), "the shipped demo target", shipped=True)
    if model is None or model == RANDOM:
        config = ModelConfig() if dtype is None else ModelConfig(dtype=dtype)
        return LoadedModel(random_model(config, seed=seed, device=device), ByteTokenizer(), RANDOM)
    if not isinstance(model, str | PathLike):
        raise TypeError(
            "`model` must be None, 'random', a model name, a .gguf file, a checkpoint folder "
            f"or a LlamaForCausalLM; got {type(model).__name__}"
        )
    name = fspath(model)
    if name in NAMED_MODELS:
        path = named_model_file(name)
        named = _load_gguf(path, device, dtype, progress, source=f"{name} ({path.name})")
        mark_named_target(named.model, name)  # `draft_model=None`: its shipped drafters
        named.name = name
        return named
    path = Path(name).expanduser()
    if path.is_file():
        return _load_gguf(path, device, dtype, progress, source=str(path))
    if path.is_dir():
        return _load_folder(path, device, dtype)
    known = ", ".join(repr(n) for n in (*NAMED_MODELS, RANDOM))
    raise CheckpointError(
        f"model {name!r} is neither a model name ({known}), a .gguf file nor a checkpoint "
        "folder; check the path"
    )


def _byte_tokenizer(config: ModelConfig) -> ByteTokenizer | None:
    return ByteTokenizer() if config.vocab_size == VOCAB_SIZE else None


def _report(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


def _load_gguf(
    path: Path,
    device: torch.device,
    dtype: torch.dtype | None,
    progress: Progress | None,
    source: str,
) -> LoadedModel:
    start = time.perf_counter()
    _report(progress, f"reading {path.name} ...")
    file = open_gguf(path)
    _report(progress, f"dequantizing {len(file.reader.tensors)} tensors ...")
    model = load_gguf_model(file, device=device, dtype=dtype)
    tokenizer: AnyTokenizer | None
    error = None
    try:
        tokenizer = tokenizer_from_gguf(file)
    except TokenizerError as exc:
        tokenizer, error = None, str(exc)
    config = model.config
    _report(
        progress,
        f"loaded {source}: {config.num_layers} layers, width {config.hidden_size}, "
        f"vocabulary {config.vocab_size}, {str(config.dtype).removeprefix('torch.')} "
        f"({time.perf_counter() - start:.1f} s)",
    )
    return LoadedModel(model, tokenizer, source, tokenizer_error=error)


def _load_folder(path: Path, device: torch.device, dtype: torch.dtype | None) -> LoadedModel:
    model = load_checkpoint(path, device=device, dtype=dtype)
    error = None
    tokenizer: AnyTokenizer | None
    try:
        tokenizer = tokenizer_from_dir(path, model.config.vocab_size) or _byte_tokenizer(
            model.config
        )
    except TokenizerError as exc:
        tokenizer, error = None, str(exc)
    return LoadedModel(model, tokenizer, str(path), tokenizer_error=error)
