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
from tests.compiler.sglang_twin import DRAFT_PROBS_SCENARIO, SCENARIOS, Twin
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


def pool(size: int = 16) -> types.SimpleNamespace:
    return types.SimpleNamespace(req_to_token=torch.zeros(size, 8, dtype=torch.int32))


def make_map(gen: types.ModuleType, algorithm: str, sglang_name: str = "EAGLE", **kw: Any):
    return gen.FutureMap("cpu", FakeAlgorithm(sglang_name), pool(), algorithm=algorithm, **kw)


# -- the compiler ------------------------------------------------------------------------
def test_checked_in_module_is_current() -> None:
    output = compile_sglang(bundled_spec_paths(), "relayc/sglang_generated")
    assert output.text == CHECKED_IN.read_text(encoding="utf-8"), (
        "relayc/sglang_generated/overlap_utils.py is stale: run `relayc compile --target sglang "
        "relayc/specs/{eagle,eagle3,eagle_multilayer,ngram,none,standalone}.yaml -o relayc/sglang_generated`"
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
    with pytest.raises(NotImplementedError, match="DSPARK confidence ring"):
        make_map(gen, "eagle", needs_confidence_relay=True)
    with pytest.raises(NotImplementedError, match="DSPARK"):
        gen.FutureMap("cpu", FakeAlgorithm("DSPARK"), pool())
    with pytest.raises(NotImplementedError, match="DFLASH"):
        gen.FutureMap("cpu", FakeAlgorithm("DFLASH"), pool())
    fmap = make_map(gen, "eagle")
    with pytest.raises(NotImplementedError, match="DSA top-k seeds"):
        fmap.stash(torch.tensor([1]), gen.RelayPayload(None, dsa_topk_indices=torch.zeros(1, 4)))
    with pytest.raises(NotImplementedError, match="HiSparse staging"):
        fmap.make_staged_spec_input(torch.tensor([1]))


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
    names = ("FutureMap", "RelayPayload", "resolve_forward_inputs")
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
