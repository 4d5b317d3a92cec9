"""``Engine(...)`` rejects loose arguments with a clear TypeError / ValueError before it loads a
model or builds anything (issue 23, class 9). Each case used to be taken as something else
(``block_verification="no"`` on, ``draft_confidence=True`` as 1.0, a bucket above
``max_batch_size`` padding every batch), ignored (``impls={"typo_op": fn}``) or to fail with a
raw ``TypeError`` / ``AttributeError``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import relayc.generated.ngram as ngram_module
from relayc.engine import Engine, LlamaForCausalLM, SamplingParams, random_model
from relayc.engine.ops import implementations
from tests.engine.engine_helpers import one_intra_op_thread  # noqa: F401 - autouse fixture

CHAIN = {"algorithm": "standalone", "num_steps": 3, "topk": 1, "num_draft_tokens": 4}


def _rejected(tmp_path: Path, error: type[Exception], match: str, **kwargs: Any) -> None:
    """``Engine(**kwargs)`` raises ``error`` before it looks at its model (a checkpoint
    directory that does not exist would fail the load)."""
    with pytest.raises(error, match=match):
        Engine(tmp_path / "no-checkpoint", **kwargs)


@pytest.mark.parametrize("name", ["block_verification", "overlap", "debug"])
@pytest.mark.parametrize("value", ["no", "false", 1, None])
def test_switches_are_bools(tmp_path: Path, name: str, value: object) -> None:
    _rejected(
        tmp_path,
        TypeError,
        rf"`{name}` must be True or False; got {value!r}",
        **CHAIN,
        **{name: value},
    )


@pytest.mark.parametrize(
    ("name", "value", "default"),
    [
        ("max_context", 0, "the model's context length"),  # 0 used to mean the default
        ("max_context", -5, "the model's context length"),
        ("max_context", 2.5, "the model's context length"),
        ("req_pool_size", 0, "2 \\* max_batch_size"),  # 0 used to be accepted
        ("req_pool_size", True, "2 \\* max_batch_size"),
    ],
)
def test_sizes_are_positive_or_none(tmp_path: Path, name: str, value: object, default: str) -> None:
    match = rf"`{name}` must be a positive integer, or None for {default}; got {value!r}"
    _rejected(tmp_path, ValueError, match, **CHAIN, **{name: value})


@pytest.mark.parametrize("name", ["kv_pool_tokens", "max_prefill_tokens"])
def test_pool_sizes_are_positive(tmp_path: Path, name: str) -> None:
    _rejected(tmp_path, ValueError, rf"`{name}` must be a positive integer; got 0", **{name: 0})


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (True, TypeError, r"`draft_confidence` must be a number in \(0, 1\] \(e.g. 0.4\) or None"),
        ("0.4", TypeError, r"must be a number in \(0, 1\].*got '0.4'"),
        (1.5, ValueError, r"`draft_confidence` must lie in \(0, 1\]; got 1.5"),
        (0, ValueError, r"must lie in \(0, 1\]; got 0"),
        (float("nan"), ValueError, r"must lie in \(0, 1\]; got nan"),
    ],
)
def test_draft_confidence_is_a_probability_or_none(
    tmp_path: Path, value: object, error: type[Exception], match: str
) -> None:
    _rejected(tmp_path, error, match, **CHAIN, draft_confidence=value)


def test_options_that_need_another_algorithm_fail_before_the_load(tmp_path: Path) -> None:
    _rejected(
        tmp_path,
        ValueError,
        r"`draft_confidence` .* got 0.4 for `ngram`",
        algorithm="ngram",
        draft_confidence=0.4,
    )
    _rejected(
        tmp_path,
        ValueError,
        "`block_verification` verifies chain drafts",
        algorithm="eagle",
        block_verification=True,
    )


@pytest.mark.parametrize(
    ("sizes", "error", "match"),
    [
        (2.5, TypeError, r"must be a list of batch sizes .* got 2.5"),
        (True, TypeError, r"must be a list of batch sizes .* got True"),
        ("8", TypeError, r"must be a list of batch sizes .* got '8'"),
        ([1, 2.5], TypeError, r"holds batch sizes \(whole numbers\); got 2.5 in \[1, 2.5\]"),
        ([True, 2], TypeError, r"holds batch sizes \(whole numbers\); got True"),
        (["8"], TypeError, r"holds batch sizes \(whole numbers\); got '8'"),
        ([0, 4], ValueError, r"capture_batch_sizes must be positive; got \[0, 4\]"),
        (
            [1, 2, 8],
            ValueError,
            r"`capture_batch_sizes` \[1, 2, 8\] has buckets above max_batch_size=4 \(8\): no "
            r"batch is that large, and every batch would be padded up to them; drop them or "
            r"raise `max_batch_size`",
        ),
    ],
)
def test_capture_batch_sizes(
    tmp_path: Path, sizes: object, error: type[Exception], match: str
) -> None:
    _rejected(tmp_path, error, match, graphs="static", max_batch_size=4, capture_batch_sizes=sizes)


def test_buckets_up_to_max_batch_size_are_kept() -> None:
    engine = Engine("random", graphs="static", max_batch_size=4, capture_batch_sizes=(4, 1, 2))
    assert engine.algorithm.graphs.batch_sizes == (1, 2, 4)
    engine.close()


def test_an_impl_for_an_op_the_module_does_not_run(tmp_path: Path) -> None:
    fn = implementations()["sample"]
    _rejected(
        tmp_path,
        ValueError,
        r"`impls` names op `typo_op`, which module `relayc.generated.none` does not run \(its "
        r"ops: `target_prefill`, `target_decode`, `sample`\)$",
        impls={"typo_op": fn},
    )
    _rejected(
        tmp_path,
        ValueError,
        r"names op `sampel`, .*; did you mean `sample`\?$",
        impls={"sampel": fn},
    )
    _rejected(
        tmp_path,
        ValueError,
        r"names op `accept_tree`, .* `relayc.generated.none`",
        impls={"accept_tree": fn},
    )
    _rejected(
        tmp_path,
        TypeError,
        r"`impls` maps op names to functions .* got list",
        impls=[("sample", fn)],
    )


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(seed=3)


@pytest.mark.parametrize(
    "given",
    ["relayc.generated.ngram", ngram_module.__file__, Path(ngram_module.__file__)],
    ids=["module-name", "path-str", "path"],
)
def test_relay_module_by_name_or_path(model: LlamaForCausalLM, given: object) -> None:
    with Engine(model, algorithm="ngram", relay_module=given) as engine:
        assert engine.algorithm.module.DecodeStep.OPS == ngram_module.DecodeStep.OPS
        (out,) = engine.generate([[3, 4, 5, 3, 4]], SamplingParams(max_new_tokens=4))
    assert out.finish_reason == "length"


def test_relay_module_that_is_not_one(tmp_path: Path) -> None:
    _rejected(tmp_path, TypeError, r"`relay_module` must be a module .* got int", relay_module=42)
    _rejected(
        tmp_path,
        ValueError,
        r"`relay_module` 'no_such_relay_module': cannot import it",
        relay_module="no_such_relay_module",
    )
    _rejected(
        tmp_path,
        ValueError,
        r"`relay_module` '.*missing.py': no such file",
        relay_module=str(tmp_path / "missing.py"),
    )
    _rejected(
        tmp_path,
        ValueError,
        r"`relay_module` `json` is not a module `relayc compile` generated \(it has no `ALGORITHM`",
        relay_module="json",
    )
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('half-written')\n")
    _rejected(
        tmp_path, ValueError, r"failed to load: RuntimeError: half-written", relay_module=broken
    )


def test_a_decode_algorithm_instance_takes_no_module(model: LlamaForCausalLM) -> None:
    algorithm = Engine(model).algorithm
    with pytest.raises(ValueError, match="a DecodeAlgorithm instance runs its own steps"):
        Engine(model, algorithm=algorithm, relay_module=ngram_module)


def test_the_engine_checks_the_rules_of_the_module_it_runs(
    tmp_path: Path, model: LlamaForCausalLM
) -> None:
    """Dims rules live in the spec: a user's spec adding one gets it checked by the engine
    that runs the module compiled from it, with the rule's own line in the error."""
    from relayc.cli import main
    from relayc.specs.loader import BUNDLED_DIR

    for name in ("ngram.yaml", "common.yaml"):
        (tmp_path / name).write_text((BUNDLED_DIR / name).read_text())
    spec = tmp_path / "ngram.yaml"
    text = spec.read_text()
    lines = text.splitlines(keepends=True)
    at = lines.index("rules:\n") + 1
    while at < len(lines) and lines[at].startswith("  "):  # after the spec's own rules
        at += 1
    lines.insert(at, "  - {rule: num_draft_tokens <= 5, message: a short window}\n")
    spec.write_text("".join(lines))
    line = at + 1
    assert main(["compile", str(spec), "-o", str(tmp_path / "out")]) == 0
    module = tmp_path / "out" / "ngram.py"
    with pytest.raises(
        ValueError,
        match=rf"`ngram` cannot run with these dims: rule `num_draft_tokens <= 5` "
        rf"\(.*ngram.yaml:{line}\) does not hold for num_draft_tokens=6: a short window",
    ):
        Engine(model, algorithm="ngram", relay_module=module, num_draft_tokens=6)
    with Engine(model, algorithm="ngram", relay_module=module) as engine:
        assert engine.algorithm.module.DIM_RULES[-1].text == "num_draft_tokens <= 5"


def test_a_rule_naming_the_vocabulary_is_checked_once_the_model_is_loaded(
    model: LlamaForCausalLM,
) -> None:
    vocab = model.config.vocab_size
    with pytest.raises(
        ValueError,
        match=rf"rule `topk <= vocab` \(relayc/specs/eagle.yaml:\d+\) does not hold for "
        rf"topk={vocab + 1}, vocab={vocab}: .*\(`topk` must be at most {vocab}\)",
    ):
        Engine(model, algorithm="eagle", num_steps=1, topk=vocab + 1, num_draft_tokens=2)


def test_a_module_whose_rules_are_missing_or_broken_is_refused(tmp_path: Path) -> None:
    """A module from before dims rules, or one whose rule was edited into no rule, is
    refused by name before anything is built (not run unchecked, not a parser traceback)."""
    source = Path(ngram_module.__file__).read_text()
    start = source.index("DIM_RULES: tuple[DimRule, ...] = (")
    end = source.index("\n)\n", start) + 3
    old = tmp_path / "old_ngram.py"
    old.write_text(source[:start] + source[end:])
    _rejected(tmp_path, ValueError, r"lists no dims rules .*regenerate it", algorithm="ngram",
              relay_module=old)  # fmt: skip
    edited = tmp_path / "edited_ngram.py"
    edited.write_text(source.replace('"num_draft_tokens >= 2"', '"num_draft_tokens => 2"'))
    _rejected(tmp_path, ValueError, r"a dims rule that does not parse, `num_draft_tokens => 2`",
              algorithm="ngram", relay_module=edited)  # fmt: skip
