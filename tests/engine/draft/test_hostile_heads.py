"""Draft-head checkpoints' sizes are checked against their safetensors headers before any
head is built (issue #45 class 3): a huge size in ``config.json`` is a ``CheckpointError``
naming the file and the key or tensor, never an allocation sized by it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from relayc.engine.draft.eagle import EagleHead
from relayc.engine.draft.eagle3 import Eagle3Head
from relayc.engine.draft.mtp import MtpDrafter
from relayc.engine.draft.standalone import StandaloneDrafter, default_standalone_config
from relayc.engine.errors import CheckpointError
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import random_model
from tests.engine.draft.helpers import SMALL

DRAFT_VOCAB = 24  # of the target's 40


@pytest.fixture(scope="module")
def target() -> LlamaForCausalLM:
    return random_model(SMALL.replace(num_layers=4), seed=1)


def _shapes(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(tensor.shape) for name, tensor in module.state_dict().items()}


def test_listed_shapes_are_the_built_heads(target: LlamaForCausalLM) -> None:
    config = target.config
    assert EagleHead.tensor_shapes(config) == _shapes(EagleHead.random(target, seed=2))
    mtp = MtpDrafter.random(target, num_steps=3, seed=2)
    assert MtpDrafter.tensor_shapes(config, 3) == _shapes(mtp)
    head = Eagle3Head.random(target, seed=2, draft_vocab_size=DRAFT_VOCAB, layer_ids=[0, 1, 2])
    assert Eagle3Head.tensor_shapes(config, DRAFT_VOCAB, 3) == _shapes(head)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, target: LlamaForCausalLM) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("heads")
    eagle3 = Eagle3Head.random(target, seed=2, draft_vocab_size=DRAFT_VOCAB, layer_ids=[0, 1, 2])
    return {
        "eagle": EagleHead.random(target, seed=2).save(root / "eagle"),
        "mtp": MtpDrafter.random(target, num_steps=2, seed=2).save(root / "mtp"),
        "eagle3": eagle3.save(root / "eagle3"),
        "standalone": StandaloneDrafter.random(
            default_standalone_config(target.config), seed=3
        ).save(root / "standalone"),
    }


@pytest.fixture
def never_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a head (or a standalone draft model) fails the test: the errors must come
    from the checks before it."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the draft head was built before its sizes were checked")

    for cls in (EagleHead, Eagle3Head, MtpDrafter):
        monkeypatch.setattr(cls, "__init__", refuse)
    monkeypatch.setattr("relayc.engine.model.weights.LlamaForCausalLM", refuse)


def _load(kind: str, directory: Path, target: LlamaForCausalLM) -> object:
    loaders: dict[str, Callable[[], object]] = {
        "eagle": lambda: EagleHead.load(directory, target),
        "mtp": lambda: MtpDrafter.load(directory, target),
        "eagle3": lambda: Eagle3Head.load(directory, target),
        "standalone": lambda: StandaloneDrafter.load(directory),
    }
    return loaders[kind]()


HUGE = 2**36


@pytest.mark.parametrize(
    ("kind", "changes", "message"),
    [
        ("eagle", {"intermediate_size": HUGE}, "`layers.0.layer.mlp.gate_proj.weight` in `model"),
        ("eagle", {"hidden_size": 2**31}, "`hidden_size` (2147483648) must equal the target's"),
        ("eagle", {"num_attention_heads": 2**30, "head_dim": 2}, "`layers.0.layer.self_attn"),
        ("eagle", {"head_dim": 2**30}, "`layers.0.layer.self_attn.q_proj.weight` in `model"),
        ("mtp", {"num_steps": 2**30}, "`num_steps` is 1073741824, but the file holds tensors"),
        ("mtp", {"intermediate_size": HUGE}, "`layers.0.layer.mlp.gate_proj.weight` in `model"),
        ("eagle3", {"intermediate_size": HUGE}, "`midlayer.mlp.gate_proj.weight` in `model"),
        ("eagle3", {"vocab_size": 2**40}, "`vocab_size` (1099511627776) must equal the target"),
        ("eagle3", {"draft_vocab_size": 2**40}, "has shape [24], the config needs [1099511627776]"),
        ("eagle3", {"head_dim": 2**30}, "`midlayer.self_attn.q_proj"),
        ("standalone", {"intermediate_size": HUGE}, "mlp.gate_proj.weight` in `model.safetensors"),
        ("standalone", {"num_hidden_layers": 2**30}, "`num_hidden_layers` is 1073741824"),
    ],
)
def test_head_sizes_are_checked_before_the_head_is_built(
    saved: dict[str, Path],
    target: LlamaForCausalLM,
    tmp_path: Path,
    never_built: None,
    kind: str,
    changes: dict[str, Any],
    message: str,
) -> None:
    directory = shutil.copytree(saved[kind], tmp_path / kind)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **changes}))
    with pytest.raises(CheckpointError) as info:
        _load(kind, directory, target)
    assert message in str(info.value) and str(directory) in str(info.value)


@pytest.mark.parametrize("kind", ["eagle", "mtp", "eagle3", "standalone"])
def test_the_unaltered_heads_still_load(
    saved: dict[str, Path], target: LlamaForCausalLM, kind: str
) -> None:
    assert _load(kind, saved[kind], target) is not None


def test_a_tensor_the_head_does_not_have_is_named(
    saved: dict[str, Path], target: LlamaForCausalLM, tmp_path: Path, never_built: None
) -> None:
    from safetensors.torch import load_file, save_file

    directory = shutil.copytree(saved["mtp"], tmp_path / "mtp")
    tensors = load_file(str(directory / "model.safetensors"))
    tensors["layers.7.fc.weight"] = torch.zeros(2, 2)
    save_file(tensors, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"unexpected tensor `layers\.7\.fc\.weight` in"):
        MtpDrafter.load(directory, target)


def test_an_eagle3_config_that_is_not_json_names_the_file(
    saved: dict[str, Path], target: LlamaForCausalLM, tmp_path: Path
) -> None:
    directory = shutil.copytree(saved["eagle3"], tmp_path / "eagle3")
    (directory / "config.json").write_text('{"hidden_size": 32,')
    with pytest.raises(CheckpointError, match=r"config\.json: invalid JSON at line 1"):
        Eagle3Head.load(directory, target)
