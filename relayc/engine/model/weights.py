"""Model weights: seeded random initialisation and Hugging Face-format checkpoints.

A checkpoint directory is what ``LlamaForCausalLM.save_pretrained`` writes:
``config.json`` plus ``model.safetensors``, or shards named in
``model.safetensors.index.json``. Tensor names are the transformers names, which
are also this model's ``state_dict`` keys.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from relayc.engine.core.config import ConfigError, ModelConfig, json_kind
from relayc.engine.core.limits import check_tensor_table
from relayc.engine.errors import CheckpointError
from relayc.engine.model.llama import LlamaForCausalLM

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Old transformers versions stored the RoPE frequencies; we recompute them.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` (a config or index file); ``CheckpointError`` naming
    the file when it cannot be read, is not JSON, or holds something else."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CheckpointError(f"cannot read: {exc.strerror or exc}", path) from None
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"not UTF-8 text (byte {exc.start}); is it JSON?", path) from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", path
        ) from None
    except (ValueError, RecursionError) as exc:  # a 5000-digit number, 100,000 nested `[`
        raise CheckpointError(f"cannot be read as JSON: {exc}", path) from None
    if not isinstance(value, dict):
        raise CheckpointError(
            f"must hold a JSON object ({{...}}) at the top level; found {json_kind(value)}", path
        )
    return value


def config_from_hf(hf: dict[str, Any], path: Path) -> ModelConfig:
    """``ModelConfig.from_hf_config`` with its ``ConfigError`` naming ``path``."""
    try:
        return ModelConfig.from_hf_config(hf)
    except ConfigError as exc:
        raise CheckpointError(str(exc), path) from None


@contextmanager
def reading_safetensors(path: Path) -> Iterator[None]:
    """A damaged or unreadable safetensors file becomes a ``CheckpointError`` naming it."""
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as exc:
        raise CheckpointError(f"not a readable safetensors file ({exc})", path) from None
    except OSError as exc:
        raise CheckpointError(f"cannot read: {exc.strerror or exc}", path) from None


def tensor_table(files: Sequence[Path]) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """Every tensor's shape in the safetensors ``files``, read from their headers alone (no
    tensor data), and where each is (``name` in `file``, for messages): what a loader checks
    its config's sizes against before it builds anything sized by them. safetensors checks
    each header against its file's size; a damaged file is a ``CheckpointError`` naming it."""
    from safetensors import safe_open

    table: dict[str, tuple[int, ...]] = {}
    where: dict[str, str] = {}
    for path in files:
        with reading_safetensors(path), safe_open(str(path), framework="pt") as file:
            for name in file.keys():
                table[name] = tuple(file.get_slice(name).get_shape())
                where[name] = f"{name}` in `{path.name}"
    return table, where


def expected_tensors(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """State-dict entries a checkpoint must provide (the tied LM head is not one of them)."""
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    return state


def init_random(model: LlamaForCausalLM, seed: int, std: float = 0.2) -> LlamaForCausalLM:
    """Fill ``model`` in place: N(0, std) matrices, unit norms; same seed, same weights.

    The default std is large for an LLM on purpose: with the usual 0.02 the tiny
    tied model just echoes its last token, a weak workload for scheduler tests;
    0.2 gives varied greedy continuations with top-1/top-2 logit gaps far above
    float32 noise.

    Draws on the CPU from a private generator in name order, so the weights do
    not depend on the device, the global RNG or module construction order.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, tensor in sorted(expected_tensors(model).items()):
            if name.endswith("norm.weight"):
                values = torch.ones(tensor.shape)
            else:
                values = torch.randn(tensor.shape, generator=generator) * std
            tensor.copy_(values.to(tensor.dtype))
    return model


def random_model(
    config: ModelConfig | None = None, seed: int = 0, device: torch.device | str = "cpu"
) -> LlamaForCausalLM:
    """A randomly initialised model; the tiny default config when ``config`` is None."""
    return init_random(LlamaForCausalLM(config or ModelConfig(), device=device), seed)


def _shard_files(directory: Path) -> list[Path]:
    index = directory / INDEX_FILE
    if index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(
            isinstance(name, str) for name in weight_map.values()
        ):
            raise CheckpointError(
                "`weight_map` must be an object mapping tensor names to shard file names "
                "(as transformers' save_pretrained writes it)",
                index,
            )
        return [directory / name for name in sorted(set(weight_map.values()))]
    if (directory / SINGLE_FILE).is_file():
        return [directory / SINGLE_FILE]
    found = sorted(directory.glob("*.safetensors"))
    if not found:
        raise CheckpointError(f"no *.safetensors files in checkpoint directory {directory}")
    return found


def load_checkpoint(
    directory: str | Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> LlamaForCausalLM:
    """Build a model from a Hugging Face Llama checkpoint directory.

    ``dtype`` overrides the checkpoint's ``torch_dtype``. Raises ``CheckpointError``
    naming the file and the key when ``config.json`` is not a Llama config the model can
    be built from, the file when a shard is damaged, and the tensor when one is missing,
    unexpected or has the wrong shape -- the last three from the shards' headers, before
    the model is built from the config's sizes.
    """
    from safetensors import safe_open

    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {directory} does not exist")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"checkpoint directory {directory} has no config.json")
    hf = read_json_object(config_path)
    config = config_from_hf(hf, config_path)
    if dtype is not None:
        config = config.replace(dtype=dtype)
    shards = _shard_files(directory)
    for path in shards:
        if not path.is_file():
            raise CheckpointError(f"shard {path.name} named in {INDEX_FILE} is missing")
    table, where = tensor_table(shards)
    for name in list(table):
        if name.endswith(_IGNORED_SUFFIXES) or (
            name == "lm_head.weight" and config.tie_word_embeddings
        ):
            del table[name]
    try:
        check_tensor_table(config, table, "num_hidden_layers", where)
    except ValueError as exc:
        raise CheckpointError(
            f"checkpoint {directory}: {exc} (the sizes are `config.json`'s)"
        ) from None
    model = LlamaForCausalLM(config, device=device)
    expected = expected_tensors(model)
    with torch.no_grad():
        for path in shards:
            with reading_safetensors(path), safe_open(str(path), framework="pt") as shard:
                for name in shard.keys():
                    if name in table:
                        target = expected[name]
                        target.copy_(shard.get_tensor(name).to(dtype=target.dtype))
    return model


def save_checkpoint(
    model: LlamaForCausalLM, directory: str | Path, max_shard_bytes: int | None = None
) -> Path:
    """Write ``config.json`` and safetensors in the Hugging Face layout ``load_checkpoint`` reads.

    With ``max_shard_bytes`` the tensors are split across shards plus an index file.
    """
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(
        json.dumps(model.config.to_hf_config(), indent=2, sort_keys=True) + "\n"
    )
    tensors = {
        name: tensor.detach().to("cpu").contiguous()
        for name, tensor in sorted(expected_tensors(model).items())
    }
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if max_shard_bytes is not None and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(directory / SINGLE_FILE), metadata=metadata)
        return directory
    weight_map: dict[str, str] = {}
    for number, shard in enumerate(shards, start=1):
        filename = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / filename), metadata=metadata)
        weight_map.update(dict.fromkeys(shard, filename))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return directory
