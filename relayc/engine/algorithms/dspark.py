"""``dspark``: the DFlash drafter plus a Markov head; compiled for SGLang only (the engine
has no DSpark drafter: naming it there says so)."""

from __future__ import annotations

from relayc.engine.algorithms.dflash import DFLASH_INJECT_KV, DFLASH_PREFILL
from relayc.engine.algorithms.registry import SPECS_DIR, Algorithm

ALGORITHM = Algorithm(
    name="dspark",
    spec=SPECS_DIR / "dspark.yaml",
    summary="DFlash plus a Markov head, confidence relayed to the host (SGLang only)",
    no_engine_drafter="a DSpark drafter (the DFlash drafter plus a Markov head)",
    # DFlash's prefill and KV injection (the same declarations); dspark_draft is a shared
    # op for now (relayc/nodes/ops.py says why).
    ops=(DFLASH_PREFILL, DFLASH_INJECT_KV),
)
