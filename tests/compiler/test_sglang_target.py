"""The SGLang target: the generated module, its errors, and the differential test.

The differential test drives SGLang 0.5.23's own FutureMap and the generated one with
the same randomized call sequences (tests/compiler/sglang_twin.py) and compares every
resolved tensor. It needs sglang, which the default test environment does not have: it
skips there, saying so, and runs in the SGLang venv (docs/sglang.md; CI does both).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from relayc.compiler.targets.sglang import compile_sglang
from relayc.compiler.triton_relay import count_triton_launches
from relayc.compiler.writer import write
from relayc.specs.errors import SpecErrors
from relayc.specs.loader import BUNDLED_DIR, bundled_spec_paths
from tests.compiler import sglang_env
from tests.compiler.sglang_twin import DRAFT_PROBS_SCENARIO, DSA_SCENARIO, SCENARIOS, Twin
from tests.spec_edits import DRAFT_PROBS_EDITS, edited_eagle_spec

REPO = Path(__file__).resolve().parents[2]
CHECKED_IN = REPO / "relayc" / "sglang_generated" / "overlap_utils.py"
# scripts/test-sglang.sh sets RELAYC_REQUIRE_SGLANG=1: there a missing sglang fails, not skips.
needs_sglang = pytest.mark.skipif(
    not sglang_env.sglang_available() and not os.environ.get("RELAYC_REQUIRE_SGLANG"),
    reason=sglang_env.SKIP_REASON,
)


def load_module(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen() -> types.ModuleType:
    return load_module(CHECKED_IN, "sglang_relay_under_test")


class FakeAlgorithm:
    """Enough of SGLang's SpeculativeAlgorithm for the generated module."""

    def __init__(self, name: str) -> None:
        self.name = name

    def is_none(self) -> bool:
        return self.name == "NONE"

    def is_some(self) -> bool:
        return self.name != "NONE"

    def is_eagle(self) -> bool:
        return self.name in ("EAGLE", "EAGLE3", "FROZEN_KV_MTP")

    def is_standalone(self) -> bool:
        return self.name == "STANDALONE"


def pool(size: int = 16) -> types.SimpleNamespace:
    return types.SimpleNamespace(req_to_token=torch.zeros(size, 8, dtype=torch.int32))


def make_map(gen: types.ModuleType, algorithm: str, sglang_name: str = "EAGLE", **kw: Any):
    return gen.FutureMap("cpu", FakeAlgorithm(sglang_name), pool(), algorithm=algorithm, **kw)


# -- the compiler ------------------------------------------------------------------------
def test_checked_in_module_is_current() -> None:
    output = compile_sglang(bundled_spec_paths(), "relayc/sglang_generated")
    assert output.text == CHECKED_IN.read_text(encoding="utf-8"), (
        "relayc/sglang_generated/overlap_utils.py is stale: run `relayc compile --target sglang "
        "relayc/specs/*.yaml -o relayc/sglang_generated` (or `relayc compile --bundled`)"
    )


def test_output_is_deterministic_and_machine_independent(tmp_path: Path) -> None:
    first = compile_sglang(bundled_spec_paths(), "out").text
    assert first == compile_sglang(bundled_spec_paths(), "out").text
    assert str(REPO) not in first and str(Path.home()) not in first
    output = compile_sglang(bundled_spec_paths(), tmp_path)
    assert write(output) and not write(output)  # rewritten only on change


def test_generated_module_needs_no_relayc(tmp_path: Path) -> None:
    tree = ast.parse(CHECKED_IN.read_text(encoding="utf-8"))
    imported = {
        name.split(".")[0]
        for node in ast.walk(tree)
        for name in (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
    }
    # sglang only inside functions, for its runtime config and install()
    assert imported <= {
        "__future__",
        "os",
        "collections",
        "dataclasses",
        "typing",
        "torch",
        "triton",
        "sys",
        "sglang",
    }, imported


def test_target_errors_are_located(tmp_path: Path) -> None:
    shutil.copy(BUNDLED_DIR / "common.yaml", tmp_path / "common.yaml")
    text = (BUNDLED_DIR / "none.yaml").read_text().replace("algorithm: none", "algorithm: beam")
    (tmp_path / "beam.yaml").write_text(text)
    with pytest.raises(SpecErrors) as exc:
        compile_sglang(
            [tmp_path / "beam.yaml", BUNDLED_DIR / "none.yaml", BUNDLED_DIR / "none.yaml"], "o"
        )
    rendered = exc.value.render()
    assert "beam.yaml:1:1: error: the SGLang target has no SGLang algorithm for `beam`" in rendered
    assert "algorithm `none` is also compiled from" in rendered


# -- the generated module without SGLang ----------------------------------------------------
def test_stash_publish_resolve_round_trip(gen: types.ModuleType) -> None:
    fmap = make_map(gen, "eagle")
    assert isinstance(fmap, gen.FutureMap) and fmap.ALGORITHM == "eagle"
    assert fmap.topk_p_buf is None and fmap.hidden_states_buf is None  # lazy
    idx = torch.tensor([3, 7, 0])  # slot 0: a padded row
    payload = gen.RelayPayload(
        bonus_tokens=torch.tensor([5, 6, 9], dtype=torch.int32),
        topk_p=torch.rand(3, 4),
        topk_index=torch.arange(12).reshape(3, 4),
        hidden_states=torch.randn(3, 8, dtype=torch.bfloat16),
    )
    fmap.stash(idx, payload)
    fmap.publish(idx, torch.tensor([11, 12, 1]))
    assert fmap.hidden_states_buf.dtype == torch.bfloat16 and fmap.topk_p_buf.shape == (16, 4)
    info = types.SimpleNamespace(future_indices=torch.tensor([7, 3]))
    batch = types.SimpleNamespace(
        prefill_input_ids_cpu=None,
        input_ids=None,
        spec_info=info,
        enable_overlap=True,
        spec_algorithm=fmap.spec_algo,
        req_pool_indices=info.future_indices,
        req_pool_indices_cpu=info.future_indices,
    )
    fmap.resolve_seq_lens_cpu(batch)
    gen.resolve_forward_inputs(batch, fmap)
    assert batch.seq_lens.tolist() == [12, 11] and batch.seq_lens_sum == 23
    assert info.bonus_tokens.dtype == torch.int64 and info.bonus_tokens.tolist() == [6, 5]
    assert torch.equal(info.topk_p, payload.topk_p[[1, 0]])
    assert torch.equal(info.hidden_states, payload.hidden_states[[1, 0]])
    assert info.dsa_topk_indices is None


def test_uncovered_features_raise_naming_them(gen: types.ModuleType) -> None:
    # an algorithm of a later SGLang: named, with what the module does relay
    with pytest.raises(NotImplementedError, match=r"algorithm MEDUSA; this module relays .*dflash"):
        gen.FutureMap("cpu", FakeAlgorithm("MEDUSA"), pool())
    fmap = make_map(gen, "eagle")
    with pytest.raises(gen.RelayError, match=r"dsa_topk_indices.*add the field to the spec"):
        fmap.stash(torch.tensor([1]), gen.RelayPayload(None, dsa_topk_indices=torch.zeros(1, 4)))
    info = types.SimpleNamespace(future_indices=torch.tensor([1]))
    info.future_dsa_topk_indices_available = True
    with pytest.raises(gen.RelayError, match=r"future_dsa_topk_indices_available.*eagle.yaml"):
        fmap._resolve_spec_extras(types.SimpleNamespace(spec_info=info))
    with pytest.raises(RuntimeError, match="HiSparse staging only supports EAGLE-family"):
        make_map(gen, "dflash", "DFLASH").make_staged_spec_input(torch.tensor([1]))


def test_block_drafters_map_without_sglang(gen: types.ModuleType) -> None:
    """All nine SpeculativeAlgorithm members have a relay (EAGLE's family needs SGLang's
    runtime config for multi-layer EAGLE, so it is covered by the SGLang test)."""
    for sglang_name, algorithm in [
        ("NONE", "none"),
        ("STANDALONE", "standalone"),
        ("NGRAM", "ngram"),
        ("DFLASH", "dflash"),
        ("UNO", "uno"),
        ("DSPARK", "dspark"),
    ]:
        assert gen.FutureMap("cpu", FakeAlgorithm(sglang_name), pool()).ALGORITHM == algorithm


def test_module_without_a_spec_says_which(tmp_path: Path) -> None:
    specs = [p for p in bundled_spec_paths() if p.stem != "dflash"]
    output = compile_sglang(specs, tmp_path / "out")
    write(output)
    module = load_module(output.path, "sglang_relay_without_dflash")
    with pytest.raises(NotImplementedError, match=r"compiled without a spec for `dflash`"):
        module.FutureMap("cpu", FakeAlgorithm("DFLASH"), pool())


def test_block_drafters_relay_only_the_bonus_and_refuse_what_sglang_reads(
    gen: types.ModuleType,
) -> None:
    """DFLASH drops the legacy top-k and hidden states SGLang drops; UNO refuses hidden
    states, which SGLang would relay for it (spec_need_hidden_states) and its spec does not."""
    idx = torch.tensor([2, 5])
    dflash = make_map(gen, "dflash", "DFLASH")
    dflash.stash(
        idx,
        gen.RelayPayload(
            torch.tensor([7, 8]), topk_p=torch.rand(2, 1), hidden_states=torch.rand(2, 4)
        ),
    )
    assert dflash.topk_p_buf is None and dflash.hidden_states_buf is None
    dflash.publish(idx, torch.tensor([10, 11]))
    batch = types.SimpleNamespace(spec_info=types.SimpleNamespace(future_indices=idx[[1, 0]]))
    dflash._resolve_spec_extras(batch)
    assert batch.spec_info.bonus_tokens.tolist() == [8, 7]
    assert batch.spec_info.dsa_topk_indices is None
    uno = make_map(gen, "uno", "UNO")
    with pytest.raises(gen.RelayError, match=r"hidden_states.*relayc/specs/uno.yaml"):
        uno.stash(idx, gen.RelayPayload(torch.tensor([1, 2]), hidden_states=torch.rand(2, 4)))


def test_bad_payloads_say_what_is_wrong(gen: types.ModuleType) -> None:
    fmap = make_map(gen, "eagle")
    with pytest.raises(gen.RelayError, match=r"draft_probs.*add the field to the spec"):
        fmap.stash(
            torch.tensor([1]), gen.RelayPayload(torch.tensor([1]), draft_probs=torch.rand(1, 5))
        )
    fmap.stash(torch.tensor([1]), gen.RelayPayload(torch.tensor([1]), topk_p=torch.rand(1, 4)))
    with pytest.raises(gen.RelayError, match=r"topk_index.*\[4\] elements|another field of row"):
        fmap.stash(
            torch.tensor([2]),
            gen.RelayPayload(None, topk_index=torch.zeros(1, 5, dtype=torch.long)),
        )
    with pytest.raises(gen.RelayError, match=r"rows must be \[4\]"):
        fmap.stash(torch.tensor([2]), gen.RelayPayload(None, topk_p=torch.rand(1, 3)))
    with pytest.raises(gen.RelayError, match="2 rows"):
        fmap.stash(torch.tensor([2, 3]), gen.RelayPayload(torch.tensor([1])))


def test_fused_triton_path_matches_indexing(gen: types.ModuleType) -> None:
    """One launch per stash and per spec-extras resolve (Triton's interpreter on the CPU);
    a float32 model dtype checks that model-dtype fields take the payload's dtype."""
    if not gen._HAVE_TRITON:
        pytest.skip("Triton is not installed")
    maps = [make_map(gen, "standalone", "STANDALONE"), make_map(gen, "standalone", "STANDALONE")]
    maps[1]._fused = True
    eagle = [make_map(gen, "eagle"), make_map(gen, "eagle")]
    eagle[1]._fused = True
    g = torch.Generator().manual_seed(0)
    idx = torch.tensor([5, 2, 9])
    payloads = (
        gen.RelayPayload(
            torch.tensor([1, 2, 3]),
            torch.rand(3, 2, generator=g),
            torch.randint(0, 9, (3, 2), generator=g),
            None,
            torch.rand(3, 7, generator=g),
        ),
        gen.RelayPayload(
            torch.tensor([4, 5, 6]),
            torch.rand(3, 2, generator=g),
            torch.randint(0, 9, (3, 2), generator=g),
            torch.randn(3, 6, generator=g),
        ),
    )
    for pair, payload in zip((maps, eagle), payloads, strict=True):
        infos = []
        for fmap in pair:
            with count_triton_launches() as launches:
                fmap.stash(idx, payload)
                info = types.SimpleNamespace(future_indices=torch.tensor([9, 5]))
                fmap._resolve_spec_extras(types.SimpleNamespace(spec_info=info))
            expected = (1, 1) if fmap._fused else (0, 0)
            assert (launches.stash, launches.resolve) == expected
            infos.append(info)
        for name in ("bonus_tokens", "topk_p", "topk_index", "hidden_states", "draft_probs"):
            assert torch.equal(*(getattr(i, name, torch.empty(0)) for i in infos)), name
    assert eagle[1].hidden_states_buf.dtype == torch.float32


# -- against SGLang 0.5.23 -------------------------------------------------------------------
@pytest.fixture(scope="module")
def sgl() -> types.SimpleNamespace:
    return sglang_env.load_sglang()


def eagle_with_draft_probs(tmp_path: Path) -> Path:
    """The bundled eagle spec plus `draft_probs` (the README's "Adding a relay field")."""
    return edited_eagle_spec(tmp_path, DRAFT_PROBS_EDITS)


def run_twin(sgl, gen_module, scenario, seeds=range(4), steps: int = 36) -> None:
    with sglang_env.server_args(sgl, scenario.sglang_algorithm, **scenario.server_kwargs):
        for seed in seeds:
            twin = Twin(sgl, gen_module, scenario, seed)
            twin.run(steps)
            assert twin.resolves >= steps // 4, "too few resolves to have compared anything"


@needs_sglang
@pytest.mark.parametrize("name", [s.name for s in SCENARIOS])
def test_differential_against_sglang(sgl, gen: types.ModuleType, name: str) -> None:
    scenario = next(s for s in SCENARIOS if s.name == name)
    run_twin(sgl, gen, scenario)


@needs_sglang
def test_differential_eagle_with_draft_probs(sgl, tmp_path: Path) -> None:
    specs = [p for p in bundled_spec_paths() if p.stem != "eagle"] + [
        eagle_with_draft_probs(tmp_path)
    ]
    output = compile_sglang(specs, tmp_path / "out")
    write(output)
    module = load_module(output.path, "sglang_relay_draft_probs")
    run_twin(sgl, module, DRAFT_PROBS_SCENARIO)


@needs_sglang
def test_spec_algorithm_picks_the_generated_class(sgl, gen: types.ModuleType) -> None:
    algo = sgl.SpeculativeAlgorithm
    cases = [
        (None, {}, "none"),
        ("EAGLE", {}, "eagle"),
        ("EAGLE3", {}, "eagle3"),
        ("EAGLE", {"enable_multi_layer_eagle": True}, "eagle_multilayer"),
        ("EAGLE3", {"enable_multi_layer_eagle": True}, "eagle_multilayer"),
        ("STANDALONE", {}, "standalone"),
        ("NGRAM", {}, "ngram"),
        ("FROZEN_KV_MTP", {}, "eagle"),
        ("NEXTN", {}, "eagle"),
        ("DFLASH", {}, "dflash"),
        ("UNO", {}, "uno"),
        ("DSPARK", {}, "dspark"),
    ]
    for name, kwargs, expected in cases:
        with sglang_env.server_args(sgl, name, **kwargs):
            fmap = gen.FutureMap(torch.device("cpu"), algo.from_string(name), pool())
            assert fmap.ALGORITHM == expected


@needs_sglang
def test_eagle3_without_its_spec_relays_with_eagle(sgl, tmp_path: Path) -> None:
    """SGLang's FutureMap relays EAGLE3 with EAGLE's buffers: a module compiled without the
    eagle3 spec serves EAGLE3 with the eagle relay, and the differential test holds."""
    specs = [p for p in bundled_spec_paths() if p.stem != "eagle3"]
    output = compile_sglang(specs, tmp_path / "out")
    write(output)
    module = load_module(output.path, "sglang_relay_without_eagle3")
    scenario = next(s for s in SCENARIOS if s.sglang_algorithm == "EAGLE3")
    with sglang_env.server_args(sgl, "EAGLE3"):
        algo = sgl.SpeculativeAlgorithm.from_string("EAGLE3")
        assert module.FutureMap(torch.device("cpu"), algo, pool()).ALGORITHM == "eagle"
    run_twin(sgl, module, scenario, seeds=range(2))


@needs_sglang
@pytest.mark.parametrize("name", ["none", "eagle", "ngram"])
def test_debug_mode_fails_where_sglang_fails(
    sgl, gen: types.ModuleType, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under SGLang's CI flag: same poisoned start, and a resolve with no stash or publish
    since the last one fails on both sides (SGLang's check run eagerly, not compiled)."""
    ou = sgl.overlap_utils
    monkeypatch.setattr(ou, "_DEBUG_ASSERT", True)
    monkeypatch.setattr(ou, "_assert_nonneg_and_invalidate", sglang_env.eager_debug_check(sgl))
    monkeypatch.setattr(gen, "_DEBUG_ASSERT", True)
    scenario = next(s for s in SCENARIOS if s.name == name)
    with sglang_env.server_args(sgl, scenario.sglang_algorithm, **scenario.server_kwargs):
        twin = Twin(sgl, gen, scenario, seed=7)
        if twin.ref.output_tokens_buf is not None and twin.gen.output_tokens_buf is not None:
            assert torch.equal(twin.ref.output_tokens_buf, twin.gen.output_tokens_buf)  # all -1
        twin.run(20)  # a correct sequence passes both sides' checks
        while not twin.running:
            twin.prefill()

        def resolve_both() -> dict[str, str | None]:
            outcomes = {}
            for side, fmap, resolve in (
                ("ref", twin.ref, ou.resolve_forward_inputs),
                ("gen", twin.gen, gen.resolve_forward_inputs),
            ):
                batch = twin.batches[side]
                batch.input_ids = None
                try:
                    fmap.resolve_seq_lens_cpu(batch)
                    resolve(batch, fmap)
                    outcomes[side] = None
                except (AssertionError, RuntimeError) as exc:
                    outcomes[side] = f"{type(exc).__name__}: {exc}"
            return outcomes

        assert resolve_both() == {"ref": None, "gen": None}
        # The same resolve again, with no stash or publish in between: both refuse.
        outcomes = resolve_both()
        # none: the input tokens were consumed; eagle and n-gram: no fresh publish either
        assert outcomes["ref"] is not None and outcomes["gen"] is not None, outcomes


def test_compile_target_sglang_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from relayc.cli import main

    specs = [str(p) for p in bundled_spec_paths()]
    assert main(["compile", "--target", "sglang", *specs, "-o", str(tmp_path)]) == 0
    assert (tmp_path / "overlap_utils.py").read_text() == compile_sglang(specs, tmp_path).text
    assert main(["compile", "--target", "sglang", *specs, "-o", str(tmp_path)]) == 0
    assert "unchanged" in capsys.readouterr().out
    # A library among the files is validated and skipped (issue 13): alone, nothing is written.
    out = tmp_path / "library_only"
    common = str(BUNDLED_DIR / "common.yaml")
    assert main(["compile", "--target", "sglang", common, "-o", str(out)]) == 0
    assert "library `common` is valid; skipped" in capsys.readouterr().out
    assert not out.exists()


@needs_sglang
def test_install_points_sglang_at_the_generated_module(
    sgl, gen: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    ou = sgl.overlap_utils
    names = (
        "FutureMap",
        "RelayPayload",
        "resolve_forward_inputs",
        "FutureRelayBuffers",  # DSPARK's verify offers these before the FutureMap exists
        "offer_future_relay_buffers",
    )
    # An SGLang module that imported the names before install(), as the scheduler does
    # (importing the real scheduler needs more packages than the relay does).
    probe = types.ModuleType("sglang.relayc_probe")
    for name in names:
        setattr(probe, name, getattr(ou, name))
        monkeypatch.setattr(ou, name, getattr(ou, name))  # restored afterwards
    monkeypatch.setitem(sys.modules, probe.__name__, probe)
    gen.install()
    for name in names:
        assert getattr(ou, name) is getattr(gen, name) and getattr(probe, name) is getattr(
            gen, name
        )
    with sglang_env.server_args(sgl, "EAGLE"):
        fmap = sgl.SpeculativeAlgorithm.EAGLE.create_future_map(torch.device("cpu"), pool())
    assert type(fmap) is gen.FutureMap.ALGORITHMS["eagle"]


# -- plugin algorithms (SGLang's spec_registry) ---------------------------------------------
PLUGIN_SPEC = Path(__file__).with_name("block_kv_plugin.yaml")


def compile_with_plugin(tmp_path: Path, name: str = "sglang_relay_plugin") -> types.ModuleType:
    """The bundled specs plus the BLOCK_KV plugin spec (which imports common.yaml)."""
    shutil.copy(BUNDLED_DIR / "common.yaml", tmp_path / "common.yaml")
    shutil.copy(PLUGIN_SPEC, tmp_path / "block_kv.yaml")
    output = compile_sglang([*bundled_spec_paths(), tmp_path / "block_kv.yaml"], tmp_path / "out")
    write(output)
    return load_module(output.path, name)


def plugin_batch(algo: Any, indices: torch.Tensor, spec_info: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        enable_overlap=True,
        spec_algorithm=algo,
        spec_info=spec_info,
        prefill_input_ids_cpu=None,
        input_ids=None,
        req_pool_indices=indices,
        req_pool_indices_cpu=indices.clone(),
    )


def test_plugin_spec_relays_its_own_field(tmp_path: Path) -> None:
    """A spec with `sglang: {plugin: BLOCK_KV}` relays its draft_seq_lens, a field no
    built-in has, for the algorithm SGLang's registry knows as BLOCK_KV."""
    module = compile_with_plugin(tmp_path)
    algo = FakeAlgorithm("BLOCK_KV")  # what SpeculativeAlgorithm.from_string returns for it
    fmap = module.FutureMap("cpu", algo, pool())
    assert fmap.ALGORITHM == "block_kv" and fmap.draft_seq_lens_buf.tolist() == [0] * 16
    idx = torch.tensor([4, 9])
    draft_input = types.SimpleNamespace(
        bonus_tokens=torch.tensor([11, 12]), draft_seq_lens=torch.tensor([30, 40])
    )
    fmap.publish(idx, torch.tensor([31, 41]))
    fmap.stash(idx, module.RelayPayload.from_draft_input(draft_input))
    batch = plugin_batch(algo, idx[[1, 0]], types.SimpleNamespace(future_indices=idx[[1, 0]]))
    fmap.resolve_seq_lens_cpu(batch)
    module.resolve_forward_inputs(batch, fmap)
    assert batch.seq_lens.tolist() == [41, 31]
    assert batch.spec_info.bonus_tokens.tolist() == [12, 11]
    assert batch.spec_info.draft_seq_lens.tolist() == [40, 30]
    with pytest.raises(
        NotImplementedError, match=r"OTHER_PLUGIN.*sglang: \{plugin: OTHER_PLUGIN\}"
    ):
        module.FutureMap("cpu", FakeAlgorithm("OTHER_PLUGIN"), pool())


def test_plugin_names_are_checked(tmp_path: Path) -> None:
    shutil.copy(BUNDLED_DIR / "common.yaml", tmp_path / "common.yaml")
    text = PLUGIN_SPEC.read_text()
    (tmp_path / "eagle_plugin.yaml").write_text(
        text.replace("algorithm: block_kv", "algorithm: eagle_plugin").replace(
            "plugin: BLOCK_KV", "plugin: eagle"
        )
    )
    (tmp_path / "twin_a.yaml").write_text(text.replace("algorithm: block_kv", "algorithm: twin_a"))
    (tmp_path / "twin_b.yaml").write_text(text.replace("algorithm: block_kv", "algorithm: twin_b"))
    with pytest.raises(SpecErrors) as exc:
        compile_sglang([tmp_path / f"{n}.yaml" for n in ("eagle_plugin", "twin_a", "twin_b")], "o")
    rendered = exc.value.render()
    assert (
        "eagle_plugin.yaml:9:11: error: `EAGLE` is one of SGLang's built-in algorithms" in rendered
    )
    assert "twin_b.yaml:9:11: error: plugin `BLOCK_KV` is also relayed by" in rendered


@needs_sglang
def test_plugin_registered_and_driven_like_sglangs_scheduler(sgl, tmp_path: Path) -> None:
    """Register BLOCK_KV with SGLang's registry, build both FutureMaps through
    SpeculativeAlgorithm.from_string, publish/stash/resolve as the scheduler does: the
    lengths and bonus tokens match SGLang's relay, and draft_seq_lens, which SGLang's
    FutureMap cannot relay for a plugin, arrives too."""
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo, get_spec

    class BlockKv(CustomSpecAlgo):
        # SGLang's FutureMap calls need_topk(), which CustomSpecAlgo lacks in 0.5.23
        def need_topk(self) -> bool:
            return False

    if get_spec("BLOCK_KV") is None:
        sgl.SpeculativeAlgorithm.register("BLOCK_KV", supports_overlap=True, spec_class=BlockKv)(
            lambda server_args: object
        )
    algo = sgl.SpeculativeAlgorithm.from_string("BLOCK_KV")
    module = compile_with_plugin(tmp_path, "sglang_relay_plugin_sgl")
    with sglang_env.server_args(sgl, "BLOCK_KV"):
        ref = sgl.overlap_utils.FutureMap(torch.device("cpu"), algo, pool())
        gen = module.FutureMap(torch.device("cpu"), algo, pool())
        assert gen.ALGORITHM == "block_kv"
        idx = torch.tensor([5, 2, 7])
        lens, bonus = torch.tensor([20, 21, 22]), torch.tensor([100, 101, 102])
        draft_input = sgl.EagleDraftInput(bonus_tokens=bonus, future_indices=idx)
        draft_input.draft_seq_lens = torch.tensor([8, 9, 10])
        for fmap, ou in ((ref, sgl.overlap_utils), (gen, module)):
            fmap.publish(idx, lens)
            fmap.stash(idx, ou.RelayPayload.from_draft_input(draft_input))
        batches = {}
        for side, fmap, ou in (("ref", ref, sgl.overlap_utils), ("gen", gen, module)):
            order = torch.tensor([2, 0])
            info = sgl.EagleDraftInput(future_indices=idx[order])
            batch = plugin_batch(algo, idx[order], info)
            batch.device = torch.device("cpu")
            fmap.resolve_seq_lens_cpu(batch)
            ou.resolve_forward_inputs(batch, fmap)
            batches[side] = batch
    ref_batch, gen_batch = batches["ref"], batches["gen"]
    assert torch.equal(ref_batch.seq_lens, gen_batch.seq_lens)
    assert torch.equal(ref_batch.seq_lens_cpu, gen_batch.seq_lens_cpu)
    assert torch.equal(ref_batch.spec_info.bonus_tokens, gen_batch.spec_info.bonus_tokens)
    assert not hasattr(ref_batch.spec_info, "draft_seq_lens")
    assert gen_batch.spec_info.draft_seq_lens.tolist() == [10, 8]


@needs_sglang
@pytest.mark.parametrize("name", ["EAGLE", "STANDALONE"])
def test_hisparse_staged_input_resolves_like_sglangs(sgl, gen: types.ModuleType, name: str) -> None:
    """make_staged_spec_input builds SGLang's own EagleDraftInput (capture mode, future
    indices, DSA flag as SGLang sets them); the next overlap resolve fills it from the
    relay, top-k and hidden states kept from the stash before staging, the bonus token
    refreshed by a bonus-only stash (what a staging transition writes)."""
    algo = sgl.SpeculativeAlgorithm.from_string(name)
    idx = torch.tensor([3, 6])
    values = {
        "bonus_tokens": torch.tensor([1, 2]),
        "topk_p": torch.rand(2, 1),
        "topk_index": torch.tensor([[5], [6]]),
        "hidden_states": torch.rand(2, 8, dtype=torch.bfloat16),
    }
    if name == "STANDALONE":
        values["draft_probs"] = torch.rand(2, 10)
        del values["hidden_states"]
    staged = {}
    with sglang_env.server_args(sgl, name):
        for side, ou in (("ref", sgl.overlap_utils), ("gen", gen)):
            fmap = ou.FutureMap(torch.device("cpu"), algo, pool())
            fmap.publish(idx, torch.tensor([9, 10]))
            fmap.stash(idx, ou.RelayPayload.from_draft_input(sgl.EagleDraftInput(**values)))
            fmap.stash(idx, ou.RelayPayload(bonus_tokens=torch.tensor([7, 8])))
            info = fmap.make_staged_spec_input(idx[[1, 0]])
            batch = plugin_batch(algo, idx[[1, 0]], info)
            batch.device = torch.device("cpu")
            ou.resolve_forward_inputs(batch, fmap)
            staged[side] = info
    ref, ours = staged["ref"], staged["gen"]
    assert type(ref) is type(ours)
    assert ref.capture_hidden_mode == ours.capture_hidden_mode
    assert ref.future_dsa_topk_indices_available == ours.future_dsa_topk_indices_available
    for field in ("future_indices", *values, "dsa_topk_indices"):
        ref_value, our_value = getattr(ref, field, None), getattr(ours, field, None)
        assert (ref_value is None) == (our_value is None), field
        if ref_value is not None:
            assert torch.equal(ref_value, our_value), field
    assert ours.bonus_tokens.tolist() == [8, 7]


# -- DSA top-k seeds: a lazily allocated field read only when the draft input flags it ------
DSA_OPS = """\
from relayc.nodes import Op, TensorType, register

register(
    Op(
        "dsa_seeds",
        {"seq_lens": TensorType("int64", ()), "req_pool_indices": TensorType("int64", ())},
        {"dsa_topk_indices": TensorType("int32", ("dsa_topk",))},
        doc="the DSA indexer's top-k positions, seeds for the next iteration's sparse attention",
    )
)
"""
DSA_EDITS = [
    (
        "imports:\n",
        "ops: [dsa_ops]\n\ndims:\n  dsa_topk:\n    default: 4\n    doc: DSA seeds per request.\n\n"
        "fields:\n  dsa_topk_indices:\n    dtype: int32\n    shape: [dsa_topk]\n"
        "    alloc: lazy\n    export: true\n    doc: DSA top-k seeds, SGLang's dsa_topk_indices_buf.\n\n"
        "imports:\n",
    ),
    (
        "\ncapture:",
        "\n  - name: dsa_seeds\n    op: dsa_seeds\n"
        "    reads: {seq_lens: compact_kv.new_seq_lens, req_pool_indices: input.req_pool_indices}\n"
        "    writes: [dsa_topk_indices]\n    stash: {dsa_topk_indices: dsa_topk_indices}\n\ncapture:",
    ),
]


def compile_with_dsa(tmp_path: Path) -> types.ModuleType:
    (tmp_path / "dsa_ops.py").write_text(DSA_OPS)
    spec = edited_eagle_spec(tmp_path, DSA_EDITS)
    specs = [p for p in bundled_spec_paths() if p.stem != "eagle"] + [spec]
    output = compile_sglang(specs, tmp_path / "out")
    write(output)
    return load_module(output.path, "sglang_relay_dsa")


@needs_sglang
def test_differential_dsa_seeds(sgl, tmp_path: Path) -> None:
    module = compile_with_dsa(tmp_path)
    assert "dsa_topk_indices" in module.EagleFutureMap.STASHED
    run_twin(sgl, module, DSA_SCENARIO)


def test_dsa_seeds_are_read_only_when_flagged(tmp_path: Path) -> None:
    module = compile_with_dsa(tmp_path)
    fmap = module.FutureMap("cpu", FakeAlgorithm("EAGLE"), pool(), algorithm="eagle")
    assert fmap.dsa_topk_indices_buf is None  # created by the first stash carrying seeds
    idx = torch.tensor([2, 6])
    seeds = torch.arange(8, dtype=torch.int32).reshape(2, 4)
    fmap.stash(idx, module.RelayPayload(torch.tensor([1, 2]), dsa_topk_indices=seeds))
    info = types.SimpleNamespace(future_indices=idx[[1, 0]])
    info.future_dsa_topk_indices_available = False
    fmap._resolve_spec_extras(types.SimpleNamespace(spec_info=info))
    assert info.dsa_topk_indices is None
    info.future_dsa_topk_indices_available = True
    fmap._resolve_spec_extras(types.SimpleNamespace(spec_info=info))
    assert torch.equal(info.dsa_topk_indices, seeds[[1, 0]])


# -- relay buffers owned by a captured graph (FutureRelayBuffers) -----------------------------
def drive_adopted(ou: Any, algo: Any, poison_check: bool = False) -> tuple[Any, Any, Any]:
    """What DSPARK's verify does with offered buffers: the graph scatters lengths and bonus
    tokens before the FutureMap exists; publish / stash of those very tensors skip their
    write, a later publish of other tensors writes."""
    relay = ou.FutureRelayBuffers(req_pool_size=16, device=torch.device("cpu"))
    ou.offer_future_relay_buffers(relay)
    fmap = ou.FutureMap(torch.device("cpu"), algo, pool())
    assert relay.adopted and fmap.new_seq_lens_buf is relay.new_seq_lens
    assert fmap.output_tokens_buf is relay.output_tokens
    idx = torch.tensor([3, 8])
    lens, bonus = torch.tensor([12, 13]), torch.tensor([70, 71])
    relay.new_seq_lens[idx] = lens  # the captured graph's scatter
    relay.output_tokens[idx] = bonus
    relay.published_seq_lens, relay.published_bonus = lens, bonus
    lens.fill_(-5)  # were publish / stash to write these tensors, the rows would read -5
    bonus.fill_(-5)
    fmap.publish(idx, lens)
    fmap.stash(idx, ou.RelayPayload(bonus_tokens=bonus))
    assert relay.published_seq_lens is None and relay.published_bonus is None
    after = fmap.new_seq_lens_buf[idx].clone(), fmap.output_tokens_buf[idx].clone()
    fmap.publish(idx[:1], torch.tensor([40]))  # not the graph's tensor: written
    return fmap, after, relay


def test_adopted_relay_buffers_and_the_identity_skip(gen: types.ModuleType, monkeypatch) -> None:
    monkeypatch.setattr(gen, "_offered_relay", None)
    fmap, (lens, bonus), _ = drive_adopted(gen, FakeAlgorithm("DSPARK"))
    assert fmap.ALGORITHM == "dspark"
    assert lens.tolist() == [12, 13] and bonus.tolist() == [70, 71]
    assert fmap.new_seq_lens_buf[3].item() == 40
    monkeypatch.setattr(gen, "_offered_relay", None)
    small = gen.FutureMap("cpu", FakeAlgorithm("DSPARK"), pool(8))  # another pool: not adopted
    assert small._relay is None


@needs_sglang
def test_adopted_relay_buffers_like_sglangs(sgl, gen: types.ModuleType, monkeypatch) -> None:
    algo = sgl.SpeculativeAlgorithm.from_string("DSPARK")
    with sglang_env.server_args(sgl, "DSPARK"):
        results = {}
        for side, ou in (("ref", sgl.overlap_utils), ("gen", gen)):
            monkeypatch.setattr(ou, "_offered_relay", None)
            fmap, after, _ = drive_adopted(ou, algo)
            results[side] = (after, fmap.new_seq_lens_buf.clone(), fmap.output_tokens_buf[[3, 8]])
    (ref_after, ref_lens, ref_bonus), (gen_after, gen_lens, gen_bonus) = results.values()
    assert all(torch.equal(a, b) for a, b in zip(ref_after, gen_after, strict=True))
    assert torch.equal(ref_lens[[3, 8]], gen_lens[[3, 8]])
    assert torch.equal(ref_bonus, gen_bonus)


# -- DSPARK's confidence relay to the host ---------------------------------------------------
def drive_confidence(ou: Any, algo: Any) -> list[Any]:
    """Publishes with and without confidence, slots reused (generation bumped), reads after
    each: on the CPU there is no copy stream, so each read is the direct one."""
    req_pool = pool()
    req_pool.req_generation = torch.zeros(16, dtype=torch.int64)
    fmap = ou.FutureMap(torch.device("cpu"), algo, req_pool, True, True)
    gen = torch.Generator().manual_seed(3)
    reads = [fmap.resolve_confidence_cpu(types.SimpleNamespace(spec_info=None))]
    for round_ in range(6):
        idx = torch.randperm(15, generator=gen)[:4] + 1
        req_pool.req_generation[idx[:1]] += 1  # a finished request's slot, reused
        confidence = torch.rand(4, 5, generator=gen, dtype=torch.float64)
        fmap.publish(idx, torch.randint(5, 50, (4,), generator=gen), confidence=confidence)
        if round_ % 2:
            fmap.publish(idx, torch.randint(5, 50, (4,), generator=gen))  # no confidence
        batch = types.SimpleNamespace(
            spec_info=types.SimpleNamespace(future_indices=idx[[2, 0]]),
            req_pool_indices=idx[[2, 0]],
            req_pool_indices_cpu=idx[[2, 0]],
        )
        reads.append(fmap.resolve_confidence_cpu(batch))
    return reads


def test_confidence_relay_reads_back_on_the_host(gen: types.ModuleType) -> None:
    reads = drive_confidence(gen, FakeAlgorithm("DSPARK"))
    assert reads[0] is None  # nothing published yet
    assert all(
        r.confidence.dtype == torch.float32 and r.confidence.shape == (2, 5) for r in reads[1:]
    )
    fmap = make_map(gen, "dspark", "DSPARK")  # needs_confidence_relay=False: never read
    assert fmap.resolve_confidence_cpu(types.SimpleNamespace(spec_info=None)) is None


@needs_sglang
def test_confidence_relay_like_sglangs(sgl, gen: types.ModuleType) -> None:
    algo = sgl.SpeculativeAlgorithm.from_string("DSPARK")
    with sglang_env.server_args(sgl, "DSPARK"):
        ref = drive_confidence(sgl.overlap_utils, algo)
        ours = drive_confidence(gen, algo)
    for i, (r, o) in enumerate(zip(ref, ours, strict=True)):
        assert (r is None) == (o is None), i
        if r is not None:
            assert torch.equal(r.confidence, o.confidence), i
            assert torch.equal(r.generation, o.generation), i


# -- the failure classes SGLang users file (issue #44) ----------------------------------------
ALL_RELAYS = [
    ("none", "NONE"),
    ("eagle", "EAGLE"),
    ("eagle3", "EAGLE3"),
    ("eagle_multilayer", "EAGLE"),
    ("standalone", "STANDALONE"),
    ("ngram", "NGRAM"),
    ("dflash", "DFLASH"),
    ("dspark", "DSPARK"),
    ("uno", "UNO"),
]


@pytest.mark.parametrize(("algorithm", "sglang_name"), ALL_RELAYS)
def test_idle_batches_and_missing_spec_info_are_survived(
    gen: types.ModuleType, algorithm: str, sglang_name: str
) -> None:
    """An idle data-parallel batch (no rows, an empty payload stub) and a batch whose
    spec_info is None (a PD-disaggregation decode start, a prefill) pass every entry point
    of every relay, the confidence relay on."""
    fmap = gen.FutureMap("cpu", FakeAlgorithm(sglang_name), pool(), True, True, algorithm=algorithm)
    empty = torch.empty(0, dtype=torch.int64)
    fmap.publish(empty, empty, confidence=torch.empty(0, 4))
    fmap.stash(empty, gen.RelayPayload(bonus_tokens=empty, topk_p=torch.empty(0, 1)))
    # a non-speculative batch never has a spec_info
    idle_info = types.SimpleNamespace(future_indices=empty)
    for spec_info in (None,) if algorithm == "none" else (None, idle_info):
        batch = types.SimpleNamespace(
            spec_info=spec_info, req_pool_indices=empty, req_pool_indices_cpu=empty
        )
        fmap.resolve_seq_lens_cpu(batch)
        fmap._resolve_spec_extras(batch)
        assert fmap.resolve_confidence_cpu(batch) is None
    assert fmap.publish_ready is None  # an idle publish records nothing
