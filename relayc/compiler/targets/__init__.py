"""Code-generation targets besides relayc's own module per algorithm.

`sglang`: one module with SGLang 0.5.23's relay surface (`relayc compile --target sglang`).
"""

from __future__ import annotations

from relayc.compiler.targets.sglang import compile_sglang

TARGETS = ("relayc", "sglang")

__all__ = ["TARGETS", "compile_sglang"]
