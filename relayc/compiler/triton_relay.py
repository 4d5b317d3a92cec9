"""Fused Triton relay kernels: one launch per stash and one per resolve, whatever the field count.

A generated module relays per-request state through one device buffer per relay field,
shaped ``[req_pool_size, *row_shape]`` and indexed by request-pool slot. Copying field by
field costs one launch (and one index_put/index_select allocation) per field; for EAGLE's
five fields that is five launches on the critical path of every iteration. The code emitted
here does the whole payload in one launch: program ``i`` reads ``indices[i]`` on the device
and copies row ``i`` of every present field, so nothing syncs with the host, nothing is
allocated and the grid is ``(n,)``, which makes stash and resolve safe to capture in a
CUDA graph.

The emitted block is module-level code meant to be pasted into a generated module. Contract
with that module (see :func:`emit_triton_relay`): it defines ``torch``, ``Sequence`` (from
``collections.abc``) and, when Triton imported, ``triton`` and ``tl``, plus a boolean guard
(``_HAVE_TRITON`` by default). Everything the block defines lives under the guard, so the
module still imports without Triton; callers fall back to torch indexing when
``triton_stash`` is not defined.
"""

from __future__ import annotations

import contextlib
import keyword
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

DTYPES: tuple[str, ...] = ("int32", "int64", "float32", "bfloat16", "float16", "bool", "model")

STASH_KERNEL = "_relay_stash_kernel"
RESOLVE_KERNEL = "_relay_resolve_kernel"


_INDENT = "    "


@dataclass(frozen=True)
class RelayBuffer:
    """One relay field as the kernels see it: its name and its element dtype."""

    name: str
    dtype: str


def emit_triton_relay(
    algorithm: str, buffers: Sequence[RelayBuffer], guard: str = "_HAVE_TRITON"
) -> str:
    """Python source of the fused relay kernels for ``algorithm``'s ``buffers``, in order.

    The source defines, under ``if <guard>:``, the ``@triton.jit`` kernels
    ``_relay_stash_kernel`` / ``_relay_resolve_kernel`` (per field: a buffer pointer, a rows
    pointer and constexpr row width, chunk size and presence flag, so absent fields compile
    out) and the host entry points::

        triton_stash(indices, bufs, srcs)    # bufs[f][indices[i]] = srcs[f][i], srcs[f] not None
        triton_resolve(indices, bufs, outs)  # outs[f][i] = bufs[f][indices[i]], outs[f] not None

    ``bufs``, ``srcs`` and ``outs`` follow the order of ``buffers``. The block needs the names
    ``torch``, ``Sequence``, ``fused_copy`` (from :mod:`relayc.runtime.fused`), ``triton``,
    ``tl`` and ``guard`` from the module it is pasted into. The output depends only on the arguments (same bytes every run).
    """
    _check_buffers(algorithm, buffers, guard)
    lines = [
        f"# Fused relay kernels for `{algorithm}`: one Triton launch per stash and one per",
        "# resolve, whatever the number of fields (relayc.compiler.triton_relay).",
        f"if {guard}:",
    ]
    body = [
        "# Field order of the kernels' parameters and of `bufs` / `srcs` / `outs`.",
        "# (None: the model's dtype, bound when the FutureMap is built.)",
        "_RELAY_FIELDS: tuple[tuple[str, torch.dtype | None], ...] = (",
        *(f'{_INDENT}("{b.name}", {_dtype_literal(b.dtype)}),' for b in buffers),
        ")",
        "",
        "@triton.jit",
        "def _relay_copy_row(dst, src, width: tl.constexpr, block: tl.constexpr):",
        "    # Chunked so any row width works with bounded registers; the mask covers the tail.",
        "    for start in range(0, width, block):",
        "        cols = start + tl.arange(0, block)",
        "        mask = cols < width",
        "        tl.store(dst + cols, tl.load(src + cols, mask=mask), mask=mask)",
        "",
        *_kernel(
            STASH_KERNEL,
            buffers,
            "Program i copies row i of every present field into buffer slot indices[i].",
            dst="buf",
            src="rows",
        ),
        "",
        *_kernel(
            RESOLVE_KERNEL,
            buffers,
            "Program i copies buffer slot indices[i] of every present field into row i.",
            dst="rows",
            src="buf",
        ),
        "",
        *_HOST_CODE.splitlines(),
    ]
    lines += [_INDENT + line if line else "" for line in body]
    return "\n".join(lines) + "\n"


def _dtype_literal(dtype: str) -> str:
    return "None" if dtype == "model" else f"torch.{dtype}"


def _check_buffers(algorithm: str, buffers: Sequence[RelayBuffer], guard: str) -> None:
    if not guard.isidentifier() or keyword.iskeyword(guard):
        raise ValueError(f"`guard` must be a Python identifier; got {guard!r}")
    if "\n" in algorithm:
        raise ValueError(
            f"`algorithm` must be one line (it goes into a comment); got {algorithm!r}"
        )
    if not buffers:
        raise ValueError(f"algorithm `{algorithm}` relays no fields; there is nothing to fuse")
    seen: set[str] = set()
    for buffer in buffers:
        if not buffer.name.isidentifier() or keyword.iskeyword(buffer.name):
            raise ValueError(f"relay field name must be a Python identifier; got {buffer.name!r}")
        if buffer.name in seen:
            raise ValueError(f"relay field `{buffer.name}` is listed twice")
        seen.add(buffer.name)
        if buffer.dtype not in DTYPES:
            raise ValueError(
                f"relay field `{buffer.name}` has dtype {buffer.dtype!r}; "
                f"expected one of {', '.join(DTYPES)}"
            )


def _kernel(
    name: str, buffers: Sequence[RelayBuffer], why: str, *, dst: str, src: str
) -> list[str]:
    """One kernel; stash and resolve differ only in which side of the copy is the buffer."""
    lines = ["@triton.jit", f"def {name}(", "    indices,"]
    for b in buffers:
        lines += [
            f"    # {b.name}: {b.dtype}" + (" (as uint8)" if b.dtype == "bool" else ""),
            f"    {b.name}_buf,",
            f"    {b.name}_rows,",
            f"    {b.name}_width: tl.constexpr,",
            f"    {b.name}_block: tl.constexpr,",
            f"    {b.name}_present: tl.constexpr,",
        ]
    lines += [
        "):",
        f"    # {why}",
        "    # int64 offsets: slot * width passes 2**31 for vocab-wide rows in a large pool.",
        "    row = tl.program_id(0).to(tl.int64)",
        "    slot = tl.load(indices + row).to(tl.int64)",
    ]
    offsets = {"buf": "slot", "rows": "row"}
    for b in buffers:
        lines += [
            f"    # {b.name}: {b.dtype}",
            f"    if {b.name}_present:",
            "        _relay_copy_row(",
            f"            {b.name}_{dst} + {offsets[dst]} * {b.name}_width,",
            f"            {b.name}_{src} + {offsets[src]} * {b.name}_width,",
            f"            {b.name}_width,",
            f"            {b.name}_block,",
            "        )",
        ]
    return lines


# Field-independent host code: the per-field specialisation lives in the kernels and
# `_RELAY_FIELDS`, so one argument builder serves both entry points.
_HOST_CODE = '''\
def triton_stash(
    indices: torch.Tensor,
    bufs: Sequence[torch.Tensor | None],
    srcs: Sequence[torch.Tensor | None],
) -> None:
    """`bufs[f][indices[i]] = srcs[f][i]` for every field whose src is not None, in one launch.

    No host sync and no allocation; the grid depends only on `indices.shape[0]`.
    Duplicate indices (the padding slot) race: which row lands there is unspecified.
    """
    fused_copy(_relay_stash_kernel, _RELAY_FIELDS, indices, bufs, srcs)

def triton_resolve(
    indices: torch.Tensor,
    bufs: Sequence[torch.Tensor | None],
    outs: Sequence[torch.Tensor | None],
) -> None:
    """`outs[f][i] = bufs[f][indices[i]]` for every field with an out tensor, in one launch.

    No host sync and no allocation (callers allocate `outs`); the grid depends only on
    `indices.shape[0]`.
    """
    fused_copy(_relay_resolve_kernel, _RELAY_FIELDS, indices, bufs, outs)
'''


@dataclass
class RelayLaunches:
    """Relay kernel launches seen by :func:`count_triton_launches`: (kernel name, grid)."""

    launches: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)

    @property
    def stash(self) -> int:
        return sum(name == STASH_KERNEL for name, _ in self.launches)

    @property
    def resolve(self) -> int:
        return sum(name == RESOLVE_KERNEL for name, _ in self.launches)


@contextlib.contextmanager
def count_triton_launches() -> Iterator[RelayLaunches]:
    """Record every launch of a relay kernel (compiled or interpreted) inside the block.

    Patches ``run`` on Triton's kernel classes, because a launch ``kernel[grid](...)`` always
    ends there, whichever module the kernel was emitted into. Warm-up compiles are not counted.
    """
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    seen = RelayLaunches()
    originals = {cls: cls.run for cls in (JITFunction, InterpretedFunction)}

    def patched(original):  # one closure per class: each keeps its own `run`
        def run(self, *args, grid, warmup, **kwargs):
            if not warmup and self.__name__ in (STASH_KERNEL, RESOLVE_KERNEL):
                seen.launches.append((self.__name__, tuple(grid)))
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)

        return run

    for cls, original in originals.items():
        cls.run = patched(original)
    try:
        yield seen
    finally:
        for cls, original in originals.items():
            cls.run = original
