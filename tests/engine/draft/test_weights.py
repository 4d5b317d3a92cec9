"""Seeded init and checkpoints of the draft heads, and their error messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from relayc.engine.draft.eagle import EagleHead
from relayc.engine.draft.mtp import MtpDrafter
from relayc.engine.errors import CheckpointError
from relayc.engine.model.weights import random_model
from tests.engine.draft.helpers import SMALL


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_heads_store_only_their_own_weights() -> None:
    target = random_model(SMALL, seed=1)
    head = EagleHead.random(target, seed=2)
    assert head.target.lm_head is target.lm_head
    assert sorted(head.state_dict()) == sorted(
        f"layers.0.{name}" for name in (*_layer_names(), "fc.weight", "norm.weight")
    )
    mtp = MtpDrafter.random(target, num_steps=3, seed=2)
    assert {name.split(".")[1] for name in mtp.state_dict()} == {"0", "1", "2"}


def _layer_names() -> list[str]:
    attn = [f"layer.self_attn.{p}_proj.weight" for p in "qkvo"]
    mlp = [f"layer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
    norms = ["layer.input_layernorm.weight", "layer.post_attention_layernorm.weight"]
    return [*attn, *mlp, *norms]


def test_random_init_is_seeded_and_leaves_global_rng_alone() -> None:
    target = random_model(SMALL, seed=1)
    state = torch.random.get_rng_state()
    a, b = EagleHead.random(target, seed=5), EagleHead.random(target, seed=5)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert _same(a, b) and not _same(a, EagleHead.random(target, seed=6))
    assert torch.equal(a.layers[0].norm.weight, torch.ones(SMALL.hidden_size))


@pytest.mark.parametrize("kind", ["eagle", "mtp"])
def test_save_load_round_trip(tmp_path: Path, kind: str) -> None:
    target = random_model(SMALL, seed=1)
    if kind == "eagle":
        head = EagleHead.random(target, seed=3)
        loaded = EagleHead.load(head.save(tmp_path), target)
    else:
        head = MtpDrafter.random(target, num_steps=2, seed=3)
        loaded = MtpDrafter.load(head.save(tmp_path), target)
        assert loaded.num_steps == 2
    assert json.loads((tmp_path / "config.json").read_text())["draft_type"] == kind
    assert loaded.config == head.config and _same(loaded, head)
    assert loaded.target.embed_tokens is target.model.embed_tokens


def test_load_errors_name_the_problem(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    target = random_model(SMALL, seed=1)
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        EagleHead.load(tmp_path, target)
    EagleHead.random(target, seed=3).save(tmp_path)
    with pytest.raises(CheckpointError, match="`draft_type: eagle`, expected `mtp`"):
        MtpDrafter.load(tmp_path, target)
    path = tmp_path / "model.safetensors"
    tensors = load_file(str(path))
    tensors.pop("layers.0.fc.weight")
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match=r"lacks tensor `layers\.0\.fc\.weight`"):
        EagleHead.load(tmp_path, target)
    tensors["layers.0.fc.weight"] = torch.zeros(3, 3)
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match=r"`layers\.0\.fc\.weight`.*shape \[3, 3\]"):
        EagleHead.load(tmp_path, target)


def test_head_must_match_the_target_width() -> None:
    target = random_model(SMALL, seed=1)
    with pytest.raises(ValueError, match=r"`hidden_size` .* must equal the target's"):
        EagleHead(SMALL.replace(hidden_size=64), target)
