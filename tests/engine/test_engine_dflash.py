"""DFlash through the Engine: one block forward drafts the chain (relayc/specs/dflash.yaml,
relayc.engine.draft.dflash), greedy output equals plain decoding, sampling stays seeded and
overlap-independent, and the drafts the paged draft cache gives are those of a forward
that recomputes every context from scratch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from relayc.engine import Engine, LlamaForCausalLM, SamplingParams, random_model
from relayc.engine.draft.dflash import DFlashDrafter
from relayc.engine.errors import CheckpointError
from relayc.tools.train.chat_features import Example, target_features
from tests.engine.engine_helpers import (
    assert_idle,
    naive_outputs,
    one_intra_op_thread,  # noqa: F401 - autouse fixture
    random_workload,
)
from tests.tolerance import assert_forwards_close


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(seed=7)


@pytest.fixture(scope="module")
def drafter_dir(model: LlamaForCausalLM, tmp_path_factory: pytest.TempPathFactory) -> Path:
    drafter = DFlashDrafter.random(
        model, seed=3, num_layers=2, block_size=5, mask_token_id=4, target_layer_ids=(0, 2)
    )
    return drafter.save(tmp_path_factory.mktemp("dflash"))


@pytest.mark.parametrize("width", [None, 3])
def test_staggered_requests_match_greedy_none(
    model: LlamaForCausalLM, drafter_dir: Path, width: int | None
) -> None:
    work = random_workload(8, 16, max_prompt=20, max_new=12, last_arrival=5)
    expected = naive_outputs(model, work.prompts, work.params)
    for overlap in (True, False):
        engine = Engine(
            model,
            algorithm="dflash",
            draft_model=drafter_dir,
            num_draft_tokens=width,
            overlap=overlap,
            debug=True,
        )
        assert engine.algorithm.dims["num_draft_tokens"] == (width or 5)  # the drafter's block
        outs = engine.generate(work.prompts, work.params, arrivals=work.arrivals)
        assert [o.token_ids for o in outs] == expected, f"overlap={overlap}"
        for out in outs:
            assert all(1 <= a <= (width or 5) for a in out.accept_lengths)
        assert_idle(engine)
        engine.close()


def test_seeded_sampling_is_reproducible_overlap_and_batch_independent(
    model: LlamaForCausalLM, drafter_dir: Path
) -> None:
    work = random_workload(9, 8, max_prompt=10, max_new=10, last_arrival=3)
    params = [
        SamplingParams(max_new_tokens=10, temperature=t, top_k=k, seed=100 + i)
        for i, (t, k) in enumerate([(1.0, 0), (0.7, 8), (0.0, 0), (1.3, 20)] * 2)
    ]
    runs = []
    for overlap in (True, False):
        with Engine(model, algorithm="dflash", draft_model=drafter_dir, overlap=overlap) as e:
            runs.append([o.token_ids for o in e.generate(work.prompts, params)])
    assert runs[0] == runs[1]
    with Engine(model, algorithm="dflash", draft_model=drafter_dir) as e:
        alone = [
            e.generate([p], [s])[0].token_ids for p, s in zip(work.prompts, params, strict=True)
        ]
    assert alone == runs[0]
    greedy = naive_outputs(model, [work.prompts[2]], [params[2]])[0]
    assert runs[0][2] == greedy


def test_drafts_are_those_of_a_cache_free_forward(model: LlamaForCausalLM, tmp_path: Path) -> None:
    """Every draft the engine makes -- from the prompt's context (prefill) and the accepted
    tokens' (inject after verify) in the paged draft cache -- equals the block forward over
    a context recomputed from the whole sequence by a dense target forward."""
    saved = DFlashDrafter.random(
        model, seed=5, num_layers=2, block_size=4, mask_token_id=9, target_layer_ids=(0, 2)
    )
    engine = Engine(model, algorithm="dflash", draft_model=saved.save(tmp_path), overlap=False)
    drafter = engine.algorithm.drafter
    calls: list[tuple[int, int, torch.Tensor]] = []
    original = drafter.draft_logits
    prompt = [3, 17, 200, 45, 45, 9, 120, 7]
    truth = prompt + naive_outputs(model, [prompt], [SamplingParams(max_new_tokens=16)])[0]

    def recording(bonus, seq_lens, *args, **kwargs):  # type: ignore[no-untyped-def]
        logits = original(bonus, seq_lens, *args, **kwargs)
        seq_len = int(seq_lens[0])
        if seq_len == 0:  # a warm-up or padding batch (row 0 is the request otherwise)
            return logits
        calls.append((int(bonus[0]), seq_len, logits[0].clone()))
        # Steer the drafts to the first `good` tokens of the greedy continuation, so that
        # verify accepts 1..width tokens and inject writes that many contexts.
        steered = logits.clone()
        good = len(calls) % logits.shape[1] + 1
        for j, token in enumerate(truth[seq_len + 1 : seq_len + 1 + good]):
            steered[0, j, token] = steered[0, j].max() + 1
        return steered

    drafter.draft_logits = recording
    out = engine.generate([prompt], SamplingParams(max_new_tokens=16))[0]
    engine.close()
    sequence = prompt + out.token_ids
    assert sequence == truth
    assert max(out.accept_lengths) >= 3 and len(calls) >= 3
    for bonus, seq_len, logits in calls:
        assert sequence[seq_len] == bonus
        ids = torch.tensor(sequence[: seq_len + 1])
        feats = target_features(
            model,
            [Example(sequence[:seq_len], [])],
            drafter.settings.target_layer_ids,
            with_logits=False,
        ).aux_hidden[0]
        feats = torch.cat([feats, feats.new_zeros(1, feats.shape[1])])  # the bonus has none
        with torch.no_grad():
            hidden = drafter.dense_block_hidden(feats, ids, torch.tensor([seq_len]), 4)
            want = torch.nn.functional.linear(hidden[0, 1:], model.lm_head.weight).float()
        depth = model.config.replace(num_layers=model.config.num_layers + 2)
        assert_forwards_close(logits, want, depth, context=len(sequence))


def test_a_saved_drafter_loads_with_its_settings(
    model: LlamaForCausalLM, drafter_dir: Path
) -> None:
    loaded = DFlashDrafter.load(drafter_dir, model)
    header = json.loads((drafter_dir / "config.json").read_text())
    assert header["architectures"] == ["DFlashDraftModel"]
    assert header["dflash_config"]["mask_token_id"] == 4
    assert loaded.block_size == 5 and loaded.config.num_layers == 2
    assert loaded.settings.target_layer_ids == (0, 2)
    assert loaded.capture == tuple(i + 1 for i in loaded.settings.target_layer_ids)


def _edited(src: Path, dst: Path, **changes: object) -> Path:
    import shutil

    shutil.copytree(src, dst)
    header = json.loads((dst / "config.json").read_text())
    for key, value in changes.items():
        if key.startswith("dflash_config."):
            header["dflash_config"][key.split(".", 1)[1]] = value
        elif value is None:
            header.pop(key, None)
        else:
            header[key] = value
    (dst / "config.json").write_text(json.dumps(header))
    return dst


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, "not a DFlash drafter"),
        ({"block_size": None}, "`block_size` is missing"),
        ({"block_size": 1}, "`block_size`"),
        ({"dflash_config.mask_token_id": None}, "mask_token_id"),
        ({"dflash_config.mask_token_id": 10**9}, "mask_token_id"),
        ({"dflash_config.target_layer_ids": [0, 99]}, "target_layer_ids"),
        ({"dflash_config.target_layer_ids": "1,2"}, "target_layer_ids"),
        ({"dflash_config.conv_kernel_size": 3}, "grouped convolutions"),
        ({"dflash_config.projector_type": "domino"}, "Domino"),
        ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
        ({"num_target_layers": 40}, "num_target_layers"),
        ({"hidden_size": 64}, "hidden_size"),
        ({"num_hidden_layers": 3}, "layers."),
    ],
)
def test_a_config_it_cannot_run_is_a_located_error(
    model: LlamaForCausalLM, drafter_dir: Path, tmp_path: Path, changes: dict, says: str
) -> None:
    if "dflash_config.mask_token_id" in changes and changes["dflash_config.mask_token_id"] is None:
        directory = _edited(drafter_dir, tmp_path / "d")
        header = json.loads((directory / "config.json").read_text())
        del header["dflash_config"]["mask_token_id"]
        (directory / "config.json").write_text(json.dumps(header))
    else:
        directory = _edited(drafter_dir, tmp_path / "d", **changes)
    with pytest.raises(CheckpointError, match=None) as info:
        DFlashDrafter.load(directory, model)
    assert says in str(info.value)
    assert str(directory) in str(info.value)


def test_dims_that_are_no_block_are_refused(model: LlamaForCausalLM, drafter_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"rule `topk == 1` .* topk=2: .*\(set `topk` to 1\)"):
        Engine(model, algorithm="dflash", draft_model=drafter_dir, topk=2)
    # num_draft_tokens is the drafter's block: the rule is checked once it has loaded
    block = DFlashDrafter.load(drafter_dir, model).block_size
    with pytest.raises(
        ValueError,
        match=rf"rule `num_steps == num_draft_tokens - 1` \(relayc/specs/dflash.yaml:\d+\) does "
        rf"not hold for num_steps=2, num_draft_tokens={block} \(the drafter's block_size\): "
        rf".*set `num_steps` to {block - 1}\)",
    ):
        Engine(model, algorithm="dflash", draft_model=drafter_dir, num_steps=2)
    with pytest.raises(ValueError, match=">= 2"):
        Engine(model, algorithm="dflash", draft_model=drafter_dir, num_draft_tokens=1)


def test_bfloat16_greedy_matches_none(tmp_path: Path) -> None:
    """bfloat16 target and drafter (the drafter takes the target's dtype), greedy, overlap on
    and eager, overlap off and recorded: the same tokens as `none`."""
    from relayc.engine.core.config import ModelConfig

    model = random_model(ModelConfig(dtype=torch.bfloat16), seed=4)
    prompts = [[5, 9, 200, 31, 31, 7], [44, 2, 2, 2, 19, 100, 3, 8, 8]]
    params = SamplingParams(max_new_tokens=14)
    with Engine(model, overlap=False) as plain:
        want = [o.token_ids for o in plain.generate(prompts, params)]
    saved = DFlashDrafter.random(model, seed=6, num_layers=2, block_size=4, mask_token_id=9)
    directory = saved.save(tmp_path)
    for overlap, graphs in [(True, "off"), (False, "tape")]:
        engine = Engine(model, algorithm="dflash", draft_model=directory, overlap=overlap,
                        graphs=graphs, max_batch_size=1)  # fmt: skip
        drafter = engine.algorithm.drafter
        assert drafter.fc.weight.dtype == torch.bfloat16
        outs = [engine.generate([p], params)[0] for p in prompts]
        engine.close()
        assert [o.token_ids for o in outs] == want, (overlap, graphs)


def test_a_draft_vocabulary_narrows_the_drafts_and_stays_lossless(
    model: LlamaForCausalLM, tmp_path: Path
) -> None:
    drafter = DFlashDrafter.random(
        model, seed=3, num_layers=2, block_size=5, mask_token_id=4, target_layer_ids=(0, 2)
    )
    work = random_workload(6, 12, max_prompt=16, max_new=12, last_arrival=3)
    expected = naive_outputs(model, work.prompts, work.params)
    # the continuations' tokens and some others: drafts are sometimes right, never outside
    keep = sorted({t for out in expected for t in out} | set(range(0, 259, 7)))
    drafter.set_draft_vocab(torch.tensor(keep))
    saved = drafter.save(tmp_path / "narrow")
    assert json.loads((saved / "draft_vocab.json").read_text())["token_ids"] == keep
    engine = Engine(model, algorithm="dflash", draft_model=saved, overlap=False)
    loaded = engine.algorithm.drafter
    assert loaded.vocab_head is not None and loaded.vocab_head.tokens.tolist() == keep
    proposed: list[torch.Tensor] = []
    original = loaded.target_ids

    def recording(ids: torch.Tensor) -> torch.Tensor:
        out = original(ids)
        proposed.append(out.clone())
        return out

    loaded.target_ids = recording
    outs = engine.generate(work.prompts, work.params)
    engine.close()
    assert [o.token_ids for o in outs] == expected
    drafts = torch.cat([p.flatten() for p in proposed])
    assert proposed and bool(torch.isin(drafts, torch.tensor(keep)).all())
    # recorded and replayed steps (the narrowed head and the id map inside the tape)
    with Engine(model, algorithm="dflash", draft_model=saved, graphs="tape") as taped:
        assert [o.token_ids for o in taped.generate(work.prompts, work.params)] == expected
    # saving without one removes the stale file
    drafter.set_draft_vocab(None)
    drafter.save(saved)
    assert not (saved / "draft_vocab.json").exists()


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ('{"format": "other", "token_ids": [1]}', "`format` must be"),
        ('{"format": "relayc-draft-vocab/1", "token_ids": []}', "non-empty list"),
        ('{"format": "relayc-draft-vocab/1", "token_ids": [1, "2"]}', "non-empty list"),
        ('{"format": "relayc-draft-vocab/1", "token_ids": [1, true]}', "non-empty list"),
        ('{"format": "relayc-draft-vocab/1", "token_ids": [1, 99999]}', "holds 99999, outside"),
        ('{"format": "relayc-draft-vocab/1", "token_ids": [5, 3]}', "strictly increasing"),
        ('{"format": "relayc-draft-vocab/1", "token_ids": [3, 3]}', "strictly increasing"),
        ("[1, 2]", "JSON object"),
        (" " * 20000, "more than a draft vocabulary"),
    ],
)
def test_a_bad_draft_vocabulary_is_a_located_error(
    model: LlamaForCausalLM, drafter_dir: Path, tmp_path: Path, body: str, match: str
) -> None:
    folder = tmp_path / "d"
    folder.mkdir()
    for file in drafter_dir.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    (folder / "draft_vocab.json").write_text(body)
    with pytest.raises(CheckpointError, match=match) as info:
        DFlashDrafter.load(folder, model)
    assert "draft_vocab.json" in str(info.value)
