"""A relay module paired with the wrong algorithm fails in ``Engine(...)``, naming what does
not match (issue 23, class 3). It used to be accepted and fail inside ``generate()`` with
``AttributeError ... 'propose_for_suffixes'``, a ``TypeError`` on a drafter method or
``KeyError: 'hidden_states'``."""

from __future__ import annotations

import importlib
import importlib.util
import itertools
from pathlib import Path
from types import ModuleType

import pytest

from relayc.engine import Engine, LlamaForCausalLM, SamplingParams, random_model
from relayc.engine.algorithms import engine_names, lookup
from relayc.engine.draft import Eagle3Head
from relayc.engine.serving.algorithms import GeneratedAlgorithm
from tests.engine.engine_helpers import one_intra_op_thread  # noqa: F401 - autouse fixture

ALGORITHMS = engine_names()

# Dims every algorithm accepts (standalone: a chain of num_steps + 1).
DIMS = {"num_steps": 3, "topk": 1, "num_draft_tokens": 4}


def _bundled(name: str) -> ModuleType:
    return importlib.import_module(f"relayc.generated.{name}")


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(seed=3)


@pytest.mark.parametrize(
    ("algorithm", "compiled_for"),
    [pair for pair in itertools.permutations(ALGORITHMS, 2)],
    ids=[f"{a}-with-{m}" for a, m in itertools.permutations(ALGORITHMS, 2)],
)
def test_every_mismatched_bundled_pair_fails_in_the_constructor(
    model: LlamaForCausalLM, algorithm: str, compiled_for: str
) -> None:
    module = _bundled(compiled_for)
    with pytest.raises(ValueError) as info:
        Engine(model, algorithm=algorithm, relay_module=module, **DIMS)
    message = str(info.value)
    assert message.startswith(
        f"`relay_module` `{module.__name__}` (compiled for `{compiled_for}`) cannot run with "
        f"algorithm `{algorithm}`: "
    ), message
    assert f'pass `algorithm="{compiled_for}"`' in message
    # What does not match: the module's ops that drive another drafter, or (a module that
    # never drafts under a speculative algorithm) the ops that would drive this one's.
    if compiled_for != "none":
        assert f"drive the drafter of `{compiled_for}`" in message
    else:
        assert f"none of its ops drives the drafter of `{algorithm}`" in message


@pytest.mark.parametrize("name", ALGORITHMS)
def test_each_bundled_module_runs_with_its_own_algorithm(
    model: LlamaForCausalLM, name: str, tmp_path: Path
) -> None:
    if name == "suffix" and importlib.util.find_spec("arctic_inference") is None:
        pytest.skip("suffix drafts with arctic-inference, not installed: the `suffix` extra")
    draft = None
    if name == "eagle3":  # no head ships for the random target: an untrained one
        draft = Eagle3Head.random(model, seed=1, layer_ids=[0, 1, 2]).save(tmp_path / "head")
    with Engine(
        model, algorithm=name, relay_module=_bundled(name), draft_model=draft, **DIMS
    ) as engine:
        (out,) = engine.generate([[3, 4, 5]], SamplingParams(max_new_tokens=3))
    assert out.finish_reason == "length" and len(out.token_ids) == 3


def test_checked_before_the_model_is_loaded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="cannot run with algorithm `eagle`"):
        Engine(tmp_path / "no-checkpoint-here", algorithm="eagle", relay_module=_bundled("ngram"))


def test_the_algorithm_class_checks_too(model: LlamaForCausalLM) -> None:
    """Callers that build a GeneratedAlgorithm themselves (tests' drivers) get the same error
    before a drafter is built."""
    with pytest.raises(ValueError, match="its ops `ngram_propose`, `ngram_splice` drive"):
        GeneratedAlgorithm("standalone", model, 4, module=_bundled("ngram"), **DIMS)


def test_an_op_the_user_implements_is_not_held_to_the_engines_drafter(
    model: LlamaForCausalLM,
) -> None:
    """The drafter an op needs is a property of the engine's implementation: with the user's
    own implementation of every drafting op the module may run under another algorithm."""
    impls = dict(lookup("ngram").impls())  # the engine's own, passed as the user's
    with pytest.raises(ValueError, match="none of its ops drives the drafter of `eagle`"):
        Engine(model, algorithm="eagle", relay_module=_bundled("ngram"), impls=impls, **DIMS)
    # The mismatch it would otherwise report is gone: only the eagle drafter's absence is left.
    with pytest.raises(ValueError) as info:
        Engine(model, algorithm="eagle", relay_module=_bundled("ngram"), **DIMS)
    assert "its ops `ngram_propose`, `ngram_splice` drive the drafter of `ngram`" in str(info.value)
