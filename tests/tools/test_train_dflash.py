"""``python -m relayc.tools.train dflash``: the recipe's pieces (anchors, position weights,
labels), a smoke run that stores a drafter the engine loads, and a resumed run."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from relayc.engine import Engine, SamplingParams
from relayc.engine.core.config import ModelConfig
from relayc.engine.model.weights import random_model
from relayc.tools.train.dflash import block_labels, position_weights, sample_anchors
from relayc.tools.train.dflash_cli import main


def test_anchors_lie_in_the_answer_with_a_token_after_them() -> None:
    gen = torch.Generator().manual_seed(0)
    anchors = sample_anchors(10, 20, 500, gen)
    assert int(anchors.min()) == 10 and int(anchors.max()) == 18
    assert sample_anchors(10, 11, 5, gen).numel() == 0


def test_later_block_positions_weigh_less() -> None:
    w = position_weights(8, 4.0)
    assert w.shape == (7,) and float(w[0]) == 1.0
    assert torch.all(w[1:] < w[:-1])


def test_block_position_k_is_scored_against_the_argmax_at_a_plus_k_minus_1() -> None:
    """The target's argmax at ``a + k - 1`` is its choice of token ``a + k``: the token greedy
    verification accepts at block position ``k``; positions past the end have no label."""
    ids = torch.arange(100, 112)
    row = {"ids": ids, "argmax": ids + 1000, "prompt_len": torch.tensor(2)}
    labels, valid = block_labels(row, torch.tensor([2, 9]), 4)
    assert labels[0].tolist() == [1102, 1103, 1104]
    assert labels[1, :2].tolist() == [1109, 1110] and valid[1].tolist() == [True, True, False]
    assert bool(valid[0].all())


def test_smoke_run_stores_a_drafter_the_engine_runs_and_resumes(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    assert main(["--smoke", "--steps", "3", "--out", str(out), "--work", str(work)]) == 0
    record = json.loads((out / "training_log.json").read_text())
    assert record["training"]["steps"] == 3 and record["training"]["invocations"] == 1
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 8
    # the smoke target (seeded) with the stored drafter: lossless through the engine
    target_config = ModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64,
                                num_layers=6, num_heads=2, num_kv_heads=1, head_dim=16,
                                max_position=512)  # fmt: skip
    target = random_model(target_config, seed=0)
    params = SamplingParams(max_new_tokens=12)
    with Engine(target, overlap=False) as plain:
        want = plain.generate([[5, 6, 7]], params)[0].token_ids
    with Engine(target, algorithm="dflash", draft_model=out, overlap=False) as engine:
        assert engine.generate([[5, 6, 7]], params)[0].token_ids == want
    # the same command with a larger cap continues from the checkpoint
    assert main(["--smoke", "--steps", "5", "--out", str(out), "--work", str(work)]) == 0
    record = json.loads((out / "training_log.json").read_text())
    assert record["training"]["steps"] == 5 and record["training"]["invocations"] == 2
