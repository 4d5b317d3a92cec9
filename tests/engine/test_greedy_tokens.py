"""`greedy_tokens` (the CPU argmax of greedy decoding and greedy verify: the native
library's ``relayc_argmax``, else chunked torch) against `torch.argmax`: the same index on
ties, NaN, infinities, signed zeros and every shape it takes, on both paths."""

from __future__ import annotations

import pytest
import torch

from relayc.engine.native import library as native
from relayc.engine.ops.target import _ARGMAX_CHUNK, greedy_tokens


@pytest.fixture(params=["native", "torch"], autouse=True)
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs on the native argmax and on the chunked torch one."""
    if request.param == "native":
        if native.native_decoder() is None:
            pytest.skip("no native library here")
    else:
        monkeypatch.setattr(native, "native_decoder", lambda: None)
    return str(request.param)


@pytest.mark.parametrize("rows", [(1,), (3,), (8,), (2, 8), (1, 1, 5)])
@pytest.mark.parametrize(
    "vocab", [1, 7, 17, 259, 4 * _ARGMAX_CHUNK, 48 * _ARGMAX_CHUNK, 4 * _ARGMAX_CHUNK + 1]
)
def test_greedy_tokens_equals_argmax(rows: tuple[int, ...], vocab: int) -> None:
    generator = torch.Generator().manual_seed(vocab + sum(rows))
    # Few distinct values: ties everywhere, across chunks and inside them.
    logits = torch.randint(-3, 4, (*rows, vocab), generator=generator).float()
    flat = logits.view(-1, vocab)
    flat[0].fill_(1.0)  # one row all ties
    if flat.shape[0] > 2:
        flat[1, vocab // 2] = float("nan")
        flat[1, vocab - 1] = float("nan")
        flat[2].fill_(float("-inf"))
    if flat.shape[0] > 4:
        flat[3, vocab - 1] = float("inf")
        flat[4, max(0, vocab - _ARGMAX_CHUNK - 1)] = 5.0  # the last chunk but one
    got = greedy_tokens(logits)
    assert got.dtype == torch.int64 and got.shape == rows
    assert torch.equal(got, torch.argmax(logits, dim=-1))


def test_greedy_tokens_on_random_bfloat16_logits() -> None:
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(8, 48 * _ARGMAX_CHUNK, generator=generator).bfloat16().float()
        assert torch.equal(greedy_tokens(logits), torch.argmax(logits, dim=-1))
    strided = torch.randn(4, 8 * _ARGMAX_CHUNK, generator=generator)[:, ::2]
    assert torch.equal(greedy_tokens(strided), torch.argmax(strided, dim=-1))


@pytest.mark.parametrize("vocab", [5, 16, 33, 48 * _ARGMAX_CHUNK])
def test_greedy_tokens_nan_and_signed_zeros(vocab: int) -> None:
    """The first NaN wins wherever it sits (first element, a vector, the tail); a maximum
    of zero is the first zero of either sign, as torch compares them equal."""
    rows = []
    for at in sorted({0, 1, vocab // 2, vocab - 1}):
        row = torch.full((vocab,), -1.0)
        row[at] = float("nan")
        row[-1] = float("inf") if at != vocab - 1 else row[-1]
        rows.append(row)
    zeros = torch.full((vocab,), -2.0)
    zeros[vocab // 3] = -0.0
    zeros[vocab - 1] = 0.0
    rows.append(zeros)
    logits = torch.stack(rows)
    assert torch.equal(greedy_tokens(logits), torch.argmax(logits, dim=-1))
