"""A broken checkpoint is one ``CheckpointError`` naming the file, the key and the fix -- for
the target's config.json, the draft heads' and the shard files -- never a KeyError,
AttributeError or TypeError from deep inside the loader."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from relayc.engine.core.config import ModelConfig
from relayc.engine.draft.eagle import EagleHead
from relayc.engine.draft.mtp import MtpDrafter
from relayc.engine.errors import CheckpointError
from relayc.engine.model.weights import (
    INDEX_FILE,
    SINGLE_FILE,
    load_checkpoint,
    random_model,
    save_checkpoint,
)
from tests.engine.checkpoint_cases import BAD_CONFIGS, BadConfig, break_checkpoint


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny target and an EAGLE head and an MTP drafter for it, saved once."""
    root = tmp_path_factory.mktemp("checkpoints")
    target = random_model(seed=0)
    return {
        "target": save_checkpoint(target, root / "target"),
        "eagle": EagleHead.random(target, seed=1).save(root / "eagle"),
        "mtp": MtpDrafter.random(target, num_steps=2, seed=1).save(root / "mtp"),
    }


def _raises_naming(path: Path, message: str) -> pytest.RaisesContext[CheckpointError]:
    return pytest.raises(
        CheckpointError, match="^" + re.escape(f"{path}: ") + ".*" + re.escape(message)
    )


@pytest.mark.parametrize("case", BAD_CONFIGS, ids=[c.name for c in BAD_CONFIGS])
def test_a_bad_target_config_names_the_file_and_key(
    tmp_path: Path, checkpoints: dict[str, Path], case: BadConfig
) -> None:
    config = break_checkpoint(checkpoints["target"], tmp_path / "ckpt", case)
    with _raises_naming(config, case.message) as info:
        load_checkpoint(config.parent)
    assert info.value.path == config
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("case", BAD_CONFIGS, ids=[c.name for c in BAD_CONFIGS])
def test_a_bad_draft_config_names_the_file_and_key(
    tmp_path: Path, checkpoints: dict[str, Path], case: BadConfig
) -> None:
    config = break_checkpoint(checkpoints["eagle"], tmp_path / "head", case)
    target = load_checkpoint(checkpoints["target"])
    with _raises_naming(config, case.message):
        EagleHead.load(config.parent, target)


@pytest.mark.parametrize(
    "num_steps, message",
    [
        (2.5, "`num_steps` must be a whole number; got 2.5"),  # was truncated to 2
        ("2", "write 2 without quotes"),  # was taken as 2
        (0, "`num_steps` must be positive"),
        (None, '`num_steps` is missing; add `"num_steps": <whole number>`'),  # was a KeyError
    ],
)
def test_the_mtp_drafters_own_settings_are_checked(
    tmp_path: Path, checkpoints: dict[str, Path], num_steps: object, message: str
) -> None:
    head = tmp_path / "mtp"
    path = break_checkpoint(
        checkpoints["mtp"],
        head,
        BadConfig("num_steps", lambda config: {**config, "num_steps": num_steps}, message),
    )
    with _raises_naming(path, message):
        MtpDrafter.load(head, load_checkpoint(checkpoints["target"]))


@pytest.mark.parametrize(
    "case", [c for c in BAD_CONFIGS if c.edit is not None], ids=lambda c: c.name
)
def test_from_hf_config_raises_config_errors_naming_the_key(
    checkpoints: dict[str, Path], case: BadConfig
) -> None:
    """The dict-level API: the same message (no file to name), a ConfigError -- which is a
    ValueError, as before."""
    from relayc.engine.core.config import ConfigError

    assert case.edit is not None
    hf = case.edit(json.loads((checkpoints["target"] / "config.json").read_text()))
    with pytest.raises(ConfigError, match=re.escape(case.message)):
        ModelConfig.from_hf_config(hf)
    assert issubclass(ConfigError, ValueError)


def test_valid_configs_still_load(checkpoints: dict[str, Path]) -> None:
    """Nulls for optional keys and transformers 5.x's nested rope_theta are accepted."""
    hf = json.loads((checkpoints["target"] / "config.json").read_text())
    plain = ModelConfig.from_hf_config(hf)
    for key in ("head_dim", "num_key_value_heads", "torch_dtype", "rope_scaling"):
        assert ModelConfig.from_hf_config({**hf, key: None}).head_dim == plain.head_dim
    nested = {k: v for k, v in hf.items() if k != "rope_theta"}
    nested["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
    assert ModelConfig.from_hf_config(nested).rope_theta == 5e5


def test_a_damaged_shard_names_the_file(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    for kind in ("target", "eagle"):
        folder = tmp_path / kind
        break_checkpoint(checkpoints[kind], folder, BadConfig("same", dict, ""))
        shard = folder / SINGLE_FILE
        shard.write_bytes(shard.read_bytes()[:1000])  # an interrupted copy
        with _raises_naming(shard, "not a readable safetensors file"):
            if kind == "target":
                load_checkpoint(folder)
            else:
                EagleHead.load(folder, load_checkpoint(checkpoints["target"]))


@pytest.mark.parametrize(
    "index, message",
    [
        ("[1, 2]", "must hold a JSON object"),
        ('{"metadata": {}}', "`weight_map` must be an object"),  # was a KeyError
        ('{"weight_map": {"a": 1}}', "`weight_map` must be an object"),
        ('{"weight_map": ', "invalid JSON"),
    ],
)
def test_a_bad_shard_index_names_the_file(
    tmp_path: Path, checkpoints: dict[str, Path], index: str, message: str
) -> None:
    folder = tmp_path / "sharded"
    break_checkpoint(checkpoints["target"], folder, BadConfig("same", dict, ""))
    (folder / INDEX_FILE).write_text(index)
    with _raises_naming(folder / INDEX_FILE, message):
        load_checkpoint(folder)
