"""What generated relay modules import: the FutureMap base and its checks.

The generated ``FutureMap`` of an algorithm holds its buffers as attributes and
spells out stash / publish / resolve per field; the base class holds what is
the same for every algorithm: binding dims, allocating a buffer, the publish
event, the debug-mode bookkeeping and the error messages for bad calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from relayc.kernels._backend import resolve_backend
from relayc.nodes.registry import dims_of, eval_dim, torch_dtype


@dataclass(frozen=True)
class FieldInfo:
    """A relay field as the generated module describes it (`FIELDS`)."""

    name: str
    dtype: str  # a spec dtype name; `model` is the model's dtype
    shape: tuple[str | int, ...]  # row shape in dims
    alloc: str = "eager"
    init: str | bool | int | float = "empty"
    poison: bool | int | float | None = None


def default_poison(dtype: torch.dtype) -> bool | int | float:
    if dtype == torch.bool:
        return True
    if dtype.is_floating_point:
        return float("nan")
    return torch.iinfo(dtype).min


class RelayError(ValueError):
    """A bad call into a generated FutureMap (wrong payload, bad indices, unwritten rows)."""


class FutureMapBase:
    """Shared machinery of generated FutureMaps; see the generated class for the API."""

    ALGORITHM: str = ""
    FIELD_INFOS: tuple[FieldInfo, ...] = ()
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
        if req_pool_size < 2:
            raise ValueError(
                f"req_pool_size must be >= 2 (slot 0 is the padding slot), got {req_pool_size}"
            )
        self.req_pool_size = int(req_pool_size)
        self.device = torch.device(device)
        self.model_dtype = model_dtype
        self.debug = debug
        self.dims = self._bind_dims(dims or {})
        self.backend = resolve_backend(backend, self.device)
        self._infos = {info.name: info for info in self.FIELD_INFOS}
        self.rows: dict[str, tuple[int, ...]] = {
            i.name: tuple(eval_dim(d, self.dims) for d in i.shape) for i in self.FIELD_INFOS
        }
        self.dtypes: dict[str, torch.dtype] = {
            i.name: torch_dtype(i.dtype, model_dtype) for i in self.FIELD_INFOS
        }
        self._publish_event: Any = None
        # debug mode: which rows of each field were stashed since allocation
        self._written: dict[str, torch.Tensor] = {}

    def _bind_dims(self, given: Mapping[str, int]) -> dict[str, int]:
        unknown = sorted(set(given) - set(self.DIM_DEFAULTS))
        if unknown:
            raise ValueError(
                f"unknown dims for `{self.ALGORITHM}`: {', '.join(unknown)} "
                f"(it has {', '.join(self.DIM_DEFAULTS) or 'none'})"
            )
        # Only dims that a field's row shape names must have a value here.
        used = {d for info in self.FIELD_INFOS for entry in info.shape for d in dims_of(entry)}
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
        """A buffer `[req_pool_size, *row]` for field ``name``, initialised per the spec."""
        info = self._infos[name]
        dtype = self.dtypes[name]
        shape = (self.req_pool_size, *self.rows[name])
        if self.debug:
            poison = info.poison if info.poison is not None else default_poison(dtype)
            self._written[name] = torch.zeros(
                self.req_pool_size, dtype=torch.bool, device=self.device
            )
            return torch.full(shape, poison, dtype=dtype, device=self.device)
        if info.init == "empty":
            return torch.empty(shape, dtype=dtype, device=self.device)
        if info.init == "zeros":
            return torch.zeros(shape, dtype=dtype, device=self.device)
        return torch.full(shape, info.init, dtype=dtype, device=self.device)

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

    def host_copy(
        self,
        buffer: torch.Tensor,
        mirror: torch.Tensor | None,
        indices_cpu: torch.Tensor,
    ) -> torch.Tensor:
        """Rows of ``buffer`` on the host, after the publish event, via the pinned mirror."""
        self.wait_publish()
        if mirror is None:  # CPU: the buffer already is on the host
            return buffer.index_select(0, indices_cpu.to(buffer.device))
        mirror.copy_(buffer, non_blocking=True)
        torch.get_device_module(self.device).current_stream().synchronize()
        return mirror.index_select(0, indices_cpu)

    # -- checks and errors --------------------------------------------------------------
    def check_indices(self, indices: torch.Tensor) -> None:
        if not isinstance(indices, torch.Tensor) or indices.dim() != 1:
            raise RelayError("indices must be a 1-D tensor of request-pool slots")
        if indices.dtype not in (torch.int64, torch.int32):
            raise RelayError(f"indices must be int64 or int32, got {indices.dtype}")
        if indices.device != self.device and self.device.type != "cpu":
            raise RelayError(f"indices are on {indices.device}, the relay on {self.device}")

    def call_error(self, indices: Any, payload: Any = None) -> RelayError:
        """Why a stash or resolve failed; re-raises the original error when it is not ours.

        Called from the except branch of the generated methods, so the happy path pays
        for no checks: index_copy_ / index_select reject bad calls themselves.
        """
        if payload is not None:
            self.check_payload(indices, payload)
        self.check_indices(indices)
        bad = indices[(indices < 0) | (indices >= self.req_pool_size)]
        if not bad.numel():
            raise
        return RelayError(
            f"indices out of range for req_pool_size {self.req_pool_size}: {bad[:4].tolist()} "
            "(request-pool slots are 0 <= slot < req_pool_size; 0 is the padding slot)"
        )

    def check_payload(self, indices: torch.Tensor, payload: Any) -> None:
        """Every non-None payload field has its field's dtype and `[batch, *row]` shape."""
        self.check_indices(indices)
        batch = indices.shape[0]
        for name, dtype in self.dtypes.items():
            value = getattr(payload, name)
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

    def mark_written(self, indices: torch.Tensor, payload: Any) -> None:
        """Debug mode: remember which rows of each field a stash wrote."""
        for name, written in self._written.items():
            if getattr(payload, name) is not None:
                written[indices] = True

    def check_resolve(self, indices: torch.Tensor) -> None:
        """Debug mode: every row a resolve reads was stashed since allocation."""
        self.check_indices(indices)
        for name, written in self._written.items():
            missing = indices[~written[indices]]
            if missing.numel():
                raise RelayError(
                    f"resolve reads field `{name}` of slot {int(missing[0])}, which was never "
                    f"stashed (debug mode; {missing.numel()} unwritten rows in this resolve)"
                )
