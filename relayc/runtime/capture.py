"""`capture_check`: find, on the CPU, what a CUDA graph could not hold.

A CUDA graph replays a fixed sequence of kernels on fixed addresses. It cannot
hold a host sync (`.item()`, `.tolist()`, `bool(tensor)`), an op whose output
shape depends on data (`nonzero`, boolean-mask indexing, `unique`,
`masked_select`, `repeat_interleave` without `output_size`), or a copy between
the device and the host. :class:`CaptureCheck` is a TorchDispatchMode that sees
every aten op a decode step dispatches and fails on those, naming the op and
the line of the generated step that ran it; :func:`capture_check` also checks
that a run leaves the relay's buffers where they were (a graph's static
addresses) and returns only tensors.

Some host reads never reach the dispatcher (`.tolist()`, `.numpy()`, and `.cpu()`
of a tensor already on the CPU), so while the check runs those Tensor methods are
replaced by ones that fail: on a GPU each would be a device-to-host copy. The
tree walks' CPU host loops (``relayc.kernels._backend.host_loops``) are switched
off meanwhile, so the check sees the path a GPU captures.
"""

from __future__ import annotations

import inspect
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from relayc.runtime.backend import graph_safe_paths
from relayc.runtime.outputs import output_items

aten = torch.ops.aten

_FORBIDDEN: dict[Any, str] = {
    aten._local_scalar_dense: "reads a tensor value on the host (.item(), .tolist(), int(), "
    "bool(t)): a host sync",
    aten.is_nonzero: "reads a tensor value on the host (bool(t)): a host sync",
    aten.equal: "compares tensors on the host (torch.equal): a host sync",
    aten.nonzero: "has a data-dependent output shape (nonzero)",
    aten.masked_select: "has a data-dependent output shape (masked_select)",
    aten._unique2: "has a data-dependent output shape (unique)",
    aten.unique_dim: "has a data-dependent output shape (unique)",
    aten.unique_consecutive: "has a data-dependent output shape (unique_consecutive)",
}


class CaptureViolation(RuntimeError):
    """Something a CUDA graph cannot hold, found by :class:`CaptureCheck`."""


_OWN_FILES = ("runtime/capture.py", "runtime/tape.py")  # never the line to point at


def _where(step_file: str | None) -> str:
    """The innermost frame in the generated step's module, else the innermost of ours."""
    frames = traceback.extract_stack()[:-3]
    for frame in reversed(frames):
        if step_file is not None and frame.filename == step_file:
            return f"{frame.filename}:{frame.lineno}: {frame.line}"
    for frame in reversed(frames):
        if "/torch/" not in frame.filename and not frame.filename.endswith(_OWN_FILES):
            return f"{frame.filename}:{frame.lineno}: {frame.line}"
    return "<unknown>"


# Host reads that never reach the dispatcher: while any check runs, these Tensor methods are
# replaced by guards that fail in a thread (context) running a check and pass through in
# every other -- an engine's host thread keeps reading tokens while its forward thread
# records a step. Installed by the first check to start, restored when the last one ends.
_HOST_READS = ("tolist", "numpy", "cpu", "__array__")
_ACTIVE: ContextVar[CaptureCheck | None] = ContextVar("relayc_capture_check", default=None)
_guards_lock = threading.Lock()
_guards = {"count": 0}
_originals: dict[str, Any] = {}


def _guard(name: str, original: Any) -> Any:
    def guarded(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        check = _ACTIVE.get()
        if check is not None:
            check._fail(
                f"Tensor.{name}()", "reads a tensor on the host: a device-to-host copy and a sync"
            )
        return original(tensor, *args, **kwargs)

    return guarded


def _guard_host_reads(change: int) -> None:
    with _guards_lock:
        _guards["count"] += change
        if change > 0 and _guards["count"] == 1:
            for name in _HOST_READS:
                _originals[name] = getattr(torch.Tensor, name)
                setattr(torch.Tensor, name, _guard(name, _originals[name]))
        elif change < 0 and _guards["count"] == 0:
            for name, method in _originals.items():
                setattr(torch.Tensor, name, method)
            _originals.clear()


class CaptureCheck(TorchDispatchMode):
    """Fail on any aten op a CUDA graph cannot capture."""

    def __init__(self, step_file: str | None = None, *, native: bool = False) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.step_file = step_file  # to point at the generated line that ran the op
        self.ops_seen = 0
        # native=True keeps the CPU's native one-call paths (relayc.runtime.tape records them)
        self.native_paths = native

    def __enter__(self) -> CaptureCheck:
        # The CPU's host-loop fast paths stand aside: check the path a GPU would capture.
        self._graph_safe = graph_safe_paths(native=self.native_paths)
        self._graph_safe.__enter__()
        self._active = _ACTIVE.set(self)
        _guard_host_reads(+1)
        super().__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(self, *exc: Any) -> None:
        _guard_host_reads(-1)
        _ACTIVE.reset(self._active)
        self._graph_safe.__exit__(None, None, None)
        super().__exit__(*exc)  # type: ignore[no-untyped-call]

    def _fail(self, func: Any, why: str) -> None:
        raise CaptureViolation(
            f"{func} {why}; a CUDA graph cannot capture it (at {_where(self.step_file)})"
        )

    def __torch_dispatch__(
        self,
        func: Any,
        types: Sequence[type],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        self.ops_seen += 1
        why = _FORBIDDEN.get(func.overloadpacket)
        if why is not None:
            self._fail(func, why)
        if func.overloadpacket in (aten.index, aten.index_put, aten.index_put_):
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices):
                self._fail(func, "indexes with a boolean mask: a data-dependent shape")
        if func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            self._fail(
                func, "has a data-dependent output shape (repeat_interleave without output_size)"
            )
        if func.overloadpacket in (aten._to_copy, aten.copy_):
            self._check_copy(func, args, kwargs)
        return func(*args, **kwargs)

    def _check_copy(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if func.overloadpacket is aten.copy_:
            dst, src = args[0], args[1]
            devices = {dst.device.type, src.device.type}
        else:
            src = args[0]
            target = kwargs.get("device")
            devices = {src.device.type, torch.device(target).type} if target else set()
        if len(devices) > 1:
            self._fail(func, f"copies between {' and '.join(sorted(devices))}: a host transfer")


def _buffers(relay: Any) -> dict[str, int]:
    return {name: buffer.data_ptr() for name, buffer in relay.buffers.items() if buffer is not None}


def capture_check(
    step: Any, ctx: Any, inputs: Mapping[str, torch.Tensor], host: Mapping[str, torch.Tensor]
) -> Any:
    """Run ``step.run_device`` as a graph capture would, on any device; fail on violations.

    The step is run once eagerly first (a capture warms up the same way, so lazy relay
    buffers exist before it starts), then under :class:`CaptureCheck`.
    """
    step.run_device(ctx, **inputs, host=host)
    before = _buffers(step.relay)
    with CaptureCheck(inspect.getsourcefile(type(step))):
        outputs = step.run_device(ctx, **inputs, host=host)
    after = _buffers(step.relay)
    moved = sorted(name for name in before if after.get(name) != before[name])
    if moved or set(after) != set(before):
        raise CaptureViolation(
            f"the step reallocated relay buffers {moved or sorted(set(after) - set(before))}; "
            "a captured graph writes to fixed addresses"
        )
    for key, value in output_items(outputs):
        if not isinstance(value, torch.Tensor):
            raise CaptureViolation(
                f"output `{key}` is a {type(value).__name__}, not a tensor; "
                "a captured graph returns only tensors in its static pool"
            )
    return outputs


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.count = 0

    def __torch_dispatch__(
        self,
        func: Any,
        types: Sequence[type],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


def count_aten_ops(fn: Callable[[], object]) -> int:
    """How many aten ops ``fn()`` dispatches (what the relay benchmarks compare)."""
    mode = _CountOps()
    with mode:
        fn()
    return mode.count
