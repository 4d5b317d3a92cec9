"""The typed ops (nodes) a decode step may call, each with its signature and meta function.

The public API for user ops: describe an op with :class:`Op` and :class:`TensorType`
and :func:`register` it at the top level of a module; a spec names the module under
`ops:` (or the CLI gets `--ops MODULE`) and its steps may then name the op::

    from relayc.nodes import Op, TensorType, register

    register(Op("scale_logits", {"logits": TensorType("float32", ("vocab",))},
                {"scaled": TensorType("float32", ("vocab",))}))

The shared built-in ops (:mod:`relayc.nodes.ops`) are registered on import of this
package; each algorithm declares its own ops in its module (``Algorithm.ops``), which the
compiler finds through the algorithm's entry point (:func:`relayc.nodes.registry.plugin_ops`).
"""

from __future__ import annotations

from relayc.nodes import ops as _builtin_ops  # noqa: F401  (registers the shared ops)
from relayc.nodes.registry import (
    Op,
    OpRegistrationError,
    TensorType,
    all_ops,
    get_op,
    register,
    seal_builtins,
)

seal_builtins()

__all__ = ["Op", "OpRegistrationError", "TensorType", "all_ops", "get_op", "register"]
