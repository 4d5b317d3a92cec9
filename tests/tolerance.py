"""Float tolerances derived from the computation, not from one CPU's rounding.

Two float32 evaluations of the same network that sum in different orders (the native
decoder's GEMMs, MKL's, TorchScript's, AMX or AVX-512 or plain loops) differ by their
rounding. A sum of ``k`` products rounds to within ``gamma(k) * sum |a_i b_i|`` of the
exact value, ``gamma(k) = k u / (1 - k u)`` with ``u`` the unit roundoff (Higham,
*Accuracy and Stability of Numerical Algorithms*, 3.1). Along a forward the reductions
follow one another, so to first order their bounds add: the bound of a forward is
``gamma`` of the summed lengths of the reductions on its path (:func:`forward_reductions`),
times the magnitude they sum. RMSNorm keeps every layer's activations O(1), so the
magnitude of the compared output stands for them; two evaluations each within the bound
differ by at most twice it. This is a worst case (rounding errors mostly cancel, by about
the square root of the length), loose enough for any CPU and still a thousandth of what a
wrong weight, a stale cache or a misplaced row changes.
"""

from __future__ import annotations

import torch

from relayc.engine.core.config import ModelConfig


def gamma(terms: int, dtype: torch.dtype = torch.float32) -> float:
    """Higham's ``gamma_n``: the relative bound of ``terms`` rounded operations in ``dtype``."""
    u = torch.finfo(dtype).eps / 2
    if terms * u >= 1:
        raise ValueError(f"{terms} operations in {dtype} have no rounding bound")
    return terms * u / (1 - terms * u)


def forward_reductions(config: ModelConfig, context: int) -> int:
    """The summed lengths of the reductions on one token's path through ``config``'s
    forward, with ``context`` tokens attended: per layer its input norm, the q/k/v
    projection, the scores over a head, the softmax and the weighted values over the
    context, the output projection, the second norm, gate/up and down; then the final
    norm and the LM head."""
    hidden, head_dim = config.hidden_size, config.head_dim
    layer = hidden + hidden + head_dim + 2 * context + hidden + hidden + hidden
    layer += config.intermediate_size
    return config.num_layers * layer + hidden + hidden


def forward_atol(
    config: ModelConfig,
    want: torch.Tensor,
    *,
    context: int = 64,
    dtype: torch.dtype = torch.float32,
) -> float:
    """How far two evaluations of ``config``'s forward in ``dtype`` may differ at the scale of
    ``want`` (see the module docstring); ``context``: the longest sequence the test runs."""
    scale = max(float(want.detach().abs().max()), 1.0) if want.numel() else 1.0
    return 2 * gamma(forward_reductions(config, context), dtype) * scale


def gemm_atol(k: int, want: torch.Tensor, dtype: torch.dtype = torch.float32) -> float:
    """How far two ``dtype`` GEMMs of inner length ``k`` may differ at the scale of ``want``
    (Higham's bound on each, ``sum |a_i b_i|`` bounded by ``k`` times the largest output
    term's magnitude is looser than needed: the output's magnitude stands for it)."""
    scale = max(float(want.detach().abs().max()), 1.0) if want.numel() else 1.0
    return 2 * gamma(k, dtype) * scale


def assert_forwards_close(
    got: torch.Tensor,
    want: torch.Tensor,
    config: ModelConfig,
    *,
    context: int = 64,
    dtype: torch.dtype = torch.float32,
) -> None:
    """``got`` within :func:`forward_atol` of ``want`` (no relative term: the bound is absolute)."""
    atol = forward_atol(config, want, context=context, dtype=dtype)
    torch.testing.assert_close(got, want, atol=atol, rtol=0)


def assert_same_argmax_where_decided(got: torch.Tensor, want: torch.Tensor) -> None:
    """``got``'s argmax equals ``want``'s on every row where rounding cannot have moved it:
    with every logit within ``e = max |got - want|`` of ``want``'s, a row whose top logit
    leads its runner-up by more than ``2 e`` keeps its argmax. A near tie may flip either
    way on another CPU's rounding (a bfloat16 GEMM without AVX512-BF16 rounds otherwise),
    so those rows are left out -- and at least a quarter of the rows must be decided."""
    error = float((got - want).abs().max())
    top2 = want.topk(2, dim=-1).values
    decided = (top2[..., 0] - top2[..., 1]) > 2 * error
    assert float(decided.float().mean()) >= 0.25, ("too few decided rows", error)
    assert torch.equal(got.argmax(-1)[decided], want.argmax(-1)[decided])
