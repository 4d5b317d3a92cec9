"""The reference engine's op implementations, by op name (filled by ``@implements``)."""

from __future__ import annotations

from collections.abc import Callable

import torch

Impl = Callable[..., dict[str, torch.Tensor]]
IMPLS: dict[str, Impl] = {}


def implements(op_name: str) -> Callable[[Impl], Impl]:
    """Register ``fn`` as the engine's implementation of the op ``op_name``."""

    def register(fn: Impl) -> Impl:
        IMPLS[op_name] = fn
        return fn

    return register
