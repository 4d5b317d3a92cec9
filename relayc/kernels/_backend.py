"""Choosing between the Triton kernels and the vectorised torch paths.

Every kernel entry point takes ``backend``: ``"auto"`` runs Triton on CUDA/ROCm
tensors and the vectorised torch path on the CPU; ``"triton"`` forces the Triton
kernel (on the CPU this needs ``TRITON_INTERPRET=1`` set before Triton is
imported, which is how the tests run the Triton source without a GPU);
``"torch"`` forces the vectorised torch path.
"""

from __future__ import annotations

import os
from typing import Literal

import torch

Backend = Literal["auto", "torch", "triton"]
BACKENDS: tuple[str, ...] = ("auto", "torch", "triton")


def triton_available() -> bool:
    """True when Triton imports (it is a Linux x86_64 dependency only)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def resolve_backend(backend: str, device: torch.device | str) -> Literal["torch", "triton"]:
    """Map ``backend`` to the implementation that will run on ``device``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    device = torch.device(device)
    if backend == "torch":
        return "torch"
    if backend == "triton":
        if not triton_available():
            raise RuntimeError("backend='triton' needs the `triton` package (pip install triton)")
        if device.type == "cpu" and not triton_interpreting():
            raise RuntimeError(
                "backend='triton' on CPU tensors needs TRITON_INTERPRET=1 in the environment "
                "before triton is imported (use backend='torch' for the fast CPU path)"
            )
        return "triton"
    return "triton" if device.type == "cuda" and triton_available() else "torch"
