"""Spec dtype names and row-shape expressions, evaluated at run time.

The generated module describes its relay fields with spec dtype names and
shape entries (`topk*(num_steps-1)+1`); the relay base class turns them into
torch dtypes and sizes when it allocates. They live here, in the layer
generated code imports, so that importing a generated module needs only torch
(the compiler's op signatures in :mod:`relayc.nodes` use the same functions).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping, Sequence

import torch

TORCH_DTYPES: dict[str, torch.dtype] = {
    "int32": torch.int32,
    "int64": torch.int64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "bool": torch.bool,
}


# The most one relay field's buffer, `[req_pool_size, *row]`, may take: 1 TiB, more than
# any accelerator holds, and so at most 2**40 elements. Each dim is capped at 2**31 - 1 but
# their product is not; past this a buffer fails in torch (or overflows its size
# computation) with a message that names neither the field nor the spec.
MAX_BUFFER_BYTES = 2**40
MAX_BUFFER_TEXT = "2**40 bytes (1 TiB)"


def buffer_bytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    """The bytes of a buffer of ``shape`` and ``dtype`` (a Python int: no overflow)."""
    return math.prod(shape) * dtype.itemsize


def check_buffer_sizes(
    algorithm: str,
    req_pool_size: int,
    shapes: Mapping[str, Sequence[str | int]],
    dtypes: Mapping[str, torch.dtype],
    dims: Mapping[str, int],
) -> None:
    """Raise ValueError naming the first relay field of ``algorithm`` (field -> row shape
    in ``shapes``) whose buffer `[req_pool_size, *row]` would pass MAX_BUFFER_BYTES with
    ``dims``; called before anything is allocated."""
    for name, entries in shapes.items():
        shape = (req_pool_size, *(eval_dim(e, dims) for e in entries))
        size = buffer_bytes(shape, dtypes[name])
        if size > MAX_BUFFER_BYTES:
            used = sorted({d for e in entries for d in dims_of(e)})
            bound = "".join(f", {d}={dims[d]}" for d in used)
            raise ValueError(
                f"relay field `{name}` of the `{algorithm}` spec would need a buffer of "
                f"{list(shape)} {str(dtypes[name]).removeprefix('torch.')}: "
                f"{math.prod(shape):.3g} elements, {size:.3g} bytes, more than the "
                f"{MAX_BUFFER_TEXT} a relay buffer may take (req_pool_size={req_pool_size}"
                f"{bound}); bind smaller dims or a smaller req_pool_size"
            )


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
