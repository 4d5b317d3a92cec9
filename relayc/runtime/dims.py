"""Spec dtype names and row-shape expressions, evaluated at run time.

The generated module describes its relay fields with spec dtype names and
shape entries (`topk*(num_steps-1)+1`); the relay base class turns them into
torch dtypes and sizes when it allocates. They live here, in the layer
generated code imports, so that importing a generated module needs only torch
(the compiler's op signatures in :mod:`relayc.nodes` use the same functions).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping

import torch

TORCH_DTYPES: dict[str, torch.dtype] = {
    "int32": torch.int32,
    "int64": torch.int64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "bool": torch.bool,
}


def torch_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The torch dtype of a spec dtype name (`model` is the model's dtype)."""
    return model_dtype if name == "model" else TORCH_DTYPES[name]


def dtype_name(dtype: torch.dtype, model_dtype: torch.dtype) -> str:
    for name, value in TORCH_DTYPES.items():
        if value == dtype:
            return "model" if dtype == model_dtype and name != "bool" else name
    return str(dtype).removeprefix("torch.")


def eval_dim(expr: str | int, dims: Mapping[str, int]) -> int:
    """Evaluate a shape entry: an int, a dim name or arithmetic over dims (`topk*(s-1)+1`)."""
    if isinstance(expr, int):
        return expr
    tree = ast.parse(expr, mode="eval")
    return int(_eval(tree.body, dims))


_BINARY_OPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
}


def _eval(node: ast.AST, dims: Mapping[str, int]) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return dims[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
        return _BINARY_OPS[type(node.op)](_eval(node.left, dims), _eval(node.right, dims))
    raise ValueError(f"unsupported shape expression: {ast.unparse(node)}")


def dims_of(expr: str | int) -> set[str]:
    """The dim names a shape entry mentions."""
    if isinstance(expr, int):
        return set()
    return {n.id for n in ast.walk(ast.parse(expr, mode="eval")) if isinstance(n, ast.Name)}
