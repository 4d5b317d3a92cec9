"""The model's shape: a Llama-architecture ``ModelConfig`` and the tiny default.

``from_hf_config`` reads a Hugging Face ``config.json`` dict (transformers 4.x puts
``rope_theta`` at the top level, 5.x nests it in ``rope_parameters``) and
``to_hf_config`` writes one back, so checkpoints round-trip through both tools.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from relayc.engine.tokenizer import VOCAB_SIZE

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def dtype_from_name(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    key = name.removeprefix("torch.")
    if key not in _DTYPES:
        raise ValueError(f"`dtype` must be one of {', '.join(_DTYPES)}; got {name!r}")
    return _DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


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
        object.__setattr__(self, "dtype", dtype_from_name(self.dtype))

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any]) -> ModelConfig:
        """Read a Hugging Face Llama ``config.json`` dict."""
        model_type = hf.get("model_type", "llama")
        if model_type != "llama":
            raise ValueError(
                f"only `model_type: llama` checkpoints are supported; got {model_type!r}"
            )
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"`hidden_act` must be silu (SwiGLU); got {hf['hidden_act']!r}")
        for flag in ("attention_bias", "mlp_bias"):
            if hf.get(flag, False):
                raise ValueError(f"`{flag}: true` is not supported by the reference model")
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"only default RoPE is supported; got `rope_type: {rope_type}`")
        rope_theta = hf.get("rope_theta", rope.get("rope_theta", 10000.0))
        num_heads = hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or hf["hidden_size"] // num_heads
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rope_theta=float(rope_theta),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            max_position=hf.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            dtype=dtype_from_name(hf.get("torch_dtype") or hf.get("dtype") or "float32"),
        )

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
