"""What the training commands read back from ``--work`` (``relayc.tools.train.work``): a
pickle that would run code is refused before it runs, a damaged or foreign file is a
``CheckpointError`` naming it, and a resumed run ends where an uninterrupted one does."""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from relayc.engine.core.config import ModelConfig
from relayc.engine.draft.dflash import DFlashDrafter
from relayc.engine.errors import CheckpointError
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import random_model
from relayc.tools.train import dflash_cli, eagle3_cli
from relayc.tools.train.dflash import DFlashRecipe, check_checkpoint, train_dflash
from relayc.tools.train.eagle3_chat import read_shard
from relayc.tools.train.loop import Checkpoint, train_loop
from relayc.tools.train.work import load_pt


class _LeavesMarker:
    """Unpickling this runs ``os.system``: it leaves a file behind when it runs."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _torch_save(path: Path, value: Any) -> None:
    torch.save(value, path)


def _plain_pickle(path: Path, value: Any) -> None:
    path.write_bytes(pickle.dumps(value))


WRITERS = [_torch_save, _plain_pickle]


def _malicious(path: Path, marker: Path, write: Callable[[Path, Any], None]) -> None:
    write(path, {"module": _LeavesMarker(marker), "step": 3})


@pytest.mark.parametrize("write", WRITERS, ids=["torch.save", "pickle"])
def test_a_checkpoint_that_would_run_code_is_refused_unrun(
    tmp_path: Path, write: Callable[[Path, Any], None]
) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "checkpoint.pt"
    _malicious(path, marker, write)
    with pytest.raises(CheckpointError, match="holds more than tensors") as caught:
        Checkpoint(path, 60.0).load()
    assert caught.value.path == path and str(path) in str(caught.value)
    # what torch's unpickler refused: the call, or (protocol 4) the first opcode it lacks
    refused = r"(posix|nt)\.system" if write is _torch_save else "Unsupported operand"
    assert re.search(refused, str(caught.value))
    assert "weights_only=False" not in str(caught.value)  # no advice to load it unsafely
    assert not marker.exists()


@pytest.mark.parametrize("write", WRITERS, ids=["torch.save", "pickle"])
def test_resuming_a_work_folder_with_a_malicious_checkpoint_runs_no_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], write: Callable[[Path, Any], None]
) -> None:
    marker = tmp_path / "ran"
    for name, main in (("dflash", dflash_cli.main), ("eagle3", eagle3_cli.main)):
        work = tmp_path / name
        work.mkdir()
        _malicious(work / "checkpoint.pt", marker, write)
        argv = ["--smoke", "--steps", "1", "--out", str(tmp_path / f"{name}-out")]
        assert main([*argv, "--work", str(work), *(["--target", "toy"] * (name == "eagle3"))]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"python -m relayc.tools.train {name}: error: {work}/checkpoint.pt")
        assert err.count("\n") == 1 and "Traceback" not in err and "fresh --work" in err
        assert not marker.exists()


def test_a_malicious_feature_shard_is_refused_unrun(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "features-00000-x.pt"
    torch.save([{"ids": _LeavesMarker(marker)}], path)
    with pytest.raises(CheckpointError, match="holds more than tensors"):
        read_shard(path, 1, 3, 32)
    assert not marker.exists()
    good = {"ids": torch.arange(5), "features": torch.zeros(5, 96), "hidden": torch.zeros(5, 32),
            "argmax": torch.arange(5), "prompt_len": torch.tensor(2)}  # fmt: skip
    torch.save([good], path)
    assert read_shard(path, 1, 3, 32)[0]["ids"].tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(CheckpointError, match="not a feature shard of 2 examples"):
        read_shard(path, 2, 3, 32)
    with pytest.raises(CheckpointError, match="do not have the shapes"):
        read_shard(path, 1, 2, 32)  # features of another capture


def _valid_state(module: nn.Module) -> dict[str, Any]:
    optimizer = torch.optim.AdamW(module.parameters())
    return {"module": module.state_dict(), "optimizer": optimizer.state_dict(), "step": 2,
            "elapsed_s": 1.5, "record": {"train": [], "heldout": []},
            "extra": {"data": torch.Generator().get_state()}}  # fmt: skip


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p, s: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "damaged"),
        (lambda p, s: p.write_bytes(b""), "damaged"),
        (lambda p, s: p.write_bytes(b"not a checkpoint at all"), "damaged"),
        (lambda p, s: torch.save([1, 2], p), "holds a list"),
        (lambda p, s: torch.save({k: v for k, v in s.items() if k != "optimizer"}, p),
         "has no `optimizer`"),
        (lambda p, s: torch.save({**s, "step": "2"}, p), "`step` is a str"),
        (lambda p, s: torch.save({**s, "record": {"train": []}}, p), "`record.heldout`"),
        (lambda p, s: torch.save({**s, "extra": {}}, p), "`extra.data`"),
    ],
    ids=["truncated", "empty", "text", "list", "no-optimizer", "step-str", "record", "extra"],
)  # fmt: skip
def test_a_damaged_or_foreign_checkpoint_names_its_file(
    tmp_path: Path, damage: Callable[[Path, dict[str, Any]], None], message: str
) -> None:
    path = tmp_path / "checkpoint.pt"
    state = _valid_state(nn.Linear(3, 2))
    torch.save(state, path)
    checkpoint = Checkpoint(path, 60.0, {"data": torch.Generator()})
    assert checkpoint.load() is not None  # the undamaged file loads
    damage(path, state)
    with pytest.raises(CheckpointError, match=message) as caught:
        checkpoint.load()
    assert caught.value.path == path and "fresh --work" in str(caught.value)


def test_a_checkpoint_of_another_model_shape_says_which_flags(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    torch.save(_valid_state(nn.Linear(3, 2)), path)
    checkpoint = Checkpoint(path, 60.0, {"data": torch.Generator()}, flags="--width")
    module = nn.Linear(3, 4)
    with pytest.raises(CheckpointError, match=r"weight: \(2, 3\) saved, \(4, 3\) here.*--width"):
        train_loop("m", module, lambda b: (module(b).sum(), {}), dict, lambda: torch.ones(1, 3),
                   lr=1e-3, weight_decay=0.0, budget_s=60.0, max_steps=1, warmup_frac=0.0,
                   eval_every_s=1e9, log={}, checkpoint=checkpoint)  # fmt: skip


class _Stop(Exception):
    """Stands in for a run killed mid-training."""


def _linear_run(path: Path, steps: int, stop_after: int | None) -> nn.Module:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    data = torch.Generator().manual_seed(1)
    calls = [0]

    def sample() -> torch.Tensor:
        calls[0] += 1
        if stop_after is not None and calls[0] > stop_after:
            raise _Stop
        return torch.randn(8, 4, generator=data)

    def step(batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        return ((module(batch) - batch.sum(-1, keepdim=True)) ** 2).mean(), {}

    train_loop("m", module, step, dict, sample, lr=1e-2, weight_decay=0.1, budget_s=600.0,
               max_steps=steps, warmup_frac=0.2, eval_every_s=1e9, log={},
               checkpoint=Checkpoint(path, 0.0, {"data": data}))  # fmt: skip
    return module


def test_an_interrupted_loop_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    whole = _linear_run(tmp_path / "a.pt", 6, None)
    with pytest.raises(_Stop):
        _linear_run(tmp_path / "b.pt", 6, 3)  # saved at every step, stopped in the 4th
    resumed = _linear_run(tmp_path / "b.pt", 6, None)
    fresh = _linear_run(tmp_path / "c.pt", 3, None)  # not trivially equal: training moved it
    for ours, theirs, other in zip(
        resumed.parameters(), whole.parameters(), fresh.parameters(), strict=True
    ):
        assert torch.equal(ours, theirs)
        assert not torch.equal(ours, other)


def _smoke_target() -> LlamaForCausalLM:
    config = ModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=6,
                         num_heads=2, num_kv_heads=1, head_dim=16, max_position=512)  # fmt: skip
    return random_model(config, seed=0).requires_grad_(False)


def _dflash_run(work: Path, stop_at: int | None) -> DFlashDrafter:
    target = _smoke_target()
    drafter = DFlashDrafter.random(target, 0, num_layers=1, block_size=4, mask_token_id=299)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(4):
        ids = torch.randint(300, (20,), generator=gen)
        rows.append({"ids": ids, "features": torch.randn(20, len(drafter.capture) * 32,
                     generator=gen), "argmax": torch.roll(ids, -1), "prompt_len": torch.tensor(4)})  # fmt: skip

    def on_eval(step: int) -> dict[str, Any]:
        if stop_at is not None and step == stop_at:
            raise _Stop
        return {}

    recipe = DFlashRecipe(max_steps=5, warmup_steps=2, save_every=-1.0, examples_per_step=2,
                          anchors_per_example=3)  # fmt: skip
    train_dflash(drafter, rows, recipe, work, seed=0, on_eval=on_eval, eval_every=-1.0)
    return drafter


def test_an_interrupted_dflash_run_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    whole = _dflash_run(tmp_path / "a", None)
    with pytest.raises(_Stop):
        _dflash_run(tmp_path / "b", 3)
    resumed = _dflash_run(tmp_path / "b", None)
    for (name, ours), theirs in zip(
        resumed.state_dict().items(), whole.state_dict().values(), strict=True
    ):
        assert torch.equal(ours, theirs), name


def test_a_dflash_checkpoint_without_recorded_settings_is_checked_by_its_shapes(
    tmp_path: Path,
) -> None:
    drafter = _dflash_run(tmp_path, None)
    path = tmp_path / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    assert state["settings"]["--layers"] == 1
    del state["settings"]  # as checkpoints written before settings were recorded
    torch.save(state, path)
    check_checkpoint(drafter, tmp_path, "--layers")  # the same shape resumes
    wider = DFlashDrafter.random(_smoke_target(), 0, num_layers=2, block_size=4, mask_token_id=299)
    with pytest.raises(CheckpointError, match=r"another model shape.*layers\.1\..*--layers"):
        check_checkpoint(wider, tmp_path, "--layers")


def test_a_checkpoint_claiming_more_elements_than_it_holds_is_refused_unallocated(
    tmp_path: Path,
) -> None:
    """The size in the pickle is checked against the stored record before any allocation:
    a 16-byte record claiming 2**30 float elements (4 GiB) is a damaged file, at once."""
    small, path = tmp_path / "small.pt", tmp_path / "checkpoint.pt"
    torch.save({"a": torch.ones(4)}, small)
    with zipfile.ZipFile(small) as source, zipfile.ZipFile(path, "w") as out:
        for name in source.namelist():
            data = source.read(name)
            if name.endswith("data.pkl"):  # the storage's numel, 4 (BININT1), after 'cpu'
                at = data.index(b"K\x04", data.index(b"cpu"))
                data = data[:at] + b"J" + (2**30).to_bytes(4, "little") + data[at + 2 :]
            out.writestr(name, data)
    with pytest.raises(CheckpointError, match=r"damaged.*does not match expected size"):
        load_pt(path)
