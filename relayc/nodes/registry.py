"""Typed node ops: what a spec step may name in `op:`.

An op declares its inputs (the parameters a step's `reads:` binds) and outputs
(what its `writes:` may list) as per-request tensor types: a dtype and a row
shape in dims, the batch dimension implied. From those declarations each op
gets a meta function that maps meta tensors of its inputs to meta tensors of
its outputs, which is how the compiler checks dtypes and shapes without a GPU.
The implementation of an op lives with whoever runs it: the engine hands a
mapping from op name to implementation to the generated ``DecodeStep``.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from relayc.specs.schema import DTYPES

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


def _eval(node: ast.AST, dims: Mapping[str, int]) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return dims[node.id]
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, dims), _eval(node.right, dims)
        ops: dict[type, Callable[[int, int], int]] = {
            ast.Add: lambda a, b: a + b,
            ast.Sub: lambda a, b: a - b,
            ast.Mult: lambda a, b: a * b,
            ast.FloorDiv: lambda a, b: a // b,
        }
        if type(node.op) in ops:
            return ops[type(node.op)](left, right)
    raise ValueError(f"unsupported shape expression: {ast.unparse(node)}")


def dims_of(expr: str | int) -> set[str]:
    if isinstance(expr, int):
        return set()
    return {n.id for n in ast.walk(ast.parse(expr, mode="eval")) if isinstance(n, ast.Name)}


@dataclass(frozen=True)
class TensorType:
    """A per-request tensor type: dtype name (or `any`) and row shape expressions."""

    dtype: str
    shape: tuple[str | int, ...] = ()
    optional: bool = False
    doc: str = ""

    def __post_init__(self) -> None:
        if self.dtype != "any" and self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}")

    def text(self) -> str:
        return f"{self.dtype} [{', '.join(str(d) for d in self.shape)}]"

    def row(self, dims: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(eval_dim(d, dims) for d in self.shape)


@dataclass(frozen=True, eq=False)
class Op:
    """A node op: typed inputs and outputs and a meta function."""

    name: str
    inputs: Mapping[str, TensorType]
    outputs: Mapping[str, TensorType]
    placement: str = "device"  # where it may run: device, host, or any
    doc: str = ""

    @property
    def __name__(self) -> str:  # torch.fx names call_function nodes after the target
        return self.name

    def meta(
        self, inputs: Mapping[str, torch.Tensor], dims: Mapping[str, int], model_dtype: torch.dtype
    ) -> dict[str, torch.Tensor]:
        """Output meta tensors (`[batch, *row]`) for meta tensors of the inputs."""
        batch = next(iter(inputs.values())).shape[0] if inputs else 1
        return {
            name: torch.empty(
                (batch, *t.row(dims)), dtype=torch_dtype(t.dtype, model_dtype), device="meta"
            )
            for name, t in self.outputs.items()
        }

    def __call__(self, ctx: Any, **inputs: Any) -> Any:
        raise NotImplementedError(
            f"op `{self.name}` is a signature; generated DecodeSteps call the implementation "
            "the engine passes in `impls`"
        )


_OPS: dict[str, Op] = {}


def register(op: Op) -> Op:
    """Register an op so specs can name it; a name is registered once."""
    if op.name in _OPS and _OPS[op.name] is not op:
        raise ValueError(f"op `{op.name}` is already registered with another signature")
    _OPS[op.name] = op
    return op


def get_op(name: str) -> Op | None:
    from relayc.nodes import ops  # noqa: F401  (registers the built-in ops)

    return _OPS.get(name)


def all_ops() -> dict[str, Op]:
    from relayc.nodes import ops  # noqa: F401

    return dict(_OPS)
