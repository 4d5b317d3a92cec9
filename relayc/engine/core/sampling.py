"""Sampling parameters and a batched, counter-keyed sampler.

Randomness is a pure function of ``(seed, position, token id)``: a 32-bit
integer hash computed on the device gives every candidate token its own
uniform, and the sampler takes the Gumbel-max over the filtered logits. So a
request's draw at a position never depends on which other requests share the
batch, on how many steps ran before it, or on the position being a device value
the host has not seen yet (overlap and speculative decoding both need that).
The hash uses only int64 arithmetic that cannot overflow, so CPU and CUDA agree.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF
_SEED_MASK = (1 << 63) - 1
_INT64_MAX = (1 << 63) - 1

# Temperatures below this sample greedily, exactly as 0 does: dividing float32 logits by
# a smaller one overflows to inf, and the softmax of infinities is NaN (every draw the
# same token). At this temperature sampling already picks the argmax unless two logits
# lie within about 1e-4, so the switch is no visible change. vLLM and SGLang use a
# similar epsilon.
MIN_TEMPERATURE = 1e-5


def _is_int(value: object) -> bool:
    # numpy / torch integer scalars register as Integral; bool is an int but never a count.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _as_float(value: float) -> float:
    """``float(value)`` of a validated real (numpy scalars included); an int beyond float
    range becomes an infinity of its sign."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


_FIELD_TYPES = (
    ("max_new_tokens", _is_int, "an integer"),
    ("temperature", _is_real, "a number"),
    ("top_k", _is_int, "an integer"),
    ("top_p", _is_real, "a number"),
    ("seed", lambda v: v is None or _is_int(v), "an integer or None"),
)


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples; the engine checks it with :meth:`validate` before queueing.

    ``temperature`` 0 (or anything below ``MIN_TEMPERATURE``) is greedy; ``top_k`` at or
    above the vocabulary size keeps every token, as 0 does.
    """

    max_new_tokens: int = 32
    temperature: float = 0.0  # 0 = greedy (argmax, lowest token id on ties)
    top_k: int = 0  # 0 = no top-k filter
    top_p: float = 1.0
    seed: int | None = None  # None = the engine seed plus the request id
    stop_token_ids: tuple[int, ...] = ()  # besides the model's end-of-generation tokens
    ignore_eos: bool = False  # True: do not stop at the model's end-of-generation tokens

    def __post_init__(self) -> None:
        # Callers pass lists; a tuple keeps the params hashable and immutable. A string or
        # a bare number is a mistake here, not a sequence of token ids.
        stop = self.stop_token_ids
        if isinstance(stop, str | bytes) or not isinstance(stop, Iterable):
            raise TypeError(
                f"`stop_token_ids` must be a sequence of token ids, e.g. (2,); got {stop!r}"
            )
        object.__setattr__(self, "stop_token_ids", tuple(stop))

    def validate(self, vocab_size: int) -> SamplingParams:
        """Raise ``ValueError`` naming the first bad field and what it accepts; else return
        the same params with plain Python ``int`` / ``float`` values (numpy scalars and
        ints given for floats converted), which is what the engine queues."""
        for name, is_type, kind in _FIELD_TYPES:
            value = getattr(self, name)
            if not is_type(value):
                raise ValueError(f"`{name}` must be {kind}; got {value!r}")
        temperature, top_p = _as_float(self.temperature), _as_float(self.top_p)
        if self.max_new_tokens <= 0:
            raise ValueError(f"`max_new_tokens` must be positive; got {self.max_new_tokens}")
        if not 0.0 <= temperature < math.inf:  # also rejects NaN
            raise ValueError(
                f"`temperature` must be >= 0 and finite (0 = greedy); got {self.temperature}"
            )
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"`top_p` must be in (0, 1]; got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"`top_k` must be >= 0 (0 = off); got {self.top_k}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"`ignore_eos` must be True or False; got {self.ignore_eos!r}")
        not_ints = [t for t in self.stop_token_ids if not _is_int(t)]
        if not_ints:
            raise ValueError(f"`stop_token_ids` must be integers; got {not_ints!r}")
        bad = [t for t in self.stop_token_ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"`stop_token_ids` {bad} are outside the vocabulary [0, {vocab_size})")
        return SamplingParams(
            max_new_tokens=int(self.max_new_tokens),
            temperature=temperature,
            top_k=int(self.top_k),
            top_p=top_p,
            seed=None if self.seed is None else int(self.seed),
            stop_token_ids=tuple(int(t) for t in self.stop_token_ids),
            ignore_eos=self.ignore_eos,
        )

    def resolve_seed(self, engine_seed: int, request_id: int) -> int:
        return self.seed if self.seed is not None else engine_seed + request_id


@dataclass
class SamplingBatch:
    """Per-request sampling settings as device tensors ``[B]``.

    ``build`` applies the rules every consumer (the sampler, the speculative accept
    and draft ops) then relies on: a temperature below ``MIN_TEMPERATURE`` becomes 0
    (greedy), a ``top_k`` beyond int64 keeps every token like any ``top_k >= vocab``.
    """

    temperatures: torch.Tensor  # float32
    top_ks: torch.Tensor  # int64, 0 = off
    top_ps: torch.Tensor  # float32
    seeds: torch.Tensor  # int64, non-negative

    @classmethod
    def build(
        cls, params: Sequence[SamplingParams], seeds: Sequence[int], device: torch.device | str
    ) -> SamplingBatch:
        def tensor(values: list[float] | list[int], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        return cls(
            temperatures=tensor(
                [p.temperature if p.temperature >= MIN_TEMPERATURE else 0.0 for p in params],
                torch.float32,
            ),
            top_ks=tensor([min(p.top_k, _INT64_MAX) for p in params], torch.int64),
            top_ps=tensor([p.top_p for p in params], torch.float32),
            seeds=tensor([s & _SEED_MASK for s in seeds], torch.int64),
        )


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche hash on int64 holding values < 2**32.

    Multipliers are below 2**31, so every product stays below 2**63: exact on
    any device, no reliance on signed overflow wrapping.
    """
    x = (x ^ (x >> 16)) * 0x7FEB352D & _MASK32
    x = (x ^ (x >> 15)) * 0x6B43A9B5 & _MASK32
    x = (x ^ (x >> 16)) * 0x4C8F6E2B & _MASK32
    return x ^ (x >> 15)


def keyed_uniform(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Uniforms in (0, 1) ``[B, vocab]``, a pure function of (seed, position, token id)."""
    key = _mix32((seeds & _MASK32) ^ _mix32((seeds >> 32) ^ 0x2545F491))
    key = _mix32(key ^ _mix32(positions & _MASK32))[:, None]
    tokens = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)[None, :]
    bits = _mix32(key ^ _mix32(tokens ^ 0x5BD1E995)) >> 8  # 24 bits: exact in float32
    return (bits.float() + 0.5) * (1.0 / (1 << 24))


def filter_logits(logits: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """Set to -inf every token outside each row's top-k, then outside its top-p nucleus.

    A token survives top-p when the probability mass ranked strictly above it is
    below ``top_p``; the most likely token always survives. Ties rank by token id.
    """
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    rank = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    drop = (top_ks[:, None] > 0) & (rank >= top_ks[:, None])
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_above = torch.cumsum(probs, dim=-1) - probs
    drop = drop | ((mass_above >= top_ps[:, None]) & (rank > 0))
    return torch.full_like(logits, float("-inf")).scatter(
        -1, order, sorted_logits.masked_fill(drop, float("-inf"))
    )


def sample(logits: torch.Tensor, batch: SamplingBatch, positions: torch.Tensor) -> torch.Tensor:
    """Next token ``[B]`` int64 from ``logits [B, vocab]``.

    ``positions [B]`` is where each sampled token will sit in its sequence; it
    keys the randomness together with the request's seed.
    """
    logits = logits.float()
    greedy = batch.temperatures <= 0.0
    temperatures = torch.where(greedy, 1.0, batch.temperatures)
    filtered = filter_logits(logits / temperatures[:, None], batch.top_ks, batch.top_ps)
    uniform = keyed_uniform(batch.seeds, positions.to(torch.int64), logits.shape[-1])
    gumbel = -torch.log(-torch.log(uniform))
    sampled = torch.argmax(filtered + gumbel, dim=-1)
    return torch.where(greedy, torch.argmax(logits, dim=-1), sampled)
