"""The vLLM target (`relayc compile --target vllm`): what it emits, what it refuses, and the
checks its runtime adds to vLLM's. The differential test against vLLM's own kernels is
tests/vllm/ (its own venv: scripts/test-vllm.sh); this file needs no vLLM."""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

from relayc.compiler.targets.vllm import MODULE_NAME, PLUGIN_MODULE, RUNTIME_MODULE, compile_vllm
from relayc.compiler.writer import VLLM_GENERATED_DIR, vllm_specs
from relayc.specs.errors import SpecErrors
from relayc.specs.loader import bundled_spec_paths

SPECS = Path(bundled_spec_paths()[0]).parent


def _load(folder: Path, name: str) -> types.ModuleType:
    """Import the generated module as top-level files (its runtime beside it)."""
    sys.path.insert(0, str(folder))
    try:
        for module in (RUNTIME_MODULE, name):
            sys.modules.pop(module, None)
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def gen() -> types.ModuleType:
    from relayc.vllm_generated import vllm_relay

    return vllm_relay


def test_bundled_specs_cover_the_methods_mrv2_runs(gen: types.ModuleType) -> None:
    assert sorted(gen.STATES, key=str) == sorted(
        [None, "dflash", "dspark", "eagle", "eagle3", "mtp"], key=str
    )
    assert gen.STATES["mtp"].__name__ == "EagleMultilayerRelayState"
    assert {p.name for p in vllm_specs()} == {
        "dflash.yaml",
        "dspark.yaml",
        "eagle.yaml",
        "eagle3.yaml",
        "eagle_multilayer.yaml",
        "none.yaml",
    }


def test_checked_in_module_is_current() -> None:
    outputs = compile_vllm(vllm_specs(), "relayc/vllm_generated")
    for output in outputs:
        assert (VLLM_GENERATED_DIR / output.path.name).read_text(encoding="utf-8") == output.text


def test_generated_module_imports_nothing_from_vllm() -> None:
    for name in (MODULE_NAME, f"{RUNTIME_MODULE}.py"):
        tree = ast.parse((VLLM_GENERATED_DIR / name).read_text(encoding="utf-8"))
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
        assert "vllm" not in imported, name
        assert imported <= {"__future__", "numpy", "torch", "os", "weakref", "typing",
                            RUNTIME_MODULE}, imported  # fmt: skip
    # The plugin reaches vLLM only when vLLM calls it, by module name (importlib).
    plugin = ast.parse((VLLM_GENERATED_DIR / f"{PLUGIN_MODULE}.py").read_text(encoding="utf-8"))
    assert not [
        node
        for node in ast.walk(plugin)
        if isinstance(node, ast.Import | ast.ImportFrom)
        and any("vllm" in (a.name if isinstance(node, ast.Import) else node.module or "")
                for a in node.names)
    ]  # fmt: skip


def test_vllms_names_and_signatures(gen: types.ModuleType) -> None:
    import inspect

    post_update = inspect.signature(gen.post_update)
    assert list(post_update.parameters)[:10] == [
        "idx_mapping",
        "num_computed_tokens",
        "last_sampled_tokens",
        "output_bin_counts",
        "sampled_tokens",
        "num_sampled",
        "num_rejected",
        "query_start_loc",
        "all_token_ids",
        "total_len",
    ]
    combine = inspect.signature(gen.combine_sampled_and_draft_tokens)
    assert combine.parameters["num_new_sampled_tokens"].default == 1


def test_each_state_holds_only_its_methods_buffers(gen: types.ModuleType) -> None:
    eagle = gen.STATES["eagle"](8, 3, "cpu")
    assert eagle.draft_tokens.shape == (8, 3) and eagle.draft_tokens.dtype == torch.int64
    assert eagle.last_sampled_tokens.shape == (8, 1)
    assert eagle.num_computed_tokens.dtype == torch.int32
    assert not hasattr(eagle, "confidence_probs")
    dspark = gen.STATES["dspark"](8, 3, "cpu")
    assert dspark.confidence_probs.shape == (8, 3)
    plain = gen.STATES[None](8, 0, "cpu")
    assert plain.draft_tokens.shape == (8, 0)
    with pytest.raises(gen.RelayError, match="num_speculative_steps is 0"):
        gen.STATES["eagle"](8, 0, "cpu")
    with pytest.raises(gen.RelayError, match="plain decoding drafts none"):
        gen.STATES[None](8, 2, "cpu")


def test_generated_lines_say_which_spec_line_they_come_from() -> None:
    text = (VLLM_GENERATED_DIR / MODULE_NAME).read_text(encoding="utf-8")
    assert "# common.yaml:" in text and "bonus_tokens: Next input token" in text
    assert "# dspark.yaml:" in text and "confidence:" in text
    assert "@" + "generated by relayc (target vllm" in text
    assert "@" + "generated" not in (VLLM_GENERATED_DIR / f"{RUNTIME_MODULE}.py").read_text()


@pytest.mark.parametrize(
    ("spec", "construct"),
    [("ngram.yaml", "`placement: host`"), ("uno.yaml", "op `uno_draft`")],
)
def test_what_mrv2_does_not_run_is_a_located_error(
    spec: str, construct: str, tmp_path: Path
) -> None:
    with pytest.raises(SpecErrors) as err:
        compile_vllm([SPECS / spec], tmp_path)
    rendered = err.value.render()
    assert "the vllm target" in rendered and construct in rendered
    assert f"{spec}:" in rendered  # located


def _edited(tmp_path: Path, spec: str, old: str, new: str) -> Path:
    for name in ("common.yaml", spec):
        (tmp_path / name).write_text((SPECS / name).read_text(encoding="utf-8"), encoding="utf-8")
    path = tmp_path / spec
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new), encoding="utf-8")
    return path


def test_a_spec_without_a_vllm_section_is_located(tmp_path: Path) -> None:
    path = _edited(tmp_path, "eagle.yaml", "vllm:", "unused_vllm:")
    path.write_text(path.read_text().split("\n# vLLM 0.33")[0].split("unused_vllm")[0])
    with pytest.raises(SpecErrors, match="no `vllm:` section"):
        compile_vllm([path], tmp_path / "out")


def test_a_hook_naming_no_field_is_located(tmp_path: Path) -> None:
    path = _edited(
        tmp_path,
        "dspark.yaml",
        "method: dspark\n",
        "method: dspark\n  hooks: {confidence: confidance}\n",
    )
    with pytest.raises(SpecErrors) as err:
        compile_vllm([path], tmp_path / "out")
    assert "`confidance`, not a relay field of `dspark`" in err.value.render()
    assert "dspark.yaml:" in err.value.render()


def test_an_unknown_method_names_the_choices(tmp_path: Path) -> None:
    path = _edited(tmp_path, "eagle.yaml", "method: eagle\n", "method: eagle4\n")
    with pytest.raises(SpecErrors) as err:
        compile_vllm([path], tmp_path / "out")
    assert "eagle3" in err.value.render()


def test_two_specs_of_one_method_are_located(tmp_path: Path) -> None:
    path = _edited(tmp_path, "eagle3.yaml", "method: eagle3", "method: eagle")
    with pytest.raises(SpecErrors, match="runs as vLLM method `eagle`, as `eagle`"):
        compile_vllm([SPECS / "eagle.yaml", path], tmp_path / "out")


def test_a_hooked_field_of_the_wrong_type_for_its_vllm_tensor_is_located(tmp_path: Path) -> None:
    path = _edited(tmp_path, "dspark.yaml", "method: dspark\n",
                   "method: dspark\n  hooks: {last_sampled_tokens: confidence}\n")  # fmt: skip
    with pytest.raises(SpecErrors) as err:
        compile_vllm([path], tmp_path / "out")
    rendered = err.value.render()
    assert "holds vLLM's `last_sampled_tokens` but is float32; vLLM's is int64" in rendered
    assert "has rows ['num_draft_tokens']; vLLM's are scalars" in rendered
    assert "dspark.yaml:" in rendered


def test_generated_module_checks_the_runtime_version(tmp_path: Path) -> None:
    outputs = compile_vllm([SPECS / "none.yaml"], tmp_path)
    for output in outputs:
        output.path.write_text(output.text, encoding="utf-8")
    runtime = tmp_path / f"{RUNTIME_MODULE}.py"
    runtime.write_text(runtime.read_text().replace("RUNTIME_VERSION = 1", "RUNTIME_VERSION = 2"))
    with pytest.raises(ImportError, match="copy both files"):
        _load(tmp_path, "vllm_relay")


# The checks vLLM's code does not make, on the generated state (values need RELAYC_VLLM_CHECKS).


def _decode_batch(state: object, slot: int, drafts: int) -> dict[str, torch.Tensor]:
    """One decode step of one request in ``slot``: 1 + ``drafts`` tokens after 10 computed."""
    prefill_len = torch.zeros(8, dtype=torch.int32)
    prefill_len[slot] = 10
    return {
        "input_ids": torch.zeros(16, dtype=torch.int32),
        "idx_mapping": torch.tensor([slot]),
        "query_start_loc": torch.tensor([0, 1 + drafts], dtype=torch.int32),
        "seq_lens": torch.tensor([11 + drafts], dtype=torch.int32),
        "prefill_len": prefill_len,
        "cu_num_logits": torch.tensor([0, 1 + drafts], dtype=torch.int32),
    }


def _combine(gen: types.ModuleType, state: object, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return gen.combine_sampled_and_draft_tokens(
        batch["input_ids"],
        batch["idx_mapping"],
        state.last_sampled_tokens,  # type: ignore[attr-defined]
        batch["query_start_loc"],
        batch["seq_lens"],
        batch["prefill_len"],
        state.draft_tokens,  # type: ignore[attr-defined]
        batch["cu_num_logits"],
        int(batch["cu_num_logits"][-1]),
    )


def test_placeholders_leaking_into_a_new_requests_input_are_refused(
    gen: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gen.runtime, "VALUE_CHECKS", True)
    state = gen.STATES["eagle"](8, 2, "cpu")
    state.add_request(3, prefill_len=10, num_computed_tokens=10)
    batch = _decode_batch(state, 3, drafts=2)
    with pytest.raises(gen.RelayError, match=r"slot 3\) reads its last sampled token"):
        _combine(gen, state, batch)
    state.has_sampled[3] = True  # as post_update marks it
    with pytest.raises(gen.RelayError, match=r"slot 3\) reads its draft tokens"):
        _combine(gen, state, batch)
    state.store_draft_tokens(torch.tensor([3]), torch.tensor([[7, 8]]))
    _combine(gen, state, batch)
    assert batch["input_ids"][:3].tolist() == [0, 7, 8]
    state.add_request(3, prefill_len=10, num_computed_tokens=10)  # the slot reused
    with pytest.raises(gen.RelayError, match="last sampled token"):
        _combine(gen, state, batch)


def test_more_drafts_than_the_state_holds_are_refused(
    gen: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gen.runtime, "VALUE_CHECKS", True)
    state = gen.STATES["eagle"](8, 2, "cpu")
    with pytest.raises(gen.RelayError, match="schedules 3 draft tokens but the state holds 2"):
        _combine(gen, state, _decode_batch(state, 1, drafts=3))


def _post_update(gen: types.ModuleType, state: object, num_rejected: int) -> None:
    """A decode step of slot 2: 3 tokens scheduled (2 drafts), 2 sampled."""
    state.add_request(2, prefill_len=5, num_computed_tokens=4)  # type: ignore[attr-defined]
    gen.post_update(
        torch.tensor([2]),
        state.num_computed_tokens,  # type: ignore[attr-defined]
        state.last_sampled_tokens,  # type: ignore[attr-defined]
        None,
        torch.tensor([[11, 12, -1]]),
        torch.tensor([2], dtype=torch.int32),
        torch.tensor([num_rejected], dtype=torch.int32),
        torch.tensor([0, 3], dtype=torch.int32),
        torch.zeros(8, 16, dtype=torch.int32),
        state.total_len,  # type: ignore[attr-defined]
    )


def test_unaccepted_drafts_counted_as_computed_are_refused(
    gen: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = gen.STATES["eagle"](8, 2, "cpu")
    _post_update(gen, state, num_rejected=1)
    assert (int(state.num_computed_tokens[2]), int(state.total_len[2])) == (6, 7)
    monkeypatch.setattr(gen.runtime, "VALUE_CHECKS", True)
    _post_update(gen, state, num_rejected=1)
    with pytest.raises(gen.RelayError, match="would count 7 computed tokens of 7"):
        _post_update(gen, state, num_rejected=0)


def test_a_drafter_width_changing_between_steps_is_refused(gen: types.ModuleType) -> None:
    state = gen.STATES["eagle"](8, 2, "cpu")
    with pytest.raises(gen.RelayError, match="drafted 3 tokens per request but the state holds 2"):
        gen.post_update(
            torch.tensor([0]), state.num_computed_tokens, state.last_sampled_tokens, None,
            torch.zeros(1, 3, dtype=torch.int64), torch.ones(1, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int32), None, torch.zeros(8, 4, dtype=torch.int32),
            state.total_len, torch.zeros(1, 3, dtype=torch.int64), state.draft_tokens,
        )  # fmt: skip
    with pytest.raises(gen.RelayError, match=r"store_draft_tokens\(\).*expected \[1, 2\]"):
        state.store_draft_tokens(torch.tensor([0]), torch.zeros(1, 3, dtype=torch.int64))


def test_a_wrong_dtype_names_the_argument(gen: types.ModuleType) -> None:
    state = gen.STATES[None](4, 0, "cpu")
    with pytest.raises(gen.RelayError, match=r"`num_computed_tokens` is torch\.int64"):
        gen.prepare_pos_seq_lens(
            torch.tensor([0]), torch.tensor([0, 1], dtype=torch.int32),
            state.num_computed_tokens.long(), torch.zeros(4, dtype=torch.int64),
            torch.zeros(4, dtype=torch.int32),
        )  # fmt: skip


def test_dspark_confidences_reach_the_host_one_record_late(gen: types.ModuleType) -> None:
    """vLLM's AdaptiveVerification cannot be built on a CPU (docs/vllm.md): its semantics,
    read from vllm/v1/worker/gpu/spec_decode/adaptive_verification.py, checked here."""
    state = gen.STATES["dspark"](4, 2, "cpu")
    slots = torch.tensor([1, 3])
    first = torch.tensor([[0.5, 0.25], [0.75, 0.5]])
    state.record_confidences(first, slots, 2)
    assert state.read_stale_confidences([1, 3]).tolist() == [[1.0, 1.0], [1.0, 1.0]]
    state.record_confidences(torch.tensor([[0.1, 0.2], [0.3, 0.4]]), slots, 2)
    assert state.read_stale_confidences([1, 3]).tolist() == first.tolist()
    state.add_request(3, prefill_len=4, num_computed_tokens=0)  # slot 3 reused: back to 1.0
    assert state.read_stale_confidences([3]).tolist() == [[1.0, 1.0]]
    assert state.confidence_probs[3].tolist() == [1.0, 1.0]
    state.record_confidences(torch.tensor([[0.9, 0.9]]), torch.tensor([1]), 1)
    assert state.read_stale_confidences([1, 3]).tolist()[1] == [1.0, 1.0]


def test_the_cli_compiles_for_vllm_and_locates_what_it_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from relayc.cli import EXIT_OK, EXIT_SPEC_ERRORS, main

    assert (
        main(["compile", "--target", "vllm", str(SPECS / "dspark.yaml"), "-o", str(tmp_path)])
        == EXIT_OK
    )
    assert "wrote" in capsys.readouterr().out
    assert (tmp_path / MODULE_NAME).exists() and (tmp_path / f"{RUNTIME_MODULE}.py").exists()
    module = _load(tmp_path, "vllm_relay")
    assert list(module.STATES) == ["dspark"]
    ngram = str(SPECS / "ngram.yaml")
    assert main(["compile", "--target", "vllm", ngram, "-o", str(tmp_path)]) == EXIT_SPEC_ERRORS
    assert "the vllm target does not implement `placement: host`" in capsys.readouterr().err
    assert main(["compile", "--bundled", "--target", "vllm", "-o", str(tmp_path / "b")]) == EXIT_OK
    assert len(_load(tmp_path / "b", "vllm_relay").STATES) == 6


def test_the_plugin_replaces_vllms_objects_by_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """plugin.install() on stand-ins for vLLM's modules (tests/vllm/test_vllm_plugin.py runs
    it on vLLM's own): what imported vLLM's functions or RequestState by name is pointed at
    the generated ones; a same-named object of another module is left alone."""
    from relayc.vllm_generated import relayc_vllm_plugin as plugin
    from relayc.vllm_generated import vllm_relay as gen

    def unrelated_post_update() -> None: ...

    class RequestState:
        def __init__(self, max_num_reqs: int, num_speculative_steps: int, device: str) -> None:
            self.last_sampled_tokens = torch.zeros(max_num_reqs, 1, dtype=torch.int64)
            self.draft_tokens = torch.zeros(max_num_reqs, num_speculative_steps, dtype=torch.int64)

    input_batch = types.ModuleType(plugin.VLLM_INPUT_BATCH)
    for name in plugin.FUNCTIONS:  # vLLM's own, one function each
        setattr(input_batch, name, types.FunctionType(unrelated_post_update.__code__, {}, name))
    states = types.ModuleType(plugin.VLLM_STATES)
    states.RequestState = RequestState  # type: ignore[attr-defined]
    model_runner = types.ModuleType("vllm.v1.worker.gpu.model_runner")
    model_runner.post_update = input_batch.post_update  # type: ignore[attr-defined]
    model_runner.RequestState = RequestState  # type: ignore[attr-defined]
    other = types.ModuleType("vllm.v1.worker.gpu.other")
    other.post_update = unrelated_post_update  # type: ignore[attr-defined]
    for module in (input_batch, states, model_runner, other):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    relayed = plugin.install("eagle3")
    assert plugin.install("dspark") is relayed  # vLLM may load a plugin twice
    for name in plugin.FUNCTIONS:
        assert getattr(input_batch, name) is getattr(gen, name)
    assert model_runner.post_update is gen.post_update
    assert states.RequestState is model_runner.RequestState is relayed
    assert other.post_update is unrelated_post_update
    req_states = relayed(max_num_reqs=4, num_speculative_steps=2, device="cpu")
    assert type(req_states.relay) is gen.Eagle3RelayState
    assert req_states.draft_tokens is req_states.relay.draft_tokens
    assert req_states.last_sampled_tokens is req_states.relay.last_sampled_tokens


def test_a_class_equal_to_an_earlier_one_derives_from_it(gen: types.ModuleType) -> None:
    eagle = gen.EagleRelayState
    for derived in (gen.Eagle3RelayState, gen.EagleMultilayerRelayState, gen.DflashRelayState):
        assert (
            derived.__bases__ == (eagle,)
            and set(vars(derived)) & {"__init__", "add_request"} == set()
        )
        assert "__init__, add_request, store_draft_tokens: as EagleRelayState's." in derived.__doc__
    # DSpark holds the confidence relay and plain decoding no drafts: each its own class.
    assert gen.DsparkRelayState.__bases__ == gen.NoneRelayState.__bases__ == (object,)
    with pytest.raises(gen.RelayError, match=r"Eagle3RelayState: .* vLLM's `eagle3` drafts"):
        gen.Eagle3RelayState(8, 0, "cpu")
    assert gen.STATES["mtp"](8, 2, "cpu").draft_tokens.shape == (8, 2)


def test_a_class_whose_fields_differ_is_written_out(tmp_path: Path) -> None:
    # EAGLE3 holding num_computed_tokens in another field: not EAGLE's __init__.
    path = _edited(tmp_path, "eagle3.yaml", "method: eagle3\n",
                   "method: eagle3\n  hooks: {num_computed_tokens: bonus_tokens}\n")  # fmt: skip
    text = compile_vllm([SPECS / "eagle.yaml", path], tmp_path / "out")[0].text
    assert "class Eagle3RelayState:" in text and "as EagleRelayState's" not in text
    assert text.count("# [max_num_reqs] int32 (vLLM counts computed tokens") == 2


def test_the_plugin_picks_the_state_class_of_vllms_method() -> None:
    from relayc.vllm_generated import relayc_vllm_plugin as plugin
    from relayc.vllm_generated import vllm_relay as gen

    assert plugin.relay_state_class("dspark", 2) is gen.DsparkRelayState
    assert plugin.relay_state_class("mtp", 2) is gen.EagleMultilayerRelayState
    assert plugin.relay_state_class("eagle", 0) is gen.NoneRelayState  # no speculative steps
    with pytest.raises(gen.RelayError, match=r"method 'ngram'.*RELAYC_VLLM_METHOD"):
        plugin.relay_state_class("ngram", 2)
    with pytest.raises(gen.RelayError, match="2 speculative steps but the method is unknown"):
        plugin.relay_state_class(None, 2)
