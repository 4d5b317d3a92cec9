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
import importlib
import os
import sys
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Any

import torch

from relayc.runtime.dims import eval_dim, torch_dtype
from relayc.specs import plugins
from relayc.specs.schema import DTYPES

_SHAPE_OPS = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)


def _check_shape_entry(entry: object) -> None:
    """A shape entry is a positive int or arithmetic (+ - * //) over dim names and ints."""
    if isinstance(entry, bool) or not isinstance(entry, (int, str)):
        raise ValueError(f"shape entry {entry!r} is neither a size nor a dim expression")
    if isinstance(entry, int):
        if entry <= 0:
            raise ValueError(f"shape entry {entry} is not a positive size")
        return
    try:
        tree = ast.parse(entry, mode="eval")
    except SyntaxError:
        raise ValueError(f"shape entry {entry!r} is not a dim expression") from None
    for node in ast.walk(tree.body):
        allowed = isinstance(node, (ast.Name, ast.BinOp, *_SHAPE_OPS, ast.Load)) or (
            isinstance(node, ast.Constant) and type(node.value) is int
        )
        if not allowed:
            raise ValueError(
                f"shape entry {entry!r}: only dim names, whole numbers and + - * // are allowed"
            )


@dataclass(frozen=True)
class TensorType:
    """A per-request tensor type: dtype name (or `any`) and row shape expressions."""

    dtype: str
    shape: tuple[str | int, ...] = ()
    optional: bool = False
    doc: str = ""

    def __post_init__(self) -> None:
        if self.dtype != "any" and self.dtype not in DTYPES:
            raise ValueError(
                f"unknown dtype {self.dtype!r}; use `any` or one of {', '.join(DTYPES)}"
            )
        for entry in self.shape:
            _check_shape_entry(entry)

    def text(self) -> str:
        return f"{self.dtype} [{', '.join(str(d) for d in self.shape)}]"

    def row(self, dims: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(eval_dim(d, dims) for d in self.shape)


EFFECT_ACCESS: tuple[str, ...] = ("reads", "writes")


@dataclass(frozen=True)
class Effect:
    """State an op touches besides its inputs and outputs, named so the compiler sees it.

    The draft KV cache is the example: `dflash_inject_kv` writes it and `dflash_draft` reads
    it, and nothing in their tensors says so. A declared effect keeps that order visible in
    the plan (``relayc explain``, the generated comments) instead of a dummy output.
    """

    resource: str  # what is touched: `draft_kv_cache`, `target_kv_cache`
    access: str = "writes"  # `reads` or `writes`
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.resource.isidentifier():
            raise ValueError(f"effect resource {self.resource!r} is not an identifier")
        if self.access not in EFFECT_ACCESS:
            raise ValueError(f"effect access {self.access!r} is not reads or writes")

    @property
    def text(self) -> str:
        return f"{self.access} {self.resource}"


@dataclass(frozen=True, eq=False)
class Op:
    """A node op: typed inputs and outputs, the effects it has, and a meta function."""

    name: str
    inputs: Mapping[str, TensorType]
    outputs: Mapping[str, TensorType]
    placement: str = "device"  # where it may run: device, host, or any
    doc: str = ""
    effects: tuple[Effect, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"op name {self.name!r} is not a Python identifier")
        if self.placement not in ("device", "host", "any"):
            raise ValueError(
                f"op `{self.name}`: placement {self.placement!r} is not device, host or any"
            )
        for kind, signature in (("input", self.inputs), ("output", self.outputs)):
            for name, tensor_type in signature.items():
                if not isinstance(tensor_type, TensorType):
                    raise ValueError(f"op `{self.name}`: {kind} `{name}` is not a TensorType")
        for effect in self.effects:
            if not isinstance(effect, Effect):
                raise ValueError(f"op `{self.name}`: effect {effect!r} is not an Effect")

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


class OpRegistrationError(ValueError):
    """An op that cannot be registered: its name is a built-in op's."""


_BUILTIN: dict[str, Op] = {}
_BUILTINS_SEALED = False
# User ops by the module that registered them, then by name: a spec sees the built-in
# ops and those of the modules it names (`ops:`, `--ops`), never another spec's.
_USER: dict[str, dict[str, Op]] = {}
# The module named under `ops:` being imported now: what it registers, directly or
# through helpers it imports, is its.
_importing: list[str] = []


def register(op: Op, *, module: str | None = None) -> Op:
    """Register ``op`` so specs can name it in `op:`; returns it (usable at module level).

    User ops belong to the module that registers them (``module``, else the module
    named under `ops:` that is being imported, else the caller's module) and are
    visible only to specs that name that module. Registering again from the same
    module replaces the op of that name, so re-importing a module (or registering the
    same object twice) is harmless. A user op cannot take a built-in op's name:
    :class:`OpRegistrationError`.
    """
    if not _BUILTINS_SEALED:
        if op.name in _BUILTIN and _BUILTIN[op.name] is not op:
            raise OpRegistrationError(f"built-in op `{op.name}` is registered twice")
        _BUILTIN[op.name] = op
        return op
    if op.name in _BUILTIN:
        if _BUILTIN[op.name] is op:
            return op
        raise OpRegistrationError(
            f"op `{op.name}` clashes with the built-in op of that name; give your op another name"
        )
    owner = module or (_importing[-1] if _importing else sys._getframe(1).f_globals["__name__"])
    _USER.setdefault(owner, {})[op.name] = op
    return op


def seal_builtins() -> None:
    """From now on registrations are user ops (called once the built-in ops are in)."""
    global _BUILTINS_SEALED
    _BUILTINS_SEALED = True


def get_op(name: str, modules: Sequence[str] = ()) -> Op | None:
    """The op ``name``: a built-in, one registered by one of ``modules``, or one an installed
    algorithm declares (:func:`plugin_ops`; looked up only for an unknown name)."""
    if name in _BUILTIN:
        return _BUILTIN[name]
    for module in modules:
        op = _USER.get(module, {}).get(name)
        if op is not None:
            return op
    return plugin_ops().get(name)


def all_ops(modules: Sequence[str] = ()) -> dict[str, Op]:
    """The built-in ops, those registered by ``modules`` and those installed algorithm
    packages declare (first registration wins)."""
    ops = dict(_BUILTIN)
    for module in modules:
        for name, op in _USER.get(module, {}).items():
            ops.setdefault(name, op)
    for name, op in plugin_ops().items():
        ops.setdefault(name, op)
    return ops


def plugin_op_package(op: Op) -> str | None:
    """The installed algorithm (its entry point's ``module:attribute``) whose ``ops``
    declare ``op``; None for an op no installed algorithm declares."""
    for name, target in plugins.loaded_objects():
        if any(declared is op for declared in target.ops):
            return plugins.installed()[name][0].value
    return None


def plugin_ops() -> dict[str, Op]:
    """The ops installed algorithms declare (``Algorithm.ops``: relayc's own or a
    package's), by name; looked up only for an op that is not built in.

    A spec names no code, so the op declarations of an algorithm package reach the compiler
    through its entry point (:mod:`relayc.specs.plugins`), not an `ops:` module. An op two
    packages declare differently is left out: neither is the spec's for certain. A name that
    clashes with a built-in op cannot be declared (the built-in one wins, as for `ops:`).
    """
    found: dict[str, Op | None] = {}
    for _, target in plugins.loaded_objects():
        for op in target.ops:
            if not isinstance(op, Op) or op.name in _BUILTIN:
                continue
            if op.name in found and found[op.name] is not op:
                found[op.name] = None
            else:
                found.setdefault(op.name, op)
    return {name: op for name, op in found.items() if op is not None}


def builtin_op_names() -> frozenset[str]:
    return frozenset(_BUILTIN)


def user_ops(module: str) -> dict[str, Op]:
    """The ops ``module`` registered (empty when it registered none)."""
    return dict(_USER.get(module, {}))


class OpsImportError(Exception):
    """A module of user ops that failed to import; the message says why."""


# Top-level modules imported from a spec's folder: another spec's folder may hold its own
# module of the same name (each `ops.py`), which then replaces it.
_SPEC_LOCAL: set[str] = set()


def import_op_module(name: str, search_dir: str | os.PathLike[str]) -> dict[str, Op]:
    """Import the user-op module ``name`` with ``search_dir`` importable first; returns its ops.

    A module imported earlier from another spec's folder (an ``ops.py`` beside another
    spec) is dropped, with the ops it registered, and the name imported afresh, so
    specs in different folders each get their own ``ops``. A module beside the spec
    that would shadow one already in use from elsewhere (``json.py``) is refused.
    """
    top = name.partition(".")[0]
    folder = FsPath(search_dir).resolve()
    local = folder / f"{top}.py" if (folder / f"{top}.py").is_file() else folder / top
    cached = sys.modules.get(top)
    if cached is not None and not _defined_under(cached, local):
        if top in _SPEC_LOCAL:
            # Imported from another spec's folder: not this spec's module, whether or not
            # this folder holds one of that name.
            for loaded in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
                del sys.modules[loaded]
                _USER.pop(loaded, None)
            _SPEC_LOCAL.discard(top)
        elif local.exists():
            # Another module of that name (the standard library's, an installed package's)
            # is in use: replacing it under everyone's feet is not an option.
            origin = getattr(cached, "__file__", None) or "built-in"
            raise OpsImportError(
                f"`{top}` is already imported from {origin}; rename "
                f"{display_folder(local)} so it does not shadow it"
            )
    sys.path.insert(0, str(folder))
    _importing.append(name)
    importlib.invalidate_caches()  # the file may be newer than the finders' listings
    try:
        importlib.import_module(name)
    except OpRegistrationError as exc:
        raise OpsImportError(str(exc)) from None
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            raise OpsImportError(
                f"no module named `{exc.name}` (looked in {display_folder(folder)} and on sys.path)"
            ) from None
        raise OpsImportError(f"{type(exc).__name__}: {exc}") from None
    except (Exception, SystemExit) as exc:  # the user's module: any failure is reported
        where = _user_frame(exc)
        raise OpsImportError(f"{type(exc).__name__}: {exc}{where}") from None
    finally:
        _importing.pop()
        sys.path.remove(str(folder))
    if local.exists() and _defined_under(sys.modules[top], local):
        _SPEC_LOCAL.add(top)
    return user_ops(name)


def _defined_under(module: types.ModuleType, local: FsPath) -> bool:
    file = getattr(module, "__file__", None)
    if file is None:
        return False
    path = FsPath(file).resolve()
    return path == local or local in path.parents


def display_folder(folder: FsPath) -> str:
    try:
        return str(folder.relative_to(FsPath.cwd())) or "."
    except ValueError:
        return str(folder)


def _user_frame(exc: BaseException) -> str:
    """` (at file:line)` of the user's line that failed, so they find it."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" (at {exc.filename}:{exc.lineno})"
    tb = exc.__traceback__
    where = ""
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith("<frozen"):
            where = f" (at {filename}:{tb.tb_lineno})"
        tb = tb.tb_next
    return where
