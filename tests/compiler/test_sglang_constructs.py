"""The spec constructs behind SGLang 0.5.23's DSPARK-era relay behaviours (issue #44,
Deliver 2): each is declared in a spec and generated, never a branch keyed by an algorithm
name. These tests edit the bundled specs and check what the SGLang target makes of them."""

from __future__ import annotations

import shutil
import sys
import types
from pathlib import Path

import pytest
import torch

from relayc.compiler.targets.sglang import compile_sglang
from relayc.specs.errors import SpecErrors
from relayc.specs.loader import BUNDLED_DIR
from tests.compiler.test_sglang_target import FakeAlgorithm, compile_and_load, gen, pool

__all__ = ["gen"]  # the fixture, re-used


def edited(tmp_path: Path, name: str, *edits: tuple[str, str], to: str | None = None) -> Path:
    """The bundled spec ``name`` with ``edits`` applied, next to a copy of common.yaml."""
    shutil.copy(BUNDLED_DIR / "common.yaml", tmp_path / "common.yaml")
    text = (BUNDLED_DIR / f"{name}.yaml").read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"{to or name}.yaml"
    path.write_text(text)
    return path


# -- (a) a field relayed to the host late: `host_mirror: {lag, ring, generation_check}` -------
RING = "host_mirror: {lag: 2, ring: 3, generation_check: true}"


def test_the_host_ring_is_generated_from_the_spec(gen: types.ModuleType) -> None:
    ring = gen.FutureMap("cpu", FakeAlgorithm("DSPARK"), pool()).confidence_relay
    assert (ring.dtype, ring.lag, ring.depth) == (torch.float32, 2, 3) and ring.generation_check
    # SGLang's public constants, from the spec
    assert (gen.CONFIDENCE_RELAY_RING_LAG, gen.CONFIDENCE_RELAY_RING_DEPTH) == (2, 3)
    # no other bundled spec relays anything to the host late
    others = [name for name in gen.FutureMap.ALGORITHMS if name != "dspark"]
    for name in others:
        fmap = gen.FutureMap("cpu", FakeAlgorithm("EAGLE"), pool(), algorithm=name)
        assert fmap.confidence_relay is None, name


def test_another_ring_depth_and_no_generation_check(tmp_path: Path) -> None:
    spec = edited(tmp_path, "dspark", (RING, "host_mirror: {lag: 1}"))
    module = compile_and_load([spec], tmp_path / "out", "sglang_relay_ring")
    fmap = module.FutureMap("cpu", FakeAlgorithm("DSPARK"), pool(), True, True)
    ring = fmap.confidence_relay
    assert (ring.lag, ring.depth, ring.generation_check) == (1, 2, False)
    assert (module.CONFIDENCE_RELAY_RING_LAG, module.CONFIDENCE_RELAY_RING_DEPTH) == (1, 2)
    idx = torch.tensor([3, 5])
    fmap.publish(idx, torch.tensor([7, 9]), confidence=torch.rand(2, 4))
    batch = types.SimpleNamespace(
        spec_info=types.SimpleNamespace(future_indices=idx),
        req_pool_indices=idx,
        req_pool_indices_cpu=idx,
    )
    read = fmap.resolve_confidence_cpu(batch)  # the CPU: a direct read, no ring
    assert read.confidence.shape == (2, 4) and read.generation is None


def test_any_field_reaches_the_confidence_hook_the_spec_maps_it_to(tmp_path: Path) -> None:
    """SGLang's call sites name `confidence=`; a spec relays any field there by mapping it
    (`sglang: {hooks: {confidence: NAME}}`), and the hook must name a host-ring field."""
    renamed = [
        ("confidence:\n", "draft_confidence:\n"),
        ("{confidence: confidence}", "{draft_confidence: confidence}"),
        ("  members: [DSPARK]\n", "  members: [DSPARK]\n  hooks: {confidence: draft_confidence}\n"),
    ]
    module = compile_and_load([edited(tmp_path, "dspark", *renamed)], tmp_path / "o", "hook")
    assert "Publishes draft_confidence (dspark.yaml:" in (module.DsparkFutureMap.__doc__ or "")
    fmap = module.FutureMap("cpu", FakeAlgorithm("DSPARK"), pool(), True, True)
    idx, rows = torch.tensor([3, 5]), torch.rand(2, 4)
    fmap.publish(idx, torch.tensor([7, 9]), confidence=rows)
    batch = types.SimpleNamespace(
        spec_info=types.SimpleNamespace(future_indices=idx),
        req_pool_indices=idx,
        req_pool_indices_cpu=idx,
    )
    batch.spec_info.future_indices = idx
    fmap.req_to_token_pool.req_generation = torch.zeros(16, dtype=torch.int64)
    assert torch.equal(fmap.resolve_confidence_cpu(batch).confidence, rows)
    wrong = [
        *renamed[:2],
        ("  members: [DSPARK]\n", "  members: [DSPARK]\n  hooks: {confidence: bonus_tokens}\n"),
    ]
    with pytest.raises(SpecErrors) as exc:
        compile_sglang([edited(tmp_path, "dspark", *wrong, to="wrong")], "o")
    assert "`hooks: {confidence: bonus_tokens}` names no field" in exc.value.render()


def test_a_spec_without_the_host_field_refuses_confidence(gen: types.ModuleType) -> None:
    fmap = gen.FutureMap("cpu", FakeAlgorithm("DFLASH"), pool(), True, True)
    with pytest.raises(gen.RelayError, match=r"confidence.*dflash.yaml.*host_mirror"):
        fmap.publish(torch.tensor([1]), torch.tensor([4]), confidence=torch.rand(1, 4))


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        (
            [
                ("confidence:\n", "draft_confidence:\n"),
                ("{confidence: confidence}", "{draft_confidence: confidence}"),
            ],
            "map it: `sglang: {hooks: {confidence: draft_confidence}}`",
        ),
        ([("publish: early\n    host", "publish: stash\n    host")], "mark it `publish: early`"),
        ([(RING, "host_mirror: true")], "SGLang keeps a host copy the host read waits for only"),
    ],
    ids=["other_name", "stashed", "waited_mirror"],
)
def test_host_relays_sglang_cannot_express_are_located(
    tmp_path: Path, edits: list[tuple[str, str]], message: str
) -> None:
    spec = edited(tmp_path, "dspark", *edits)
    with pytest.raises(SpecErrors) as exc:
        compile_sglang([spec], "o")
    rendered = exc.value.render()
    assert message in rendered and "dspark.yaml:" in rendered


# -- (b) buffers a captured graph owns: `owner: graph` ---------------------------------------
def test_only_graph_owned_fields_are_adopted(gen: types.ModuleType, monkeypatch) -> None:
    base = sys.modules[f"{gen.__package__}.relayc_relay_runtime"]
    for name, adopted in (("DFLASH", False), ("DSPARK", True)):
        relay = gen.FutureRelayBuffers(req_pool_size=16, device=torch.device("cpu"))
        monkeypatch.setattr(base, "_offered_relay", relay)
        fmap = gen.FutureMap("cpu", FakeAlgorithm(name), pool())
        assert relay.adopted is adopted and (fmap.new_seq_lens_buf is relay.new_seq_lens) is adopted
        assert (fmap.output_tokens_buf is relay.output_tokens) is adopted
        lens = torch.tensor([5, 6])
        relay.published_seq_lens = lens  # what DSPARK's verify graph already scattered
        fmap.publish(torch.tensor([2, 3]), lens)
        # adopted: the identity skip consumes the mark; else the relay's own buffer is written
        assert (relay.published_seq_lens is None) is adopted
        if not adopted:
            assert fmap.new_seq_lens_buf[[2, 3]].tolist() == [5, 6]


def test_one_graph_owned_field_is_adopted_alone(tmp_path: Path, monkeypatch) -> None:
    spec = edited(
        tmp_path, "dspark", ("    owner: graph\n    doc: Next input", "    doc: Next input")
    )
    module = compile_and_load([spec], tmp_path / "out", "sglang_relay_owner")
    base = sys.modules["sglang_relay_owner.relayc_relay_runtime"]
    relay = module.FutureRelayBuffers(req_pool_size=16, device=torch.device("cpu"))
    monkeypatch.setattr(base, "_offered_relay", relay)
    fmap = module.FutureMap("cpu", FakeAlgorithm("DSPARK"), pool())
    assert fmap.new_seq_lens_buf is relay.new_seq_lens
    assert fmap.output_tokens_buf is not relay.output_tokens  # the relay's own
    bonus = torch.tensor([70, 71])
    relay.published_bonus = bonus  # not adopted: no identity skip, the stash writes
    fmap.stash(torch.tensor([3, 8]), module.RelayPayload(bonus_tokens=bonus))
    assert fmap.output_tokens_buf[[3, 8]].tolist() == [70, 71]


def test_graph_owned_fields_sglang_cannot_hold_are_located(tmp_path: Path) -> None:
    spec = edited(
        tmp_path,
        "dspark",
        ("    alloc: lazy\n    publish: early", "    owner: graph\n    publish: early"),
    )
    with pytest.raises(SpecErrors) as exc:
        compile_sglang([spec], "o")
    rendered = exc.value.render()
    assert "dspark.yaml:47:3: error: SGLang's FutureRelayBuffers holds only" in rendered
    assert "not `confidence` (float32 [num_draft_tokens])" in rendered


# -- (c) optional fields, made on first use: `alloc: lazy` (DSA seeds) -----------------------
def test_bundled_specs_relay_dsa_seeds_made_on_first_use(gen: types.ModuleType) -> None:
    relaying = set()
    seeds = torch.zeros(1, 4, dtype=torch.int32)
    for name in gen.FutureMap.ALGORITHMS:
        fmap = gen.FutureMap("cpu", FakeAlgorithm("EAGLE"), pool(), algorithm=name)
        payload = gen.RelayPayload(torch.tensor([1]), dsa_topk_indices=seeds)
        if name == "ngram":
            payload = gen.RelayPayload(
                None,
                accept_tokens=torch.zeros(1, 3, dtype=torch.long),
                accept_lens=torch.ones(1, dtype=torch.int32),
                dsa_topk_indices=seeds,
            )
        fmap.stash(torch.tensor([1]), payload)
        if fmap.dsa_topk_indices_buf is not None:
            relaying.add(name)
    assert relaying == {
        "eagle",
        "eagle3",
        "eagle_multilayer",
        "standalone",
        "dflash",
        "dspark",
        "uno",
    }
    fmap = gen.FutureMap("cpu", FakeAlgorithm("EAGLE"), pool(), algorithm="eagle")
    assert fmap.dsa_topk_indices_buf is None
    idx = torch.tensor([2, 6])
    seeds = torch.arange(8, dtype=torch.int32).reshape(2, 4)
    fmap.stash(idx, gen.RelayPayload(torch.tensor([1, 2]), dsa_topk_indices=seeds))
    assert fmap.dsa_topk_indices_buf.shape == (16, 4)
    info = types.SimpleNamespace(future_indices=idx, future_dsa_topk_indices_available=True)
    fmap._resolve_spec_extras(types.SimpleNamespace(spec_info=info))
    assert torch.equal(info.dsa_topk_indices, seeds)


def test_eager_dsa_seeds_are_located(tmp_path: Path) -> None:
    common = tmp_path / "common.yaml"
    spec = edited(tmp_path, "uno")
    text = common.read_text()
    common.write_text(
        text.replace("    shape: [dsa_topk]\n    alloc: lazy\n", "    shape: [dsa_topk]\n")
    )
    with pytest.raises(SpecErrors) as exc:
        compile_sglang([spec], "o")
    rendered = exc.value.render()
    assert "common.yaml:" in rendered and "declare it `alloc: lazy`" in rendered
    assert "future_dsa_topk_indices_available" in rendered


# -- (d) staged inputs: `staging:` (HiSparse make_staged_spec_input) --------------------------
def test_staging_is_generated_from_the_specs(gen: types.ModuleType) -> None:
    modes = {name: cls.STAGING or None for name, cls in gen.FutureMap.ALGORITHMS.items()}
    assert modes == {
        "eagle": "LAST",
        "eagle3": "LAST",
        "eagle_multilayer": "LAST",
        "standalone": "NULL",
        "none": None,
        "ngram": None,
        "suffix": None,
        "dflash": None,
        "dspark": None,
        "uno": None,
    }


def test_a_spec_declares_staging(tmp_path: Path) -> None:
    spec = edited(tmp_path, "uno", ("\nprefill:", "\nstaging: {capture_hidden: none}\n\nprefill:"))
    module = compile_and_load([spec], tmp_path / "out", "sglang_relay_staging")
    assert module.UnoFutureMap.STAGING == "NULL"
    fmap = module.FutureMap("cpu", FakeAlgorithm("DFLASH"), pool(), algorithm="uno")
    assert fmap.STAGING == "NULL"


def test_staging_without_declaring_it_is_refused_naming_the_spec(gen: types.ModuleType) -> None:
    fmap = gen.FutureMap("cpu", FakeAlgorithm("UNO"), pool())
    with pytest.raises(RuntimeError, match=r"EAGLE-family.*uno.yaml declares no `staging:`"):
        fmap.make_staged_spec_input(torch.tensor([1]))


def test_staging_sglang_cannot_build_is_located(tmp_path: Path) -> None:
    spec = edited(
        tmp_path, "ngram", ("\nprefill:", "\nstaging: {capture_hidden: none}\n\nprefill:")
    )
    with pytest.raises(SpecErrors) as exc:
        compile_sglang([spec], "o")
    rendered = exc.value.render()
    assert "ngram.yaml:" in rendered and "EagleDraftInput" in rendered
    assert "drop `staging:`" in rendered
