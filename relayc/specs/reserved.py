"""Names a spec may not use because the generated module uses them itself.

Generated code keeps spec names out of its own namespace wherever it can: relay fields
are only attribute names, keyword arguments and dict keys (``FutureMap.buffers[field]``),
and spec text only escaped comments and string literals. Two kinds of name remain:

- Steps and engine inputs become local variables and parameters of the generated
  ``PrefillStep`` / ``DecodeStep`` methods, next to the methods' own locals and the
  module-level names they refer to; those are listed in ``GENERATED_NAMES``.
- Any name starting with ``__`` is mangled by Python inside a class body (``payload.__x``
  in a FutureMap method reads ``payload._FutureMap__x``), and ``algorithm: __init__``
  would overwrite the output package's ``__init__.py``.

``tests/compiler/test_reserved_names.py`` parses every generated module and fails when
the generated code starts using a name that is missing here, or stops using one listed
here (a stale name would refuse a spec for nothing).
"""

from __future__ import annotations

from collections.abc import Collection

from relayc.specs.document import Parts
from relayc.specs.errors import SourceLoc, SpecError
from relayc.specs.schema import REF_KINDS

# Module-level names of a generated module, and the fixed locals/parameters of its
# step methods (`self`, `ctx`, `host`, `relay`).
GENERATED_NAMES: frozenset[str] = frozenset(
    {
        # imports
        "annotations",
        "Any",
        "Callable",
        "Mapping",
        "dataclass",
        "torch",
        "FutureMapBase",
        "RelayField",
        "HostMirror",
        "DimRule",
        "require_runtime",
        # the module's own constants and classes
        "ALGORITHM",
        "DESCRIPTION",
        "SPEC_HASH",
        "FIELDS",
        "DIM_DEFAULTS",
        "DIM_RULES",
        "CAPTURE_BATCH_SIZES",
        "MAX_CAPTURE_BATCH_SIZE",
        "RelayPayload",
        "FutureMap",
        "PrefillStep",
        "DecodeStep",
        "PrefillOutputs",
        "DecodeOutputs",
        # fixed locals and parameters of the generated step methods
        "self",
        "ctx",
        "host",
        "relay",
    }
)


def _reserved(kind: str, name: str, loc: SourceLoc, *, local: bool) -> SpecError | None:
    if name.startswith("__"):
        return SpecError(
            loc,
            f"{kind} name `{name}` starts with `__`",
            "Python mangles such names inside generated classes (and `__init__` would "
            "replace the package's `__init__.py`): drop the leading underscores",
        )
    if local and name in GENERATED_NAMES and not (kind == "step" and name in REF_KINDS):
        # (`relay` / `input` as step names already have their own error.)
        return SpecError(
            loc,
            f"{kind} name `{name}` is used by the generated module itself",
            f"rename the {kind}; the generated step methods would confuse the two "
            "(relayc.specs.reserved.GENERATED_NAMES lists every reserved name)",
        )
    return None


def check_reserved_names(
    parts: Parts, errors: list[SpecError], inputs: Collection[str] = ()
) -> None:
    """Located errors for the names of ``parts`` that generated code cannot hold:
    ``__``-prefixed names anywhere, generated names for steps and inputs, and a step
    named like an engine input (``inputs``: every input the algorithm sees, imported
    ones included), whose outputs would replace that input inside the step methods."""
    index = parts.index
    found: list[SpecError | None] = []
    if parts.algorithm is not None:
        found.append(
            _reserved("algorithm", parts.algorithm, index.value(("algorithm",)), local=False)
        )
    for name in parts.inputs:
        found.append(_reserved("input", name, index.key(("inputs", name)), local=True))
    for name in parts.fields:
        found.append(_reserved("relay field", name, index.key(("fields", name)), local=False))
    steps = [(("prefill",), parts.prefill)] if parts.prefill is not None else []
    for path, step in [*steps, *parts.steps]:
        loc = index.value((*path, "name"))
        # `relay` / `input` already have their own error (reference prefixes)
        found.append(_reserved("step", step.name, loc, local=step.name not in REF_KINDS))
        if step.name in inputs:
            found.append(
                SpecError(
                    loc,
                    f"step `{step.name}` has the name of an engine input",
                    "rename the step: in the generated step methods both would be one variable",
                )
            )
    errors.extend(error for error in found if error is not None)
