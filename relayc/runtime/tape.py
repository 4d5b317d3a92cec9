"""A decode step's device part recorded once on the CPU and replayed: a CPU graph.

A CUDA graph replays a step's kernels without the Python that launched them. On the CPU
the same Python is most of the time between two forwards: a generated step, its ops and
their checks run some hundreds of lines around a handful of native calls and a few dozen
small ATen calls, and after a forward has streamed the weights through the caches each
line runs cold. :class:`Recorder` runs the step once on a bucket's static buffers (as
``relayc.runtime.graph_runner`` captures a CUDA graph) and writes down what did the work:

- every ATen op that computes, through :class:`torch.utils._python_dispatch.TorchDispatchMode`:
  an op that writes its arguments (``index_copy_``, ``zero_``, an ``out=`` form) as it was
  called; an op that returns new tensors as its ``out=`` form writing into the tensors it
  returned at the recording (``_to_copy`` as a ``copy_`` into them); views and
  allocations not at all (their tensors are the recording's, kept by the tape);
- every call into a native library the engine makes through :func:`native_library`
  (``relayc.engine.native.library``), with its arguments -- pointers into the static buffers, the
  model, the caches and the tensors the recording allocated -- and the code it returned.

:meth:`Tape.replay` makes those calls again, in order, on the same memory: the bits of the
recorded run's ops on this step's inputs, without the Python around them. What the recording
refuses, and why (:class:`TapeRefused`; the runner then runs that bucket from its static
buffers as before): whatever a CUDA graph cannot hold (``relayc.runtime.capture``: a host
read such as ``.item()`` or ``.tolist()``, a data-dependent shape), a tensor made from host
data (``torch.tensor``: it would keep the recorded step's values), and an op with no
``out=`` form. The CPU's native fast paths stay on (they read only their buffers); the tree
walks' host loops do not (they read values into Python).

A native call that returns another code at a replay than at the recording either declines
(the EAGLE-3 chain's near-tie, 1: the caller drafts its own way) or found a bad index; the
one-call entry points check before they write. If no call before it wrote anything the
step had before it started (only the recording's own tensors, or a constant fill), the
replay stops and returns False and the caller runs the step eagerly from the same static
buffers; otherwise it raises. Everything the step reads outside its static inputs -- the
model, the K/V caches, the relay's buffers, ``req_to_token`` -- is held by reference, as a
CUDA graph holds it: a tape is stale once those move (``DecodeGraphs.reset``).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

import torch

from relayc.runtime.capture import CaptureCheck, _where

aten = torch.ops.aten

# Ops that only allocate: the recording's tensors are kept, nothing is replayed.
_ALLOCATIONS = frozenset(
    (aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided)
)
# Writes whose result does not depend on what the tensor held: a replay that stops after one
# leaves the step's state as a rerun will find it.
_CONSTANT_WRITES = frozenset((aten.zero_, aten.fill_))
_REFUSED = {
    aten.lift_fresh: "makes a tensor from host data (torch.tensor): a replay would keep the "
    "recorded step's values",
    aten.lift_fresh_copy: "makes a tensor from host data (torch.tensor): a replay would keep "
    "the recorded step's values",
}

_RECORDER: ContextVar[Recorder | None] = ContextVar("relayc_tape_recorder", default=None)

# op -> lowering(args, kwargs, outputs): (native function, its arguments[, what they point
# into that the tape must hold]) doing the same work on the same memory and returning 0
# (another code: an index it refuses, found before it writes); None where it does not apply
# (register_lowering)
Lowering = Callable[[tuple[Any, ...], dict[str, Any], Sequence[Any]], tuple[Any, ...] | None]
_LOWERINGS: dict[Any, Lowering] = {}


def register_lowering(op: Any, lowering: Lowering) -> None:
    """Record ``op`` (an ATen overload) as the native call ``lowering`` gives, where it
    gives one: the engine's native library registers its row gathers, scatters, fills and
    copies (``relayc.engine.native.tape_ops``)."""
    _LOWERINGS[op] = lowering


class TapeRefused(RuntimeError):
    """The step does something a tape cannot replay (the message says what, and where)."""


_NO_CODE = object()


class Tape:
    """The recorded calls of one step on one bucket's buffers; :meth:`replay` runs them.

    Runs of native calls whose library runs recorded calls itself
    (:func:`register_native_batch`) replay as one call into it (``batched`` counts them):
    a call made from Python pays ctypes' conversion of each argument, some ten microseconds
    a call right after a forward, where the library's loop makes the same calls on the
    same arguments, in the same order, checking the same codes."""

    def __init__(
        self,
        calls: Sequence[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], object, str]],
        restart_before: int,
        keep: Sequence[object],
    ) -> None:
        self._calls = tuple(calls)
        self._restart_before = restart_before  # a declining call at or before it may rerun
        self._keep = tuple(keep)  # what the calls point into
        self.names = tuple(name for *_, name in self._calls)  # what each call is, in order
        self._code = ctypes.c_int64()  # what a batch's declining call returned
        self._segments, self._records = _segments(self._calls, ctypes.addressof(self._code))
        self.batched = sum(count for _, count, run, _ in self._segments if run is not None)

    def __len__(self) -> int:
        return len(self._calls)

    def replay(self) -> bool:
        """Run the calls; False: a native call declined before any lasting write (see the
        module), so the caller reruns the step eagerly."""
        calls = self._calls
        for first, count, run, args in self._segments:
            if run is None:
                fn, call_args, kwargs, code, _ = calls[first]
                got = fn(*call_args, **kwargs)
                if code is not _NO_CODE and got != code:
                    return self._stopped(first, got)
            else:
                done = run(*args)
                if done != count:
                    return self._stopped(first + done, self._code.value)
        return True

    def _stopped(self, index: int, got: Any) -> bool:
        if index <= self._restart_before:
            return False
        _, _, _, code, name = self._calls[index]
        raise RuntimeError(
            f"the replayed step's call {index} ({name}) returned {got!r}, not "
            f"{code!r} as when it was recorded, after earlier calls had written the "
            "step's state; run with graphs='off' to see what it refuses"
        )


# Native libraries that run recorded calls themselves (register_native_batch), and their
# functions' numbers in that runner, by name.
_BATCHERS: list[tuple[Any, dict[str, int]]] = []
_ANY_CODE = -(1 << 63)  # a batched call whose code is not checked


def register_native_batch(lib: Any, names: Sequence[str]) -> None:
    """``lib`` runs recorded calls of its functions ``names`` (numbered in that order) in
    one call: ``lib.relayc_tape_run(records, n, code)`` (the engine's native library;
    csrc/tape.c says the layout). A tape batches each run of calls to them."""
    if all(known is not lib for known, _ in _BATCHERS):
        _BATCHERS.append((lib, {name: number for number, name in enumerate(names)}))


Segment = tuple[int, int, Any, tuple[Any, ...]]


def _segments(
    calls: Sequence[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], object, str]],
    code_address: int,
) -> tuple[tuple[Segment, ...], tuple[Any, ...]]:
    """(first call, how many, runner, its arguments): a run of calls one native runner makes,
    or (first, 1, None, ()) a call made from Python; and the runners' records, which the
    tape must hold."""
    segments: list[Segment] = []
    records: list[Any] = []
    index = 0
    while index < len(calls):
        found = _batchable(calls[index])
        if found is None:
            segments.append((index, 1, None, ()))
            index += 1
            continue
        lib, words = found
        end = index + 1
        while end < len(calls):
            more = _batchable(calls[end])
            if more is None or more[0] is not lib:
                break
            words.extend(more[1])
            end += 1
        record = (ctypes.c_int64 * len(words))(*words)
        records.append(record)
        run_args = (ctypes.addressof(record), end - index, code_address)
        segments.append((index, end - index, lib.relayc_tape_run, run_args))
        index = end
    return tuple(segments), tuple(records)


def _batchable(
    call: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], object, str],
) -> tuple[Any, list[int]] | None:
    """The library that can make ``call`` and its record there; None: call it from Python."""
    fn, args, kwargs, code, _ = call
    fn = getattr(fn, "__wrapped__", fn)  # a timing wrapper (the benchmarks')
    symbol = getattr(fn, "__name__", None)
    argtypes = getattr(fn, "argtypes", None)
    if kwargs or symbol is None or argtypes is None or len(argtypes) != len(args):
        return None
    for lib, numbers in _BATCHERS:
        number = numbers.get(symbol)
        own = getattr(lib, symbol, None)
        if number is None or _address(getattr(own, "__wrapped__", own)) != _address(fn):
            continue
        words = [_word(arg, kind) for arg, kind in zip(args, argtypes, strict=True)]
        if any(word is None for word in words):
            return None
        want = _ANY_CODE if code is _NO_CODE else code
        if not isinstance(want, int):
            return None
        return lib, [number, len(words), want, *(w for w in words if w is not None)]
    return None


def _address(fn: Any) -> int | None:
    try:
        return ctypes.cast(fn, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


def _word(arg: Any, kind: Any) -> int | None:
    """``arg`` as the 64-bit word the runner passes for a parameter of ctypes type ``kind``:
    an integer or pointer as it is, a float's bits; None: not one of those."""
    if kind is ctypes.c_float:
        if not isinstance(arg, (int, float)):
            return None
        return int.from_bytes(struct.pack("<f", arg), "little")
    if kind is ctypes.c_double:
        return None
    word: int | None
    if isinstance(arg, int):
        word = int(arg)
    elif arg is None:
        word = 0
    elif isinstance(arg, ctypes.Array):
        word = ctypes.addressof(arg)
    elif isinstance(arg, ctypes._SimpleCData):
        value = arg.value
        word = 0 if value is None else value if isinstance(value, int) else None
    else:
        word = _reference(arg)
    if word is None or not -(1 << 63) <= word < (1 << 63):
        return None
    return word


def _reference(arg: Any) -> int | None:
    """The address a ``ctypes.byref(obj)`` passes, where it is ``obj``'s own (no offset)."""
    obj = getattr(arg, "_obj", None)
    if type(arg).__name__ != "CArgObject" or obj is None:
        return None
    try:
        address = ctypes.addressof(obj)
    except TypeError:
        return None
    return address if f"({address:#x})" in repr(arg) else None


def warm_up() -> None:
    """Pay now what the first recording would pay: a ``TorchDispatchMode``'s first op imports
    ``torch._dynamo`` (about 1.5 s here, once a process), so without this the first request
    of a process waited that much longer than the rest. ``DecodeGraphs`` calls it when the
    engine is built with recorded steps."""
    import torch._dynamo  # noqa: F401  (what torch._compile's wrappers import on first use)


class Recorder(CaptureCheck):
    """Records a step's ATen ops and native calls into a :class:`Tape` (see the module)."""

    def __init__(self, step_file: str | None = None) -> None:
        super().__init__(step_file, native=True)
        self._calls: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], object, str]]
        self._calls = []
        self._keep: list[object] = []
        self._made: set[int] = set()  # storages the recording allocated
        self._written: set[int] = set()  # storages its calls write (native calls unknown)
        self._read: set[int] = set()  # storages its ATen calls are given
        self._pointers: list[int] = []  # integers its native calls are given
        self._restart_before: int | None = None  # the first call that writes lasting state
        self.refused: TapeRefused | None = None  # why it refused, once it has

    def __enter__(self) -> Recorder:
        self._token = _RECORDER.set(self)
        try:
            super().__enter__()
        except BaseException:
            _RECORDER.reset(self._token)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            _RECORDER.reset(self._token)

    def tape(self) -> Tape:
        restart = len(self._calls) if self._restart_before is None else self._restart_before
        return Tape(self._calls, restart, self._keep)

    def _fail(self, func: Any, why: str) -> None:
        # kept: TorchScript re-raises what its ops raise as a bare RuntimeError
        self.refused = TapeRefused(
            f"{func} {why}; a CPU graph cannot replay it (at {_where(self.step_file)})"
        )
        raise self.refused

    def _lasting(self) -> None:
        if self._restart_before is None:
            self._restart_before = len(self._calls)

    def native(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """Call ``fn(*args)`` (a native function) and record it with the code it returns."""
        code = fn(*args)
        self._pointers.extend(_integers(args))
        if code not in (0, None):
            self._fail(
                name,
                f"returned {code} while recording (a decline or a refused index): the "
                "recorded path would not be the one its replays take",
            )
        # What it writes is unknown here, so a later call's decline cannot rerun the step; its
        # own decline can (the entry points check before they write).
        self._lasting()
        self._calls.append((fn, args, {}, code, name))
        return code

    def __torch_dispatch__(
        self,
        func: Any,
        types: Sequence[type],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        why = _REFUSED.get(func.overloadpacket)
        if why is not None:
            self._fail(func, why)
        out = super().__torch_dispatch__(func, types, args, kwargs)  # the capture checks
        self._read.update(t.untyped_storage().data_ptr() for t in _tensors((args, kwargs)))
        packet, schema = func.overloadpacket, func._schema
        outs = [t for t in (out if isinstance(out, (tuple, list)) else (out,))]
        if packet in _ALLOCATIONS:
            self._own(outs)
            return out
        written = [
            value
            for argument, value in _bound(schema, args, kwargs)
            if argument.alias_info is not None and argument.alias_info.is_write
        ]
        if written:
            self._written.update(
                t.untyped_storage().data_ptr() for t in written if isinstance(t, torch.Tensor)
            )
            if packet not in _CONSTANT_WRITES and not all(self._owned(t) for t in written):
                self._lasting()
            self._append(func, args, kwargs, outs)
            return out
        if all(r.alias_info is not None for r in schema.returns):
            return out  # views of what it was given: nothing to run again
        if not all(isinstance(t, torch.Tensor) for t in outs):
            self._fail(func, "returns something other than tensors")
        self._own(outs)
        if packet is aten._to_copy:
            self._append(aten.copy_.default, (outs[0], args[0]), {}, [outs[0]], str(func))
            return out
        form = _out_form(func)
        if form is None:
            self._fail(func, "has no out= form to write into the recorded tensors")
        assert form is not None
        overload, names = form
        lowered = self._lowered(func, args, kwargs, outs)
        if lowered is not None:
            self._calls.append(lowered)
        else:
            kept = {k: v for k, v in kwargs.items() if k not in _OPTIONS}
            filled = {**kept, **dict(zip(names, outs, strict=True))}
            self._calls.append((overload, args, filled, _NO_CODE, str(func)))
        return out

    def _append(
        self,
        func: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        outs: Sequence[Any],
        name: str | None = None,
    ) -> None:
        lowered = self._lowered(func, args, kwargs, outs)
        self._calls.append(lowered or (func, args, kwargs, _NO_CODE, name or str(func)))

    def _lowered(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], outs: Sequence[Any]
    ) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], object, str] | None:
        lowering = _LOWERINGS.get(func)
        made = None if lowering is None else lowering(args, kwargs, outs)
        if made is None:
            return None
        fn, native_args = made[0], made[1]
        keep: tuple[Any, ...] = tuple(made[2:])
        # the native arguments are pointers: hold what they point into (a wrapped scalar
        # operand, a fill's pattern) for as long as the tape
        self._keep.extend((args, kwargs, outs, *keep))
        return fn, native_args, {}, 0, f"{func} (native)"

    def reads(self, tensor: torch.Tensor) -> bool:
        """Whether a recorded call is given ``tensor``'s memory: an ATen call its storage, a
        native call a pointer into it (what a native call reads through a struct -- the
        model's weights and caches -- is not seen here: a step's inputs are passed as
        arguments)."""
        storage = tensor.untyped_storage()
        start = storage.data_ptr()
        if start in self._read:
            return True
        end = start + storage.nbytes()
        return any(start <= p < end for p in self._pointers)

    def writes(self, tensor: torch.Tensor) -> bool:
        """Whether a recorded ATen op wrote ``tensor``'s storage (a native call's writes
        are not known here: only the tensors it is given as outputs -- not static inputs)."""
        return tensor.untyped_storage().data_ptr() in self._written

    def _own(self, tensors: Sequence[Any]) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._keep.append(t)
                self._made.add(t.untyped_storage().data_ptr())

    def _owned(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in self._made


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in ``value`` (nested tuples, lists and dicts)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _integers(args: Sequence[Any]) -> Iterator[int]:
    """The integers a native call is given: ints, and ctypes pointers' and arrays' values."""
    for arg in args:
        if isinstance(arg, int):
            yield arg
        elif isinstance(arg, ctypes.Array):
            yield from (int(v) for v in arg if isinstance(v, int))
        else:
            value = getattr(arg, "value", None)
            if isinstance(value, int):
                yield value


def _bound(schema: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[tuple[Any, Any]]:
    for index, argument in enumerate(schema.arguments):
        if index < len(args):
            yield argument, args[index]
        elif argument.name in kwargs:
            yield argument, kwargs[argument.name]


_OUT_FORMS: dict[Any, tuple[Any, list[str]] | None] = {}
# A factory's tensor options: its out= form takes them from the tensor it writes.
_OPTIONS = frozenset(("dtype", "layout", "device", "pin_memory"))


def _out_form(func: Any) -> tuple[Any, list[str]] | None:
    """The overload of ``func``'s packet that takes the same arguments (less a factory's
    tensor options; more with defaults) plus one ``out`` tensor per return, and those out
    arguments' names; None if it has none."""
    if func in _OUT_FORMS:
        return _OUT_FORMS[func]
    base = [(a.name, str(a.type)) for a in func._schema.arguments if a.name not in _OPTIONS]
    found = None
    for name in func.overloadpacket.overloads():
        overload = getattr(func.overloadpacket, name)
        arguments = overload._schema.arguments
        outs = [a.name for a in arguments if a.is_out]
        given = [a for a in arguments if not a.is_out]
        # the same arguments, then any with defaults (arange.start_out's step)
        if (
            outs
            and len(outs) == len(func._schema.returns)
            and [(a.name, str(a.type)) for a in given[: len(base)]] == base
            and all(a.has_default_value() for a in given[len(base) :])
        ):
            found = (overload, outs)
            break
    _OUT_FORMS[func] = found
    return found


def recording() -> Recorder | None:
    """The recorder this thread runs under, if any (native call sites record through it)."""
    return _RECORDER.get()


class _RecordingLibrary:
    """A native library whose functions record their calls on ``recorder`` as they run."""

    def __init__(self, lib: Any, recorder: Recorder) -> None:
        self._lib, self._recorder = lib, recorder

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = getattr(self._lib, name)
        recorder = self._recorder

        def call(*args: Any) -> Any:
            return recorder.native(name, fn, args)

        return call


def native_library(lib: Any) -> Any:
    """``lib``, or while a step is recorded a stand-in whose calls the tape records: every
    native call a recorded step makes must come through here."""
    recorder = _RECORDER.get()
    return lib if recorder is None or lib is None else _RecordingLibrary(lib, recorder)
