"""`greedy_tokens` (the chunked CPU argmax of greedy decoding and greedy verify) against
`torch.argmax`: the same index on ties, NaN, infinities and every shape it takes."""

from __future__ import annotations

import pytest
import torch

from relayc.engine.ops.target import _ARGMAX_CHUNK, greedy_tokens


@pytest.mark.parametrize("rows", [(1,), (3,), (8,), (2, 8), (1, 1, 5)])
@pytest.mark.parametrize(
    "vocab", [259, 4 * _ARGMAX_CHUNK, 48 * _ARGMAX_CHUNK, 4 * _ARGMAX_CHUNK + 1]
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
