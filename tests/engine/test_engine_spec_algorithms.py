"""The algorithms through the Engine: the generated steps on the real drafters stay lossless
with overlap on and off (issue: speculative decoding end to end); the engine reads only what
the spec's `outputs:` names, so renaming a step is a spec edit; user modules and ops plug in
through `Engine(relay_module=..., impls=...)`."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from relayc.cli import main
from relayc.engine import Engine, LlamaForCausalLM, SamplingParams, random_model
from relayc.engine.draft import EagleHead, StandaloneDrafter
from relayc.engine.draft.standalone import default_standalone_config
from relayc.engine.ops import implementations
from relayc.nodes import Op, TensorType, register
from relayc.specs.loader import BUNDLED_DIR
from tests.engine.engine_helpers import (
    assert_idle,
    naive_outputs,
    one_intra_op_thread,  # noqa: F401 - autouse fixture
    random_workload,
)

CONFIGS = [
    ("eagle", {"num_steps": 3, "topk": 1, "num_draft_tokens": 4}),
    ("eagle", {"num_steps": 3, "topk": 4, "num_draft_tokens": 8}),
    ("eagle", {"num_steps": 1, "topk": 2, "num_draft_tokens": 3}),  # one draft step
    ("eagle_multilayer", {"num_steps": 3, "topk": 2, "num_draft_tokens": 6}),
    ("ngram", {"num_steps": 3, "topk": 1, "num_draft_tokens": 5}),
    ("standalone", {"num_steps": 3, "topk": 1, "num_draft_tokens": 4}),
]


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(seed=3)


@pytest.mark.parametrize(
    ("algorithm", "sizes"), CONFIGS, ids=[f"{a}-topk{s['topk']}" for a, s in CONFIGS]
)
def test_32_staggered_requests_match_greedy_none(
    model: LlamaForCausalLM, algorithm: str, sizes: dict[str, int]
) -> None:
    work = random_workload(5, 32, max_prompt=20, max_new=10, last_arrival=6)
    expected = naive_outputs(model, work.prompts, work.params)
    for overlap in (True, False):
        engine = Engine(model, algorithm=algorithm, overlap=overlap, debug=True, **sizes)
        outs = engine.generate(work.prompts, work.params, arrivals=work.arrivals)
        assert [o.token_ids for o in outs] == expected, f"{algorithm} overlap={overlap}"
        for out in outs:
            assert all(1 <= a <= sizes["num_draft_tokens"] for a in out.accept_lengths)
        assert engine.scheduler.stats.max_running >= 16
        assert_idle(engine)
        engine.close()


def test_a_draft_head_that_agrees_with_the_target_is_accepted(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """With the test suite's target-copying head (tests/engine/draft/helpers.py) every chain
    is accepted whole: accept lengths reach num_steps + 1 through the engine too."""
    from tests.engine.draft.helpers import copying_head

    target, head = copying_head(config_seed=4)
    directory = tmp_path / "head"
    head.save(directory)
    assert EagleHead.load(directory, target) is not None
    engine = Engine(
        target,
        algorithm="eagle",
        num_steps=3,
        topk=1,
        num_draft_tokens=4,
        draft_model=directory,
        overlap=True,
    )
    outs = engine.generate([[1, 2, 3, 4]], None)
    assert max(outs[0].accept_lengths) == 4
    engine.close()


@pytest.mark.parametrize("overlap", [True, False])
def test_the_target_as_its_own_standalone_draft_model_accepts_every_chain(
    model: LlamaForCausalLM,
    tmp_path,
    overlap: bool,  # type: ignore[no-untyped-def]
) -> None:
    """Self-drafting agrees with the target at every position only if the draft cache holds
    exactly the target's context: prompt slots, accepted drafts, and the bonus position that
    lives in the request's private bonus slot until the next verify commits it."""
    directory = tmp_path / "self"
    StandaloneDrafter(model).save(directory)
    work = random_workload(8, 12, max_prompt=16, max_new=13, last_arrival=4)
    expected = naive_outputs(model, work.prompts, work.params)
    engine = Engine(model, algorithm="standalone", draft_model=directory, overlap=overlap)
    outs = engine.generate(work.prompts, work.params, arrivals=work.arrivals)
    assert [o.token_ids for o in outs] == expected
    for out in outs:
        # every verify but a request's last (cut at max_new_tokens) accepts the whole chain
        assert all(a == 4 for a in out.accept_lengths[:-1]), out.accept_lengths
    engine.close()


def test_a_standalone_draft_model_with_another_vocabulary_is_refused_at_load(
    model: LlamaForCausalLM, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    directory = tmp_path / "other"
    other = model.config.replace(vocab_size=model.config.vocab_size + 5)
    StandaloneDrafter.random(default_standalone_config(other), seed=1).save(directory)
    with pytest.raises(ValueError, match=r"vocabulary of 264 tokens but the target has 259"):
        Engine(model, algorithm="standalone", draft_model=directory)


def test_standalone_needs_a_chain() -> None:
    with pytest.raises(
        ValueError, match=r"rule `topk == 1` .* topk=2: .*chain \(set `topk` to 1\)"
    ):
        Engine(random_model(seed=3), algorithm="standalone", topk=2, num_draft_tokens=4)


def test_eagle_prefill_writes_the_prompts_draft_kv_to_their_slots(
    model: LlamaForCausalLM,
) -> None:
    """The scheduler records prompt slots in `req_to_token` after the prefill step, so the
    draft extend over a prompt must write to the prefill's own slots."""
    engine = Engine(model, algorithm="eagle", overlap=False)
    prompt = [5, 6, 7, 8, 9, 10]
    engine.generate([prompt], None)
    row = engine.scheduler.req_pool.req_to_token[1, : len(prompt)].long()
    draft_keys = engine.algorithm.draft_kv.k[0][row]
    assert row.unique().numel() == len(prompt)
    assert bool((draft_keys.abs().flatten(1).amax(dim=1) > 0).all())
    engine.close()


@pytest.mark.parametrize("algorithm", ["eagle", "standalone"])
def test_a_sampled_request_is_the_same_alone_and_beside_greedy_ones(
    model: LlamaForCausalLM, algorithm: str
) -> None:
    """An all-greedy batch skips the sampled acceptance rule (host knowledge); a mixed batch
    runs both and each row keeps its own: the sampled request's tokens depend only on its
    seed, the greedy ones stay the target's greedy tokens."""
    sampled = SamplingParams(max_new_tokens=12, temperature=0.9, seed=7)
    greedy = SamplingParams(max_new_tokens=12)
    prompts = [[4, 5, 6, 7], [9, 8, 7], [1, 2, 3, 4, 5]]
    with Engine(model, algorithm=algorithm, overlap=False) as engine:
        alone = engine.generate(prompts[:1], sampled)[0].token_ids
        mixed = engine.generate(prompts, [sampled, greedy, greedy])
    assert mixed[0].token_ids == alone
    assert [o.token_ids for o in mixed[1:]] == naive_outputs(model, prompts[1:], [greedy] * 2)


def _compiled(directory: Path, text: str, algorithm: str) -> ModuleType:
    """Write ``text`` as a spec next to the library it imports, compile it with the CLI and
    import the generated module."""
    shutil.copy(BUNDLED_DIR / "common.yaml", directory / "common.yaml")
    path = directory / f"{algorithm}.yaml"
    path.write_text(re.sub(r"(?m)^algorithm: \w+$", f"algorithm: {algorithm}", text))
    assert main(["compile", str(path), "-o", str(directory / "out")]) == 0
    spec = importlib.util.spec_from_file_location(algorithm, directory / "out" / f"{algorithm}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _renamed_accept(text: str, *, in_outputs: bool) -> str:
    """The n-gram spec with its `accept` step called `judge` everywhere but, unless
    ``in_outputs``, in the `outputs:` section."""
    head, sep, outputs = text.partition("\noutputs:")
    assert sep and "accept." in outputs
    head = head.replace("  - name: accept\n", "  - name: judge\n").replace(" accept.", " judge.")
    if in_outputs:
        outputs = outputs.replace(" accept.", " judge.")
    return head + sep + outputs


def test_renaming_the_accept_step_renames_what_the_engine_reads(
    model: LlamaForCausalLM, tmp_path: Path
) -> None:
    """The engine reads `DecodeOutputs` attributes, never step names: a spec whose accept
    step has another name runs exactly like the bundled one."""
    text = (BUNDLED_DIR / "ngram.yaml").read_text()
    module = _compiled(tmp_path, _renamed_accept(text, in_outputs=True), "ngram_judged")
    assert "judge_accept_tokens" in Path(module.__file__).read_text()
    work = random_workload(9, 6, max_prompt=14, max_new=9, last_arrival=2)
    sizes = {"num_draft_tokens": 5}
    with Engine(model, algorithm="ngram", overlap=False, debug=True, **sizes) as engine:
        want = engine.generate(work.prompts, work.params, arrivals=work.arrivals)
    with Engine(
        model, algorithm="ngram", overlap=False, debug=True, relay_module=module, **sizes
    ) as engine:
        assert engine.algorithm.module is module
        got = engine.generate(work.prompts, work.params, arrivals=work.arrivals)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.accept_lengths for o in got] == [o.accept_lengths for o in want]


def test_a_rename_the_outputs_miss_fails_at_validate_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _renamed_accept((BUNDLED_DIR / "ngram.yaml").read_text(), in_outputs=False)
    shutil.copy(BUNDLED_DIR / "common.yaml", tmp_path / "common.yaml")
    (tmp_path / "ngram.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "-q", "ngram.yaml"]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line]
    line = text.splitlines().index("    next_tokens: accept.bonus_tokens") + 1
    assert lines == [
        f"ngram.yaml:{line + i}:{col}: error: `outputs.decode.{name}` is `accept.{output}`, but "
        f"there is no decode step named `accept` (`outputs.decode` reads the outputs of the "
        "decode `steps:`: `propose`, `splice`, `verify`, `judge`, `compact_kv`)"
        for i, (name, col, output) in enumerate(
            [
                ("next_tokens", 18, "bonus_tokens"),
                ("tokens", 13, "accept_tokens"),
                ("counts", 13, "accept_lens"),
            ]
        )
    ]


def test_user_impls_replace_built_in_ones_and_missing_ones_fail_at_construction(
    model: LlamaForCausalLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    builtin = implementations()["sample"]

    def counting_sample(ctx, **inputs):  # type: ignore[no-untyped-def]
        calls.append(inputs["logits"].shape[0])
        return builtin(ctx, **inputs)

    prompts = [[4, 5, 6], [7, 8]]
    params = SamplingParams(max_new_tokens=5)
    with Engine(model, impls={"sample": counting_sample}) as engine:
        outs = engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == naive_outputs(model, prompts, [params] * 2)
    assert calls  # every decode iteration sampled through the user's function

    text = (BUNDLED_DIR / "none.yaml").read_text().replace(
        "    op: sample\n", "    op: my_sample\n"
    ) + f"ops: [{__name__}]\n"  # the user op below belongs to this module
    register(
        Op(
            "my_sample",
            {"logits": TensorType("float32", ("vocab",))},
            {"next_tokens": TensorType("int64", ())},
        ),
        module=__name__,
    )
    module = _compiled(tmp_path, text, "none_mine")
    with pytest.raises(
        ValueError,
        match=r"no implementation: `my_sample`; pass them as `impls=\{\"my_sample\": fn\}`",
    ):
        Engine(model, relay_module=module)
    with Engine(model, relay_module=module, impls={"my_sample": builtin}) as engine:
        mine = engine.generate(prompts, params)
    assert [o.token_ids for o in mine] == [o.token_ids for o in outs]
