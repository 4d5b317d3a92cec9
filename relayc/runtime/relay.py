"""The engine relay's runtime: the FutureMap base that generated engine modules subclass.

Hand-written and versioned (:data:`RUNTIME_VERSION`): a generated module calls
:func:`require_runtime` with the version it was generated for when it is imported, so a
module and a runtime that do not match fail at import with what to do, not at the first
stash (protobuf's generated code checks its runtime the same way).

The generated ``FutureMap`` names its fields: ``stash`` hands :meth:`FutureMapBase.write`
one value per field in ``FIELDS`` order, ``resolve`` builds its ``RelayPayload`` from
:meth:`FutureMapBase.read`. Those two are the one path on every device: they check the
call the same way, then copy with the fused kernel (:mod:`relayc.runtime.relay_kernel`,
one launch, on CUDA or with ``backend='triton'``) or with one ``index_copy_`` /
``index_select`` per field (the CPU, where Triton only interprets). The base also binds
dims, allocates the buffers (``buffers[field]``, keyed by name so no field name can
collide with an attribute; one ``[req_pool_size, *row]`` tensor per field rather than typed
views of one byte arena, because per-field indexing measured faster on the CPU at batch
size 1 and the fused kernel reaches every buffer in one launch anyway), records the publish event, keeps the host mirrors and the
debug-mode bookkeeping. Every bad call into the relay raises :class:`RelayError`.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from relayc.runtime.backend import resolve_backend
from relayc.runtime.dims import check_buffer_sizes, dims_of, eval_dim, torch_dtype
from relayc.runtime.fields import RelayField
from relayc.runtime.relay_kernel import relay_copy

# Bumped whenever what generated engine modules call here changes; they pass the version
# they were generated for to require_runtime().
RUNTIME_VERSION = 2

# What index_copy_ / index_select raise for a bad call (wrong dtype, shape, slot, payload).
_CAUGHT = (AttributeError, IndexError, RuntimeError, TypeError)


class RuntimeVersionError(ImportError):
    """A generated module meets a relay runtime of another version."""


def require_runtime(version: int, module: str) -> None:
    """Called by generated module ``module`` at import: it was generated for ``version``."""
    if version != RUNTIME_VERSION:
        raise RuntimeVersionError(
            f"{module} was generated for relay runtime version {version}, but "
            f"relayc.runtime.relay is version {RUNTIME_VERSION}: regenerate it with the "
            "relayc that provides this runtime (`relayc compile SPEC -o DIR`), or install "
            "the relayc it was generated with"
        )


def default_poison(dtype: torch.dtype) -> bool | int | float:
    if dtype == torch.bool:
        return True
    if dtype.is_floating_point:
        return float("nan")
    return torch.iinfo(dtype).min


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} tensor of shape {list(value.shape)}"
    return type(value).__name__


class RelayError(ValueError):
    """A bad call into a generated FutureMap (wrong payload, bad indices, unwritten rows)."""


class FutureMapBase:
    """Shared machinery of generated FutureMaps; see the generated class for the API."""

    ALGORITHM: str = ""
    FIELDS: tuple[RelayField, ...] = ()
    DIM_DEFAULTS: Mapping[str, int | None] = {}

    def __init__(
        self,
        req_pool_size: int,
        device: torch.device | str,
        *,
        dims: Mapping[str, int] | None = None,
        model_dtype: torch.dtype = torch.bfloat16,
        debug: bool = False,
        backend: str = "auto",
    ) -> None:
        # bool is an int subclass, and `int(2.7)` would silently drop a fraction.
        if isinstance(req_pool_size, bool) or not isinstance(req_pool_size, int):
            raise RelayError(
                f"req_pool_size must be a whole number of slots, got {req_pool_size!r}"
            )
        if req_pool_size < 2:
            raise RelayError(
                f"req_pool_size must be >= 2 (slot 0 is the padding slot), got {req_pool_size}"
            )
        self.req_pool_size = req_pool_size
        self.device = torch.device(device)
        self.model_dtype = model_dtype
        self.debug = debug
        self.dims = self._bind_dims(dims or {})
        self.backend = resolve_backend(backend, self.device)
        self._infos = {info.name: info for info in self.FIELDS}
        self.rows: dict[str, tuple[int, ...]] = {
            i.name: tuple(eval_dim(d, self.dims) for d in i.shape) for i in self.FIELDS
        }
        self.dtypes: dict[str, torch.dtype] = {
            i.name: torch_dtype(i.dtype, model_dtype) for i in self.FIELDS
        }
        shapes = {i.name: i.shape for i in self.FIELDS}
        check_buffer_sizes(self.ALGORITHM, req_pool_size, shapes, self.dtypes, self.dims)
        self._publish_event: Any = None
        # debug mode: which rows of each field were stashed since allocation
        self._written: dict[str, torch.Tensor] = {}
        # One buffer per field, [req_pool_size, *row]; None until a lazy field's first stash.
        self.buffers: dict[str, torch.Tensor | None] = dict.fromkeys(self._infos)
        for info in self.FIELDS:
            if info.alloc == "eager":
                self.allocate(info.name)
        # Pinned host copies of the mirrored fields (CUDA only: on the CPU the buffer is one).
        # Only the lag-0 mirror (a host read waits for the publish): generated engine modules
        # exist only for specs whose fields the engine target implements.
        self.host_mirrors: dict[str, torch.Tensor | None] = {
            info.name: self._host_mirror(info.name)
            for info in self.FIELDS
            if info.host_mirror is not None
        }
        # The fused kernel's view of the fields: (name, dtype), in FIELDS order.
        self._kernel_fields = tuple((name, dtype) for name, dtype in self.dtypes.items())
        self.fused = self.backend == "triton"

    def _host_mirror(self, name: str) -> torch.Tensor | None:
        if self.device.type != "cuda":
            return None
        buffer = self.buffers[name]
        if buffer is None:
            buffer = self.allocate(name)
        return torch.empty_like(buffer, device="cpu").pin_memory()

    def _bind_dims(self, given: Mapping[str, int]) -> dict[str, int]:
        unknown = sorted(set(given) - set(self.DIM_DEFAULTS))
        if unknown:
            raise ValueError(
                f"unknown dims for `{self.ALGORITHM}`: {', '.join(unknown)} "
                f"(it has {', '.join(self.DIM_DEFAULTS) or 'none'})"
            )
        # Only dims that a field's row shape names must have a value here.
        used = {d for info in self.FIELDS for entry in info.shape for d in dims_of(entry)}
        bound: dict[str, int] = {}
        for name, default in self.DIM_DEFAULTS.items():
            value = given.get(name, default)
            if value is None and name not in used:
                continue
            if value is None:
                raise ValueError(
                    f"`{self.ALGORITHM}` needs dim `{name}`: pass dims={{{name!r}: ...}}"
                )
            if int(value) <= 0:
                raise ValueError(f"dim `{name}` must be positive, got {value}")
            bound[name] = int(value)
        return bound

    def allocate(self, name: str) -> torch.Tensor:
        """Allocate field ``name``'s buffer `[req_pool_size, *row]`, initialised per the spec.

        Row 0, the padding slot, always starts as zeros (a valid token id and length): a
        CUDA graph's padded rows resolve it and feed it to the model, so it must never
        hold the poison or fill values that catch a real read-before-write. In debug
        mode an `empty` field starts as the poison value and every other row counts as
        unwritten; a field with an `init` value is defined from the start.
        """
        info = self._infos[name]
        dtype = self.dtypes[name]
        shape = (self.req_pool_size, *self.rows[name])
        if self.debug and info.init == "empty":
            poison = info.poison if info.poison is not None else default_poison(dtype)
            self._written[name] = torch.zeros(
                self.req_pool_size, dtype=torch.bool, device=self.device
            )
            self._written[name][0] = True
            buffer = torch.full(shape, poison, dtype=dtype, device=self.device)
        elif info.init == "empty":
            buffer = torch.empty(shape, dtype=dtype, device=self.device)
        elif info.init == "zeros":
            buffer = torch.zeros(shape, dtype=dtype, device=self.device)
        else:
            buffer = torch.full(shape, info.init, dtype=dtype, device=self.device)
        buffer[0] = 0
        self.buffers[name] = buffer
        return buffer

    # -- the one stash / resolve path --------------------------------------------------
    def write(self, indices: torch.Tensor, values: Sequence[torch.Tensor | None]) -> None:
        """Write ``values`` (one per field, in FIELDS order; None: not written) into rows
        ``indices``: what the generated ``stash`` calls. A lazy field's first value
        allocates its buffer."""
        buffers = self.buffers
        if self.fused:
            self.check_values(indices, values)
            if self.debug:
                self.check_slots(indices)
            for name, value in zip(buffers, values, strict=True):
                if value is not None and buffers[name] is None:
                    self.allocate(name)
            try:
                relay_copy(
                    self._kernel_fields, indices, list(buffers.values()), values, to_buffers=True
                )
            except ValueError as exc:
                raise RelayError(str(exc)) from exc
        else:
            # No checks up front: index_copy_ rejects a wrong dtype, shape or slot itself,
            # and the except branch says why (zero cost when all is well).
            try:
                if indices.dtype != torch.int64:  # index_copy_ takes int64 slots only
                    indices = indices.long()
                # strict=False: the generated stash passes one value per field, and a
                # length check on every call costs more than the copy of a small field.
                for (name, buffer), value in zip(buffers.items(), values, strict=False):
                    if value is not None:
                        if buffer is None:
                            buffer = self.allocate(name)
                        buffer.index_copy_(0, indices, value)
            except (*_CAUGHT, ValueError) as exc:
                raise self.call_error(indices, values) from exc
        if self.debug:
            self.mark_written(indices, values)

    def read(self, indices: torch.Tensor) -> list[torch.Tensor | None]:
        """Rows ``indices`` of every field, in FIELDS order (None: a lazy field never
        stashed): what the generated ``resolve`` builds its payload from."""
        if self.debug:
            self.check_resolve(indices)
        buffers = self.buffers.values()
        if not self.fused:
            try:
                return [None if b is None else torch.index_select(b, 0, indices) for b in buffers]
            except _CAUGHT as exc:
                raise self.call_error(indices) from exc
        self.check_indices(indices)
        n = indices.shape[0]
        outs = [
            None if b is None else torch.empty((n, *b.shape[1:]), dtype=b.dtype, device=b.device)
            for b in buffers
        ]
        try:
            relay_copy(self._kernel_fields, indices, list(buffers), outs, to_buffers=False)
        except ValueError as exc:
            raise RelayError(str(exc)) from exc
        return outs

    # -- events -----------------------------------------------------------------------
    def record_publish(self) -> None:
        """Record the publish event on the current stream (nothing to do on the CPU)."""
        if self.device.type == "cpu":
            return
        if self._publish_event is None:
            self._publish_event = torch.get_device_module(self.device).Event()
        self._publish_event.record()

    def wait_publish(self) -> None:
        if self._publish_event is not None:
            self._publish_event.synchronize()

    def host_copy(self, name: str, indices_cpu: torch.Tensor) -> torch.Tensor:
        """Rows of field ``name`` on the host, after the publish event, via the pinned mirror."""
        self.wait_publish()
        buffer = self.buffers[name]
        if buffer is None:
            buffer = self.allocate(name)
        mirror = self.host_mirrors.get(name)
        if mirror is None:  # CPU: the buffer already is on the host
            return buffer.index_select(0, indices_cpu.to(buffer.device))
        mirror.copy_(buffer, non_blocking=True)
        torch.get_device_module(self.device).current_stream().synchronize()
        return mirror.index_select(0, indices_cpu)

    # -- checks and errors --------------------------------------------------------------
    def check_indices(self, indices: Any) -> None:
        if not isinstance(indices, torch.Tensor) or indices.dim() != 1:
            raise RelayError(
                f"indices must be a 1-D tensor of request-pool slots, got {_describe(indices)}"
            )
        if indices.dtype not in (torch.int64, torch.int32):
            raise RelayError(f"indices must be int64 or int32, got {indices.dtype}")
        if indices.device != self.device and self.device.type != "cpu":
            raise RelayError(f"indices are on {indices.device}, the relay on {self.device}")

    def check_slots(self, indices: torch.Tensor) -> None:
        """Every slot is in ``[0, req_pool_size)`` (a host sync: debug mode and errors only)."""
        bad = indices[(indices < 0) | (indices >= self.req_pool_size)]
        if bad.numel():
            raise RelayError(
                f"indices out of range for req_pool_size {self.req_pool_size}: "
                f"{bad[:4].tolist()} (request-pool slots are 0 <= slot < req_pool_size; "
                "0 is the padding slot)"
            )

    def call_error(
        self, indices: Any, values: Sequence[Any] | None = None, payload_type: Any = None
    ) -> Exception:
        """Why a stash or resolve failed, as a RelayError.

        Called from except branches, so the happy path pays for no checks: index_copy_ /
        index_select reject bad calls themselves. ``values``: a stash's per-field values,
        or (with ``payload_type``) the payload that was not a ``RelayPayload``.
        """
        if payload_type is not None:
            self.check_payload(indices, values, payload_type)
        elif values is not None:
            self.check_values(indices, values)
        self.check_indices(indices)
        self.check_slots(indices)
        return RelayError(
            f"{self.ALGORITHM} relay call failed for indices {_describe(indices)}: "
            f"{sys.exc_info()[1]}"
        )

    def check_payload(self, indices: Any, payload: Any, payload_type: Any) -> None:
        """The payload is this relay's RelayPayload and every non-None field has its field's
        dtype and `[batch, *row]` shape."""
        if not isinstance(payload, payload_type):
            if not dataclasses.is_dataclass(payload) or isinstance(payload, type):
                raise RelayError(
                    f"payload must be a RelayPayload of `{self.ALGORITHM}`, got "
                    f"{_describe(payload)}"
                )
            foreign = [
                f.name
                for f in dataclasses.fields(payload)
                if f.name not in self._infos and getattr(payload, f.name) is not None
            ]
            if foreign:
                raise RelayError(
                    f"payload field{'s' if len(foreign) > 1 else ''} "
                    f"{', '.join(f'`{n}`' for n in foreign)} not relayed by "
                    f"`{self.ALGORITHM}` (its fields: {', '.join(self._infos)})"
                )
        self.check_values(indices, [getattr(payload, name, None) for name in self.dtypes])

    def check_values(self, indices: Any, values: Sequence[Any]) -> None:
        """Every non-None value has its field's dtype and `[batch, *row]` shape."""
        self.check_indices(indices)
        if len(values) != len(self.dtypes):
            raise RelayError(
                f"expected {len(self.dtypes)} values ({', '.join(self.dtypes)}), got {len(values)}"
            )
        batch = indices.shape[0]
        for (name, dtype), value in zip(self.dtypes.items(), values, strict=True):
            if value is None:
                continue
            if (
                not isinstance(value, torch.Tensor)
                or value.dtype != dtype
                or tuple(value.shape) != (batch, *self.rows[name])
            ):
                raise self.bad_payload(name, value, batch)

    def bad_payload(self, name: str, value: Any, batch: int) -> RelayError:
        if not isinstance(value, torch.Tensor):
            return RelayError(
                f"payload field `{name}` must be a tensor, got {type(value).__name__}"
            )
        want = (batch, *self.rows[name])
        return RelayError(
            f"payload field `{name}` must be {self.dtypes[name]} of shape {list(want)} "
            f"(batch {batch}, row {list(self.rows[name])}), got {value.dtype} of shape "
            f"{list(value.shape)}"
        )

    def payload_error(self, values: Mapping[str, Any], payload_type: Any) -> RelayError:
        """Why ``RelayPayload(**values)`` failed (publish with a field it does not relay)."""
        names = {f.name for f in dataclasses.fields(payload_type)}
        unknown = [name for name in values if name not in names]
        return RelayError(
            f"`{self.ALGORITHM}` relays no field {', '.join(f'`{n}`' for n in unknown)} "
            f"(its fields: {', '.join(self._infos)})"
        )

    def mark_written(self, indices: torch.Tensor, values: Sequence[Any]) -> None:
        """Debug mode: remember which rows of each field a stash wrote."""
        for name, value in zip(self.dtypes, values, strict=True):
            written = self._written.get(name)
            if written is not None and value is not None:
                written[indices.long()] = True

    def check_resolve(self, indices: torch.Tensor) -> None:
        """Debug mode: every row a resolve reads is in the pool and was stashed since allocation."""
        self.check_indices(indices)
        self.check_slots(indices)
        indices = indices.long()
        for name, written in self._written.items():
            missing = indices[~written[indices]]
            if missing.numel():
                raise RelayError(
                    f"resolve reads field `{name}` of slot {int(missing[0])}, which was never "
                    f"stashed (debug mode; {missing.numel()} unwritten rows in this resolve)"
                )
