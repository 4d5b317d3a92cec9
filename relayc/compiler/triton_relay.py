"""The SGLang target's fused relay kernel source: one launch per stash and one per resolve.

The engine target no longer emits this: its modules share the one hand-written kernel in
:mod:`relayc.runtime.relay_kernel`. The SGLang target still pastes the block emitted here
into its drop-in (``relayc_relay_kernels.py``), unrolled for the specs' field union, until
it moves to its own runtime; :func:`count_triton_launches` counts launches of either
kernel (both are named ``_relay_copy_kernel``).

The emitted block copies the whole payload in one launch: program ``i`` reads
``indices[i]`` on the device and copies row ``i`` of every present field, so nothing syncs
with the host, nothing is allocated and the grid is ``(n,)``. Contract with the module it
is pasted into (see :func:`emit_triton_relay`): it defines ``torch``, ``Sequence`` (from
``collections.abc``) and, when Triton imported, ``triton`` and ``tl``, plus a boolean guard
(``_HAVE_TRITON`` by default). Everything the block defines lives under the guard, so the
module still imports without Triton.
"""

from __future__ import annotations

import contextlib
import keyword
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

DTYPES: tuple[str, ...] = ("int32", "int64", "float32", "bfloat16", "float16", "bool", "model")

KERNEL = "_relay_copy_kernel"
# Largest row chunk one loop iteration copies: a power of two (tl.arange needs one) that keeps
# registers bounded while a 4096-wide bf16 hidden row still takes only four iterations.
MAX_BLOCK = 1024
# The kernel's direction flag (a tl.constexpr): True copies rows into the buffers (stash),
# False copies buffer slots out into rows (resolve). One kernel, two specialisations.
DIRECTION = "TO_BUFFERS"
# Per-field kernel parameters: the buffer pointer, the rows pointer and the row width
# (constexpr; 0 for a field absent from the launch, whose copy then compiles out).
FIELD_PARAMS = ("buf", "rows", "width")

_INDENT = "    "


@dataclass(frozen=True)
class RelayBuffer:
    """One relay field as the kernels see it: its name and its element dtype."""

    name: str
    dtype: str


def emit_triton_relay(buffers: Sequence[RelayBuffer], guard: str = "_HAVE_TRITON") -> str:
    """Python source of the fused relay kernel for ``buffers``, in order.

    The source defines, under ``if <guard>:``, one ``@triton.jit`` kernel
    ``_relay_copy_kernel`` (per field a buffer pointer, a rows pointer and a constexpr row
    width; a ``TO_BUFFERS`` constexpr picks stash or resolve) and the host entry points::

        triton_stash(indices, bufs, srcs)    # bufs[f][indices[i]] = srcs[f][i], srcs[f] not None
        triton_resolve(indices, bufs, outs)  # outs[f][i] = bufs[f][indices[i]], outs[f] not None

    ``bufs``, ``srcs`` and ``outs`` follow the order of ``buffers``. A slot outside
    ``[0, len(buffer))`` is never written by a stash and reads as zeros in a resolve, so a
    bad index cannot touch memory outside the buffers (callers that want an error check
    first, as the generated FutureMap does in debug mode).

    The block needs the names ``torch``, ``Sequence``, ``fused_copy`` (from
    :mod:`relayc.runtime.fused`), ``triton``, ``tl`` and ``guard`` from the module it is
    pasted into; it defines only names starting with ``_relay`` or ``triton_``, so no spec
    name can collide with them. The output depends only on the arguments.
    """
    _check_buffers(buffers, guard)
    lines = [
        "# The fused relay kernel: one Triton launch per stash and one per resolve, whatever",
        "# the number of fields (emitted by relayc.compiler.triton_relay; the host side is",
        "# relayc.runtime.fused). Program i copies row i of every field present in the launch.",
        f"if {guard}:",
    ]
    body = [
        "# Field order of the kernel's parameters and of `bufs` / `srcs` / `outs`.",
        "# (None: the model's dtype, bound when the FutureMap is built.)",
        "_RELAY_FIELDS: tuple[tuple[str, torch.dtype | None], ...] = (",
        *(f"{_INDENT}({b.name!r}, {_dtype_literal(b.dtype)})," for b in buffers),
        ")",
        "",
        *_COPY_ROW.replace("MAX_BLOCK", str(MAX_BLOCK)).splitlines(),
        "",
        *_kernel(buffers),
        "",
        *_HOST_CODE.splitlines(),
    ]
    lines += [_INDENT + line if line else "" for line in body]
    return "\n".join(lines) + "\n"


def _dtype_literal(dtype: str) -> str:
    return "None" if dtype == "model" else f"torch.{dtype}"


def _check_buffers(buffers: Sequence[RelayBuffer], guard: str) -> None:
    if not guard.isidentifier() or keyword.iskeyword(guard):
        raise ValueError(f"`guard` must be a Python identifier; got {guard!r}")
    if not buffers:
        raise ValueError("no relay fields: there is nothing to fuse")
    seen: set[str] = set()
    for buffer in buffers:
        if not buffer.name.isidentifier() or keyword.iskeyword(buffer.name):
            raise ValueError(f"relay field name must be a Python identifier; got {buffer.name!r}")
        if buffer.name.startswith("__"):
            # Inside a class body Python would mangle it; the spec checks reject it too.
            raise ValueError(f"relay field name must not start with `__`; got {buffer.name!r}")
        if buffer.name in seen:
            raise ValueError(f"relay field `{buffer.name}` is listed twice")
        seen.add(buffer.name)
        if buffer.dtype not in DTYPES:
            raise ValueError(
                f"relay field `{buffer.name}` has dtype {buffer.dtype!r}; "
                f"expected one of {', '.join(DTYPES)}"
            )


# Row copy of one field. `width` is a constexpr: 0 compiles the copy out (the field is not
# in this launch); otherwise the row is copied in power-of-two chunks of at most 1024
# elements (registers stay bounded; the mask covers the tail). A slot outside the pool
# masks every store into the buffer and reads zeros out of it.
_COPY_ROW = """\
@triton.jit
def _relay_copy_row(
    buf, rows, slot, row, valid, width: tl.constexpr, TO_BUFFERS: tl.constexpr
):
    if width > 0:
        block: tl.constexpr = MAX_BLOCK if width > MAX_BLOCK // 2 else triton.next_power_of_2(width)
        for start in tl.static_range(0, width, block):
            cols = start + tl.arange(0, block)
            mask = cols < width
            # valid is 0 or 1: a slot outside the pool has no buffer columns at all.
            buf_mask = cols < width * valid
            buf_at = buf + slot * width + cols
            rows_at = rows + row * width + cols
            if TO_BUFFERS:
                tl.store(buf_at, tl.load(rows_at, mask=mask), mask=buf_mask)
            else:
                tl.store(rows_at, tl.load(buf_at, mask=buf_mask, other=0), mask=mask)"""


def _kernel(buffers: Sequence[RelayBuffer]) -> list[str]:
    """The one kernel; stash and resolve differ only in its TO_BUFFERS constexpr."""
    # Fixed parameter and local names never end in a field suffix (`_buf`, `_rows`,
    # `_width`), so `<field>_<suffix>` cannot collide with them whatever the field is called.
    lines = [
        "@triton.jit",
        f"def {KERNEL}(",
        "    indices,",
        "    index_stride,",
        "    pool_size,",
    ]
    for b in buffers:
        note = " (as uint8)" if b.dtype == "bool" else ""
        lines.append(f"    # {b.name}: {b.dtype}{note}")
        lines += [
            f"    {b.name}_{p}{': tl.constexpr' if p == 'width' else ''}," for p in FIELD_PARAMS
        ]
    lines += [
        f"    {DIRECTION}: tl.constexpr,",
        "):",
        "    # int64 offsets: slot * width passes 2**31 for vocab-wide rows in a large pool.",
        "    row = tl.program_id(0).to(tl.int64)",
        "    slot = tl.load(indices + row * index_stride).to(tl.int64)",
        "    # Out-of-pool slots never write a buffer and read as zeros: a bad index cannot",
        "    # corrupt memory (debug mode rejects it on the host before the launch).",
        "    valid = ((slot >= 0) & (slot < pool_size)).to(tl.int64)",
        "    slot = tl.where(valid != 0, slot, 0)",
    ]
    for b in buffers:
        buf, rows, width = (f"{b.name}_{p}" for p in FIELD_PARAMS)
        lines.append(f"    _relay_copy_row({buf}, {rows}, slot, row, valid, {width}, {DIRECTION})")
    return lines


# Field-independent host code: the per-field specialisation lives in the kernel and
# `_RELAY_FIELDS`, so one argument builder (relayc.runtime.fused) serves both directions.
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
    fused_copy(_relay_copy_kernel, _RELAY_FIELDS, indices, bufs, srcs, to_buffers=True)


def triton_resolve(
    indices: torch.Tensor,
    bufs: Sequence[torch.Tensor | None],
    outs: Sequence[torch.Tensor | None],
) -> None:
    """`outs[f][i] = bufs[f][indices[i]]` for every field with an out tensor, in one launch.

    No host sync and no allocation (callers allocate `outs`); the grid depends only on
    `indices.shape[0]`.
    """
    fused_copy(_relay_copy_kernel, _RELAY_FIELDS, indices, bufs, outs, to_buffers=False)
'''


@dataclass
class RelayLaunches:
    """Relay kernel launches seen by :func:`count_triton_launches`: ("stash" or "resolve", grid)."""

    launches: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)

    @property
    def stash(self) -> int:
        return sum(name == "stash" for name, _ in self.launches)

    @property
    def resolve(self) -> int:
        return sum(name == "resolve" for name, _ in self.launches)


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
            if not warmup and self.__name__ == KERNEL:
                direction = "stash" if kwargs[DIRECTION] else "resolve"
                seen.launches.append((direction, tuple(grid)))
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)

        return run

    for cls, original in originals.items():
        cls.run = patched(original)
    try:
        yield seen
    finally:
        for cls, original in originals.items():
            cls.run = original
