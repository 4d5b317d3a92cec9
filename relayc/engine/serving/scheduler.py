"""The scheduler: admission, batching, and the overlap of host work with the forward.

The overlap contract it keeps (what the host may touch while a job runs, and when) is
written down once, in the docstring of ``relayc.engine.serving.overlap``.
"""

from __future__ import annotations

import contextlib
import heapq
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from relayc.engine.core.kv_cache import KVCache, ReqToTokenPool, TokenToKVPool
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.serving.algorithms import DecodeAlgorithm, StepOutput
from relayc.engine.serving.overlap import ForwardRunner, Pending
from relayc.engine.serving.request import FinishReason, Request
from relayc.engine.serving.scheduler_config import SchedulerConfig, SchedulerStats
from relayc.engine.serving.step_batch import DecodeRows, HostStep, StepKind
from relayc.engine.serving.undrafted import undrafted

__all__ = ["Scheduler", "SchedulerConfig", "SchedulerStats"]


# Integers the host holds: a list, or a NumPy view of a CPU tensor.
_Ints = Sequence[int] | np.ndarray

# A step's results on the host: tokens [B, K] and counts [B], or next_tokens [B] and None
# (one token a request).
_HostResult = tuple[torch.Tensor, torch.Tensor | None]


@dataclass
class _InFlight:
    steps: list[HostStep]
    # host copies, job seconds, whether its decode step replayed through decode_held
    pending: Pending[tuple[list[_HostResult], float, bool]]


def _barrier() -> None:
    """A job that does nothing: waiting for it waits for every job submitted before it."""


class Scheduler:
    def __init__(
        self,
        model: LlamaForCausalLM,
        algorithm: DecodeAlgorithm,
        runner: ForwardRunner,
        config: SchedulerConfig,
        *,
        check_pools: bool = False,
    ) -> None:
        self.model, self.algorithm, self.runner, self.config = model, algorithm, runner, config
        self.device = model.device
        self.req_pool = ReqToTokenPool(config.req_pool_size, config.max_context, self.device)
        self.kv_pool = TokenToKVPool(config.kv_pool_tokens, self.device, check=check_pools)
        self.kv_cache = KVCache.for_model(model.config, config.kv_pool_tokens, self.device)
        self.kv_unreserved = config.kv_pool_tokens
        self.iteration = 0
        self.stats = SchedulerStats()
        self._arrivals: list[tuple[int, int, Request]] = []  # heap of (arrival, order, request)
        self._order = 0
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []  # admitted, prompt not fully scheduled yet
        self.running: list[Request] = []  # prompt scheduled, decoding
        self._inflight: deque[_InFlight] = deque()
        self._pin = self.device.type == "cuda"
        self.width = algorithm.decode_width
        if not 1 <= algorithm.max_tokens_per_step <= self.width:
            raise ValueError(
                f"`{algorithm.name}`: max_tokens_per_step {algorithm.max_tokens_per_step} must lie "
                f"in 1..decode_width ({self.width}): every emitted token but the last needs KV"
            )
        self._decode_rows: DecodeRows | None = None  # the last decode batch's composition
        # The batch whose next iteration is its decode step alone, replayed from its lengths
        # and slots (see ``_held_step``); None: schedule the next iteration.
        self._held: DecodeRows | None = None
        # memoryviews of a recorded step's output tensors, by id (``_output_words``)
        self._words: dict[int, tuple[torch.Tensor, tuple[memoryview, int] | None]] = {}

    # -- requests -------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue ``request``; it may be admitted from iteration ``request.arrival`` on."""
        heapq.heappush(self._arrivals, (request.arrival, self._order, request))
        self._order += 1

    def abort(self, request: Request) -> None:
        """Finish ``request`` now; its resources come back once no job holds it."""
        if request.finish_reason is not None:
            return
        request.finish_reason = FinishReason.ABORT
        self._arrivals = [a for a in self._arrivals if a[2] is not request]
        heapq.heapify(self._arrivals)
        if request in self.waiting:
            self.waiting.remove(request)
        elif request.req_pool_index and request.inflight == 0:
            self._release(request)

    def recover(self, error: str, requests: Iterable[Request] = ()) -> list[Request]:
        """Bring the scheduler back to idle after an exception escaped one of its methods.

        An interrupt or a failure may stop any method half way (a slot taken but not
        yet recorded, a job launched but not yet tracked), so no bookkeeping is
        trusted: wait for every job on the runner (a no-op job: jobs run in order),
        finish every request the scheduler knows of with ``ERROR`` and ``error``, and
        give every request slot, KV slot and reservation back. ``requests``: more the
        caller knows of (one may be in no queue, caught between two). Returns the
        requests it finished. Interrupted itself, it is safe to run again.
        """
        self.runner.submit(_barrier).wait()
        known = {id(r): r for r in (*self._known_requests(), *requests)}.values()
        stopped = [r for r in known if r.finish_reason is None]
        for request in stopped:
            request.finish_reason, request.error = FinishReason.ERROR, error
        for request in known:
            request.req_pool_index, request.kv_reserved = 0, 0
            request.inflight, request.inflight_decodes = 0, 0
        for slot in self.req_pool.in_use():
            # The hook may never have seen a slot whose admission was cut short (n-gram
            # then has no history to drop); the slot is free either way.
            with contextlib.suppress(Exception):
                self.algorithm.release(slot)
        self.req_pool.reset()
        self.kv_pool.reset()
        self.kv_unreserved = self.config.kv_pool_tokens
        self._arrivals.clear()
        self.waiting.clear()
        self.prefilling.clear()
        self.running.clear()
        self._inflight.clear()
        self._decode_rows = self._held = None
        return stopped

    def _known_requests(self) -> list[Request]:
        in_flight = [r for job in self._inflight for step in job.steps for r in step.requests]
        return [
            *(entry[2] for entry in self._arrivals),
            *self.waiting,
            *self.prefilling,
            *self.running,
            *in_flight,
        ]

    def has_work(self) -> bool:
        return bool(
            self._arrivals or self.waiting or self.prefilling or self.running or self._inflight
        )

    # -- the loop -------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """One iteration; returns the requests that got tokens or finished on the host."""
        if self._held is not None and self._steady(self._held):
            held_touched = self._held_step(self._held)
            if held_touched is not None:
                return held_touched
        start = time.perf_counter()
        self._held = None
        steps = self._schedule()
        self.stats.host_s += time.perf_counter() - start
        overlap = False
        if steps:  # the inline runner (no overlap) runs the forward right here
            # A job the runner does not overlap (CPU, one request: see ThreadRunner) runs
            # here after the earlier ones and is processed in this iteration, as without
            # overlap; every token is the same either way.
            overlap = self.runner.overlaps(sum(len(step.requests) for step in steps))
            # A CPU job overlapped with the host hands over copies: its outputs may be a
            # recorded step's buffers (graphs='tape'), rewritten by the next job.
            job = self._job(steps, copy=overlap and self.device.type == "cpu")
            pending = self.runner.submit(job) if overlap else self.runner.run_inline(job)
            self._inflight.append(_InFlight(steps, pending))
            self.stats.forwards += len(steps)
        touched: dict[int, Request] = {}
        lag = 1 if overlap else 0
        held = False
        while len(self._inflight) > lag:
            inflight = self._inflight.popleft()
            requests, held = self._process(inflight)
            for request in requests:
                touched[id(request)] = request
        if (
            held
            and not overlap
            and len(steps) == 1
            and steps[0].kind is StepKind.DECODE
            and steps[0].requests == self.running
        ):
            self._held = self._decode_rows  # the whole batch decoded and replayed held
        self.iteration += 1
        self.stats.iterations += 1
        return list(touched.values())

    def _steady(self, rows: DecodeRows) -> bool:
        """Whether this iteration would schedule ``rows``' decode step and nothing else:
        nothing arrives, waits or prefills, nothing is in flight, and every request of the
        batch (the whole running batch when ``_held`` was set) goes on decoding, with a draft
        (else it runs one-token steps: ``undrafted``)."""
        if self.waiting or self.prefilling or self._inflight:
            return False
        if self._arrivals and self._arrivals[0][0] <= self.iteration:
            return False
        limit = self.config.max_context - self.width  # nothing in flight: kv_len is exact
        for request in rows.requests:
            if request.device_done or request.kv_len > limit:
                return False
        return not undrafted(self.algorithm, rows.requests)

    def _held_step(self, rows: DecodeRows) -> list[Request] | None:
        """The steady batch's next iteration without scheduling it: its KV windows and
        lengths straight into the recorded step (``DecodeAlgorithm.decode_held``), the
        replay, the commit and the tokens, where a scheduled iteration builds its
        ``HostStep``, a job, the step's inputs and its results' records. Runs only where
        that iteration would run its one decode step inline and process it at once (no
        overlap), so the requests' in-flight counts stay 0 throughout. None: the replay
        declined (nothing taken or written); the caller schedules the iteration.

        Right after a forward every torch or NumPy call costs tens of microseconds (their
        code and data left the caches), so the host's side here is plain Python: the KV
        slots, the slot table and the step's tokens are read and written through
        memoryviews (``TokenToKVPool.alloc_words``, ``ReqToTokenPool.host_words``)."""
        start = time.perf_counter()
        requests, width = rows.requests, self.width
        n = len(requests) * width
        slots = self.kv_pool.alloc_words(n)
        if slots is None:  # admission reserved them: a broken invariant, not a full pool
            raise RuntimeError(f"KV pool has {self.kv_pool.available_size()} slots, needs {n}")
        prefix_lens = [request.kv_len for request in requests]  # nothing in flight: exact
        job_start = time.perf_counter()
        grad = torch.is_grad_enabled()
        if grad:  # torch.no_grad() costs tens of microseconds here; the switch itself a few
            torch._C._set_grad_enabled(False)
        try:
            out = self.algorithm.decode_held(
                rows.req_pool_indices, rows.all_greedy, prefix_lens, slots
            )
        finally:
            if grad:
                torch._C._set_grad_enabled(True)
        job_s = time.perf_counter() - job_start
        if out is None:
            self.kv_pool.free_host(slots)
            self._held = None
            return None
        if not out.committed:
            self._check_uncommitted(width)
            self._commit_host(rows.slots, prefix_lens, slots)
        self._check_counts(out)
        tokens, counts = self._read_tokens(out)
        self._free_unaccepted(width, slots, None, counts)
        touched = []
        for request, row, count in zip(requests, tokens, counts, strict=True):
            request.scheduled_samples += 1  # as _decode_step would, then _process
            if self._decoded(request, row, count):
                touched.append(request)
            if request.finish_reason is not None:
                self._release(request)
        self.stats.forwards += 1
        self.stats.held_steps += 1
        self.stats.decode_rows += len(requests)
        self.stats.job_s += job_s
        self.stats.host_s += time.perf_counter() - start - job_s
        self.iteration += 1
        self.stats.iterations += 1
        return touched

    def _read_tokens(self, out: StepOutput) -> tuple[list[list[int]], list[int]]:
        """A held step's tokens per request (its first ``count``) and counts, read through
        memoryviews of the recording's output buffers (the same tensors every replay of a
        bucket; made on first sight), or ``tolist`` where a tensor has none."""
        if out.tokens is None:
            tokens = self._output_words(out.next_tokens)
            values = out.next_tokens.tolist() if tokens is None else tokens[0].tolist()
            return [[token] for token in values], [1] * len(values)
        assert out.counts is not None
        words, counts_words = self._output_words(out.tokens), self._output_words(out.counts)
        if words is None or counts_words is None:
            return self._tokens_on_host(out.tokens, out.counts, False)
        counts = counts_words[0].tolist()
        view, row = words
        return [view[b * row : b * row + c].tolist() for b, c in enumerate(counts)], counts

    def _output_words(self, tensor: torch.Tensor) -> tuple[memoryview, int] | None:
        """``tensor`` as a flat memoryview of its integers and its row's length; None: it
        has none (another dtype or layout). Kept for the few tensors a recording returns."""
        cached = self._words.get(id(tensor))
        if cached is not None and cached[0] is tensor:
            return cached[1]
        made = None
        if tensor.device.type == "cpu" and tensor.is_contiguous():
            row = tensor[0].numel() if tensor.dim() > 1 else 1
            data = tensor.detach().numpy().data.cast("B")
            if tensor.dtype == torch.int64:
                made = (data.cast("q"), row)
            elif tensor.dtype == torch.int32:
                made = (data.cast("i"), row)
        if len(self._words) >= 8:  # a bucket's outputs are few; sliced ones come and go
            self._words.clear()
        self._words[id(tensor)] = (tensor, made)
        return made

    def drain(self) -> list[Request]:
        """Step until nothing is queued, running or in flight."""
        touched: dict[int, Request] = {}
        while self.has_work():
            for request in self.step():
                touched[id(request)] = request
        return list(touched.values())

    # -- host side --------------------------------------------------------------------------
    def _schedule(self) -> list[HostStep]:
        while self._arrivals and self._arrivals[0][0] <= self.iteration:
            self.waiting.append(heapq.heappop(self._arrivals)[2])
        self.running = [r for r in self.running if not r.device_done]
        self.prefilling = [r for r in self.prefilling if r.finish_reason is None]
        decoding: list[Request] = []
        tails: list[Request] = []  # past their last window: one known token at a time
        for request in self.running:
            if self._window_fits(request):
                decoding.append(request)
            elif request.inflight == 0:  # else it waits for its steps' tokens
                tails.append(request)
        self.stats.tail_steps += len(tails)
        if undrafted(self.algorithm, decoding):  # one-token steps, as at the context end
            self.stats.undrafted_steps += len(decoding)
            tails, decoding = [*tails, *decoding], []
        chunks = self._plan_prefill()
        steps = []
        if chunks or tails:
            steps.append(self._prefill_step(chunks, tails))
        if decoding:
            steps.append(self._decode_step(decoding))
        self.stats.decode_rows += len(decoding)
        admitted = len(self.running) + len(self.prefilling)
        self.stats.max_running = max(self.stats.max_running, admitted)
        return steps

    def _window_fits(self, request: Request) -> bool:
        """Whether a decode window of ``request`` surely fits its context.

        Always true with a window of 1 (``max_new_tokens`` is clipped to the context).
        A wider window may pass the context end only if the steps in flight filled
        theirs; the request then sits out until they are processed, and when even
        its exact committed length leaves no room, it takes tail steps instead.
        """
        return request.kv_len_bound + self.width <= self.config.max_context

    def _plan_prefill(self) -> list[tuple[Request, int]]:
        """(request, prompt tokens this iteration): unfinished prompts first, then admissions."""
        budget = self.config.max_prefill_tokens
        plan: list[tuple[Request, int]] = []
        for request in self.prefilling:
            if budget == 0:
                return plan
            n = min(budget, request.prompt_len - request.kv_len)
            plan.append((request, n))
            budget -= n
        while budget and self._admit_one():
            request = self.prefilling[-1]
            n = min(budget, request.prompt_len)
            plan.append((request, n))
            budget -= n
        return plan

    def _admit_one(self) -> bool:
        """Move the head of the queue into ``prefilling`` if everything it needs is free."""
        if not self.waiting:
            return False
        request = self.waiting[0]
        if len(self.running) + len(self.prefilling) >= self.config.max_batch_size:
            return False
        idle = not (self.running or self.prefilling or self._inflight)
        if request.kv_need > self.kv_unreserved:
            if idle:  # nothing will ever release slots: waiting would hang
                raise RuntimeError(
                    f"broken invariant: an idle scheduler has {self.kv_unreserved} of "
                    f"{self.config.kv_pool_tokens} KV slots unreserved, a request needs "
                    f"{request.kv_need}"
                )
            self.stats.kv_blocked += 1
            return False
        slots = self.req_pool.alloc(1)
        if slots is None:
            if idle:
                raise RuntimeError("broken invariant: an idle scheduler has no free request slot")
            return False
        self.waiting.popleft()
        request.req_pool_index = slots[0]
        request.kv_reserved = request.kv_need
        self.kv_unreserved -= request.kv_reserved
        self.prefilling.append(request)
        self.algorithm.on_prompt(request.req_pool_index, list(request.prompt_ids))
        return True

    def _alloc_kv(self, n: int) -> torch.Tensor:
        return self._alloc_kv_host(n)[0]

    def _alloc_kv_host(self, n: int) -> tuple[torch.Tensor, np.ndarray | None]:
        """``n`` KV slots, and on the CPU the same slots as a NumPy view."""
        taken = self.kv_pool.alloc_host(n)
        if taken is None:  # admission reserved them: a broken invariant, not a full pool
            raise RuntimeError(f"KV pool has {self.kv_pool.available_size()} slots, needs {n}")
        return taken

    def _prefill_step(self, plan: list[tuple[Request, int]], tails: list[Request]) -> HostStep:
        """Prompt chunks (``plan``) and one-token tail steps (``tails``) in one forward.

        A tail token sits at ``kv_len`` < ``max_context``: the request has sampled fewer
        than ``max_new_tokens``, which the context bounds. Tail tokens are no prompt
        tokens and take nothing of ``max_prefill_tokens``.
        """
        rows = [*plan, *((request, 1) for request in tails)]
        slots = self._alloc_kv(sum(n for _, n in rows))
        step = HostStep.prefill(rows, slots, self._pin)
        for request in tails:
            request.kv_len += 1
            request.scheduled_samples += 1
            request.inflight += 1
        for request, n in plan:
            request.kv_len += n  # the scheduler commits prompt KV itself, so it is known now
            request.inflight += 1
            if request.kv_len == request.prompt_len:
                request.scheduled_samples = 1
                self.prefilling.remove(request)
                self.running.append(request)
            else:
                self.stats.prefill_chunks += 1
        # Only a prompt's last chunk (and a tail step) samples; earlier chunks' tokens
        # (and stashes, overwritten by the last chunk's) are never used.
        step.samples = [r.kv_len >= r.prompt_len for r, _ in rows]
        return step

    def _decode_step(self, requests: list[Request]) -> HostStep:
        slots, host_slots = self._alloc_kv_host(len(requests) * self.width)
        rows = self._decode_rows
        if rows is None or not rows.holds(requests, self.width):
            rows = self._decode_rows = DecodeRows.build(requests, self.width, self._pin)
        step = HostStep.decode(requests, self.width, slots, self._pin, rows, host_slots)
        for request in requests:
            request.scheduled_samples += 1  # at least one token; the rest once processed
            request.inflight += 1
            request.inflight_decodes += 1
        return step

    def _process(self, inflight: _InFlight) -> tuple[list[Request], bool]:
        """The requests touched, and whether the job's decode step replayed held."""
        start = time.perf_counter()
        results, job_s, held = inflight.pending.wait()
        waited = time.perf_counter() - start
        self.stats.job_s += job_s
        touched = []
        for step, (tokens, counts) in zip(inflight.steps, results, strict=True):
            rows, counts_list = self._tokens_on_host(tokens, counts, counts is None)
            decode = step.kind is StepKind.DECODE
            if decode:
                self._free_unaccepted(step.width, step.host_slots, step.out_cache_loc, counts_list)
            for request, row, count, sampled in zip(
                step.requests, rows, counts_list, step.samples, strict=True
            ):
                request.inflight -= 1
                if decode:
                    request.inflight_decodes -= 1
                    if self._decoded(request, row, count):
                        touched.append(request)
                elif sampled and request.finish_reason is None:
                    # A prefill row that samples after the first token is a tail step: a
                    # decode step of one token, as `none` would count it.
                    if request.output_ids:
                        self._count_accepted(request, count)
                    self._append(request, row[:count])
                    touched.append(request)
                # else: the extra step of a request that finished one iteration late.
                if request.finish_reason is not None and request.inflight == 0:
                    self._release(request)
        self.stats.wait_s += waited
        self.stats.host_s += time.perf_counter() - start - waited
        return touched, held

    @staticmethod
    def _tokens_on_host(
        tokens: torch.Tensor, counts: torch.Tensor | None, single: bool
    ) -> tuple[list[list[int]], list[int]]:
        """A step's tokens per row and their counts, as lists: ``single``, one token a row
        (``next_tokens [B]``, ``counts`` None), else ``tokens [B, K]`` and ``counts [B]``."""
        if single:
            rows = [[token] for token in tokens.tolist()]
            return rows, [1] * len(rows)
        assert counts is not None
        return tokens.tolist(), counts.tolist()

    def _decoded(self, request: Request, row: list[int], count: int) -> bool:
        """A decode step's ``count`` tokens of ``request`` reached the host (its step is
        done with it): its lengths move on, and unless it finished earlier they are its
        next tokens. Whether it got them."""
        request.kv_len += count
        request.scheduled_samples += count - 1
        if request.finish_reason is not None:
            return False  # the extra step of a request that finished one iteration late
        self._count_accepted(request, count)
        self._append(request, row[:count])
        return True

    def _count_accepted(self, request: Request, count: int) -> None:
        request.accept_lengths.append(count)
        self.stats.accept_steps += 1
        self.stats.accept_tokens += count

    def _append(self, request: Request, tokens: list[int]) -> None:
        """Append in order up to a stop token or ``max_new_tokens``; drop the rest."""
        kept = 0
        for token in tokens:
            request.output_ids.append(token)
            kept += 1
            if token in request.params.stop_token_ids:
                request.finish_reason = FinishReason.STOP
            elif len(request.output_ids) >= request.max_new_tokens:
                request.finish_reason = FinishReason.LENGTH
            if request.finish_reason is not None:
                break
        self.stats.tokens += kept
        self.algorithm.on_tokens(request.req_pool_index, tokens[:kept])

    def _free_unaccepted(
        self,
        width: int,
        host_slots: _Ints | None,
        out_cache_loc: torch.Tensor | None,
        counts: list[int],
    ) -> None:
        """Free each window's slots past its committed ``count``; the job is done with them.
        ``host_slots``: the windows' slots as integers on the host (the CPU: a NumPy view of
        ``out_cache_loc``, or a held step's ints), freed without a torch op; else None and
        ``out_cache_loc`` on the device."""
        self._check_window_counts(width, counts)
        if width == 1:
            return
        if host_slots is not None:  # no torch op right after a forward
            unaccepted = [
                slot
                for b, count in enumerate(counts)
                for slot in host_slots[b * width + count : (b + 1) * width]
            ]
            if unaccepted:
                self.kv_pool.free_host(unaccepted)
            return
        assert out_cache_loc is not None
        index = [b * width + j for b, count in enumerate(counts) for j in range(count, width)]
        if index:
            taken = torch.tensor(index, dtype=torch.int64, device=self.device)
            self.kv_pool.free(out_cache_loc[taken])

    def _check_window_counts(self, width: int, counts: list[int]) -> None:
        for count in counts:
            if not 1 <= count <= width:
                raise RuntimeError(
                    f"`{self.algorithm.name}` reported {count} tokens for a decode window of "
                    f"{width}; a decode step commits between 1 and decode_width tokens"
                )

    def _check_uncommitted(self, width: int) -> None:
        """The scheduler commits one token a request; a wider step commits its own."""
        if width > 1:
            raise RuntimeError(
                f"`{self.algorithm.name}` decodes windows of {width} slots and "
                "must commit its accepted KV itself (StepOutput.committed)"
            )

    def _check_counts(self, out: StepOutput) -> None:
        if out.tokens is not None and out.counts is None:
            raise RuntimeError(f"`{self.algorithm.name}` returned tokens without counts")

    def _commit_host(self, rows: Sequence[int], positions: _Ints, slots: _Ints) -> None:
        """One token a request (a decode step of width 1) into ``req_to_token``, stored at
        each request's prefix length through the CPU's ``ReqToTokenPool.host_words``."""
        table = self.req_pool.host_words
        assert table is not None
        for row, position, slot in zip(rows, positions, slots, strict=True):
            table[row, position] = slot

    def _release(self, request: Request) -> None:
        row = self.req_pool.req_to_token[request.req_pool_index, : request.kv_len]
        self.kv_pool.free(row.to(torch.int64))  # a copy: the row is reused by the next owner
        self.req_pool.free(request.req_pool_index)
        self.algorithm.release(request.req_pool_index)
        self.kv_unreserved += request.kv_reserved
        request.req_pool_index, request.kv_reserved = 0, 0

    # -- device side (runs on the forward runner) -----------------------------------------
    def _job(
        self, steps: list[HostStep], copy: bool = False
    ) -> Callable[[], tuple[list[_HostResult], float, bool]]:
        algorithm, device, kv_cache = self.algorithm, self.device, self.kv_cache

        on_cpu = device.type == "cpu"

        def to_host(t: torch.Tensor) -> torch.Tensor:
            if copy:
                return t.clone()
            return t if on_cpu else t.to("cpu", non_blocking=True)

        req_to_token = self.req_pool.req_to_token
        table = self.req_pool.host_words  # the CPU's memoryview of it

        def run() -> tuple[list[_HostResult], float, bool]:
            start = time.perf_counter()
            host_results: list[_HostResult] = []
            held = False
            with torch.no_grad():
                for step in steps:
                    out = None
                    lengths, host_slots = step.host_lengths, step.host_slots
                    if lengths is not None and host_slots is not None:
                        # the CPU's steady decode batch: its recorded step replayed from the
                        # new lengths and slots alone (Algorithm.decode_held)
                        out = algorithm.decode_held(
                            step.req_pool_indices,
                            step.all_greedy,
                            lengths[0].tolist(),
                            host_slots.tolist(),
                        )
                        held = out is not None
                    if out is None:
                        inputs, commit_rows = step.to_device(device, req_to_token, kv_cache)
                        hook = (
                            algorithm.prefill if step.kind is StepKind.PREFILL else algorithm.decode
                        )
                        out = hook(inputs)
                    if not out.committed:
                        self._check_uncommitted(step.width)
                        if table is not None and lengths is not None and host_slots is not None:
                            self._commit_host(step.host_rows, lengths[0], host_slots)
                        else:
                            req_to_token[commit_rows, inputs.forward.positions] = (
                                inputs.forward.out_cache_loc.to(torch.int32)
                            )
                    self._check_counts(out)
                    if out.tokens is None:  # [B]: one token a row (see _process)
                        host_results.append((to_host(out.next_tokens), None))
                    else:
                        host_results.append(
                            (
                                to_host(out.tokens),
                                None if out.counts is None else to_host(out.counts),
                            )
                        )
            return host_results, time.perf_counter() - start, held

        return run
