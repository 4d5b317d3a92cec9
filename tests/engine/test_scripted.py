"""The scripted CPU decoder (relayc.engine.scripted) against the eager layers: same bits."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import relayc.engine.model as model_module
import relayc.engine.scripted as scripted_module
from relayc.engine import Engine, SamplingParams
from relayc.engine.model import LlamaForCausalLM, use_cpu_matmul_layout
from relayc.engine.weights import random_model
from tests.engine.helpers import PagedDriver


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _session(model: LlamaForCausalLM) -> list[torch.Tensor]:
    """Mixed-length prefill (the gathered path), chunked prefill, decode, tree verify."""
    driver = PagedDriver(model, shuffle_seed=7)
    reqs = [driver.new_request() for _ in range(3)]
    out = [driver.extend(reqs, [_tokens(n, seed=n) for n in (5, 11, 2)])]
    out.append(driver.extend(reqs[:2], [_tokens(4, seed=1), _tokens(4, seed=2)]))
    for step in range(3):
        out.append(driver.decode(reqs, [7 + step, 100, 255]))
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    out.append(
        driver.verify(
            reqs[:2],
            [[3, 4, 5, 6], [9, 8, 7, 6]],
            [[0, 1, 1, 2]] * 2,
            mask[None].expand(2, -1, -1).contiguous(),
        )
    )
    return out


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many forwards ran through the scripted function."""
    calls: list[int] = []
    real = scripted_module.scripted_layers()
    assert real is not None, "TorchScript should take the decoder on this torch"

    def counting() -> Callable[..., torch.Tensor]:
        def run(*args: Any, **kwargs: Any) -> torch.Tensor:
            calls.append(1)
            return real(*args, **kwargs)

        return run

    monkeypatch.setattr(model_module, "scripted_layers", counting)
    return calls


def test_scripted_forward_is_bit_identical_to_eager(counted: list[int]) -> None:
    scripted = random_model(seed=21)
    eager = random_model(seed=21)
    use_cpu_matmul_layout(scripted)
    use_cpu_matmul_layout(eager, scripted=False)
    assert scripted.scripted is not None and eager.scripted is None
    got, expected = _session(scripted), _session(eager)
    assert len(counted) == len(got)  # every forward took the scripted path
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)


def test_autograd_and_dense_forwards_stay_eager(counted: list[int]) -> None:
    model = random_model(seed=4)
    use_cpu_matmul_layout(model)
    ids = torch.tensor([256, 1, 2, 3])
    model.forward_dense(ids)  # no paged attention to script
    model.forward_train(ids[None])  # autograd on
    assert counted == []


def test_replaced_weights_are_never_stale(counted: list[int]) -> None:
    """A parameter replaced after the layout (new ``.data``, or an assigned Parameter) is
    what the next forward uses: the scripted weights are rebuilt, or the forward runs
    eagerly while a fused weight is stale."""
    model = random_model(seed=8)
    reference = random_model(seed=8)
    use_cpu_matmul_layout(model)
    use_cpu_matmul_layout(reference, scripted=False)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        o_proj = model.model.layers[1].self_attn.o_proj
        new_o = torch.randn(o_proj.weight.shape, generator=gen)
        o_proj.weight.data = new_o.clone()  # not fused: the scripted weights are rebuilt
        reference.model.layers[1].self_attn.o_proj.weight.copy_(new_o)
        norm = model.model.layers[0].post_attention_layernorm
        new_norm = torch.randn(norm.weight.shape, generator=gen)
        norm.weight = torch.nn.Parameter(new_norm.clone())
        reference.model.layers[0].post_attention_layernorm.weight.copy_(new_norm)
    # (close, not equal: the new o_proj weight is row-major, the reference's column-major)
    for a, b in zip(_session(model), _session(reference), strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    assert counted  # still scripted
    counted.clear()
    with torch.no_grad():
        k_proj = model.model.layers[0].self_attn.k_proj
        new_k = torch.randn(k_proj.weight.shape, generator=gen)
        k_proj.weight.data = new_k.clone()  # the fused q/k/v copy is stale now
        reference.model.layers[0].self_attn.k_proj.weight.copy_(new_k)
    for a, b in zip(_session(model), _session(reference), strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)  # eager, unfused for k
    assert counted == []
    use_cpu_matmul_layout(model)  # fuse again: scripted again
    _session(model)
    assert counted


def test_a_torch_that_cannot_script_runs_eagerly_with_one_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(fn: object) -> object:
        raise RuntimeError("no TorchScript here")

    monkeypatch.setattr(scripted_module, "_compiled", None)
    monkeypatch.setattr(scripted_module, "_failed", False)
    monkeypatch.setattr(torch.jit, "script", refuse)
    model = random_model(seed=21)
    reference = random_model(seed=21)
    use_cpu_matmul_layout(model)
    use_cpu_matmul_layout(reference, scripted=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _session(model)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "no TorchScript here" in messages[0], messages
    for a, b in zip(got, _session(reference), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("algorithm", ["eagle", "standalone"])
def test_drafting_engines_give_the_same_tokens_and_accepts(
    algorithm: str, counted: list[int]
) -> None:
    """The draft model's stack and the EAGLE head's single layer are scripted as well."""
    prompts = [_tokens(n, seed=30 + n) for n in (6, 13, 9)]
    params = SamplingParams(max_new_tokens=12)
    results = []
    for scripted in (True, False):
        engine = Engine("random", algorithm=algorithm, overlap=False)
        for module in (engine.model, *engine.algorithm.draft_modules()):
            use_cpu_matmul_layout(module, scripted=scripted)
        outs = engine.generate(prompts, params)
        engine.close()
        results.append([(o.token_ids, o.accept_lengths) for o in outs])
        if scripted:
            assert counted
            counted.clear()
    assert results[0] == results[1]
    assert counted == []
