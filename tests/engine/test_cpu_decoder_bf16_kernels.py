"""gemm_bf16.c's bfloat16 GEMM kernels (portable, avx512bf16, amx), each on its own.

Every kernel runs under each test its CPU supports (one at a time, through
relayc.engine.native.library.use_bf16_kernel); the others skip, saying why. What they must give:

- portable and avx512bf16: exactly the sums gemm_bf16.c documents: the input
  rounded to bfloat16, each output summed over the k pairs in order, odd product then even,
  in float32 -- computed here by a naive torch loop that is never edited to match;
- amx: that sum within float32 rounding (AMX's rounding inside a tile op is the
  hardware's);
- every kernel: a row's bits whatever the other rows and their number (an LM-head row
  alone or among 8, 16, 17 or 64; a decode alone or inside an 8- and a 16-row verify),
  and a model's logits within a bfloat16 tolerance of its float32 twin, argmax equal.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import pytest
import torch

import relayc.engine.native.library as native_module
from relayc.engine.decoder.packing import _pack
from relayc.engine.model.llama import use_cpu_matmul_layout
from relayc.engine.model.weights import random_model
from tests.engine.helpers import PagedDriver
from tests.engine.test_cpu_decoder import _session, _tokens
from tests.engine.test_cpu_decoder_bf16 import BF16, _float32_twin
from tests.tolerance import assert_same_argmax_where_decided

EXACT = ("portable", "avx512bf16")  # the kernels whose sums are specified to the bit


def _lib() -> ctypes.CDLL:
    lib = native_module.native_decoder()
    assert lib is not None, "the native decoder should build here"
    return lib


@pytest.fixture(params=native_module.BF16_KERNELS)
def kernel(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each bfloat16 kernel in turn, the machine's own restored after."""
    lib, name = _lib(), request.param
    if name not in native_module.bf16_kernels(lib):
        pytest.skip(f"this CPU or OS does not run the {name} kernel (CPUID, arch_prctl)")
    previous = native_module.use_bf16_kernel(lib, name)
    try:
        yield name
    finally:
        native_module.use_bf16_kernel(lib, previous)


def _rows(rows: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """LM-head inputs whose RMSNorm is exact, so the GEMM's input is known to the bit:
    every entry of row m is +-2^e_m (mean square 4^e_m, eps 0: the norm scales by 2^-e_m
    exactly), and the norm weight carries the values, awkward float32s the kernel must
    round to bfloat16. Returns the rows and the norm weight."""
    generator = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (rows, width), generator=generator).float() * 2 - 1
    scales = 2.0 ** torch.randint(-3, 4, (rows, 1), generator=generator).float()
    weight = torch.randn(width, generator=generator) * 1.7
    return signs * scales, weight


def _head(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """relayc_head_bf16 over rows ``x`` (eps 0), logits poisoned before the call."""
    vocab, width = weight.shape
    padded = -(-vocab // 16) * 16
    packed = _pack(weight)
    x = x.contiguous()
    out = torch.full((x.shape[0], padded), float("nan"))
    code = _lib().relayc_head_bf16(
        x.shape[0],
        width,
        padded,
        x.data_ptr(),
        norm_weight.contiguous().data_ptr(),
        0.0,
        packed.data_ptr(),
        out.data_ptr(),
    )
    assert code == 0
    return out[:, :vocab]


def _normed(x: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """RMSNorm of :func:`_rows`' rows, exactly: each entry's sign times the norm weight."""
    return torch.sign(x) * norm_weight


def _documented_sums(
    x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    """The naive sums of gemm_bf16's comment: a = bf16(normed x), k padded with zeros to a
    multiple of 32, acc += a[2i+1] w[2i+1]; acc += a[2i] w[2i] for i in order, float32
    (each product of two bfloat16s exact)."""
    a = _normed(x, norm_weight).to(torch.bfloat16).float()
    w = weight.float()
    pad = -a.shape[1] % 32
    a = torch.nn.functional.pad(a, (0, pad))
    w = torch.nn.functional.pad(w, (0, pad))
    acc = torch.zeros(a.shape[0], w.shape[0])
    for i in range(a.shape[1] // 2):
        for k in (2 * i + 1, 2 * i):
            acc = acc + a[:, k, None] * w[None, :, k]
    return acc


SHAPES = [(1, 576, 96), (3, 41, 16), (8, 64, 40), (17, 100, 208), (64, 576, 192)]


@pytest.mark.parametrize(("rows", "width", "vocab"), SHAPES)
def test_head_gives_the_documented_sums(kernel: str, rows: int, width: int, vocab: int) -> None:
    x, norm_weight = _rows(rows, width, seed=rows)
    weight = (torch.randn(vocab, width, generator=torch.Generator().manual_seed(width)) * 0.1).to(
        torch.bfloat16
    )
    got = _head(x, norm_weight, weight)
    want = _documented_sums(x, norm_weight, weight)
    assert not got.isnan().any(), "an output the kernel did not write"
    if kernel in EXACT:
        assert torch.equal(got, want), (got - want).abs().max()
    else:
        # AMX: the same exact products, summed with the hardware's own roundings: within
        # the error bound of any order of float32 sums (k terms, unit roundoff 2^-24 each)
        a = _normed(x, norm_weight).to(torch.bfloat16).double()
        exact = a @ weight.double().t()
        bound = a.abs() @ weight.double().abs().t() * (width + 32) * 2.0**-24
        assert ((got.double() - exact).abs() <= bound).all()


def test_head_rows_do_not_depend_on_the_row_count(kernel: str) -> None:
    x, norm_weight = _rows(64, 576, seed=4)
    weight = (torch.randn(200, 576, generator=torch.Generator().manual_seed(2)) * 0.1).to(
        torch.bfloat16
    )
    full = _head(x, norm_weight, weight)
    for count in (1, 8, 16, 17):
        assert torch.equal(_head(x[:count], norm_weight, weight), full[:count]), count
    # the same rows in another order, and a late row alone
    order = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(_head(x[order], norm_weight, weight), full[order])
    assert torch.equal(_head(x[40:41], norm_weight, weight), full[40:41])


def test_decode_equals_its_row_in_8_and_16_row_verifies(kernel: str) -> None:
    model = random_model(BF16, seed=5)
    use_cpu_matmul_layout(model)
    prompt = _tokens(9, seed=3)
    chain = [17, 250, 3, 99, 4, 4, 180, 61, 5, 77, 200, 1, 0, 42, 9, 128]
    alone = PagedDriver(model)
    req = alone.new_request()
    alone.extend([req], [prompt])
    decoded = torch.cat([alone.decode([req], [t]) for t in chain])
    for width in (8, 16):
        verify = PagedDriver(model)
        vreq = verify.new_request()
        verify.extend([vreq], [prompt])
        causal = torch.ones(1, width, width, dtype=torch.bool).tril()
        verified = verify.verify([vreq], [chain[:width]], [list(range(width))], causal)
        assert torch.equal(decoded[:width], verified), width


def test_logits_near_the_float32_twin(kernel: str) -> None:
    model = random_model(BF16, seed=21)
    use_cpu_matmul_layout(model)
    reference = _session(_float32_twin(model, seed=21))
    got = _session(model)
    scale = max(r.abs().max().item() for r in reference)
    for step, (a, r) in enumerate(zip(got, reference, strict=True)):
        assert (a - r).abs().max().item() < 0.05 * scale, step
        assert_same_argmax_where_decided(a, r)


def test_portable_and_avx512bf16_decoders_give_the_same_bits() -> None:
    lib = _lib()
    if "avx512bf16" not in native_module.bf16_kernels(lib):
        pytest.skip("this CPU has no AVX512-BF16: nothing to compare the portable kernel with")
    model = random_model(BF16, seed=8)
    use_cpu_matmul_layout(model)
    sessions = {}
    previous = native_module.bf16_kernel(lib)
    try:
        for name in EXACT:
            native_module.use_bf16_kernel(lib, name)
            sessions[name] = _session(model)
    finally:
        native_module.use_bf16_kernel(lib, previous)
    for step, (a, b) in enumerate(zip(*sessions.values(), strict=True)):
        assert torch.equal(a, b), step


def test_the_machine_runs_its_best_or_chosen_kernel_and_refuses_others() -> None:
    lib = _lib()
    supported = native_module.bf16_kernels(lib)
    assert supported[0] == "portable"
    chosen = native_module.bf16_kernel_choice() or supported[-1]  # RELAYC_BF16_KERNEL or best
    assert native_module.bf16_kernel(lib) == chosen
    with pytest.raises(ValueError, match="unknown bfloat16 kernel 'tiles'"):
        native_module.use_bf16_kernel(lib, "tiles")
    for name in set(native_module.BF16_KERNELS) - set(supported):
        with pytest.raises(ValueError, match=f"the {name} kernel does not run on this CPU"):
            native_module.use_bf16_kernel(lib, name)
    assert native_module.bf16_kernel(lib) == chosen
