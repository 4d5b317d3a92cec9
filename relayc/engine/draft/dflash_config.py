"""A DFlash drafter's ``config.json``: its layers' shape and its block settings, checked.

The public DFlash layout (z-lab's ``DFlashDraftModel``; SGLang 0.5.23's
``parse_dflash_draft_config`` in ``speculative/dflash_utils.py``) is a Qwen3-style config
plus ``block_size`` (top level or in ``dflash_config``) and ``dflash_config:
{target_layer_ids, mask_token_id}``. ``target_layer_ids`` name target layers whose
*outputs* are read; SGLang's default when absent (:func:`default_target_layer_ids`) spreads
one per draft layer over ``1..L-3``. relayc needs ``mask_token_id`` as a number (SGLang
can look the ``mask_token`` string up in the tokenizer; a drafter's loader here has none).

Every key of SGLang's variants this drafter does not implement is refused by name, so a
drafter trained with one never loads into something that computes otherwise.

The file is hostile until checked: every key is read with the engine's typed reads
(``relayc.engine.core.config.config_value``), and every count is bounded by the target (a
drafter no deeper than its target, fewer layer ids than it has layers) before anything is
listed from it; the safetensors headers bound the sizes again before the drafter is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relayc.engine.core.config import (
    ConfigError,
    ModelConfig,
    config_list,
    config_value,
    shown,
    whole_number,
)
from relayc.engine.draft.layers import check_head_config
from relayc.engine.errors import CheckpointError
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import config_from_hf, read_json_object

ARCHITECTURE = "DFlashDraftModel"
MAX_ARCHITECTURES = 8  # HF configs name one class; a long list is damage, not a drafter
# Why a drafter may not have more layers than its target: the bound on `num_hidden_layers`
# that holds before the safetensors headers are read (they bound it again).
_DEEPER = (
    "a drafter deeper than its target drafts slower than the target decodes; the file is "
    "damaged or is not a drafter for this target"
)
MAX_BLOCK_SIZE = 64  # SGLang's DFlash drafters use 16; a verify of more rows never pays here
# dflash_config / config.json keys of SGLang's DFlash variants, and what each would need.
_UNSUPPORTED = {
    "conv_kernel_size": "grouped convolutions (DFlash-2)",
    "selector_rank": "a candidate selector (DFlash-2)",
    "projector_type": "a Domino projector",
    "attention_sink_bias": "attention sinks",
    "attention_value_scale": "a value scale",
    "use_gemma_norm": "Gemma norms",
    "final_logit_softcapping": "logit soft-capping",
    "attention_bias": "attention biases",
    "swa_window_size": "sliding-window layers",
}


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """SGLang's ``build_target_layer_ids``: the middle layer for one draft layer, else
    ``num_draft_layers`` ids spread evenly over ``1..L-3`` (rounded): as many as the drafter
    has layers, so a reader bounds that count first (:func:`settings_from_config`)."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    start, end = 1, num_target_layers - 3
    if end < start:
        raise ValueError(
            f"DFlash's default target layers need a target of 4+ layers; got {num_target_layers}"
        )
    span = end - start
    return tuple(round(start + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers))


@dataclass(frozen=True)
class DFlashSettings:
    """What a DFlash drafter needs beyond its layers' shape."""

    block_size: int  # tokens a draft forward covers: the bonus token and block_size - 1 masks
    target_layer_ids: tuple[int, ...]  # target layers whose outputs make the context
    mask_token_id: int  # the target token id a block's masked positions carry
    num_target_layers: int | None = None  # as trained (None: not recorded)

    def check_target(self, num_layers: int, vocab_size: int) -> None:
        """``ValueError`` naming the key unless the settings fit a target of ``num_layers``
        layers and ``vocab_size`` tokens."""
        if not 2 <= self.block_size <= MAX_BLOCK_SIZE:
            raise ValueError(
                f"`block_size` must lie in 2..{MAX_BLOCK_SIZE}; got {shown(self.block_size)}"
            )
        ids = self.target_layer_ids
        if not ids or len(set(ids)) != len(ids) or not all(0 <= i <= num_layers - 2 for i in ids):
            raise ValueError(
                f"`dflash_config.target_layer_ids` must name distinct target layers in "
                f"0..{num_layers - 2} (the outputs of a layer another layer reads); got "
                f"{shown(list(ids))} for a target of {num_layers} layers"
            )
        if list(ids) != sorted(ids):
            raise ValueError(
                f"`dflash_config.target_layer_ids` must be in layer order; got {shown(list(ids))}"
            )
        if not 0 <= self.mask_token_id < vocab_size:
            raise ValueError(
                f"`dflash_config.mask_token_id` must be a token id of the target "
                f"(0..{vocab_size - 1}); got {shown(self.mask_token_id)}"
            )
        if self.num_target_layers is not None and self.num_target_layers != num_layers:
            raise ValueError(
                f"`num_target_layers` is {shown(self.num_target_layers)}: the drafter was "
                f"trained for a target of that many layers, this one has {num_layers}"
            )


def _setting(
    header: dict[str, Any], block: dict[str, Any], key: str
) -> tuple[dict[str, Any], str | None]:
    """Where DFlash setting ``key`` is read: in ``dflash_config`` when set there (SGLang
    looks there first), else at the top level; and the object's name for messages."""
    if block.get(key) is not None:
        return block, "dflash_config"
    return header, None


def settings_from_config(
    header: dict[str, Any], num_draft_layers: int, target_layers: int
) -> DFlashSettings:
    """The :class:`DFlashSettings` of a ``config.json`` dict; ``ValueError`` (``ConfigError``
    for a value of the wrong JSON type) naming the key. Every count is bounded by the
    target before anything is listed from it."""
    if num_draft_layers > target_layers:
        raise ConfigError(
            f"`num_hidden_layers` is {num_draft_layers}, more than the target's "
            f"{target_layers} layers: {_DEEPER}"
        )
    block = config_value(header, "dflash_config", dict, {})
    for key, what in _UNSUPPORTED.items():
        where, within = _setting(header, block, key)
        value = where.get(key)
        if value not in (None, False, 0, 0.0) and not (
            key == "attention_value_scale" and value == 1
        ):
            name = f"{within}.{key}" if within else key
            raise ValueError(
                f"`{name}: {shown(value)}` asks for {what}, which relayc's DFlash drafter does "
                "not implement"
            )
    if config_value(header, "is_causal", bool, False):
        raise ValueError("`is_causal: true` (a causal draft) is not DFlash's block attention")
    layer_types = config_list(
        header, "layer_types", str, max_items=(num_draft_layers, "one per `num_hidden_layers`")
    )
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        raise ValueError(
            f"`layer_types` {shown(layer_types)}: only full-attention layers are implemented"
        )
    where, within = _setting(header, block, "block_size")
    if where.get("block_size") is None:
        raise ValueError("`block_size` is missing (DFlash drafters record it, e.g. 16)")
    block_size = whole_number(
        where,
        "block_size",
        low=2,
        high=(MAX_BLOCK_SIZE, "a verify of more rows never pays here"),
        within=within,
    )
    where, within = _setting(header, block, "target_layer_ids")
    ids = config_list(
        where,
        "target_layer_ids",
        int,
        max_items=(max(target_layers - 1, 1), f"distinct layers of the target's {target_layers}"),
        within=within,
    )
    if ids is None:
        layer_ids = default_target_layer_ids(target_layers, num_draft_layers)
    else:
        layer_ids = tuple(ids)
    where, within = _setting(header, block, "mask_token_id")
    if where.get("mask_token_id") is None:
        raise ValueError(
            "`dflash_config.mask_token_id` is missing: set it to the id of the drafter's mask "
            "token (relayc does not look `mask_token` up in a tokenizer)"
        )
    mask = whole_number(where, "mask_token_id", low=0, within=within)
    where, within = _setting(header, block, "num_target_layers")
    trained_for = (
        None
        if where.get("num_target_layers") is None
        else whole_number(where, "num_target_layers", within=within)
    )
    return DFlashSettings(block_size, layer_ids, mask, trained_for)


def read_dflash_config(
    directory: Path, target: LlamaForCausalLM
) -> tuple[ModelConfig, DFlashSettings]:
    """The drafter's layer config and settings from ``directory/config.json``, checked
    against ``target``; ``CheckpointError`` naming the file and the key otherwise."""
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"DFlash drafter directory {directory} has no config.json")
    header = read_json_object(path)
    try:
        architectures = config_list(
            header, "architectures", str, max_items=(MAX_ARCHITECTURES, "it names a model class")
        )
    except ConfigError as exc:
        raise CheckpointError(str(exc), path) from None
    if architectures and not any("DFlash" in a for a in architectures):
        raise CheckpointError(
            f"`architectures` is {shown(architectures)}, not a DFlash drafter ({ARCHITECTURE})",
            path,
        )
    config = config_from_hf(header, path).replace(dtype=target.config.dtype)
    try:
        check_head_config(config, target)
        settings = settings_from_config(header, config.num_layers, target.config.num_layers)
        settings.check_target(target.config.num_layers, target.config.vocab_size)
    except ValueError as exc:
        raise CheckpointError(str(exc), path) from None
    return config, settings
