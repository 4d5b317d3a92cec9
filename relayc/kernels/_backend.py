"""Choosing between the Triton kernels and the vectorised torch paths.

Every kernel entry point takes ``backend``: ``"auto"`` runs Triton on CUDA/ROCm
tensors and the vectorised torch path on the CPU; ``"triton"`` forces the Triton
kernel (on the CPU this needs ``TRITON_INTERPRET=1`` set before Triton is
imported, which is how the tests run the Triton source without a GPU);
``"torch"`` forces the vectorised torch path.

The tree walks (``verify_tree_greedy``, ``build_tree``, and the engine's
``tree_from_parents``) have a third path for ``"auto"``: on CPU tensors and small
batches (:func:`host_loops`) they run their plain per-request loops over host
lists. There a tree of a few nodes costs tens of microseconds instead of the
vectorised path's dozens of tiny torch ops (about a millisecond). Nothing is
synchronised on the CPU, and the results are the same by definition: the loops
are the references every other path is tested against. Under
:func:`graph_safe_paths` (``capture_check`` standing in for a CUDA graph
capture) the vectorised path runs, the one a GPU would capture.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Literal

import torch

Backend = Literal["auto", "torch", "triton"]
BACKENDS: tuple[str, ...] = ("auto", "torch", "triton")

# Above this batch the vectorised torch path beats the host loops (measured on 2 CPU cores:
# even at batch 8, at parity near 32).
HOST_LOOP_MAX_BATCH = 16
_GRAPH_SAFE: ContextVar[bool] = ContextVar("relayc_graph_safe_paths", default=False)


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


def host_loops(backend: str, device: torch.device | str, batch: int) -> bool:
    """Whether ``backend`` on ``device`` runs a tree walk's host loop (see the module docstring)."""
    return (
        backend == "auto"
        and torch.device(device).type == "cpu"
        and batch <= HOST_LOOP_MAX_BATCH
        and not _GRAPH_SAFE.get()
    )


@contextmanager
def graph_safe_paths() -> Iterator[None]:
    """Within this block ``"auto"`` never picks a host loop (no host reads of tensor data)."""
    token = _GRAPH_SAFE.set(True)
    try:
        yield
    finally:
        _GRAPH_SAFE.reset(token)
