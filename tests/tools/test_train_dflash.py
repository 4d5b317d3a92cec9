"""``python -m relayc.tools.train dflash``: the recipe's pieces (anchors, position weights,
labels), a smoke run that stores a drafter the engine loads, and a resumed run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from relayc.engine import Engine, SamplingParams
from relayc.engine.core.config import ModelConfig
from relayc.engine.draft.dflash import DFlashDrafter
from relayc.engine.model.weights import random_model
from relayc.tools.train.dflash import (
    TrainVocab,
    block_labels,
    block_loss,
    position_weights,
    sample_anchors,
    warm_start,
)
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


def test_train_vocab_keeps_every_answer_label_then_the_most_frequent_tokens() -> None:
    rows = [
        # prompt (2 tokens) then answer positions; argmax at prompt positions is not a label
        {"prompt_len": torch.tensor(2), "argmax": torch.tensor([9, 9, 3, 4, 3])},
        {"prompt_len": torch.tensor(1), "argmax": torch.tensor([8, 5, 8])},
    ]
    vocab = TrainVocab.of(rows, vocab_size=12, size=5)
    # labels 3, 4, 5, 8 (8 is a label in the second row), then the most frequent other: 9
    assert vocab.tokens.tolist() == [3, 4, 5, 8, 9]
    assert vocab.position[[3, 4, 5, 8, 9]].tolist() == [0, 1, 2, 3, 4]
    assert int((vocab.position >= 0).sum()) == 5 and int(vocab.position[0]) == -1
    # fewer slots than labels: every label still stays
    assert TrainVocab.of(rows, vocab_size=12, size=2).tokens.tolist() == [3, 4, 5, 8]


def _smoke_drafter() -> tuple[DFlashDrafter, torch.nn.Module]:
    config = ModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=6,
                         num_heads=2, num_kv_heads=1, head_dim=16, max_position=512)  # fmt: skip
    target = random_model(config, seed=0)
    return DFlashDrafter.random(target, 0, num_layers=2, block_size=4, mask_token_id=299), target


def test_restricted_loss_equals_the_full_loss_over_the_kept_rows() -> None:
    drafter, _ = _smoke_drafter()
    gen = torch.Generator().manual_seed(0)
    length, width = 20, drafter.block_size
    ids = torch.randint(300, (length,), generator=gen)
    row = {
        "ids": ids,
        "features": torch.randn(length, len(drafter.capture) * 32, generator=gen),
        "argmax": torch.cat([ids[1:], ids[:1]]),
        "prompt_len": torch.tensor(4),
    }
    anchors = torch.tensor([4, 9, 15])
    weights = position_weights(width, 4.0)
    labels = row["argmax"][4:]
    vocab = TrainVocab.of([row], 300, 300)  # every token: the same loss
    full = block_loss(drafter, row, anchors, weights)
    kept = block_loss(drafter, row, anchors, weights, vocab)
    assert torch.allclose(full[0], kept[0], atol=1e-4) and torch.equal(full[1], kept[1])
    small = TrainVocab.of([row], 300, 0)  # only the labels: a different, smaller loss
    part = block_loss(drafter, row, anchors, weights, small)
    assert small.tokens.numel() == int(labels.unique().numel())
    assert float(part[0].detach()) < float(full[0].detach()) and torch.equal(part[1], full[1])


def test_warm_start_copies_the_target_layers_norm_and_an_eagle3_fusion() -> None:
    drafter, target = _smoke_drafter()
    fc = {
        "fc.weight": torch.randn(drafter.fc.weight.shape),
        "midlayer.hidden_norm.weight": torch.rand(32),
    }
    warm_start(drafter, target, [5, 0], fc)
    for layer, index in zip(drafter.draft_layers, [5, 0], strict=True):
        source = target.model.layers[index]
        assert torch.equal(layer.self_attn.q_proj.weight, source.self_attn.q_proj.weight)
        assert torch.equal(layer.mlp.down_proj.weight, source.mlp.down_proj.weight)
        assert torch.equal(layer.input_layernorm.weight, source.input_layernorm.weight)
        assert torch.all(layer.self_attn.k_norm.weight == 1)
    assert torch.equal(drafter.norm.weight, target.model.norm.weight)
    assert torch.equal(drafter.fc.weight, fc["fc.weight"])
    assert torch.equal(drafter.hidden_norm.weight, fc["midlayer.hidden_norm.weight"])


def test_bad_warm_start_options_are_refused_with_what_to_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--smoke", "--steps", "1", "--out", str(tmp_path / "o"), "--work", str(tmp_path / "w")]

    def refused(*extra: str) -> str:
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        return err

    assert re.search(r"--init-layers \[6\].*in -6\.\.5", refused("--init-layers", "6"))
    assert "at most 2 target layers" in refused("--init-layers", "0,1,2")
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text(
        json.dumps({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 3]}})
    )
    err = refused("--init-fc", str(head))
    assert re.search(r"taps layers \[0, 2, 3\].*--target-layer-ids", err)
    # a config.json that is not an EAGLE-3 head's: named, not a TypeError
    (head / "config.json").write_text(json.dumps({"eagle_config": 5}))
    assert "taps layers None" in refused("--init-fc", str(head))
    (head / "config.json").write_text("[1,")
    assert f"{head / 'config.json'}: invalid JSON" in refused("--init-fc", str(head))


def test_a_warm_started_restricted_smoke_run_records_both(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["--smoke", "--steps", "2", "--out", str(out), "--work", str(tmp_path / "work"),
            "--init-layers=-2,-1", "--train-vocab", "64"]  # fmt: skip
    assert main(argv) == 0
    drafter = json.loads((out / "training_log.json").read_text())["drafter"]
    assert drafter["warm_start"] == {"target_layers": [4, 5], "fc_from": None}
    assert 64 <= drafter["train_vocab"] < 300  # every label of the answers, at least 64
    vocab = json.loads((out / "draft_vocab.json").read_text())["token_ids"]
    assert (
        len(vocab) == drafter["train_vocab"]
        and "Draft vocabulary" in (out / "MODEL_CARD.md").read_text()
    )
