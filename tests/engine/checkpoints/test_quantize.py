"""Q8_0, Q4_1 and Q4_0 quantization of a drafter after loading
(``Engine(draft_quantization="q8_0")``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize as gguf_quantize

from relayc.engine import Engine, SamplingParams
from relayc.engine.checkpoints.quantize import QUANTIZATIONS, QUANTIZERS, quantize_linears
from relayc.engine.core.layers import Linear
from relayc.engine.native.blocks import blocks_of, native_blocks
from relayc.engine.serving.engine_args import check_draft_quantization
from relayc.tools.generate import DRAFT_QUANTIZATIONS


def _matrix(rows: int, cols: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * 0.05
    w[0, :32] = 0.0  # an all-zero block: d = 0, every q 0
    w[1, :32] = torch.arange(-16, 16) * 0.25  # exact halves of d: the rounding's ties
    w[2, 32:64] = -w[2, 32:64].abs()  # a block whose maximum is negative
    if cols >= 64:  # largest magnitudes of both signs: Q4_0 takes the first one's sign
        w[0, 32:64] = torch.linspace(-0.25, 0.25, 32)
        w[0, 40], w[0, 33] = 0.5, -0.5
    return w


@pytest.mark.parametrize("qtype", QUANTIZATIONS)
@pytest.mark.parametrize(("rows", "cols"), [(3, 32), (17, 96), (64, 256)])
def test_the_bytes_are_llama_cpps(qtype: str, rows: int, cols: int) -> None:
    """The bytes the ``gguf`` package's reference quantizer writes, bit for bit, and the
    weights they hold are what the blocks dequantize to."""
    w = _matrix(max(rows, 3), cols, seed=cols)
    w[2, :32] = 0.3  # an all-equal block: Q4_1's d = 0
    blocks = QUANTIZERS[qtype](w)
    want = gguf_quantize(w.numpy(), getattr(GGMLQuantizationType, qtype.upper()))
    assert blocks.qtype == qtype.upper() and blocks.cols == cols
    np.testing.assert_array_equal(blocks.data.numpy(), want.reshape(blocks.data.shape))
    error = (blocks.dequantize() - w).abs().amax(dim=1)
    scale = w.abs().amax(dim=1)
    assert bool((error <= scale / {"q8_0": 100, "q4_1": 10, "q4_0": 6}[qtype]).all())


@pytest.mark.parametrize("qtype", QUANTIZATIONS)
def test_quantizers_refuse_what_they_cannot_hold(qtype: str) -> None:
    quantize = QUANTIZERS[qtype]
    with pytest.raises(ValueError, match=f"{qtype.upper()} quantizes matrices of whole blocks"):
        quantize(torch.zeros(4, 48))
    bad = torch.zeros(2, 32)
    bad[1, 3] = float("nan")
    with pytest.raises(ValueError, match=f"{qtype.upper()} cannot hold infinite or NaN"):
        quantize(bad)


class _Drafter(torch.nn.Module):
    """Two matrices of its own, one of the target's, and one the format cannot hold."""

    def __init__(self, shared: Linear) -> None:
        super().__init__()
        self.own = Linear(64, 32, torch.float32)
        self.head = Linear(32, 16, torch.float32)
        self.shared = shared
        self.odd = Linear(40, 8, torch.float32)  # 40 columns: not whole blocks
        for i, linear in enumerate((self.own, self.head, self.odd)):
            with torch.no_grad():
                linear.weight.copy_(torch.randn(linear.weight.shape) * 0.1 + i)


def test_quantize_linears_keeps_shared_and_unfit_weights() -> None:
    shared = Linear(32, 8, torch.float32)
    with torch.no_grad():
        shared.weight.normal_()
    drafter = _Drafter(shared)
    before = {name: p.detach().clone() for name, p in drafter.named_parameters()}
    done = quantize_linears(drafter, "q8_0", keep=shared.parameters())
    assert done == ["own.weight", "head.weight"]
    for name in ("shared.weight", "odd.weight"):
        assert torch.equal(dict(drafter.named_parameters())[name], before[name])
    for name in done:
        weight = dict(drafter.named_parameters())[name]
        blocks = blocks_of(weight)  # checked against the values, as the packer checks them
        assert blocks is not None and blocks.qtype == "Q8_0"
        assert native_blocks(weight) is blocks
        assert torch.equal(weight, blocks.dequantize())
        # at most half a step of its block's scale, plus the scale's float16 rounding
        # (2^-11 of it, up to 127 times)
        step = before[name].abs().reshape(-1, 32).amax(-1, keepdim=True) / 127
        error = (weight - before[name]).abs().reshape(-1, 32)
        assert bool((error <= step * (0.5 + 127 * 2**-11)).all())
    with pytest.raises(ValueError, match="unknown quantization 'q2_k'"):
        quantize_linears(drafter, "q2_k")


def test_draft_quantization_argument_is_checked() -> None:
    assert DRAFT_QUANTIZATIONS == QUANTIZATIONS  # `relayc generate --draft-quantization`
    assert check_draft_quantization(None) is None
    assert check_draft_quantization("Q8_0") == "q8_0"
    assert check_draft_quantization("Q4_1") == "q4_1"
    with pytest.raises(ValueError, match="one of 'q8_0', 'q4_1', 'q4_0' or None; got 'int4'"):
        check_draft_quantization("int4")
    with pytest.raises(TypeError, match="got True"):
        check_draft_quantization(True)


@pytest.fixture(scope="module")
def greedy_none() -> list[list[int]]:
    engine = Engine(overlap=False)
    prompts = ["def fib(n):", "import os\n", "class Relay:"]
    return [o.token_ids for o in engine.generate(prompts, SamplingParams(max_new_tokens=20))]


@pytest.mark.parametrize(
    ("algorithm", "qtype"),
    [("eagle3", "q8_0"), ("standalone", "q8_0"), ("eagle3", "q4_1"), ("standalone", "q4_0")],
)
def test_quantized_drafters_keep_the_tokens(
    algorithm: str, qtype: str, greedy_none: list[list[int]]
) -> None:
    """The drafter reads the blocks; the target verifies, so every token is `none`'s."""
    engine = Engine(algorithm=algorithm, overlap=False, draft_quantization=qtype)
    assert engine.draft_quantized
    (drafter,) = engine.algorithm.draft_modules()
    target = {id(p) for p in engine.model.parameters()}
    quantized = {id(drafter.get_parameter(name)) for name in engine.draft_quantized}
    for name, param in drafter.named_parameters():  # a tied embedding is its head's weight
        assert (id(param) in quantized) == (blocks_of(param) is not None), name
        blocks = blocks_of(param)
        assert blocks is None or blocks.qtype == qtype.upper(), name
        assert not (id(param) in quantized and id(param) in target), name
    prompts = ["def fib(n):", "import os\n", "class Relay:"]
    out = engine.generate(prompts, SamplingParams(max_new_tokens=20))
    assert [o.token_ids for o in out] == greedy_none


def test_draft_quantization_needs_a_drafter_with_weights() -> None:
    with pytest.raises(ValueError, match="`ngram` drafts without any: drop it"):
        Engine(algorithm="ngram", draft_quantization="q8_0")
    with pytest.raises(ValueError, match=r"its weights are torch.bfloat16\); load the models as"):
        Engine(algorithm="eagle3", dtype="bfloat16", draft_quantization="q8_0")
