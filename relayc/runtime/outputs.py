"""A decode step's outputs as (name, tensor) pairs: what the graph runner slices and the
capture check inspects (a mapping, or the generated ``DecodeOutputs`` dataclass)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


def output_items(outputs: Any) -> list[tuple[str, Any]]:
    """(name, value) of a step's outputs: a mapping or a dataclass (``DecodeOutputs``)."""
    if isinstance(outputs, Mapping):
        return list(outputs.items())
    if dataclasses.is_dataclass(outputs) and not isinstance(outputs, type):
        return [(f.name, getattr(outputs, f.name)) for f in dataclasses.fields(outputs)]
    raise TypeError(
        f"a step's device part must return a mapping or a dataclass of tensors, "
        f"not {type(outputs).__name__}"
    )
