"""The paged KV cache, laid out as SGLang lays it out.

Three pieces, each with one job:

* ``ReqToTokenPool`` maps a request slot to the KV slots of its tokens:
  ``req_to_token[req_pool_index, position] -> kv slot`` (int32).
* ``TokenToKVPool`` hands out and takes back KV slots (a free list).
* ``KVCache`` holds the K/V tensors, ``k[layer][kv_slot] -> [num_kv_heads, head_dim]``.

Slot 0 of both pools is reserved and never handed out: CUDA-graph padding rows
use request slot 0, whose row of ``req_to_token`` stays all zeros, so they read
and write KV slot 0 and never touch a live request's cache.

The model never writes ``req_to_token``: a forward writes the new tokens' K/V at
``out_cache_loc`` and reads the cached prefix through ``req_to_token[r, :prefix_len]``;
the scheduler records the new slots in ``req_to_token`` once it commits the
tokens (for a draft tree, only the accepted ones).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from relayc.engine.core.config import ModelConfig


class ReqToTokenPool:
    """Request slots ``1..size`` and the ``[size + 1, max_context]`` slot table."""

    def __init__(self, size: int, max_context: int, device: torch.device | str = "cpu") -> None:
        if size <= 0 or max_context <= 0:
            raise ValueError(f"size and max_context must be positive; got {size}, {max_context}")
        self.size = size
        self.max_context = max_context
        self.req_to_token = torch.zeros((size + 1, max_context), dtype=torch.int32, device=device)
        # On the CPU, the same memory as a NumPy array: the scheduler's per-step writes
        # there are NumPy scalar stores, a few microseconds right after a forward has
        # emptied the caches, where one torch op costs about a hundred. None elsewhere.
        self.host_table: np.ndarray | None = (
            self.req_to_token.numpy() if self.req_to_token.device.type == "cpu" else None
        )
        # ... and as a memoryview ``[size + 1, max_context]`` of int32: a store there is a
        # few CPython instructions, cheaper still than NumPy's right after a forward.
        self.host_words: memoryview | None = (
            None
            if self.host_table is None
            else self.host_table.data.cast("B").cast("i", self.host_table.shape)
        )
        self._free: list[int] = list(range(1, size + 1))

    def available_size(self) -> int:
        return len(self._free)

    def alloc(self, n: int = 1) -> list[int] | None:
        """``n`` request slots, or None when fewer than ``n`` are free."""
        if n > len(self._free):
            return None
        taken, self._free = self._free[:n], self._free[n:]
        return taken

    def free(self, indices: int | list[int]) -> None:
        indices = [indices] if isinstance(indices, int) else list(indices)
        for index in indices:
            if not 1 <= index <= self.size:
                raise ValueError(f"request slot {index} is outside 1..{self.size}")
        doubled = set(indices) & set(self._free)
        if doubled or len(set(indices)) != len(indices):
            raise ValueError(f"request slots freed twice: {sorted(doubled) or indices}")
        self._free.extend(indices)

    def in_use(self) -> list[int]:
        """Request slots handed out and not freed, ascending."""
        free = set(self._free)
        return [i for i in range(1, self.size + 1) if i not in free]

    def reset(self) -> None:
        """Every slot free and every row zero, as new; the table keeps its storage (a
        captured CUDA graph may hold it)."""
        self._free = list(range(1, self.size + 1))
        self.req_to_token.zero_()


class TokenToKVPool:
    """Allocator of KV slots ``1..size``; the free list lives on the device.

    ``alloc`` slices the free list, so it neither synchronises nor launches work
    that waits on the GPU: the scheduler can allocate for step i+1 while step i
    runs. ``check=True`` validates every ``free`` on the host (a sync): use it in
    tests to catch a double free or a freed padding slot.
    """

    def __init__(
        self, size: int, device: torch.device | str = "cpu", *, check: bool = False
    ) -> None:
        if size <= 0:
            raise ValueError(f"size must be positive; got {size}")
        self.size = size
        self.device = torch.device(device)
        self.check = check
        self._buffer = torch.empty(0, dtype=torch.int64, device=self.device)
        self._host: np.ndarray | None = None  # the buffer as NumPy, on the CPU
        self._words: memoryview | None = None  # ... and as an int64 memoryview
        self._capacity = 0  # the buffer's length
        self._start = self._end = 0
        self.reset()

    @property
    def _free(self) -> torch.Tensor:
        """The free slots, oldest first (a view of the buffer)."""
        return self._buffer[self._start : self._end]

    def available_size(self) -> int:
        return self._end - self._start

    def alloc(self, n: int) -> torch.Tensor | None:
        """``n`` KV slots as an int64 tensor, or None when fewer than ``n`` are free."""
        if n > self._end - self._start:
            return None
        taken = self._buffer[self._start : self._start + n]
        self._start += n
        return taken

    def alloc_host(self, n: int) -> tuple[torch.Tensor, np.ndarray | None] | None:
        """:meth:`alloc`, and on the CPU the same slots as a NumPy view (read without a
        torch op: see ``ReqToTokenPool.host_table``); None elsewhere."""
        start = self._start
        taken = self.alloc(n)
        if taken is None:
            return None
        return taken, None if self._host is None else self._host[start : start + n]

    def alloc_words(self, n: int) -> list[int] | None:
        """:meth:`alloc` on the CPU as a list of ints (read through a memoryview: no torch
        or NumPy call, see ``ReqToTokenPool.host_words``); None when fewer than ``n`` are
        free. Off the CPU: :meth:`alloc`'s slots read back."""
        if self._words is None:
            taken = self.alloc(n)
            return None if taken is None else taken.tolist()
        start = self._start
        if n > self._end - start:
            return None
        self._start = start + n
        return self._words[start : start + n].tolist()

    def free(self, slots: torch.Tensor) -> None:
        slots = slots.reshape(-1).to(device=self.device, dtype=torch.int64)
        if slots.numel() == 0:
            return
        if self.check:
            self._check_freed(slots.tolist())
        n = slots.numel()
        self._room(n)
        self._buffer[self._end : self._end + n] = slots
        self._end += n

    def free_host(self, slots: Sequence[int] | np.ndarray) -> None:
        """:meth:`free` for slots the host holds as integers (a NumPy array or a list): NumPy
        or memoryview stores on the CPU."""
        if self._host is None:
            self.free(torch.tensor(np.asarray(slots, dtype=np.int64), device=self.device))
            return
        n = len(slots)
        if n == 0:
            return
        if self.check:
            self._check_freed([int(s) for s in slots])
        self._room(n)
        end, words = self._end, self._words
        if isinstance(slots, np.ndarray) or words is None:
            self._host[end : end + n] = slots
        else:  # a few ints: memoryview stores
            for i, slot in enumerate(slots):
                words[end + i] = slot
        self._end = end + n

    def _check_freed(self, host: list[int]) -> None:
        if min(host) < 1 or max(host) > self.size:
            raise ValueError(f"freed KV slots must lie in 1..{self.size}; got {sorted(host)}")
        doubled = set(host) & set(self._free.tolist())
        if doubled or len(set(host)) != len(host):
            raise ValueError(f"KV slots freed twice: {sorted(doubled) or host}")

    def _room(self, n: int) -> None:
        """Room for ``n`` freed slots past ``_end``. When the buffer is full, a new one (the
        free slots at its front): slots handed out are views of the old one, which stays
        theirs; only past ``_end`` is ever written."""
        if self._end + n <= self._capacity:
            return
        live = self._free
        size = 2 * max(self.size, live.numel() + n)
        self._set_buffer(torch.empty(size, dtype=torch.int64, device=self.device))
        self._buffer[: live.numel()] = live
        self._start, self._end = 0, live.numel()

    def _set_buffer(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer
        self._capacity = buffer.numel()
        self._host = buffer.numpy() if buffer.device.type == "cpu" else None
        self._words = None if self._host is None else self._host.data.cast("B").cast("q")

    def reset(self) -> None:
        """Every slot free, as new. The free list is ``_buffer[_start:_end]``: ``alloc``
        takes from its front, ``free`` appends at its back (one copy of the freed slots,
        where a new list would copy every free slot)."""
        self._set_buffer(torch.empty(2 * self.size, dtype=torch.int64, device=self.device))
        self._buffer[: self.size] = torch.arange(
            1, self.size + 1, dtype=torch.int64, device=self.device
        )
        self._start, self._end = 0, self.size


class KVCache:
    """K and V buffers ``[num_layers][size + 1, num_kv_heads, head_dim]``; row 0 is padding."""

    def __init__(
        self,
        num_layers: int,
        size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (size + 1, num_kv_heads, head_dim)
        self.size = size
        # One buffer, every layer's K then V a contiguous view of it: copy_slots moves a
        # slot in every layer with one gather and one scatter instead of two per layer.
        self.buffer = torch.zeros((2 * num_layers, *shape), dtype=dtype, device=device)
        self.k = list(self.buffer[:num_layers].unbind(0))
        self.v = list(self.buffer[num_layers:].unbind(0))

    @classmethod
    def for_model(
        cls, config: ModelConfig, size: int, device: torch.device | str = "cpu"
    ) -> KVCache:
        return cls(
            config.num_layers, size, config.num_kv_heads, config.head_dim, config.dtype, device
        )

    def copy_slots(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy every layer's K/V at slots ``src [T]`` to slots ``dst [T]``."""
        src, dst = src.long(), dst.long()
        self.buffer[:, dst] = self.buffer[:, src]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``/``v`` ``[T, num_kv_heads, head_dim]`` at KV ``slots`` ``[T]``."""
        k_cache, v_cache = self.k[layer], self.v[layer]
        if k.dtype != k_cache.dtype:  # a no-op .to() still costs a dispatch per layer
            k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
        k_cache[slots] = k
        v_cache[slots] = v
