"""What the scheduler is given (:class:`SchedulerConfig`: pool and batch sizes) and what it
reports (:class:`SchedulerStats`: counters the engine, benchmarks and tests read)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch_size: int = 64  # running requests (decode batch size)
    req_pool_size: int = 128  # request slots; finished requests hold theirs one iteration
    kv_pool_tokens: int = 16384  # KV slots
    max_context: int = 2048  # tokens per request: prompt + generated - 1
    max_prefill_tokens: int = 4096  # prompt tokens per prefill forward; longer prompts are chunked

    def __post_init__(self) -> None:
        for name in (
            "max_batch_size",
            "req_pool_size",
            "kv_pool_tokens",
            "max_context",
            "max_prefill_tokens",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"`{name}` must be positive; got {getattr(self, name)}")


@dataclass
class SchedulerStats:
    iterations: int = 0
    forwards: int = 0
    tokens: int = 0  # tokens delivered to requests (extra tokens not counted)
    host_s: float = 0.0  # schedule + prepare + process, waits excluded
    wait_s: float = 0.0  # blocked on job results
    job_s: float = 0.0  # inside forward jobs (CUDA: launch time, the kernels run later)
    kv_blocked: int = 0  # iterations whose queue head waited for KV slots
    prefill_chunks: int = 0  # prefill rows that did not finish their prompt
    max_running: int = 0  # most requests admitted at once (prefilling or decoding)
    decode_rows: int = 0  # requests summed over decode batches (extra tokens included)
    accept_steps: int = 0  # decode rows the host counted in a request's accept_lengths
    accept_tokens: int = 0  # tokens those rows emitted (before truncation)
    tail_steps: int = 0  # one-token steps at the context end (counted as accept rows too)
    undrafted_steps: int = 0  # one-token steps of rows no draft was proposed for (undrafted.py)
    held_steps: int = 0  # iterations that ran a steady batch's recorded step (_held_step)

    @property
    def mean_accept_length(self) -> float:
        """Tokens per counted decode row (1.0 for `none`); 0.0 before any."""
        return self.accept_tokens / self.accept_steps if self.accept_steps else 0.0
