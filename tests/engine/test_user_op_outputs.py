"""What an op implementation returns is checked against the op's declaration when the op
returns (issue 23, class 4): a narrower logits row or int32 logits used to run to completion
and emit garbage tokens, or to surface deep in torch."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from relayc.cli import main
from relayc.engine import Engine, LlamaForCausalLM, SamplingParams, random_model
from relayc.engine.ops import implementations
from relayc.engine.ops.registry import OpOutputError
from relayc.nodes import Op, TensorType, register
from relayc.specs.loader import BUNDLED_DIR
from tests.engine.engine_helpers import (
    assert_idle,
    one_intra_op_thread,  # noqa: F401 - autouse fixture
)

BUILTIN = implementations()
PROMPTS = [[4, 5, 6], [7, 8]]
PARAMS = SamplingParams(max_new_tokens=4)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(seed=3)


def _decode_returning(change: Any) -> Any:
    """`target_decode` as the engine implements it, its logits passed through ``change``."""

    def target_decode(ctx: Any, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": change(BUILTIN["target_decode"](ctx, **inputs)["logits"])}

    return target_decode


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
@pytest.mark.parametrize(
    ("change", "actual"),
    [
        (lambda logits: logits[:, :-1], "[2, {vocab_1}] float32"),  # a narrower logits row
        (lambda logits: logits.to(torch.int32), "[2, {vocab}] int32"),
        (lambda logits: logits[:1], "[1, {vocab}] float32"),  # rows missing
    ],
    ids=["narrow-row", "int32", "rows"],
)
def test_a_replaced_builtin_returning_another_shape_or_dtype(
    model: LlamaForCausalLM, change: Any, actual: str, overlap: bool
) -> None:
    vocab = model.config.vocab_size
    engine = Engine(model, overlap=overlap, impls={"target_decode": _decode_returning(change)})
    with pytest.raises(OpOutputError) as info:
        engine.generate(PROMPTS, PARAMS)
    assert str(info.value) == (
        "op `target_decode` (implementation `_decode_returning.<locals>.target_decode`) "
        f"returned output `logits` as `{actual.format(vocab=vocab, vocab_1=vocab - 1)}`; the op "
        f"declares `[rows, vocab] float32`, here `[2, {vocab}] float32`: return that shape and dtype (the steps after it and the "
        "relay read the output as declared)"
    )
    assert_idle(engine)  # the failed step returned every slot
    engine.close()


def test_a_conforming_replacement_runs(model: LlamaForCausalLM) -> None:
    with Engine(model, impls={"target_decode": _decode_returning(lambda x: x)}) as engine:
        outs = engine.generate(PROMPTS, PARAMS)
    with Engine(model) as engine:
        assert [o.token_ids for o in outs] == [
            o.token_ids for o in engine.generate(PROMPTS, PARAMS)
        ]


def test_not_a_dict_and_not_a_tensor(model: LlamaForCausalLM) -> None:
    def sample_tensor(ctx: Any, *, logits: torch.Tensor) -> Any:
        return logits.argmax(-1)

    def sample_list(ctx: Any, *, logits: torch.Tensor) -> Any:
        return {"next_tokens": logits.argmax(-1).tolist()}

    with Engine(model, impls={"sample": sample_tensor}) as engine:
        with pytest.raises(
            OpOutputError, match=r"returned Tensor; an implementation returns a dict"
        ):
            engine.generate(PROMPTS, PARAMS)
    with Engine(model, impls={"sample": sample_list}) as engine:
        with pytest.raises(
            OpOutputError,
            match=r"output `next_tokens` as list; the op declares a tensor `\[rows\] int64`",
        ):
            engine.generate(PROMPTS, PARAMS)


@pytest.mark.parametrize("graphs", ["off", "static"])
def test_speculative_step_outputs_are_checked(model: LlamaForCausalLM, graphs: str) -> None:
    """An accept op returning int64 counts in a tree algorithm, eager and on the static-buffer
    path that CUDA graph capture runs."""

    def accept_tree(ctx: Any, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        out = dict(BUILTIN["accept_tree"](ctx, **inputs))
        out["accept_lens"] = out["accept_lens"].long()
        return out

    engine = Engine(
        model,
        algorithm="eagle",
        num_steps=2,
        topk=2,
        num_draft_tokens=4,
        graphs=graphs,
        capture_batch_sizes=[1, 2, 4],
        max_batch_size=4,
        impls={"accept_tree": accept_tree},
    )
    with pytest.raises(OpOutputError) as info:
        engine.generate(PROMPTS, PARAMS)
    assert "output `accept_lens` as `[2] int64`; the op declares `[rows] int32`" in str(info.value)
    engine.close()


def _compiled_none_with(tmp_path: Path, op_name: str) -> ModuleType:
    """The bundled `none` spec with its sampler replaced by the user op ``op_name``."""
    text = (
        (BUNDLED_DIR / "none.yaml").read_text().replace("    op: sample\n", f"    op: {op_name}\n")
    )
    text = re.sub(r"(?m)^algorithm: \w+$", "algorithm: none_checked", text)
    text += f"ops: [{__name__}]\n"
    shutil.copy(BUNDLED_DIR / "common.yaml", tmp_path / "common.yaml")
    (tmp_path / "none_checked.yaml").write_text(text)
    assert main(["compile", str(tmp_path / "none_checked.yaml"), "-o", str(tmp_path / "out")]) == 0
    spec = importlib.util.spec_from_file_location(
        "none_checked", tmp_path / "out" / "none_checked.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_user_op_is_checked_against_its_registration(
    model: LlamaForCausalLM, tmp_path: Path
) -> None:
    register(
        Op(
            "checked_sample",
            {"logits": TensorType("float32", ("vocab",))},
            {"next_tokens": TensorType("int64", ())},
        ),
        module=__name__,
    )
    module = _compiled_none_with(tmp_path, "checked_sample")

    def float_tokens(ctx: Any, *, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"next_tokens": logits.argmax(-1).float()}

    engine = Engine(model, relay_module=module, impls={"checked_sample": float_tokens})
    with pytest.raises(
        OpOutputError, match=r"as `\[2\] float32`; the op declares `\[rows\] int64`"
    ):
        engine.generate(PROMPTS, PARAMS)
    engine.close()
    with Engine(model, relay_module=module, impls={"checked_sample": BUILTIN["sample"]}) as engine:
        assert all(o.finish_reason == "length" for o in engine.generate(PROMPTS, PARAMS))
