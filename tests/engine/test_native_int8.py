"""The integer-dot GEMMs (int8.c, dtype "int8"): every kernel this CPU runs gives the scalar
reference's bits, the scalar reference gives a naive NumPy reading of the GGUF blocks' bits,
and a row's result does not depend on the rows beside it.

The naive reference decodes the file's bytes itself (not the packer's fields) and follows
int8.c's stated arithmetic: x quantised per block of 32 (d = amax / 127, q = round half to
even of x / d), an exact integer sum per block, then acc = acc + (d_w * d_x) * isum (+ m_w *
s_x) in float32, block by block. It is never edited to match the kernels.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from relayc.engine.checkpoints.quantize import quantize_q4_0, quantize_q4_1, quantize_q8_0
from relayc.engine.native import library as native
from relayc.engine.native.blocks import BlockWeight

KERNELS = ("scalar", "avx2", "vnni")
QUANTIZE = {"Q4_0": quantize_q4_0, "Q4_1": quantize_q4_1, "Q8_0": quantize_q8_0}


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    lib = native.native_decoder()
    assert lib is not None, "the native library should build here"
    return lib


def _weights(qtype: str, rows: int, cols: int, seed: int) -> BlockWeight:
    g = torch.Generator().manual_seed(seed)
    # a spread of block magnitudes, and one all-zero block (d = 0)
    w = torch.randn(rows, cols, generator=g) * torch.rand(rows, cols // 32, 1, generator=g).mul(
        0.2
    ).repeat_interleave(32, dim=1).reshape(rows, cols)
    w[0, :32] = 0.0
    return QUANTIZE[qtype](w)


def _activations(rows: int, cols: int, seed: int) -> np.ndarray:
    g = np.random.default_rng(seed)
    x = (g.standard_normal((rows, cols)) * g.uniform(0.01, 30, (rows, 1))).astype(np.float32)
    x[0, :32] = 0.0  # a zero block: d_x = 0
    if cols >= 64:
        x[-1, 32:64] = np.float32(2**-140)  # a subnormal block
    return x


def naive_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q [M, K] int8, d and s [M, K / 32] float32."""
    rows, cols = x.shape
    blocks = x.reshape(rows, cols // 32, 32)
    amax = np.abs(blocks).max(axis=-1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
        q = np.rint(blocks * inv[..., None])
    q = np.clip(np.nan_to_num(q, nan=0.0), -127, 127).astype(np.int8)
    s = (d * q.astype(np.int32).sum(axis=-1).astype(np.float32)).astype(np.float32)
    return q.reshape(rows, cols), d, s


def _naive_fields(w: BlockWeight) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """d, m (None for Q8_0) [N, nb] float32 and q [N, nb, 32] int32, from the GGUF bytes:
    Q4_1 d, m then 16 bytes (byte j: q[j] low nibble, q[j + 16] high); Q4_0 d then the
    same nibbles, m = -8d; Q8_0 d then 32 signed bytes."""
    size = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}[w.qtype]
    raw = w.data.numpy().reshape(w.rows, -1, size)
    d = raw[..., 0:2].copy().view(np.float16)[..., 0]
    if w.qtype == "Q8_0":
        return d.astype(np.float32), None, raw[..., 2:].copy().view(np.int8).astype(np.int32)
    start = 4 if w.qtype == "Q4_1" else 2
    nib = raw[..., start:].astype(np.int32)
    q = np.concatenate([nib & 15, nib >> 4], axis=-1)
    m = raw[..., 2:4].copy().view(np.float16)[..., 0] if w.qtype == "Q4_1" else d * np.float16(-8)
    return d.astype(np.float32), m.astype(np.float32), q


def naive_gemm(x: np.ndarray, w: BlockWeight) -> np.ndarray:
    """out [M, N] float32 as int8.c's header states it."""
    qx, dx, sx = naive_quantize(x)
    dw, mw, qw = _naive_fields(w)
    rows, cols = x.shape
    qx = qx.reshape(rows, cols // 32, 32).astype(np.int32)
    acc = np.zeros((rows, w.rows), np.float32)
    for b in range(cols // 32):
        isum = qx[:, b, :] @ qw[:, b, :].T  # [M, N] exact int32 (int64 here)
        acc = acc + (dw[None, :, b] * dx[:, b, None]) * isum.astype(np.float32)
        if mw is not None:
            acc = acc + mw[None, :, b] * sx[:, b, None]
    return acc.astype(np.float32)


def _run(
    lib: ctypes.CDLL, x: np.ndarray, w: BlockWeight, kernel: int, panels: torch.Tensor
) -> np.ndarray | None:
    rows, cols = x.shape
    padded = -(-w.rows // 16) * 16
    out = np.full((rows, padded), np.nan, np.float32)  # poisoned: an unwritten output fails
    xc = np.ascontiguousarray(x)
    code = lib.relayc_int8_gemm(
        rows, cols, padded, xc.ctypes.data, panels.data_ptr(), w.format, kernel, out.ctypes.data
    )
    if code == -3:
        return None  # this kernel does not run on this CPU
    assert code == 0
    return out[:, : w.rows]


def _kernels_here(lib: ctypes.CDLL) -> list[int]:
    found = lib.relayc_int8_kernels()
    return [k for k in range(len(KERNELS)) if found >> k & 1]


def test_this_cpu_runs_its_best_int8_kernel(lib: ctypes.CDLL) -> None:
    here = _kernels_here(lib)
    assert 0 in here  # the scalar reference runs everywhere
    flags = open("/proc/cpuinfo").read() if __import__("os").path.exists("/proc/cpuinfo") else ""
    if " avx512_vnni" in flags and " avx512bw" in flags:
        assert 2 in here
    if " avx2" in flags and " f16c" in flags:
        assert 1 in here
    assert lib.relayc_int8_kernel(-1) == max(here)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize(("cols", "rows_w"), [(32, 16), (96, 80), (160, 48), (576, 200)])
def test_every_kernel_gives_the_naive_bits(
    lib: ctypes.CDLL, qtype: str, cols: int, rows_w: int
) -> None:
    w = _weights(qtype, rows_w, cols, seed=cols + rows_w)
    iw = BlockWeight(w.qtype, w.data, w.cols, int8=True)
    panels = iw.panels()
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 17):
        x = _activations(m, cols, seed=m * 7 + cols)
        want = naive_gemm(x, w)
        assert np.isfinite(want).all()
        for kernel in _kernels_here(lib):
            got = _run(lib, x, iw, kernel, panels)
            assert got is not None
            np.testing.assert_array_equal(
                got.view(np.uint32), want.view(np.uint32), err_msg=f"{KERNELS[kernel]}, {m} rows"
            )


def test_int8_is_close_to_float32(lib: ctypes.CDLL) -> None:
    """The semantics, against the float32 product over the same weights: int8 activations
    cost about 2^-8 of a row's scale, never more."""
    w = _weights("Q4_1", 64, 576, seed=5)
    iw = BlockWeight(w.qtype, w.data, w.cols, int8=True)
    x = _activations(4, 576, seed=9)
    got = _run(lib, x, iw, lib.relayc_int8_kernel(-1), iw.panels())
    assert got is not None
    exact = x.astype(np.float64) @ w.dequantize().double().numpy().T
    scale = np.abs(x).max(axis=1, keepdims=True) * np.abs(w.dequantize().numpy()).sum(1)[None]
    assert (np.abs(got - exact) <= 2**-8 * scale).all()
    assert np.abs(got - exact).max() > 0  # it is not the float32 path


def test_a_row_is_the_same_alone_or_beside_others(lib: ctypes.CDLL) -> None:
    w = _weights("Q4_1", 96, 192, seed=11)
    iw = BlockWeight(w.qtype, w.data, w.cols, int8=True)
    panels = iw.panels()
    x = _activations(8, 192, seed=3)
    for kernel in _kernels_here(lib):
        together = _run(lib, x, iw, kernel, panels)
        assert together is not None
        for i in range(8):
            alone = _run(lib, x[i : i + 1], iw, kernel, panels)
            assert alone is not None
            np.testing.assert_array_equal(alone[0].view(np.uint32), together[i].view(np.uint32))


def test_quantize_is_the_naive_one(lib: ctypes.CDLL) -> None:
    x = _activations(5, 128, seed=1)
    x[1, 5] = 0.5 * x[1, :32].max() / 127 * 127  # ties and exact halves round to even
    x[2, 64:96] = np.arange(32, dtype=np.float32) - 15.5
    q = np.zeros((5, 128), np.int8)
    d, s = np.zeros((5, 4), np.float32), np.zeros((5, 4), np.float32)
    total = np.zeros((5, 4), np.int32)
    code = lib.relayc_int8_quantize(
        5, 128, x.ctypes.data, q.ctypes.data, d.ctypes.data, s.ctypes.data, total.ctypes.data
    )
    assert code == 0
    want_q, want_d, want_s = naive_quantize(x)
    np.testing.assert_array_equal(q, want_q)
    np.testing.assert_array_equal(d.view(np.uint32), want_d.view(np.uint32))
    np.testing.assert_array_equal(s.view(np.uint32), want_s.view(np.uint32))
    np.testing.assert_array_equal(total, want_q.reshape(5, 4, 32).astype(np.int32).sum(-1))


def test_a_non_finite_input_block_makes_its_row_nan(lib: ctypes.CDLL) -> None:
    w = _weights("Q8_0", 16, 64, seed=2)
    iw = BlockWeight(w.qtype, w.data, w.cols, int8=True)
    x = _activations(3, 64, seed=4)
    x[0, 3], x[1, 40] = np.inf, np.nan
    for kernel in _kernels_here(lib):
        got = _run(lib, x, iw, kernel, iw.panels())
        assert got is not None
        assert np.isnan(got[0]).all() and np.isnan(got[1]).all() and np.isfinite(got[2]).all()


def test_bad_arguments_are_refused(lib: ctypes.CDLL) -> None:
    x = np.zeros((1, 32), np.float32)
    out = np.zeros((1, 16), np.float32)
    w = torch.zeros(544, dtype=torch.uint8)
    for rows, cols, n, fmt in ((1, 30, 16, 8), (1, 32, 15, 8), (1, 32, 16, 2), (-1, 32, 16, 8)):
        code = lib.relayc_int8_gemm(
            rows, cols, n, x.ctypes.data, w.data_ptr(), fmt, 0, out.ctypes.data
        )
        assert code == -2
    assert lib.relayc_int8_gemm(1, 32, 16, x.ctypes.data, w.data_ptr(), 8, 7, out.ctypes.data) == -3
    with pytest.raises(ValueError, match="no integer-dot kernel"):
        BlockWeight("Q4_K", torch.zeros(1, 144, dtype=torch.uint8), 256, int8=True)
