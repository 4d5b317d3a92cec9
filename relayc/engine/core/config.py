"""The model's shape: a Llama-architecture ``ModelConfig`` and the tiny default.

``from_hf_config`` reads a Hugging Face ``config.json`` dict (transformers 4.x puts
``rope_theta`` at the top level, 5.x nests it in ``rope_parameters``) and
``to_hf_config`` writes one back, so checkpoints round-trip through both tools.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from relayc.engine.text.bytes import VOCAB_SIZE

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
# Precisions named like a dtype that are not one: the model's tensors have the dtype mapped
# to and only the native CPU decoder's matrix products change ("int8": integer dot products
# over a GGUF file's Q4_0, Q4_1 and Q8_0 blocks, relayc/engine/native/csrc/int8.c).
PRECISIONS: dict[str, torch.dtype] = {"int8": torch.float32}


def dtype_from_name(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    key = name.removeprefix("torch.")
    if key not in _DTYPES:
        raise ValueError(f"`dtype` must be one of {', '.join(_DTYPES)}; got {name!r}")
    return _DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class ConfigError(ValueError):
    """A ``config.json`` dict the reference model cannot be built from; the message names
    the key and the fix. The loaders add the file (``relayc.engine.errors.CheckpointError``)."""


# The keys a Llama config.json must have; every other one has a default.
_REQUIRED_INTS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)
_REQUIRED: Any = object()

_JSON_KINDS: dict[type, str] = {
    bool: "a boolean",
    int: "a whole number",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
    type(None): "null",
}


def json_kind(value: Any) -> str:
    """What a JSON value is, in the words a message uses ("a list")."""
    return _JSON_KINDS.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    """``value`` as config.json spells it, cut short: a message stays one readable line."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _wrong_type(key: str, value: Any, expected: str, fix: str = "") -> ConfigError:
    return ConfigError(f"`{key}` must be {expected}; got {_shown(value)} ({json_kind(value)}){fix}")


_Value = TypeVar("_Value")


def _optional(hf: dict[str, Any], key: str, kind: type[_Value], default: _Value) -> _Value:
    """``hf[key]`` of JSON type ``kind``; ``default`` when absent or null."""
    value = hf.get(key)
    if value is None:
        return default
    # A bool is an int to Python but not to JSON: `true` is no layer count.
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise _wrong_type(key, value, _JSON_KINDS[kind])
    return value


def positive_int(hf: dict[str, Any], key: str, default: int = _REQUIRED) -> int:
    """``hf[key]``, a JSON whole number > 0 (``ConfigError`` otherwise); required unless
    ``default`` is given (then used when the key is absent or null)."""
    value = hf.get(key)
    if value is None:
        if default is not _REQUIRED:
            return default
        needs = f"; a Llama config.json needs {', '.join(_REQUIRED_INTS)}"
        raise ConfigError(
            f'`{key}` is missing; add `"{key}": <whole number>`'
            + (needs if key in _REQUIRED_INTS else "")
        )
    if isinstance(value, bool) or not isinstance(value, int):
        fix = ""
        if isinstance(value, float) and value.is_integer():
            fix = f"; write {int(value)}"
        elif isinstance(value, str) and value.strip().isdigit():
            fix = f"; write {int(value)} without quotes"
        raise _wrong_type(key, value, "a whole number", fix)
    if value <= 0:
        raise ConfigError(f"`{key}` must be positive; got {value}")
    return value


def finite_positive(value: object, key: str) -> float:
    """``value`` as a float when it is a finite number > 0, else ``ConfigError`` naming
    ``key``: a RoPE base or an RMS-norm epsilon of 0, NaN or -1 makes every logit NaN. The
    one check of every path (config.json, GGUF metadata, ``ModelConfig`` itself)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _wrong_type(key, value, "a number")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(
            f"`{key}` must be a finite positive number; got {value} (the model would compute NaN)"
        )
    return float(value)


# The RoPE tables are [context, head_dim] float32 (cos and sin), built with the model:
# 2**20 positions of a 128-wide head are 1 GiB, more than any model relayc runs needs.
MAX_CONTEXT = 1 << 20


def check_context(value: int, key: str) -> int:
    """``value`` when it is a context length relayc builds RoPE tables for, else
    ``ConfigError`` naming ``key`` (no tensor's shape in a file checks it)."""
    if value > MAX_CONTEXT:
        raise ConfigError(
            f"`{key}` is {value}, past the {MAX_CONTEXT} positions relayc builds RoPE tables "
            "for; the file is damaged, or lower the value"
        )
    return value


def _positive_number(
    hf: dict[str, Any], key: str, default: float, within: str | None = None
) -> float:
    """``hf[key]``, a finite JSON number > 0; ``default`` when absent or null."""
    value = hf.get(key)
    if value is None:
        return default
    return finite_positive(value, f"{within}.{key}" if within else key)


def _dtype(hf: dict[str, Any]) -> torch.dtype:
    """The weights' dtype: ``torch_dtype`` (transformers 4.x) or ``dtype`` (5.x)."""
    key = "torch_dtype" if hf.get("torch_dtype") is not None else "dtype"
    value = hf.get(key) or "float32"
    if isinstance(value, torch.dtype):  # a dict built in Python rather than read from JSON
        return value
    if not isinstance(value, str) or value.removeprefix("torch.") not in _DTYPES:
        raise ConfigError(f"`{key}` must be one of {', '.join(_DTYPES)}; got {_shown(value)}")
    return _DTYPES[value.removeprefix("torch.")]


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a Llama decoder; the defaults are the tiny byte-level model."""

    vocab_size: int = VOCAB_SIZE  # the byte-level tokenizer: 256 bytes + <bos>, <eos>, <pad>
    hidden_size: int = 128
    intermediate_size: int = 352
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position: int = 2048
    tie_word_embeddings: bool = True
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"`{name}` must be positive; got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"`num_heads` ({self.num_heads}) must be a multiple of `num_kv_heads` "
                f"({self.num_kv_heads}) for grouped-query attention"
            )
        if self.head_dim % 2:
            raise ValueError(f"`head_dim` must be even for RoPE; got {self.head_dim}")
        finite_positive(self.rope_theta, "rope_theta")
        finite_positive(self.rms_norm_eps, "rms_norm_eps")
        object.__setattr__(self, "dtype", dtype_from_name(self.dtype))

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf_config(cls, hf: Any) -> ModelConfig:
        """Read a Hugging Face Llama ``config.json`` dict.

        Raises ``ConfigError`` (a ``ValueError``) naming the key and the fix when a required
        key is missing, a value has the wrong JSON type, or the values describe a model the
        reference model cannot run.
        """
        if not isinstance(hf, dict):
            raise ConfigError(
                f"must hold a JSON object ({{...}}) at the top level; found {json_kind(hf)}"
            )
        model_type = _optional(hf, "model_type", str, "llama")
        if model_type != "llama":
            raise ConfigError(
                f"only `model_type: llama` checkpoints are supported; got {model_type!r}"
            )
        sizes = {key: positive_int(hf, key) for key in _REQUIRED_INTS}
        num_heads = sizes["num_attention_heads"]
        num_kv_heads = positive_int(hf, "num_key_value_heads", num_heads)
        head_dim = positive_int(hf, "head_dim", sizes["hidden_size"] // num_heads)
        # ModelConfig checks these relations too; here they are worded with config.json's keys.
        if num_heads % num_kv_heads:
            raise ConfigError(
                f"`num_attention_heads` ({num_heads}) must be a multiple of "
                f"`num_key_value_heads` ({num_kv_heads}) for grouped-query attention"
            )
        if head_dim % 2:
            raise ConfigError(
                f"the head size must be even for RoPE; got {head_dim} ("
                + (
                    "`head_dim`)"
                    if hf.get("head_dim") is not None
                    else f"`hidden_size` {sizes['hidden_size']} / `num_attention_heads` "
                    f"{num_heads})"
                )
            )
        hidden_act = _optional(hf, "hidden_act", str, "silu")
        if hidden_act != "silu":
            raise ConfigError(f"`hidden_act` must be silu (SwiGLU); got {hidden_act!r}")
        for flag in ("attention_bias", "mlp_bias"):
            if _optional(hf, flag, bool, False):
                raise ConfigError(f"`{flag}: true` is not supported by the reference model")
        rope_key = next((k for k in ("rope_parameters", "rope_scaling") if hf.get(k)), None)
        rope: dict[str, Any] = _optional(hf, rope_key, dict, {}) if rope_key else {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(f"only default RoPE is supported; got `rope_type: {rope_type}`")
        if hf.get("rope_theta") is not None:  # transformers 4.x
            rope_theta = _positive_number(hf, "rope_theta", 10000.0)
        else:
            rope_theta = _positive_number(rope, "rope_theta", 10000.0, within=rope_key)
        try:
            return cls(
                vocab_size=sizes["vocab_size"],
                hidden_size=sizes["hidden_size"],
                intermediate_size=sizes["intermediate_size"],
                num_layers=sizes["num_hidden_layers"],
                num_heads=num_heads,
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
                rope_theta=rope_theta,
                rms_norm_eps=_positive_number(hf, "rms_norm_eps", 1e-6),
                max_position=check_context(
                    positive_int(hf, "max_position_embeddings", 2048), "max_position_embeddings"
                ),
                tie_word_embeddings=_optional(hf, "tie_word_embeddings", bool, False),
                dtype=_dtype(hf),
            )
        except ValueError as exc:  # a check of __post_init__ the ones above do not make
            raise ConfigError(str(exc)) from None

    def to_hf_config(self) -> dict[str, Any]:
        """The ``config.json`` dict transformers' ``LlamaForCausalLM`` loads."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": False,
            "mlp_bias": False,
            "torch_dtype": dtype_name(self.dtype),
        }


TINY_CONFIG = ModelConfig()
