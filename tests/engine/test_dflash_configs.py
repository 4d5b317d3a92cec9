"""A DFlash drafter's config.json is read with typed, bounded reads (issue #50, items 3 and 4):
a wrong JSON type, a size past its bound or a huge value is one short ``CheckpointError``
naming the file and the key -- never a stray ``TypeError``, a 30-million-character message,
or gigabytes listed from a 300-byte file -- at the API and on the command line. The same
reads serve the other drafters' and the target's config readers."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from relayc.engine.checkpoints.shipped import DEMO_DIR, shipped_target
from relayc.engine.core.config import ConfigError, config_list, config_value, shown, whole_number
from relayc.engine.draft.dflash import DFlashDrafter
from relayc.engine.draft.eagle3 import Eagle3Head
from relayc.engine.draft.mtp import MtpDrafter
from relayc.engine.errors import CheckpointError
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import (
    SINGLE_FILE,
    load_checkpoint,
    random_model,
    save_checkpoint,
)
from tests.engine.checkpoint_cases import BAD_DFLASH_CONFIGS, BadConfig, break_checkpoint

MAX_MESSAGE = 500  # characters: one readable line, whatever the file holds
# What reading a hostile config may allocate (tracemalloc's peak). The 10**7-layer config
# listed ~11 entries per layer before the fix: gigabytes, where reading it takes well under this.
PEAK_BYTES = 16 << 20
SHIPPED_DFLASH = DEMO_DIR / "dflash"

needs_shipped = pytest.mark.skipif(
    shipped_target() is None or not (SHIPPED_DFLASH / "config.json").is_file(),
    reason="an install without the shipped demo target and DFlash drafter",
)


@pytest.fixture(scope="module")
def toy_target() -> LlamaForCausalLM:
    """The shipped demo target (what `--toy` loads), whose shipped DFlash drafter the cases
    break."""
    directory = shipped_target()
    assert directory is not None
    return load_checkpoint(directory)


@pytest.fixture
def peak_bytes() -> Iterator[Callable[[], int]]:
    """tracemalloc's peak since the test began (torch tensors are outside its view, but the
    shape tables and messages that a config's sizes once inflated are Python objects)."""
    tracemalloc.start()
    try:
        yield lambda: tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _raises_naming(path: Path, message: str) -> pytest.RaisesContext[CheckpointError]:
    return pytest.raises(
        CheckpointError, match="^" + re.escape(f"{path}: ") + ".*" + re.escape(message)
    )


@needs_shipped
@pytest.mark.parametrize("case", BAD_DFLASH_CONFIGS, ids=[c.name for c in BAD_DFLASH_CONFIGS])
def test_a_bad_dflash_config_is_a_short_error_naming_file_and_key(
    tmp_path: Path,
    toy_target: LlamaForCausalLM,
    peak_bytes: Callable[[], int],
    case: BadConfig,
) -> None:
    config = break_checkpoint(SHIPPED_DFLASH, tmp_path / "dflash", case)
    start = peak_bytes()
    with pytest.raises(CheckpointError, match=re.escape(case.message)) as info:
        DFlashDrafter.load(config.parent, toy_target)
    if info.value.path == config.parent:  # a size the safetensors headers contradict
        assert "in `model.safetensors` has shape" in str(info.value)
    else:
        assert info.value.path == config
    assert str(info.value).startswith(f"{info.value.path}: ")
    assert len(str(info.value)) < MAX_MESSAGE, str(info.value)[:MAX_MESSAGE]
    assert "\n" not in str(info.value)
    # the file's own JSON (up to 1.2 MB here) is read; nothing is listed from its sizes
    assert peak_bytes() - start < PEAK_BYTES + 20 * config.stat().st_size


@needs_shipped
def test_the_shipped_drafter_still_loads(toy_target: LlamaForCausalLM, tmp_path: Path) -> None:
    """Its settings at the top level and in `dflash_config`, as SGLang reads both."""
    drafter = DFlashDrafter.load(SHIPPED_DFLASH, toy_target)
    assert drafter.settings.target_layer_ids == (0, 2, 4)
    moved = BadConfig(
        "moved",
        lambda c: {
            **{k: v for k, v in c.items() if k != "block_size"},
            "dflash_config": {**c["dflash_config"], "block_size": 8},
            "layer_types": ["full_attention"] * 2,
            "is_causal": False,
        },
        "",
    )
    config = break_checkpoint(SHIPPED_DFLASH, tmp_path / "moved", moved)
    assert DFlashDrafter.load(config.parent, toy_target).block_size == 8


def _with_extra_layer_tensor(directory: Path, name: str) -> None:
    """Add one tiny tensor named for a far layer: a file of a few KB that claims one."""
    path = directory / SINGLE_FILE
    tensors = load_file(str(path))
    tensors[name] = torch.zeros(1)
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_one_far_layer_tensor_does_not_vouch_for_a_huge_layer_count(
    tmp_path: Path, peak_bytes: Callable[[], int]
) -> None:
    """The layer count is checked against the layers the file holds tensors of, not its
    largest index: `layers.9999999.x` once let 10**7 layers' shape tables be listed (the
    target's loader and the MTP drafter's share the check)."""
    target = random_model(seed=0)
    mtp = MtpDrafter.random(target, num_steps=2, seed=1).save(tmp_path / "mtp")
    _with_extra_layer_tensor(mtp, "layers.9999999.fc.weight")
    (mtp / "config.json").write_text(
        json.dumps({**json.loads((mtp / "config.json").read_text()), "num_steps": 10**7})
    )
    start = peak_bytes()
    with pytest.raises(CheckpointError, match="`num_steps` is 10000000, but the file holds"):
        MtpDrafter.load(mtp, target)
    assert peak_bytes() - start < PEAK_BYTES

    folder = save_checkpoint(target, tmp_path / "target")
    _with_extra_layer_tensor(folder, "model.layers.9999999.input_layernorm.weight")
    hf = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**hf, "num_hidden_layers": 10**7}))
    start = peak_bytes()
    with pytest.raises(CheckpointError, match="`num_hidden_layers` is 10000000, but the file"):
        load_checkpoint(folder)
    assert peak_bytes() - start < PEAK_BYTES


@needs_shipped
def test_a_header_that_claims_more_bytes_than_its_file_does_not_vouch_for_a_config(
    tmp_path: Path, toy_target: LlamaForCausalLM, peak_bytes: Callable[[], int]
) -> None:
    """The config's sizes are checked against the headers' shapes, and each shape against
    the bytes the file holds (safetensors' own check, as the loaders read it): a 1 GiB
    MLP claimed by a 100-byte file is refused before anything is sized by either."""
    huge = BadConfig("huge", lambda c: {**c, "intermediate_size": 2**20}, "")
    config = break_checkpoint(SHIPPED_DFLASH, tmp_path / "lie", huge)
    header = {"fc.weight": {"dtype": "F32", "shape": [2**20, 256], "data_offsets": [0, 4]}}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    shard = config.parent / SINGLE_FILE
    shard.write_bytes(len(text).to_bytes(8, "little") + text + bytes(4))
    start = peak_bytes()
    with _raises_naming(shard, "not a readable safetensors file"):
        DFlashDrafter.load(config.parent, toy_target)
    assert peak_bytes() - start < PEAK_BYTES


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"architectures": 5}, "`architectures` must be a list; got 5 (a whole number)"),
        ({"eagle_config": [1]}, "`eagle_config` must be an object; got [1] (a list)"),
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": 5}}, "_ids` must be a list"),
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, "2"]}}, "ids[2]` must"),
        ({"draft_vocab_size": 2.5}, "`draft_vocab_size` must be a whole number; got 2.5"),
        ({"draft_vocab_size": True}, "`draft_vocab_size` must be a whole number; got true"),
        ({"num_hidden_layers": list(range(10**5))}, "`num_hidden_layers: [0, 1, 2, 3, ..."),
    ],
)
def test_an_eagle3_config_is_read_with_the_same_typed_reads(
    tmp_path: Path, edit: dict[str, object], message: str
) -> None:
    """Once `TypeError`/`AttributeError` from the reader, or a value silently truncated."""
    from tests.engine.draft.helpers import SMALL

    target = random_model(SMALL.replace(num_layers=4), seed=1)
    head = Eagle3Head.random(target, seed=2, draft_vocab_size=24, layer_ids=[0, 1, 2])
    directory = head.save(tmp_path / "eagle3")
    hf = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**hf, **edit}))
    with _raises_naming(directory / "config.json", message) as info:
        Eagle3Head.load(directory, target)
    assert info.value.path == directory / "config.json"
    assert len(str(info.value)) < MAX_MESSAGE


@pytest.mark.parametrize(
    ("value", "shown_as"),
    [
        (list(range(10**6)), "[0, 1, 2, 3, ... 1000000 entries]"),
        ({"a": [[[1]]], "b": 2}, '{"a": [[...]], "b": 2}'),
        ("\x1b]0;owned\x07", '"\\u001b]0;owned\\u0007"'),  # escaped: the terminal stays
        ("x" * 10**6, '"' + "x" * 36 + "..."),
        (True, "true"),
        (None, "null"),
    ],
)
def test_shown_values_are_short_and_inert(value: object, shown_as: str) -> None:
    assert shown(value) == shown_as


def test_the_typed_reads_name_the_key_and_what_it_must_be() -> None:
    hf = {"n": True, "f": 3, "s": 5, "l": [1, "2"], "big": 10**6, "none": None}
    with pytest.raises(ConfigError, match=r"^`n` must be a whole number; got true \(a boolean\)$"):
        config_value(hf, "n", int)
    assert config_value(hf, "f", float) == 3.0  # a whole number is a number
    with pytest.raises(ConfigError, match=r"^`x\.s` must be a string; got 5"):
        config_value(hf, "s", str, within="x")
    with pytest.raises(ConfigError, match=re.escape('`none` is missing; add `"none": [...]`')):
        config_value(hf, "none", list)
    assert config_value(hf, "none", list, [7]) == [7]
    with pytest.raises(ConfigError, match=r"^`l\[1\]` must be a whole number; got \"2\""):
        config_list(hf, "l", int, max_items=(2, "why"))
    with pytest.raises(ConfigError, match=r"^`l` lists 2 entries, more than 1: why$"):
        config_list(hf, "l", int, max_items=(1, "why"))
    with pytest.raises(ConfigError, match=r"^`big` is 1000000, more than 4096: why$"):
        whole_number(hf, "big", high=(4096, "why"))
    # a default is used only when the key is absent: a value equal to it is still checked
    with pytest.raises(ConfigError, match="more than 5"):
        whole_number({"k": 256}, "k", 256, high=(5, "why"))


@needs_shipped
def test_the_command_line_ends_a_bad_dflash_config_with_one_line(tmp_path: Path) -> None:
    """`relayc generate --toy --algorithm dflash --draft-model DIR`, as a user runs it: exit 2,
    one line naming the file and key, no traceback (once a TypeError's traceback)."""
    cases = {c.name: c for c in BAD_DFLASH_CONFIGS}
    for name in ("layer-types-int", "architectures-int", "layers-1e7-default-ids"):
        case = cases[name]
        config = break_checkpoint(SHIPPED_DFLASH, tmp_path / name, case)
        argv = ["generate", "--toy", "--prompt", "hi", "--algorithm", "dflash"]
        proc = subprocess.run(
            [sys.executable, "-m", "relayc.cli", *argv, "--draft-model", str(config.parent)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, proc.stderr[-2000:]
        assert f"{config}: " in lines[0] and case.message in lines[0]
        assert len(lines[0]) < MAX_MESSAGE + 100
