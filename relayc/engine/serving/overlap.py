"""Where forward jobs run: inline, on a worker thread (CPU) or on a forward stream (CUDA).

This module is only the mechanism; the overlap contract (what may be touched
while a job runs, and when) is the docstring of ``relayc.engine.serving.scheduler``.

``submit(job)`` starts ``job`` after every earlier job (FIFO, like a stream)
and returns a ``Pending``; ``Pending.wait()`` blocks until the job's results,
host copies included, are readable on the host, and returns them.
``overlaps(rows)`` says whether a job of ``rows`` request rows should overlap the
host at all; when it says no, the scheduler calls ``run_inline(job)`` instead: the
job runs in the caller's thread after every earlier job, and the scheduler processes
it in the same iteration (no lag, as with ``overlap=False``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
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

    def overlaps(self, rows: int) -> bool:
        """Whether a job of ``rows`` request rows runs alongside the host (else inline)."""
        return self.overlap

    def run_inline(self, job: Callable[[], T]) -> Pending[T]:
        """Run ``job`` here, after every job submitted before it (FIFO as ``submit``)."""
        self.submit(_nothing).wait()
        return Pending(result=job())

    def close(self) -> None:  # noqa: B027 - only the thread runner holds a resource
        """Release the worker; jobs already submitted still finish."""


def _nothing() -> None:
    """A job that does nothing: waiting for it waits for every job submitted before it."""


class InlineRunner(ForwardRunner):
    """``overlap=False`` on the CPU: the job runs to completion inside ``submit``."""

    overlap = False

    def submit(self, job: Callable[[], T]) -> Pending[T]:
        return Pending(result=job())

    def run_inline(self, job: Callable[[], T]) -> Pending[T]:
        return Pending(result=job())


class ThreadRunner(ForwardRunner):
    """One worker thread, so jobs run in submission order; torch ops release the GIL.

    A job of at most ``inline_rows`` request rows runs inline instead (``overlaps``):
    a one-request forward is hundreds of ops of a few microseconds, each taking the
    GIL back, so the host's Python work does not run beside it but between its ops,
    and the hand-off to the worker (a queue, a future, a thread wake-up per step) is
    pure cost -- measured on `none`, one request at a time: about 9% fewer tokens/s
    than inline. At 8 requests the GEMMs are long enough to overlap and the worker
    wins. ``inline_rows=0``: every job goes to the worker.
    """

    overlap = True

    def __init__(self, inline_rows: int = 1) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relayc-forward")
        self.inline_rows = inline_rows
        self._last: Future[Any] | None = None  # the latest job handed to the worker

    def overlaps(self, rows: int) -> bool:
        return rows > self.inline_rows

    def submit(self, job: Callable[[], T]) -> Pending[T]:
        future = self._pool.submit(job)
        self._last = future
        return Pending(future=future)

    def run_inline(self, job: Callable[[], T]) -> Pending[T]:
        last = self._last
        if last is not None:
            self._last = None
            # Its failure, if any, reaches the host through its own Pending; here
            # only the order matters.
            wait([last])
        return Pending(result=job())

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
