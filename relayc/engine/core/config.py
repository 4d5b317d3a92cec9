"""The model's shape: a Llama-architecture ``ModelConfig`` and the tiny default.

``from_hf_config`` reads a Hugging Face ``config.json`` dict (transformers 4.x puts
``rope_theta`` at the top level, 5.x nests it in ``rope_parameters``) and
``to_hf_config`` writes one back, so checkpoints round-trip through both tools.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

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
        raise ValueError(f"`dtype` must be one of {', '.join(_DTYPES)}; got {shown(name)}")
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


_SHOWN_CHARS = 40  # a value in a message: one readable line, whatever the file holds
_SHOWN_ENTRIES = 4  # a list's or object's first entries shown; the rest are counted


def _sketch(value: Any, depth: int) -> str:
    """JSON text of ``value`` with containers cut to their first entries, so that the work
    is bounded too (a 10**7-entry list is not rendered to be cut afterwards)."""
    if isinstance(value, list | tuple):
        if depth == 0:
            return "[...]" if value else "[]"
        items = [_sketch(item, depth - 1) for item in value[:_SHOWN_ENTRIES]]
        if len(value) > _SHOWN_ENTRIES:
            items.append(f"... {len(value)} entries")
        return "[" + ", ".join(items) + "]"
    if isinstance(value, dict):
        if depth == 0:
            return "{...}" if value else "{}"
        pairs = [
            f"{_sketch(str(key), 0)}: {_sketch(item, depth - 1)}"
            for key, item in list(value.items())[:_SHOWN_ENTRIES]
        ]
        if len(value) > _SHOWN_ENTRIES:
            pairs.append(f"... {len(value)} entries")
        return "{" + ", ".join(pairs) + "}"
    if isinstance(value, str):
        value = value[: _SHOWN_CHARS + 1]  # escaped below: control characters stay inert
    try:
        return json.dumps(value)
    except (TypeError, ValueError):  # not JSON (a dict built in Python); an int past str()'s limit
        return f"<{type(value).__name__}>"


def shown(value: Any, *, quoted: bool = True) -> str:
    """``value`` as config.json spells it, cut short: a message stays one readable line, and
    a hostile value (a 10**7-entry list, a megabyte string) costs no more to show. A string
    is escaped as JSON escapes it; ``quoted=False`` leaves out its quotes (`rope_type: yarn`)."""
    text = _sketch(value, 2)
    if not quoted and isinstance(value, str):
        text = text[1:-1]
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _wrong_type(key: str, value: Any, expected: str, fix: str = "") -> ConfigError:
    return ConfigError(f"`{key}` must be {expected}; got {shown(value)} ({json_kind(value)}){fix}")


_Value = TypeVar("_Value")
# What a message asks for when a key is missing, by the JSON kind it must hold.
_PLACEHOLDERS: dict[type, str] = {
    bool: "true or false",
    int: "<whole number>",
    float: "<number>",
    str: '"<text>"',
    list: "[...]",
    dict: "{...}",
}


def config_value(
    hf: Mapping[str, Any],
    key: str,
    kind: type[_Value],
    default: Any = _REQUIRED,
    *,
    within: str | None = None,
) -> _Value:
    """``hf[key]`` when it is a JSON value of ``kind`` (bool, int, float, str, list or dict):
    the one typed read of a config.json key, so that no stray ``TypeError`` comes from
    using a value of another type. ``ConfigError`` names the key (``within.key`` for a key
    of the object ``within``), what it must be, and the value found, cut short.

    null counts as absent: ``default`` then, or an error saying to add the key when there
    is none. A JSON bool is no number (``true`` is no layer count); a whole number is a
    number (a float ``kind`` returns it as a float).
    """
    name = f"{within}.{key}" if within else key
    value = hf.get(key)
    if value is None:
        if default is not _REQUIRED:
            return cast("_Value", default)
        needs = f"; a Llama config.json needs {', '.join(_REQUIRED_INTS)}"
        raise ConfigError(
            f'`{name}` is missing; add `"{key}": {_PLACEHOLDERS.get(kind, "...")}`'
            + (needs if name in _REQUIRED_INTS else "")
        )
    return _typed(name, value, kind)


def _typed(name: str, value: Any, kind: type[_Value]) -> _Value:
    """``value`` when it is a JSON ``kind`` (:func:`config_value`'s rules), else
    ``ConfigError`` naming ``name``."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return cast("_Value", float(value))
    if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    fix = ""
    if kind is int and isinstance(value, float) and value.is_integer():
        fix = f"; write {int(value)}"
    elif kind is int and isinstance(value, str) and 0 < len(value.strip()) <= 18:
        fix = f"; write {value.strip()} without quotes" if value.strip().isdigit() else ""
    raise _wrong_type(name, value, _JSON_KINDS.get(kind, kind.__name__), fix)


def whole_number(
    hf: Mapping[str, Any],
    key: str,
    default: Any = _REQUIRED,
    *,
    low: int = 1,
    high: tuple[int, str] | None = None,
    within: str | None = None,
) -> int:
    """``hf[key]``, a JSON whole number ``>= low`` (:func:`config_value`'s rules); ``high``
    is ``(bound, why)``: a larger value is a ``ConfigError`` naming the bound and the reason,
    raised before anything is sized by it."""
    if hf.get(key) is None and default is not _REQUIRED:
        return cast("int", default)
    name = f"{within}.{key}" if within else key
    value = config_value(hf, key, int, within=within)
    if value < low:
        raise ConfigError(
            f"`{name}` must be positive; got {shown(value)}"
            if low == 1
            else f"`{name}` must be at least {low}; got {shown(value)}"
        )
    if high is not None and value > high[0]:
        raise ConfigError(f"`{name}` is {shown(value)}, more than {high[0]}: {high[1]}")
    return value


def positive_int(hf: dict[str, Any], key: str, default: int = _REQUIRED) -> int:
    """``hf[key]``, a JSON whole number > 0 (``ConfigError`` otherwise); required unless
    ``default`` is given (then used when the key is absent or null)."""
    return whole_number(hf, key, default)


def config_list(
    hf: Mapping[str, Any],
    key: str,
    item_kind: type[_Value],
    *,
    max_items: tuple[int, str],
    within: str | None = None,
) -> list[_Value] | None:
    """``hf[key]``, a JSON list of at most ``max_items[0]`` values of ``item_kind`` (why:
    ``max_items[1]``), or None when absent or null; ``ConfigError`` naming the key, or the
    entry (``key[3]``), otherwise. The length is checked before any entry is looked at."""
    name = f"{within}.{key}" if within else key
    items: list[Any] | None = config_value(hf, key, list, None, within=within)
    if items is None:
        return None
    if len(items) > max_items[0]:
        raise ConfigError(
            f"`{name}` lists {len(items)} entries, more than {max_items[0]}: {max_items[1]}"
        )
    return [_typed(f"{name}[{i}]", item, item_kind) for i, item in enumerate(items)]


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
        raise ConfigError(f"`{key}` must be one of {', '.join(_DTYPES)}; got {shown(value)}")
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
        model_type = config_value(hf, "model_type", str, "llama")
        if model_type != "llama":
            raise ConfigError(
                f"only `model_type: llama` checkpoints are supported; got {shown(model_type)}"
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
        hidden_act = config_value(hf, "hidden_act", str, "silu")
        if hidden_act != "silu":
            raise ConfigError(f"`hidden_act` must be silu (SwiGLU); got {shown(hidden_act)}")
        for flag in ("attention_bias", "mlp_bias"):
            if config_value(hf, flag, bool, False):
                raise ConfigError(f"`{flag}: true` is not supported by the reference model")
        rope_key = next((k for k in ("rope_parameters", "rope_scaling") if hf.get(k)), None)
        rope: dict[str, Any] = config_value(hf, rope_key, dict, {}) if rope_key else {}
        rope_type = config_value(
            rope,
            "rope_type",
            str,
            config_value(rope, "type", str, "default", within=rope_key),
            within=rope_key,
        )
        if rope_type != "default":
            raise ConfigError(
                f"only default RoPE is supported; got `rope_type: {shown(rope_type, quoted=False)}`"
            )
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
                tie_word_embeddings=config_value(hf, "tie_word_embeddings", bool, False),
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
