"""``uno``: a LoRA self-drafter; compiled for SGLang only (the engine has no UNO drafter:
naming it there says so)."""

from __future__ import annotations

from relayc.engine.algorithms.registry import SPECS_DIR, Algorithm

ALGORITHM = Algorithm(
    name="uno",
    spec=SPECS_DIR / "uno.yaml",
    summary="a LoRA self-drafter (SGLang only)",
    no_engine_drafter="an UNO LoRA self-drafter",
)
