"""Where forward jobs run: inline, on a worker thread (CPU) or on a forward stream (CUDA).

This module is only the mechanism; the overlap contract (what may be touched
while a job runs, and when) is the docstring of ``relayc.engine.scheduler``.

``submit(job)`` starts ``job`` after every earlier job (FIFO, like a stream)
and returns a ``Pending``; ``Pending.wait()`` blocks until the job's results,
host copies included, are readable on the host, and returns them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

import torch

T = TypeVar("T")


class Pending(Generic[T]):
    """A submitted job; ``wait()`` returns its result once the host may read it."""

    def __init__(
        self, result: T | None = None, future: Future[T] | None = None, event: Any = None
    ) -> None:
        self._result = result
        self._future = future
        self._event = event  # a device event recorded after the job's host copies

    def wait(self) -> T:
        if self._future is not None:
            return self._future.result()
        if self._event is not None:
            self._event.synchronize()
        return self._result  # type: ignore[return-value]


class ForwardRunner(ABC):
    overlap: bool

    @abstractmethod
    def submit(self, job: Callable[[], T]) -> Pending[T]: ...

    def close(self) -> None:  # noqa: B027 - only the thread runner holds a resource
        """Release the worker; jobs already submitted still finish."""


class InlineRunner(ForwardRunner):
    """``overlap=False`` on the CPU: the job runs to completion inside ``submit``."""

    overlap = False

    def submit(self, job: Callable[[], T]) -> Pending[T]:
        return Pending(result=job())


class ThreadRunner(ForwardRunner):
    """One worker thread, so jobs run in submission order; torch ops release the GIL."""

    overlap = True

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relayc-forward")

    def submit(self, job: Callable[[], T]) -> Pending[T]:
        return Pending(future=self._pool.submit(job))

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class StreamRunner(ForwardRunner):
    """A forward stream: jobs enqueue kernels there; an event after each job guards its results.

    The forward stream first waits for the scheduler's stream, so tensors the
    host prepared there (KV slots sliced from the free list, host-to-device
    copies) are ready before the forward reads them. Without overlap the event
    is synchronised right away.
    """

    def __init__(self, device: torch.device, overlap: bool) -> None:
        self.overlap = overlap
        self._module = torch.get_device_module(device)
        self._device = device
        self.stream = self._module.Stream(device)

    def submit(self, job: Callable[[], T]) -> Pending[T]:
        self.stream.wait_stream(self._module.current_stream(self._device))
        with self._module.stream(self.stream):
            result = job()
            event = self._module.Event()
            event.record(self.stream)
        if not self.overlap:
            event.synchronize()
        return Pending(result=result, event=event)


def set_cpu_threads(threads: int | None = None) -> int:
    """Set torch's intra-op threads for CPU inference the one way every entry point uses
    (``relayc generate``, ``relayc demo``, the benchmarks); returns the count set.

    Default 1: a forward of the demo-sized models is hundreds of ops of a few microseconds,
    where more intra-op threads only add hand-offs (measured: torch's default threads made
    ``relayc generate --no-overlap`` 5-40x slower and erratic on a shared two-core machine),
    and with overlap the scheduler thread needs a core beside the forward's. Pass a larger
    count for a model whose GEMMs are big enough to split.
    """
    count = 1 if threads is None else threads
    if count < 1:
        raise ValueError(f"threads must be at least 1; got {count}")
    torch.set_num_threads(count)
    return count


def make_runner(device: torch.device, overlap: bool) -> ForwardRunner:
    if device.type == "cpu":
        return ThreadRunner() if overlap else InlineRunner()
    return StreamRunner(device, overlap)
