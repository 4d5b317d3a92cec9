"""Test helpers for the sampling kernels: exact-arithmetic inputs and a chi-square check."""

from __future__ import annotations

import torch

# Probabilities on this grid (and coins on it) keep every partial sum and every
# coin * total exact in float32, so the reference (Python floats), the torch path
# and the Triton kernel (each summing in its own order) must agree to the token.
GRID = 4096

# Upper 0.1% points of the chi-square distribution by degrees of freedom, from the
# NIST/SEMATECH e-Handbook of Statistical Methods, section 1.3.6.7.4.
CHI2_CRITICAL_0_001 = {
    1: 10.828,
    2: 13.816,
    3: 16.266,
    4: 18.467,
    5: 20.515,
    6: 22.458,
    7: 24.322,
    8: 26.124,
    9: 27.877,
    10: 29.588,
    11: 31.264,
    12: 32.909,
    19: 43.820,
    26: 54.052,
}


def grid_probs(shape: tuple[int, ...], gen: torch.Generator, zero_frac: float = 0.3):
    """Random distributions over the last dim, each entry a multiple of 1/GRID, summing to 1.
    About ``zero_frac`` of the entries are exactly zero (at least one entry stays positive)."""
    vocab = shape[-1]
    weights = torch.rand(shape, generator=gen) + 0.05
    weights = weights * (torch.rand(shape, generator=gen) >= zero_frac)
    keep = torch.randint(vocab, (*shape[:-1], 1), generator=gen)
    weights.scatter_(-1, keep, 1.0)
    counts = torch.floor(weights / weights.sum(-1, keepdim=True) * GRID)
    # The rounding remainder goes to the entry known to be positive.
    counts.scatter_add_(-1, keep, GRID - counts.sum(-1, keepdim=True))
    return (counts / GRID).to(torch.float32)


def grid_uniforms(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    return torch.randint(GRID, shape, generator=gen).to(torch.float32) / GRID


def chi_square(observed: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic of token counts against ``probs``, and its degrees of freedom.
    Tokens with zero probability must never be observed (asserted here)."""
    probs = probs.double()
    observed = observed.double()
    support = probs > 0
    assert observed[~support].sum() == 0, f"emitted zero-probability tokens: {observed}"
    expected = probs[support] * observed.sum()
    assert expected.min() >= 5, "too few trials for the chi-square approximation"
    stat = float(((observed[support] - expected) ** 2 / expected).sum())
    return stat, int(support.sum()) - 1


def assert_distribution(observed: torch.Tensor, probs: torch.Tensor) -> None:
    stat, dof = chi_square(observed, probs)
    critical = CHI2_CRITICAL_0_001[dof]
    assert stat < critical, f"chi-square {stat:.1f} >= {critical} (dof {dof}): not lossless"
