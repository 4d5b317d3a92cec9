"""relayc: compile relay-state specs for overlapped speculative decoding.

The pipeline, one subpackage per stage::

    specs/     YAML spec -> validated, frozen pydantic Spec (with source locations)
    graph/     Spec -> torch.fx Graph of one decode iteration, analysis passes
    nodes/     the typed ops a decode step may call
    compiler/  annotated graph -> generated Python module
    kernels/   Triton verify kernels and their torch references
    runtime/   what generated modules import
    engine/    the reference engine that runs generated modules
    generated/ modules generated from the bundled specs (checked in)
"""

from __future__ import annotations

__version__ = "0.1.0"
