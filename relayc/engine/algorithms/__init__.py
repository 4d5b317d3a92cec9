"""The algorithms: one module per algorithm (its drafter, decode window, checkpoints, op
implementations, demo settings), each registered through the ``relayc.algorithms`` entry
point group as a third-party package's would be; ``registry.py`` finds and checks them.
"""

from __future__ import annotations

from relayc.engine.algorithms.registry import (
    Algorithm,
    Demo,
    DemoRun,
    DraftingRequest,
    UnknownAlgorithmError,
    algorithms,
    default_dims,
    engine_algorithms,
    engine_names,
    lookup,
    shipped_drafter,
)

__all__ = [
    "Algorithm",
    "Demo",
    "DemoRun",
    "DraftingRequest",
    "UnknownAlgorithmError",
    "algorithms",
    "default_dims",
    "engine_algorithms",
    "engine_names",
    "lookup",
    "shipped_drafter",
]
