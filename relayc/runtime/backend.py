"""Which implementation runs: Triton kernels or the torch paths, and graph-safe mode.

Every kernel entry point (``relayc.kernels``) and the generated relay take
``backend``: ``"auto"`` runs Triton on CUDA/ROCm tensors and the torch path on
the CPU; ``"triton"`` forces the Triton kernel (on the CPU this needs
``TRITON_INTERPRET=1`` set before Triton is imported, which is how the tests run
the Triton source without a GPU); ``"torch"`` forces the torch path.

:func:`graph_safe_paths` marks a block that stands in for a CUDA graph capture
(``relayc.runtime.capture``): code that has a faster host-reading path on the
CPU (the kernels' tree walks, see ``relayc.kernels._backend.host_loops``) takes
the path a GPU would capture instead, and so do the CPU's native one-call paths
(:func:`native_paths`) unless the block records them for a CPU graph
(``relayc.runtime.tape``). The choice lives here, in the layer
generated code imports, so the relay and the capture check need no kernels.
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

_GRAPH_SAFE: ContextVar[bool] = ContextVar("relayc_graph_safe_paths", default=False)
_NATIVE: ContextVar[bool] = ContextVar("relayc_graph_safe_native", default=True)


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


def graph_safe() -> bool:
    """Whether the caller runs inside :func:`graph_safe_paths`."""
    return _GRAPH_SAFE.get()


def native_paths() -> bool:
    """Whether the CPU's native one-call paths may run: everywhere but inside
    :func:`graph_safe_paths` without ``native`` (the path a GPU captures has none)."""
    return _NATIVE.get()


@contextmanager
def graph_safe_paths(*, native: bool = False) -> Iterator[None]:
    """Within this block ``"auto"`` never picks a host-reading fast path; with ``native``
    the CPU's native one-call paths still run (a CPU graph records them:
    ``relayc.runtime.tape``), else they stand aside too."""
    token, native_token = _GRAPH_SAFE.set(True), _NATIVE.set(native)
    try:
        yield
    finally:
        _NATIVE.reset(native_token)
        _GRAPH_SAFE.reset(token)
