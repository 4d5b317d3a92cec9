"""The native GEMM of a plain Linear (``NativeLinear``, gemm.c's ``relayc_linear``): an
EAGLE-3 head's ``fc`` in every weight layout the native decoder reads."""

from __future__ import annotations

import pytest
import torch

from relayc.engine.checkpoints.quantize import quantize_linears
from relayc.engine.core.layers import Linear
from relayc.engine.decoder.head import NativeLinear
from relayc.engine.native import library as native
from tests.tolerance import gemm_atol


def _linear(rows: int, cols: int, layout: str, seed: int) -> Linear:
    linear = Linear(cols, rows, torch.bfloat16 if layout == "bfloat16" else torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(rows, cols, generator=g) * 0.05)
        if layout == "words":  # float32 holding bfloat16 values: read as two-byte words
            linear.weight.copy_(linear.weight.to(torch.bfloat16).float())
    if layout == "q8_0":
        assert quantize_linears(linear, "q8_0") == ["weight"]
    return linear


@pytest.mark.parametrize("layout", ["float32", "words", "q8_0", "bfloat16"])
@pytest.mark.parametrize(("rows", "cols"), [(576, 1728), (40, 96)])
def test_native_linear_is_the_module_row_by_row(layout: str, rows: int, cols: int) -> None:
    lib = native.native_decoder()
    assert lib is not None, "the native library should build here"
    linear = _linear(rows, cols, layout, seed=rows)
    packed = NativeLinear(linear)
    assert packed.format == {"float32": 0, "words": 5, "q8_0": 2, "bfloat16": -1}[layout]
    x = torch.randn(7, cols, generator=torch.Generator().manual_seed(1)).to(linear.weight.dtype)
    got = packed(lib, x)
    assert got.shape == (7, rows) and got.dtype == linear.weight.dtype
    want = linear(x).float()
    scale = want.abs().max().item()
    tolerance = 2e-2 if layout == "bfloat16" else 1e-5  # bfloat16 rounds the inputs
    assert (got.float() - want).abs().max().item() <= tolerance * scale
    # each row on its own: the same bits alone, in any batch, under any leading shape
    alone = torch.cat([packed(lib, x[i : i + 1]) for i in range(7)])
    assert torch.equal(alone, got)
    assert torch.equal(packed(lib, x.view(7, 1, cols)).view(7, rows), got)


def test_a_changed_weight_is_packed_again() -> None:
    lib = native.native_decoder()
    assert lib is not None
    linear = _linear(64, 64, "float32", seed=3)
    first = NativeLinear.reuse(None, linear)
    assert NativeLinear.reuse(first, linear) is first
    with torch.no_grad():
        linear.weight.mul_(2.0)
    second = NativeLinear.reuse(first, linear)
    assert second is not first
    x = torch.randn(3, 64)
    want = linear(x)
    torch.testing.assert_close(second(lib, x), want, atol=gemm_atol(64, want), rtol=0)
    with pytest.raises(ValueError, match=r"takes \[\.\.\., 64\]"):
        second(lib, torch.zeros(3, 32))
