"""Triton, imported once for every kernel module.

Triton ships for Linux x86_64 only. Elsewhere the kernel modules must still
import (their torch paths and references work everywhere), so ``jit`` degrades
to a no-op decorator; ``resolve_backend`` refuses ``backend="triton"`` there, so
an undecorated kernel is never launched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:
    import triton
    import triton.language as tl

    jit: Callable[[Any], Any] = triton.jit
except ImportError:
    triton = None
    tl = None

    def jit(fn: Any) -> Any:
        return fn


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


__all__ = ["jit", "next_power_of_2", "tl", "triton"]
