"""The reference engine's implementations of the ops in :mod:`relayc.nodes`.

The op *signatures* (what the compiler checks) live in ``relayc.nodes``; the
implementations that run them on this engine's model, KV cache and drafters live
here. The shared ones (no drafter) register with ``@implements``: importing this package
imports every module that does. Those that drive an algorithm's drafter are named by the
algorithm's module (``relayc.engine.algorithms``), not registered here.

context.py   StepContext: what every implementation receives as ``ctx``
target.py    the target-only ops: prefill, one-token decode, sample (``none``)
verify.py    build the tree, verify it with one target forward, accept, commit KV
draft.py     the drafters' ops (EAGLE, MTP, n-gram, standalone) and the prefills
block_draft.py  DFlash's ops: one block forward drafts the chain; the context it reads
registry.py  ``@implements(op_name)``, the output checks
"""

from __future__ import annotations

from typing import Any

from relayc.engine.ops import draft, target, verify  # noqa: F401  (they register their ops)
from relayc.engine.ops.registry import IMPLS


def implementations() -> dict[str, Any]:
    """The reference engine's shared op implementations (no drafter), by op name."""
    return dict(IMPLS)
