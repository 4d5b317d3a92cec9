"""Stand-in op implementations for testing generated steps without a model.

Each fake returns tensors of exactly the declared dtypes and shapes, computed from
its inputs with graph-safe ops only, so that capture_check accepts them and a
replay must reproduce the eager result.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from typing import Any

import torch

from relayc.nodes.registry import Op, get_op
from relayc.runtime.dims import torch_dtype


def _seed(inputs: Mapping[str, torch.Tensor], batch: int) -> torch.Tensor:
    """[batch] float64 mixing the first element of every input row."""
    acc = torch.zeros(batch, dtype=torch.float64)
    for i, value in enumerate(inputs.values()):
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            acc = acc + (i + 1) * value.reshape(batch, -1)[:, 0].to(torch.float64)
    return acc


def fake_impl(op: Op, dims: Mapping[str, int], model_dtype: torch.dtype) -> Callable[..., Any]:
    def run(ctx: Any, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        batch = next(v.shape[0] for v in inputs.values() if isinstance(v, torch.Tensor))
        base = _seed(inputs, batch)
        outputs = {}
        for name, tensor_type in op.outputs.items():
            salt = zlib.crc32(f"{op.name}.{name}".encode()) % 97
            row = tensor_type.row(dims)
            numel = 1
            for d in row:
                numel *= d
            ramp = torch.arange(numel, dtype=torch.float64).reshape(1, *row) if row else 0
            value = (base.reshape(batch, *([1] * len(row))) + salt + ramp) % 50
            dtype = torch_dtype(tensor_type.dtype, model_dtype)
            outputs[name] = (value >= 25) if dtype == torch.bool else value.to(dtype)
        if ctx is not None and "after" in ctx:
            ctx["after"](op, inputs, outputs)
        return outputs

    return run


def fake_impls(
    module: Any, dims: Mapping[str, int], model_dtype: torch.dtype = torch.bfloat16
) -> dict[str, Callable[..., Any]]:
    names = {*module.DecodeStep.OPS, *module.PrefillStep.OPS}
    return {name: fake_impl(get_op(name), dims, model_dtype) for name in sorted(names)}
