"""Seeded init and local-directory checkpoints of the draft heads (EAGLE, MTP).

Same format as ``relayc.engine.model.weights`` writes for the target: ``config.json``
plus ``model.safetensors`` (the standalone draft model *is* a target-style Llama
and uses those functions directly). ``config.json`` holds the Hugging Face
fields of the head's ``ModelConfig`` plus ``draft_type`` and the head's own
settings (e.g. ``num_steps``); the embedding and LM head are the target's and
are not stored. A head's loader checks the sizes ``config.json`` gives against the
safetensors headers (:func:`check_draft_tensors`) before it builds the head.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from relayc.engine.core.config import ModelConfig, positive_int, shown
from relayc.engine.core.limits import check_count, check_shapes
from relayc.engine.draft.layers import check_head_config
from relayc.engine.errors import CheckpointError
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import (
    SINGLE_FILE,
    config_from_hf,
    read_json_object,
    reading_safetensors,
    tensor_table,
)

DRAFT_TYPE_KEY = "draft_type"


def init_module_random(module: nn.Module, seed: int, std: float = 0.2) -> nn.Module:
    """Fill ``module``'s parameters in place like ``relayc.engine.model.weights.init_random``:
    N(0, std) in name order from a private CPU generator, norms to ones."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, tensor in sorted(module.state_dict().items()):
            if name.endswith("norm.weight"):
                values = torch.ones(tensor.shape)
            else:
                values = torch.randn(tensor.shape, generator=generator) * std
            tensor.copy_(values.to(tensor.dtype))
    return module


def save_draft(
    module: nn.Module,
    config: ModelConfig,
    draft_type: str,
    directory: str | Path,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` for a draft head."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    header = {**config.to_hf_config(), DRAFT_TYPE_KEY: draft_type, **(extra or {})}
    (directory / "config.json").write_text(json.dumps(header, indent=2, sort_keys=True) + "\n")
    tensors = {
        name: tensor.detach().to("cpu").contiguous()
        for name, tensor in sorted(module.state_dict().items())
    }
    save_file(tensors, str(directory / SINGLE_FILE), metadata={"format": "pt"})
    return directory


def read_draft_config(
    directory: str | Path,
    draft_type: str,
    target: LlamaForCausalLM,
    counts: Sequence[str] = (),
) -> tuple[ModelConfig, dict[str, Any]]:
    """The head's ``ModelConfig`` and the whole ``config.json`` dict; checks ``draft_type``,
    that the head's widths are ``target``'s (it shares the target's embedding and LM head)
    and that each of the head's own ``counts`` (e.g. ``num_steps``) is a whole number > 0.
    Raises ``CheckpointError`` naming the file and the key."""
    directory = Path(directory)
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"draft checkpoint directory {directory} has no config.json")
    header = read_json_object(path)
    found = header.get(DRAFT_TYPE_KEY)
    if found != draft_type:
        raise CheckpointError(
            f"holds `{DRAFT_TYPE_KEY}: {shown(found, quoted=False)}`, expected `{draft_type}` "
            "(a checkpoint of the draft head this algorithm uses, as its save() writes it)",
            path,
        )
    config = config_from_hf(header, path)
    try:
        check_head_config(config, target)
        for key in counts:
            positive_int(header, key)
    except ValueError as exc:  # ConfigError among them
        raise CheckpointError(str(exc), path) from None
    return config, header


def check_draft_tensors(
    directory: str | Path,
    shapes: Callable[[], Mapping[str, tuple[int, ...]]],
    *,
    kind: str,
    count: tuple[str, int] | None = None,
    files: Sequence[Path] | None = None,
    optional: Collection[str] = (),
    ignored: Collection[str] = (),
) -> None:
    """``CheckpointError`` naming the checkpoint and the key or tensor unless the
    checkpoint's safetensors ``files`` (default: its ``model.safetensors``) hold exactly the
    tensors ``shapes()`` lists, each of its shape -- read from the files' headers, before the
    head is built from the config's sizes (``relayc.engine.core.limits``).

    ``count`` is the key and value of the head's layer count (MTP's ``num_steps``), checked
    against the ``layers.N.`` tensors the files hold before ``shapes()`` lists that many;
    ``optional`` tensors may be absent, ``ignored`` ones are not the head's (EAGLE-3 files
    may carry an embedding the target's replaces). ``kind`` names the head in messages.
    """
    directory = Path(directory)
    if files is None:
        path = directory / SINGLE_FILE
        if not path.is_file():
            raise CheckpointError(f"draft checkpoint {directory} has no {SINGLE_FILE}")
        files = [path]
    table, where = tensor_table(files)
    for name in ignored:
        table.pop(name, None)
    if count is not None:
        try:
            check_count(count[1], count[0], table, "layers.")
        except ValueError as exc:  # the key is config.json's: name that file
            raise CheckpointError(str(exc), directory / "config.json") from None
    try:
        check_shapes(
            shapes(), table, model=kind, needs="the config", describe=where, optional=optional
        )
    except ValueError as exc:
        raise CheckpointError(str(exc), directory) from None


def load_draft_weights(
    module: nn.Module,
    directory: str | Path,
    *,
    files: Sequence[Path] | None = None,
    ignored: Collection[str] = (),
) -> nn.Module:
    """Copy the checkpoint's safetensors ``files`` (default: its ``model.safetensors``) into
    ``module``; every tensor must match by name and shape, bar the ``ignored`` ones (the
    target's, which a drafter borrows)."""
    from safetensors.torch import load_file

    if files is None:
        path = Path(directory) / SINGLE_FILE
        if not path.is_file():
            raise CheckpointError(f"draft checkpoint {directory} has no {SINGLE_FILE}")
        files = [path]
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        with reading_safetensors(path):
            tensors.update(load_file(str(path)))
    for name in ignored:
        tensors.pop(name, None)
    where = files[0].name if len(files) == 1 else str(directory)
    expected = module.state_dict()
    for name in sorted(set(expected) - set(tensors)):
        raise CheckpointError(f"draft checkpoint {directory} lacks tensor `{name}`")
    for name in sorted(set(tensors) - set(expected)):
        raise CheckpointError(f"unexpected tensor `{name}` in {where}")
    with torch.no_grad():
        for name, target in expected.items():
            tensor = tensors[name]
            if tensor.shape != target.shape:
                raise CheckpointError(
                    f"tensor `{name}` in {where} has shape {list(tensor.shape)}, "
                    f"the config needs {list(target.shape)}"
                )
            target.copy_(tensor.to(target.dtype))
    return module
