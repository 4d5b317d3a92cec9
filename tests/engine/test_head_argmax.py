"""The native LM head's argmax (``relayc_head_argmax``) and the memo that hands it to the ops
(`relayc.engine.native.head_argmax`).

The head must give the same logits as the plain head entries, bit for bit, and the argmax
``torch.argmax`` gives on those logits over the vocabulary (never a padding column), for
every weight layout, with ties, NaN and infinities placed across its column chunks. The
memo must answer only for the very logits the head made, unchanged.
"""

from __future__ import annotations

import ctypes
import threading

import pytest
import torch

from relayc.engine.decoder.head import NativeHead
from relayc.engine.decoder.packing import _pack
from relayc.engine.native import head_argmax
from relayc.engine.native import library as native
from relayc.engine.native.blocks import random_blocks
from relayc.engine.ops.target import greedy_tokens

CHUNK = 1024  # head.c's ARGMAX_CHUNK


def _lib() -> ctypes.CDLL:
    lib = native.native_decoder()
    if lib is None:
        pytest.skip("no native library here")
    return lib


def _packed(kind: str, weight: torch.Tensor) -> tuple[torch.Tensor, int, torch.Tensor]:
    """(panels, the entry's format code, the weight the panels hold) for ``kind``."""
    if kind == "float32":
        return _pack(weight), 0, weight
    if kind == "bfloat16":
        rounded = weight.to(torch.bfloat16)
        return _pack(rounded), -1, rounded.float()
    blocks = random_blocks(kind, weight.shape[0], weight.shape[1], seed=weight.shape[0])
    return blocks.panels(), blocks.format, blocks.dequantize()


def _run(
    kind: str, x: torch.Tensor, weight: torch.Tensor, vocab: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits of relayc_head_argmax, its argmax, logits of the plain entry), the logits
    poisoned before each call; ``vocab`` below the weight's rows leaves the rest padding."""
    lib = _lib()
    packed, fmt, _ = _packed(kind, weight)
    rows, width = x.shape
    padded = -(-weight.shape[0] // 16) * 16
    vocab = weight.shape[0] if vocab is None else vocab
    norm = torch.ones(width)
    x = x.contiguous()
    ptrs = (x.data_ptr(), norm.data_ptr(), ctypes.c_float(0.0), packed.data_ptr())
    with_argmax = torch.full((rows, padded), float("nan"))
    argmax = torch.full((rows,), -7, dtype=torch.int64)
    code = lib.relayc_head_argmax(
        rows, width, padded, vocab, *ptrs, with_argmax.data_ptr(), fmt, argmax.data_ptr()
    )
    assert code == 0
    plain = torch.full((rows, padded), float("nan"))
    if fmt > 0:
        code = lib.relayc_head_blocks(rows, width, padded, *ptrs, plain.data_ptr(), fmt)
    elif fmt == 0:
        code = lib.relayc_head(rows, width, padded, *ptrs, plain.data_ptr())
    else:
        code = lib.relayc_head_bf16(rows, width, padded, *ptrs, plain.data_ptr())
    assert code == 0
    return with_argmax, argmax, plain


KINDS = ["float32", "bfloat16", "Q4_1", "Q8_0", "Q4_K", "Q6_K", "F16"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("vocab", [64, 1040, 3 * CHUNK])
def test_head_argmax_gives_the_plain_logits_and_their_argmax(
    kind: str, rows: int, vocab: int
) -> None:
    generator = torch.Generator().manual_seed(vocab * 10 + rows)
    x = torch.randn(rows, 256, generator=generator)
    weight = torch.randn(vocab, 256, generator=generator) / 16
    logits, argmax, plain = _run(kind, x, weight)
    assert torch.equal(logits, plain)  # bit for bit: the chunks change no column's sum
    assert torch.equal(argmax, torch.argmax(logits, dim=-1))


def test_head_argmax_ties_nan_and_infinities_across_chunks() -> None:
    """Float32 panels with chosen columns: equal maxima in two chunks (the first wins), a
    row whose maximum is in the last chunk, +inf, -inf everywhere, and NaN (the first NaN
    wins even where a larger number or an infinity comes first)."""
    vocab, width = 3 * CHUNK + 16, 32
    weight = -torch.ones(vocab, width) / width  # every logit -1 for x = ones
    x = torch.ones(5, width)
    x[1] *= -1  # row 1: every logit +1: all tied, argmax 0
    x[3] *= float("inf")  # row 3: every logit -inf, argmax 0
    x[4, 0] = float("nan")  # row 4: every logit NaN, argmax 0
    weight[CHUNK - 1] = 1.0 / width  # rows 0 and 2: +1 at CHUNK-1 and CHUNK+5, a tie
    weight[CHUNK + 5] = 1.0 / width
    logits, argmax, plain = _run("float32", x, weight)
    assert torch.equal(argmax, torch.argmax(logits, dim=-1))
    assert argmax.tolist() == [CHUNK - 1, 0, CHUNK - 1, 0, 0]
    # a NaN in a later chunk beats any number before it; +inf then NaN: the NaN
    weight[2 * CHUNK + 3] = float("nan")
    weight[10] = float("inf")
    logits, argmax, plain = _run("float32", x[:3], weight)
    assert torch.equal(argmax, torch.argmax(logits, dim=-1))
    assert argmax.tolist() == [2 * CHUNK + 3] * 3
    torch.testing.assert_close(logits, plain, equal_nan=True, rtol=0, atol=0)


def test_head_argmax_refuses_what_it_cannot_read() -> None:
    """An unknown weight format, no argmax buffer, or a vocabulary wider than the padded
    row: refused (-2), nothing read or written."""
    lib = _lib()
    x, norm, packed = torch.ones(1, 32), torch.ones(32), _pack(torch.ones(16, 32))
    out, argmax = torch.zeros(1, 16), torch.zeros(1, dtype=torch.int64)
    ptrs = (x.data_ptr(), norm.data_ptr(), ctypes.c_float(0.0), packed.data_ptr(), out.data_ptr())
    assert lib.relayc_head_argmax(1, 32, 16, 16, *ptrs, -2, argmax.data_ptr()) == -2
    assert lib.relayc_head_argmax(1, 32, 16, 16, *ptrs, 99, argmax.data_ptr()) == -2
    assert lib.relayc_head_argmax(1, 32, 16, 17, *ptrs, 0, argmax.data_ptr()) == -2
    assert lib.relayc_head_argmax(1, 32, 16, 16, *ptrs, 0, None) == -2
    assert lib.relayc_head_argmax(1, 32, 16, 16, *ptrs, 0, argmax.data_ptr()) == 0


def test_head_argmax_never_picks_a_padding_column() -> None:
    """With every real logit negative, the zero logits past ``vocab`` would win an argmax
    over the padded row; the head's argmax covers the vocabulary only."""
    width = 32
    weight = -torch.rand(1000, width, generator=torch.Generator().manual_seed(1)) - 0.5
    x = torch.rand(2, width) + 0.5
    logits, argmax, _ = _run("float32", x, weight, vocab=990)
    assert torch.equal(argmax, torch.argmax(logits[:, :990], dim=-1))
    assert logits[:, 990:].max() >= -1e-6 > logits[:, :990].max()  # the padding would win


class _Norm(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))
        self.eps = 1e-6


def _native_head(vocab: int = 2 * CHUNK, width: int = 64) -> NativeHead:
    _lib()
    lm_head = torch.nn.Linear(width, vocab, bias=False)
    with torch.no_grad():
        lm_head.weight.copy_(torch.randn(vocab, width, generator=torch.Generator().manual_seed(2)))
    return NativeHead(_Norm(width), lm_head)  # type: ignore[arg-type]


def test_memo_answers_for_the_head_logits_and_their_views_only() -> None:
    head = _native_head()
    hidden = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(3))
    logits = head.logits(_lib(), hidden)
    want = torch.argmax(logits, dim=-1)
    known = head_argmax.lookup(logits)
    assert known is not None and torch.equal(known, want) and known.shape == (2, 4)
    flat = logits.view(8, -1)  # the same rows, another shape: still known
    assert torch.equal(head_argmax.lookup(flat), want.view(8))  # type: ignore[arg-type]
    assert torch.equal(greedy_tokens(logits), want)
    # other rows, a copy: not known, and greedy_tokens still right
    assert head_argmax.lookup(logits[1]) is None
    assert head_argmax.lookup(logits.clone()) is None
    assert head_argmax.lookup(logits[:, :, :CHUNK]) is None
    # changed in place after the head: the memo must not answer any more
    logits[0, 0, 7] = 1e9
    assert head_argmax.lookup(logits) is None
    assert greedy_tokens(logits)[0, 0].item() == 7
    assert torch.equal(greedy_tokens(logits), torch.argmax(logits, dim=-1))


def test_memo_is_per_thread_and_replaced_by_the_next_head() -> None:
    head = _native_head()
    generator = torch.Generator().manual_seed(4)
    first = head.logits(_lib(), torch.randn(3, 64, generator=generator))
    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.append(head_argmax.lookup(first)))
    thread.start()
    thread.join()
    assert seen == [None]
    second = head.logits(_lib(), torch.randn(3, 64, generator=generator))
    assert head_argmax.lookup(first) is None
    assert torch.equal(head_argmax.lookup(second), torch.argmax(second, dim=-1))  # type: ignore[arg-type]
    head_argmax.forget()
    assert head_argmax.lookup(second) is None


def test_memo_skips_many_rows() -> None:
    """A head call of more than MAX_ROWS rows takes the plain entry and holds nothing."""
    head = _native_head(vocab=64)
    hidden = torch.randn(head_argmax.MAX_ROWS + 1, 64)
    logits = head.logits(_lib(), hidden)
    assert head_argmax.lookup(logits) is None
    assert torch.equal(greedy_tokens(logits), torch.argmax(logits, dim=-1))


def test_memo_skips_inference_tensors() -> None:
    """Under torch.inference_mode the logits keep no version counter: nothing is held, and
    greedy_tokens takes the argmax itself."""
    head = _native_head()
    with torch.inference_mode():
        logits = head.logits(_lib(), torch.randn(2, 64))
        assert head_argmax.lookup(logits) is None
        assert torch.equal(greedy_tokens(logits), torch.argmax(logits, dim=-1))
