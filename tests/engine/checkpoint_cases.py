"""Broken ``config.json`` files, shared by the API tests (tests/engine/test_checkpoint_configs.py)
and the command-line tests (tests/tools/test_generate_cli.py): each case must give one
``CheckpointError`` that names the file, the key and the fix."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Edit = Callable[[dict[str, Any]], Any]  # the good config dict -> what config.json holds


def _set(key: str, value: Any) -> Edit:
    return lambda config: {**config, key: value}


def _drop(key: str) -> Edit:
    return lambda config: {k: v for k, v in config.items() if k != key}


def _rope_nested(value: Any) -> Edit:
    """transformers 5.x: rope_theta inside rope_parameters, none at the top level."""
    return lambda config: {
        **_drop("rope_theta")(config),
        "rope_parameters": {"rope_type": "default", "rope_theta": value},
    }


@dataclass(frozen=True)
class BadConfig:
    name: str
    edit: Edit | None  # None: ``raw`` is written instead
    message: str  # must appear in the error, after the file name
    raw: bytes = b""


BAD_CONFIGS = [
    BadConfig("missing-key", _drop("hidden_size"), '`hidden_size` is missing; add `"hidden_size"'),
    BadConfig("null-key", _set("vocab_size", None), "`vocab_size` is missing"),
    BadConfig(
        "list", lambda config: [config], "JSON object ({...}) at the top level; found a list"
    ),
    BadConfig("string", lambda config: "config", "top level; found a string"),
    BadConfig("fraction", _set("num_hidden_layers", 2.5), "`num_hidden_layers` must be a whole"),
    BadConfig("whole-float", _set("hidden_size", 128.0), "got 128.0 (a number); write 128"),
    BadConfig("quoted-int", _set("hidden_size", "128"), '"128" (a string); write 128 without'),
    BadConfig("bool-int", _set("num_attention_heads", True), "whole number; got true (a boolean)"),
    BadConfig("list-int", _set("intermediate_size", [352]), "whole number; got [352] (a list)"),
    BadConfig("zero", _set("num_key_value_heads", 0), "`num_key_value_heads` must be positive"),
    BadConfig("quoted-bool", _set("tie_word_embeddings", "false"), "must be a boolean"),
    BadConfig("quoted-float", _set("rms_norm_eps", "1e-6"), "`rms_norm_eps` must be a number"),
    BadConfig("nan", _set("rope_theta", float("nan")), "`rope_theta` must be a finite positive"),
    BadConfig("nested-theta", _rope_nested("1e4"), "`rope_parameters.rope_theta` must be a number"),
    BadConfig("rope-string", _set("rope_scaling", "linear"), "`rope_scaling` must be an object"),
    BadConfig("dtype", _set("torch_dtype", 16), "`torch_dtype` must be one of float32"),
    BadConfig("model-type", _set("model_type", ["llama"]), "`model_type` must be a string"),
    BadConfig("gqa", _set("num_key_value_heads", 3), "multiple of `num_key_value_heads` (3)"),
    BadConfig("odd-head", _set("head_dim", 31), "even for RoPE; got 31 (`head_dim`)"),
    BadConfig("json", None, "invalid JSON at line 1 column 20", b'{"vocab_size": 259,,}'),
    BadConfig("not-utf8", None, "not UTF-8 text", b'{"vocab_size": "\xff"}'),
    BadConfig(  # the RoPE tables (of target and heads) are sized by it
        "context", _set("max_position_embeddings", 2**40), "`max_position_embeddings` is 1099"
    ),
    # json's own limits: not JSONDecodeError, and once stray exceptions naming no file
    BadConfig(
        "5000-digits", None, "cannot be read as JSON", b'{"vocab_size": ' + b"9" * 5000 + b"}"
    ),
    BadConfig("nested", None, "cannot be read as JSON", b'{"a": ' + b"[" * 100_000 + b"}"),
]


def break_checkpoint(good: Path, where: Path, case: BadConfig) -> Path:
    """A copy of the checkpoint folder ``good`` (weights and all) whose config.json is
    ``case``'s; returns its config.json."""
    shutil.copytree(good, where)
    path = where / "config.json"
    if case.edit is None:
        path.write_bytes(case.raw)
    else:
        path.write_text(json.dumps(case.edit(json.loads(path.read_text()))))
    return path


def _set_dflash(key: str, value: Any) -> Edit:
    """A key of a DFlash config's ``dflash_config`` object."""
    return lambda config: {**config, "dflash_config": {**config["dflash_config"], key: value}}


def _deep_drafter(config: dict[str, Any]) -> dict[str, Any]:
    """10**7 layers, and no target_layer_ids: SGLang's default would list one per layer."""
    block = {k: v for k, v in config["dflash_config"].items() if k != "target_layer_ids"}
    return {**config, "num_hidden_layers": 10**7, "dflash_config": block}


# Broken DFlash drafter configs (issue #50): wrong JSON types, sizes past their bounds, long
# values. Each is one CheckpointError naming the file and the key (``message``), under 500
# characters, raised before anything is sized by the value.
BAD_DFLASH_CONFIGS = [
    BadConfig("top-level-list", lambda config: [config], "top level; found a list"),
    BadConfig("layers-1e7", _set("num_hidden_layers", 10**7), "`num_hidden_layers` is 10000000"),
    BadConfig("layers-1e7-default-ids", _deep_drafter, "more than the target's 6 layers"),
    BadConfig("layers-past-tensors", _set("num_hidden_layers", 3), "holds tensors for 2 layers"),
    BadConfig("layers-string", _set("num_hidden_layers", "2"), "write 2 without quotes"),
    BadConfig("heads-huge", _set("num_attention_heads", 2**40), "`layers.0.self_attn.q_proj"),
    BadConfig("width-huge", _set("intermediate_size", 2**50), "`layers.0.mlp.gate_proj"),
    BadConfig("vocab-huge", _set("vocab_size", 2**40), "`vocab_size` (1099511627776) must"),
    BadConfig("architectures-int", _set("architectures", 5), "`architectures` must be a list"),
    BadConfig("architectures-entry", _set("architectures", [5]), "`architectures[0]` must be a"),
    BadConfig(
        "architectures-long", _set("architectures", ["x"] * 10**5), "lists 100000 entries, more"
    ),
    BadConfig("layer-types-int", _set("layer_types", 5), "`layer_types` must be a list; got 5"),
    BadConfig("layer-types-entry", _set("layer_types", [None]), "`layer_types[0]` must be a str"),
    BadConfig("layer-types-long", _set("layer_types", ["x"] * 10**5), "more than 2: one per"),
    BadConfig("layer-types-sliding", _set("layer_types", ["sliding"] * 2), '`layer_types` ["sl'),
    BadConfig("dflash-config-list", _set("dflash_config", [1]), "`dflash_config` must be an obj"),
    BadConfig("is-causal-string", _set("is_causal", "false"), "`is_causal` must be a boolean"),
    BadConfig("block-string", _set("block_size", "8"), "`block_size` must be a whole number"),
    BadConfig("block-bool", _set("block_size", True), "got true (a boolean)"),
    BadConfig("block-huge", _set("block_size", 10**9), "`block_size` is 1000000000, more than"),
    BadConfig(
        "block-nested", _set_dflash("block_size", [8]), "`dflash_config.block_size` must be a"
    ),
    BadConfig(
        "ids-string", _set_dflash("target_layer_ids", "0,2"), "target_layer_ids` must be a list"
    ),
    BadConfig("ids-nested", _set_dflash("target_layer_ids", [[0], 2]), "ids[0]` must be a whole"),
    BadConfig("ids-bool", _set_dflash("target_layer_ids", [True]), "got true (a boolean)"),
    BadConfig("ids-null", _set_dflash("target_layer_ids", [None]), "got null (null)"),
    BadConfig(
        "ids-long", _set_dflash("target_layer_ids", list(range(10**5))), "more than 5: distinct"
    ),
    BadConfig("ids-range", _set_dflash("target_layer_ids", [0, 2**60]), "[0, 1152921504606846"),
    BadConfig("mask-string", _set_dflash("mask_token_id", "258"), "write 258 without quotes"),
    BadConfig("mask-float", _set_dflash("mask_token_id", 258.0), "got 258.0 (a number); write"),
    BadConfig("mask-object", _set_dflash("mask_token_id", {"id": 1}), 'got {"id": 1} (an object)'),
    BadConfig("mask-negative", _set_dflash("mask_token_id", -1), "must be at least 0; got -1"),
    BadConfig(
        "mask-huge", _set_dflash("mask_token_id", 10**4000), "mask_token_id` must be a token id"
    ),
    BadConfig("trained-for-bool", _set("num_target_layers", False), "`num_target_layers` must"),
    BadConfig(
        "unsupported-long",
        _set_dflash("conv_kernel_size", [3] * 10**5),
        "`dflash_config.conv_kernel_size: [3, 3, 3, 3, ... 100000 entries]` asks for grouped",
    ),
    BadConfig("rope-type-list", _set("rope_scaling", {"type": [1]}), "`rope_scaling.type` must"),
    BadConfig("model-type-long", _set("model_type", "q" * 10**6), "`model_type: llama`"),
]
