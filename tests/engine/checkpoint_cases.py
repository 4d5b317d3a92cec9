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
