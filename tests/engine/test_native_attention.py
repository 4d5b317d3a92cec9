"""attention.c's attention over long cached contexts, and the exponential it and SiLU share.

The native layers attend each KV head's keys once for all the query heads that share it
and all the rows of a verify (`attend_group`), four keys at a time, with the head size
unrolled for 32, 64 and 128 and a generic path for any other; `exp16` is their e^x.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import relayc.engine.native.library as native_module
from relayc.engine.core.config import ModelConfig
from relayc.engine.model.llama import use_cpu_matmul_layout
from relayc.engine.model.weights import random_model
from tests.engine.helpers import PagedDriver
from tests.tolerance import assert_forwards_close


def _native() -> Any:
    lib = native_module.native_decoder()
    assert lib is not None, "the native decoder should build here"
    return lib


def _exp(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    assert _native().relayc_exp(x.data_ptr(), x.numel(), out.data_ptr()) == 0
    return out


def _ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|got - want| in units of float32's last place at ``want`` (want normal, float64)."""
    ulp = torch.finfo(torch.float32).eps * torch.exp2(torch.floor(torch.log2(want)))
    return (got.double() - want).abs() / ulp


def test_exp_is_within_one_ulp_over_the_whole_range() -> None:
    x = torch.linspace(-104.0, 88.72283172607421875, 1_000_003, dtype=torch.float32)
    got, want = _exp(x), torch.exp(x.double())
    normal = (want >= torch.finfo(torch.float32).tiny) & (want <= torch.finfo(torch.float32).max)
    assert normal.sum() > 900_000
    assert _ulps(got[normal], want[normal]).max() <= 1.0
    # subnormal results: within one unit of the smallest subnormal
    sub = ~normal & (want > 0)
    assert sub.any()
    assert ((got[sub].double() - want[sub]).abs() / 2.0**-149).max() <= 1.0


def test_exp_edges() -> None:
    top = 88.72283172607421875  # the largest float32 whose e^x is finite
    inf, nan = float("inf"), float("nan")
    x = torch.tensor(
        [0.0, -0.0, 1e-30, -1e-30, top, 88.7228393554, 1e4, -103.0, -104.01, -1e4, inf, -inf, nan]
    )
    got = _exp(x)
    assert got[:4].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert torch.isfinite(got[4]) and got[4] > 3.4e38
    assert got[5] == float("inf") and got[6] == float("inf")
    assert got[7] == 2.0**-149  # e^-103 rounds to the smallest subnormal
    assert got[8] == 0 and got[9] == 0
    assert got[10] == float("inf") and got[11] == 0 and torch.isnan(got[12])
    # every length: the last few lanes take the padded path with the same bits
    y = torch.linspace(-20, 20, 37)
    whole = _exp(y)
    for n in (1, 15, 16, 17, 33):
        assert torch.equal(_exp(y[:n]), whole[:n]), n


# head size: 64 and 32 (the shipped models), 128 (unrolled too), 48 and 24 (the generic
# path: whole sixteens and a tail, or a tail only past one sixteen); query heads per KV
# head: 1, 2, 6 and 8 (more than the four whose values one pass keeps in registers)
SHAPES = [(64, 4, 2), (32, 4, 2), (64, 8, 1), (128, 2, 1), (48, 6, 1), (24, 2, 2)]


@pytest.mark.parametrize(("head_dim", "heads", "kv_heads"), SHAPES)
def test_long_context_rows_agree_and_match_the_eager_layers(
    head_dim: int,
    heads: int,
    kv_heads: int,
    native_calls: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 150-token cached prompt on scattered KV slots, then 37 tokens decoded one at a
    time and the same 37 verified as one chain: the same bits (the verify's rows are
    attended in passes of up to 64 (row, head) pairs, four keys at a time, so 37 rows of
    one to six heads cross every pass and key-group boundary), and the eager layers'
    logits within float32 rounding (tests/tolerance.py)."""
    config = ModelConfig(
        hidden_size=heads * head_dim,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        num_layers=2,
        intermediate_size=96,
    )
    generator = torch.Generator().manual_seed(head_dim)
    prompt = torch.randint(0, 256, (150,), generator=generator).tolist()
    chain = torch.randint(0, 256, (37,), generator=generator).tolist()
    causal = torch.ones(1, len(chain), len(chain), dtype=torch.bool).tril()

    def drive(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
        one = PagedDriver(model, shuffle_seed=3)
        req = one.new_request()
        one.extend([req], [prompt])
        decoded = torch.cat([one.decode([req], [t]) for t in chain])
        two = PagedDriver(model, shuffle_seed=4)
        req = two.new_request()
        two.extend([req], [prompt])
        return decoded, two.verify([req], [chain], [list(range(len(chain)))], causal)

    native = random_model(config, seed=head_dim)
    use_cpu_matmul_layout(native)
    decoded, verified = drive(native)
    assert native_calls.count(1) == len(chain) and 37 in native_calls, native_calls
    assert torch.equal(decoded, verified)

    eager = random_model(config, seed=head_dim)
    use_cpu_matmul_layout(eager, scripted=False)
    monkeypatch.setattr(native_module, "native_decoder", lambda: None)
    eager_decoded, eager_verified = drive(eager)
    # (the float32 sums' order differs; 187 tokens attended at most)
    assert_forwards_close(decoded, eager_decoded, config, context=187)
    assert_forwards_close(verified, eager_verified, config, context=187)
