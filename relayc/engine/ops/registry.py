"""The reference engine's shared op implementations, by op name (filled by ``@implements``),
and the contract every implementation -- the engine's or a user's -- is held to when a step
runs it.

The implementations of ops that drive one algorithm's drafter (``ctx.drafter``) are not
registered here: that algorithm's module names them (``Algorithm.impls``,
:mod:`relayc.engine.algorithms`), which is how the engine knows whose drafter they need.

:func:`checked` wraps an implementation so that what it returns is checked against the
op's declaration (:mod:`relayc.nodes`) when the op returns, before the next step of the
spec reads it: a dict, each declared output present in it a tensor of
``[rows, *row shape]`` and the declared dtype. The check reads shapes and dtypes only
(no device sync); under CUDA graphs it runs while a graph is captured, not on replay.
It is always on: about 2 us per op call on the CPU, some 0.2% of a decode step of
``eagle`` on the tiny random model (debug=False, eager), where a wrong output would
otherwise run on as garbage tokens.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch

from relayc.nodes import Op, get_op
from relayc.nodes.registry import user_ops
from relayc.runtime.dims import torch_dtype

Impl = Callable[..., dict[str, torch.Tensor]]
IMPLS: dict[str, Impl] = {}


def implements(op_name: str) -> Callable[[Impl], Impl]:
    """Register ``fn`` as the engine's implementation of the op ``op_name``, one any
    algorithm's step may run (it uses no drafter)."""

    def register(fn: Impl) -> Impl:
        IMPLS[op_name] = fn
        return fn

    return register


class OpOutputError(TypeError):
    """An op implementation returned something other than what its op declares."""


def declaration(op_name: str) -> Op | None:
    """The signature of ``op_name``: a built-in op's, or a user op's registered in this process.

    A user op belongs to the module that registered it, which a generated module does not
    record; every imported module is asked, and an op two of them declare differently
    (two specs' own ops of one name) is left unchecked rather than checked against the
    wrong one.
    """
    op = get_op(op_name)
    if op is not None:
        return op
    found = {id(op): op for m in list(sys.modules) if (op := user_ops(m).get(op_name))}
    return next(iter(found.values())) if len(found) == 1 else None


def _text(shape: tuple[int | str, ...], dtype: torch.dtype | str | None) -> str:
    """``[rows, *shape] dtype``, as the generated code's comments write a value's type."""
    name = "any" if dtype is None else dtype if isinstance(dtype, str) else str(dtype)
    return f"[{', '.join(str(d) for d in shape)}] {name.removeprefix('torch.')}"


def checked(
    op: Op, fn: Impl, dims: Mapping[str, int], model_dtype: torch.dtype
) -> Callable[..., Any]:
    """``fn`` with its outputs checked against ``op``'s declaration (see the module docstring).

    ``dims`` sizes the declared rows (the algorithm's dims); rows are the batch of the op's
    first tensor input, as in ``Op.meta``. An output whose row the dims cannot size (a dim
    the engine does not know) is checked for its dtype and rank only.
    """
    expected: dict[str, tuple[tuple[int, ...] | None, int, torch.dtype | None, str]] = {}
    for name, tensor_type in op.outputs.items():
        try:
            row: tuple[int, ...] | None = tensor_type.row(dims)
        except (KeyError, ValueError):
            row = None
        dtype = None if tensor_type.dtype == "any" else torch_dtype(tensor_type.dtype, model_dtype)
        declared = _text(("rows", *tensor_type.shape), tensor_type.dtype)
        expected[name] = (row, len(tensor_type.shape), dtype, declared)
    input_names = tuple(op.inputs)
    label = f"op `{op.name}` (implementation `{getattr(fn, '__qualname__', repr(fn))}`)"

    def run(ctx: Any, **inputs: Any) -> Any:
        outputs = fn(ctx, **inputs)
        if not isinstance(outputs, Mapping):
            raise OpOutputError(
                f"{label} returned {type(outputs).__name__}; an implementation returns a dict "
                f"of its outputs ({', '.join(f'`{n}`' for n in expected)})"
            )
        rows: int | None = None
        for input_name in input_names:
            value = inputs.get(input_name)
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                rows = value.shape[0]
                break
        for name, (row, rank, dtype, declared) in expected.items():
            value = outputs.get(name)
            if value is None:
                continue  # not produced: only a step reading it would notice (its KeyError)
            if not isinstance(value, torch.Tensor):
                raise OpOutputError(
                    f"{label} returned output `{name}` as {type(value).__name__}; the op "
                    f"declares a tensor `{declared}`"
                )
            want = None if row is None or rows is None else (rows, *row)
            shape_ok = value.dim() == 1 + rank if want is None else tuple(value.shape) == want
            if shape_ok and (dtype is None or value.dtype == dtype):
                continue
            here = "" if want is None else f", here `{_text(want, dtype)}`"
            raise OpOutputError(
                f"{label} returned output `{name}` as `{_text(tuple(value.shape), value.dtype)}`"
                f"; the op declares `{declared}`{here}: return that shape and dtype (the "
                "steps after it and the relay read the output as declared)"
            )
        return outputs

    run.__wrapped__ = fn  # type: ignore[attr-defined]
    return run
