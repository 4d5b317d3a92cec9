"""What gets trained and how big: the model subdirectories, the full and smoke ``Plan``s
(model configs, batch, learning rates, per-model time budgets and step caps), seeded
GPT-2 style initialisation, and the storage helpers (float16 rewrite of the stored
weights, parameter and byte counts)."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from relayc.engine.core.config import ModelConfig
from relayc.engine.model.weights import SINGLE_FILE

MTP_STEPS = 3
SUBDIRS = ("target", "eagle", "eagle_multilayer", "standalone")


@dataclass
class Plan:
    target: ModelConfig
    standalone: ModelConfig
    seq: int
    batch: int
    lr: float
    draft_lr: float
    minutes: dict[str, float]
    steps: dict[str, int | None]
    eval_windows: int
    eval_every_s: float
    corpus_bytes: int
    weight_decay: float = 0.1
    warmup_frac: float = 0.05


def full_plan(args: argparse.Namespace) -> Plan:
    target = ModelConfig(
        hidden_size=256,
        intermediate_size=704,
        num_layers=args.target_layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        max_position=2048,
        tie_word_embeddings=True,
    )
    standalone = ModelConfig(
        hidden_size=128,
        intermediate_size=352,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        max_position=2048,
        tie_word_embeddings=True,
    )
    return Plan(
        target=target,
        standalone=standalone,
        seq=256,
        batch=16,
        lr=2e-3,
        draft_lr=2e-3,
        minutes=_per_model(args, "minutes"),
        steps=_per_model(args, "steps"),
        eval_windows=32,
        eval_every_s=90.0,
        corpus_bytes=args.corpus_bytes,
    )


def smoke_plan(args: argparse.Namespace) -> Plan:
    tiny = ModelConfig(
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        max_position=512,
    )
    steps = {name: s if s is not None else 25 for name, s in _per_model(args, "steps").items()}
    return Plan(
        target=tiny,
        standalone=tiny.replace(hidden_size=16, intermediate_size=32, head_dim=8),
        seq=64,
        batch=4,
        lr=1e-2,
        draft_lr=1e-2,
        minutes={name: 0.25 for name in SUBDIRS},
        steps=steps,
        eval_windows=4,
        eval_every_s=2.0,
        corpus_bytes=min(args.corpus_bytes, 1 << 20),
    )


def _per_model(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    return {name: getattr(args, f"{kind}_{name}") for name in SUBDIRS}


def init_for_training(module: nn.Module, seed: int, num_layers: int, std: float = 0.02) -> None:
    """GPT-2 style: N(0, std) matrices, residual-output projections scaled by 1/sqrt(2L),
    norms one; drawn from a private generator in parameter-name order."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(module.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
                continue
            scale = (
                std / math.sqrt(2 * num_layers)
                if name.endswith(("o_proj.weight", "down_proj.weight"))
                else std
            )
            param.copy_(torch.randn(param.shape, generator=generator) * scale)


def model_record(
    module: nn.Module, folder: Path, record: dict[str, Any], final: dict[str, Any]
) -> dict[str, Any]:
    """A trained drafter's log entry: its size, the training run's ``record`` (from
    ``loop.train_loop``) and the reloaded model's held-out evaluation ``final``."""
    return {
        "params": count_params(module),
        "bytes": dir_bytes(folder),
        "steps": record["steps"],
        "minutes": record["minutes"],
        "final_train_loss": record["final_train_loss"],
        "final_heldout_loss": final["loss"],
        "heldout_kl_per_step": final["kl_per_step"],
        "heldout_top1_agree_per_step": final["top1_agree_per_step"],
    }


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def store_half(directory: Path) -> None:
    """Rewrite ``model.safetensors`` with float16 tensors (the config keeps float32)."""
    from safetensors.torch import load_file, save_file

    path = directory / SINGLE_FILE
    tensors = load_file(str(path))
    half = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}
    save_file(half, str(path), metadata={"format": "pt"})


def dir_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _config_summary(config: ModelConfig) -> str:
    return (
        f"{config.num_layers}L, hidden {config.hidden_size}, {config.num_heads} heads / "
        f"{config.num_kv_heads} kv, head_dim {config.head_dim}, MLP {config.intermediate_size}"
    )
