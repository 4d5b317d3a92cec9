"""The overlap contract the scheduler keeps, and where forward jobs run: inline, on a
worker thread (CPU) or on a forward stream (CUDA).

Overlap contract
================

One iteration ``i`` of ``Scheduler.step()`` on the host:

1. **Schedule.** Arrived requests join the waiting queue. The running batch is
   filtered (requests the device is done with leave) and merged with requests
   admitted from the queue, first come first served, while a request slot, room
   in ``max_batch_size`` and the request's whole KV reservation are free.
2. **Prepare.** A prefill step (prompt tokens from the host, at most
   ``max_prefill_tokens`` of them: a long prompt is prefilled in chunks over
   several iterations, only its last chunk samples; and the one-token tail
   steps below) and a decode step (running requests whose window surely fits
   the context) are built as host tensors; KV slots for every prefill token,
   and a window of ``W = decode_width`` slots per decoding request, are sliced
   off the KV pool's free list.
3. **Launch** job ``i`` on the forward runner (CUDA: the forward stream; CPU: a
   worker thread, or inline for a one-request job, see ``ThreadRunner``;
   ``overlap=False``: inline). An inline job is processed in the same iteration. In order, on the device: copy the
   host tensors; prefill hook (forward, sample, stash into the ``FutureMap``);
   decode hook (resolve the input tokens from the ``FutureMap`` by request-pool
   slot, forward, sample -- or draft, verify and accept -- stash); record the
   new tokens' KV slots in ``req_to_token`` (the scheduler's commit, unless the
   algorithm committed its accepted KV itself, as every ``W > 1`` algorithm
   does; the model never writes it); start non-blocking copies of the tokens
   (and, for multi-token steps, their counts) to the host.
4. **Process** job ``i - 1`` (overlap) or job ``i`` (no overlap): wait for its
   guard, append the tokens to the requests, free each window's unaccepted
   slots, detect finishes, free finished requests.

What lives where. The device state -- KV cache, ``req_to_token``, the relay
buffers, the sampled tokens -- is touched only by jobs, and jobs run one after
the other in submission order, so job ``i``'s resolve reads exactly what job
``i - 1`` stashed (a request prefilled in job ``i - 1`` decodes in job ``i``
from the token its prefill stashed). The host owns the request records, the
queues and both free lists. The KV free list is a device tensor that is only
sliced and concatenated, never written in place, so the slots handed to an
in-flight job stay valid while the host allocates and frees.

Guards. The host reads job ``i``'s sampled tokens only after ``Pending.wait()``:
on CUDA an event recorded on the forward stream after the device-to-host copy,
on the CPU the worker's future. Job ``i`` reads what the host prepared only
after the forward stream waited for the scheduler's stream (CUDA) or after
``submit`` handed it over (CPU); the in-flight record keeps those tensors alive
until the wait.

Why the host lags one iteration. Job ``i`` is prepared and launched before job
``i - 1`` is processed, so the host knows tokens only up to job ``i - 2``. It
needs no token to launch: the input tokens come from the relay. Streamed
tokens reach the caller one iteration late.

Lengths under the lag. A prompt chunk commits a known number of tokens, so
``Request.kv_len`` counts it at launch; a decode step commits 1 to ``W`` tokens
that the host learns when it processes the step. So the host keeps the known
length ``kv_len`` and the decode steps in flight ``inflight_decodes`` (at most
two while a decode is being launched), and uses ``kv_len + W * inflight_decodes``
(``kv_len_bound``) wherever it needs the truth: as ``max_prefix_len`` (the
attention shapes), in the context check (a window is scheduled only if
``kv_len_bound + W <= max_context``; else the request sits out until its
steps are processed), and in the reservation below. ``kv_len + inflight_decodes``
is a lower bound, passed as the decode batch's ``prefix_lens`` / positions
guess; both are exact for ``W = 1``, where the device's own lengths need no
relay. An algorithm with ``W > 1`` keeps the true lengths on the device (its
relayed ``new_seq_lens``).

The context end. Near ``max_context`` a window no longer fits (positions and
``req_to_token`` stop there), yet the request may still owe up to ``W - 1``
tokens (``max_new_tokens`` is clipped to the context, as for ``none``). With
nothing in flight the host knows every token of it, so it finishes with tail
steps: one row of the prefill step each, the last sampled token at the exact
committed length, run through the prefill hook as a prompt's next chunk would
be (forward, sample keyed by position, reseed the relay) and committed by the
scheduler. The tail samples as ``none`` does, so the greedy tokens and the
finish are those of ``none``. No decode step
follows a tail step (the committed length only grows), so the reseeded relay
is never resolved by a window. Only a request's last ``W - 1`` or fewer tokens
take this path, one every other iteration under overlap (each waits for the
token before it); requests that end earlier never do.

Late finishes. ``scheduled_samples`` counts one token per step in flight (a
lower bound; a processed step adds the rest of its count), so no request is
scheduled once it surely has ``max_new_tokens``. A stop token sampled by job
``i - 1`` is seen when that job is processed in iteration ``i``, after job
``i`` -- which holds the request again -- was launched: job ``i``'s tokens for
it are extra, discarded when job ``i`` is processed (the request is finished
by then), and the request leaves the batch at the next schedule. A
multi-token step is cut at the first stop token or at ``max_new_tokens``; the
rest of it is dropped. Without overlap there is no extra step.

Freeing. A finished request keeps its request slot and KV slots until every
job holding it has been processed (``inflight == 0``): no running forward can
then read or stash into them. Its KV slots are read back from its
``req_to_token`` row -- the one device read the host makes, safe because every
job that wrote the row is done and no later job touches it; with every job
processed, ``kv_len`` is exact. A window's slots past its step's count are
freed when the step is processed, never earlier (the job may use them until
its guard). Admission reserves ``Request.kv_need`` = ``prompt_len +
max_new_tokens - 1 + 2 * (W - 1)`` KV slots per request (the most it can hold
at once: its committed tokens plus two windows in flight), so a decode
allocation never fails; a request that does not fit waits at the head of the
queue until a release returns slots -- nothing is preempted or dropped.

Failures. Nothing here is atomic: an exception (``KeyboardInterrupt`` from the
caller's thread, or one a job raised, re-raised by ``Pending.wait``) may stop
``step`` between taking a slot and recording it. The caller then runs
``recover``: it waits for every submitted job with a no-op job behind them,
finishes every request it knows of with ``ERROR`` and resets both pools, the
reservations and the queues, trusting none of the bookkeeping. An idle scheduler
that cannot admit the head of its queue raises instead of waiting: only a leak
could cause that, and no release would ever come.

Algorithm hooks. ``on_prompt`` runs at admission, ``on_tokens`` with the tokens
the host kept from each processed step, ``release`` when the request slot is
freed -- all on the host, possibly while a job runs. On the device,
``prefill`` runs prompt chunks and tail steps alike: a chunk after a committed
prefix, whose tokens an algorithm must not assume to be the prompt's.

Determinism. The sampler keys its randomness by (seed, position), so overlap,
batch composition and admission timing do not change any request's tokens.

Runners
=======

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
