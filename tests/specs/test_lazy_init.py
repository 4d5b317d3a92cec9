"""`alloc: lazy` and `init:` (issue #50, item 5): a lazy field's rows resolve to None until
its first stash, so a fill value is never what a first read sees. The combination is a
located error, and the message for a field the prefill does not seed suggests an edit that
makes the first read defined -- which these tests apply and run."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from relayc.compiler.writer import compile_spec
from relayc.specs.errors import SpecErrors
from relayc.specs.loader import load_spec

DATA = Path(__file__).parent / "data"
TOPK_P = "topk_p: {dtype: float32, shape: [topk], doc: top-k probabilities}"
SEEDED = "stash: {bonus_tokens: next_tokens, topk_p: topk_p}\nsteps:"
UNSEEDED = "stash: {bonus_tokens: next_tokens}\nsteps:"


def tiny(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    text = (DATA / "tiny.yaml").read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    for name in ("shared.yaml", "tiny_ops.py"):
        shutil.copy(DATA / name, tmp_path / name)
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path


def errors_of(path: Path) -> list[str]:
    with pytest.raises(SpecErrors) as info:
        compile_spec(path, path.parent / "out")
    return [e.render() for e in info.value.errors]


def load(path: Path) -> ModuleType:
    output = compile_spec(path, path.parent / "out")
    output.path.parent.mkdir(exist_ok=True)
    output.path.write_text(output.text)
    name = f"lazy_init_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, output.path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("init", ["zeros", "0.5", "-1"])
@pytest.mark.parametrize("seeded", [True, False])
def test_lazy_with_init_is_located(tmp_path: Path, init: str, seeded: bool) -> None:
    """Refused whether or not the prefill seeds it: seeded, the fill would be dead text;
    not seeded, the first decode read None and failed deep in an op."""
    lazy = TOPK_P.replace("}", f", alloc: lazy, init: {init}}}")
    path = tiny(tmp_path, (TOPK_P, lazy), *([] if seeded else [(SEEDED, UNSEEDED)]))
    column = len("  ") + lazy.index("init: ") + len("init: ") + 1
    rendered = errors_of(path)
    assert rendered == [
        f"{path}:8:{column}: error: field `topk_p` is `alloc: lazy`: it has no buffer until its "
        "first stash, so its rows read None before then and the `init:` is never their value "
        "(drop `alloc: lazy` to allocate it filled with the `init:` value, or drop the "
        "`init:` and seed the field in the prefill step)"
    ]


@pytest.mark.parametrize(
    "declared", ["init: zeros", "init: 0.5", "alloc: lazy", "alloc: lazy, init: empty"]
)
def test_each_half_alone_compiles(tmp_path: Path, declared: str) -> None:
    assert compile_spec(tiny(tmp_path, (TOPK_P, TOPK_P.replace("}", f", {declared}}}"))), "o")


def test_unseeded_lazy_field_suggests_an_edit_that_works(tmp_path: Path) -> None:
    """The message used to suggest `init:` alone, which a lazy field cannot use; the edit it
    suggests now compiles, and the relay then answers a first read with the fill value."""
    lazy = TOPK_P.replace("}", ", alloc: lazy}")
    path = tiny(tmp_path, (TOPK_P, lazy), (SEEDED, UNSEEDED))
    (error,) = errors_of(path)
    assert error == (
        f"{path}:9:1: error: the prefill does not seed relay field `topk_p`, which step "
        "`decode` reads in a request's first decode iteration (stash it in the prefill step, "
        "or drop its `alloc: lazy` and give it an `init:` of zeros or a fill value so the "
        "first read is defined)"
    )
    fixed = tiny(tmp_path, (TOPK_P, TOPK_P.replace("}", ", init: 0.25}")), (SEEDED, UNSEEDED))
    assert load_spec(fixed).fields["topk_p"].alloc == "eager"
    module = load(fixed)
    relay = module.FutureMap(4, "cpu", dims={"topk": 2})
    first = relay.resolve(torch.tensor([2, 3])).topk_p  # no stash yet: a new request
    assert first is not None and first.tolist() == [[0.25, 0.25], [0.25, 0.25]]


def test_an_eager_unseeded_field_still_suggests_init(tmp_path: Path) -> None:
    (error,) = errors_of(tiny(tmp_path, (SEEDED, UNSEEDED)))
    assert "or give the field an `init:` of zeros or a fill value" in error
