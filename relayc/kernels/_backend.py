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

import torch

# The backend choice and the graph-safe switch are the runtime's (generated code imports
# them without the kernels); re-exported here for the kernels and their callers.
from relayc.runtime.backend import (
    BACKENDS,
    Backend,
    graph_safe,
    graph_safe_paths,
    native_paths,
    resolve_backend,
    triton_available,
    triton_interpreting,
)

__all__ = [
    "BACKENDS",
    "HOST_LOOP_MAX_BATCH",
    "Backend",
    "graph_safe",
    "graph_safe_paths",
    "host_loops",
    "native_paths",
    "resolve_backend",
    "triton_available",
    "triton_interpreting",
]

# Above this batch the vectorised torch path beats the host loops (measured on 2 CPU cores:
# even at batch 8, at parity near 32).
HOST_LOOP_MAX_BATCH = 16


def host_loops(backend: str, device: torch.device | str, batch: int) -> bool:
    """Whether ``backend`` on ``device`` runs a tree walk's host loop (see the module docstring)."""
    return (
        backend == "auto"
        and torch.device(device).type == "cpu"
        and batch <= HOST_LOOP_MAX_BATCH
        and not graph_safe()
    )
