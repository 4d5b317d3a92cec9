"""A request's life in the engine, and what the caller gets back.

``Request`` is the scheduler's record of one prompt: what it asked for, where
its state lives (request-pool slot, KV slots) and how far the device and the
host have got. Under overlap the host sees a forward's results one iteration
after launching it, so it keeps bounds: ``scheduled_samples`` is a lower bound
on the tokens the device has sampled (each step in flight counts one), and the
committed KV length lies in ``[kv_len_hint, kv_len_bound]`` (each decode step
in flight commits 1 to ``decode_width`` tokens); ``output_ids`` holds the tokens
the host has seen. ``Output`` is the finished result, ``StreamDelta`` one piece of it.
"""

from __future__ import annotations

import codecs
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from relayc.engine.core.sampling import SamplingParams
from relayc.engine.text.chat import Chat
from relayc.engine.text.detok import Detokenizer

Prompt = str | Sequence[int] | Chat
Conversation = Sequence[Mapping[str, Any]]  # [{"role": ..., "content": ...}, ...]


class FinishReason(StrEnum):
    STOP = "stop"  # sampled a stop token (included in the output)
    LENGTH = "length"  # max_new_tokens, or the context is full
    ERROR = "error"  # rejected before it ran, or stopped by an engine failure; see ``error``
    ABORT = "abort"  # the caller stopped consuming its stream


@dataclass
class Output:
    """One request's result; ``token_ids`` holds generated tokens only (a stop token included)."""

    index: int  # position of the prompt in the call
    prompt_token_ids: list[int]  # [] for a rejected request
    token_ids: list[int]
    text: str | None  # None when the model has no tokenizer
    finish_reason: FinishReason
    error: str | None = None
    # Tokens emitted by each decode step of the request, before truncation at a stop
    # token or max_new_tokens (bonus token included; 1 each for `none`). The prefill's
    # token is no decode step; steps run after the host saw the finish are not counted.
    accept_lengths: list[int] = field(default_factory=list)


@dataclass
class StreamDelta:
    """New tokens of one request since its previous delta; the last one has a finish reason."""

    index: int
    token_ids: list[int]
    text: str  # decoded text of the new tokens ("" while a UTF-8 character is incomplete)
    finish_reason: FinishReason | None = None
    error: str | None = None


@dataclass(eq=False)
class Request:
    rid: int  # index in the caller's list; keys the default seed
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    max_new_tokens: int  # params.max_new_tokens, clipped so the sequence fits the context
    arrival: int = 0  # iteration at which the scheduler may first admit it
    decode_width: int = 1  # the algorithm's KV window per decode step (sizes the reservation)
    # Resources, held from admission until the last in-flight forward using them is done;
    # the KV slots themselves are recorded in req_to_token.
    req_pool_index: int = 0
    kv_reserved: int = 0
    # Device progress as the host knows it: committed KV tokens (a prompt chunk counts
    # at launch, a decode step once processed), a lower bound on the tokens sampled,
    # forwards launched but not processed, and the decode steps among them.
    kv_len: int = 0
    scheduled_samples: int = 0
    inflight: int = 0
    inflight_decodes: int = 0
    # Host progress (lags the device by one iteration under overlap).
    output_ids: list[int] = field(default_factory=list)
    accept_lengths: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    error: str | None = None  # why it finished ``ERROR``
    _streamed: int = 0
    _utf8: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def kv_need(self) -> int:
        """KV slots the request can ever hold at once, reserved at admission.

        ``prompt + max_new_tokens - 1`` (the last sampled token is never written)
        with a window of 1. A window ``W`` adds ``2 * (W - 1)``: a decode step is
        launched only while ``scheduled_samples < max_new_tokens``, with at most one
        other decode step in flight (the one-iteration lag), so the committed
        length is then at most ``prompt + max_new_tokens - 3`` and two windows
        are held: ``prompt + max_new_tokens - 3 + 2W``. Unaccepted window slots
        are freed when their step is processed.
        """
        return self.prompt_len + self.max_new_tokens - 1 + 2 * (self.decode_width - 1)

    def uncommitted_ids(self, n: int) -> list[int]:
        """The ``n`` tokens after the committed KV: prompt tokens, then sampled ones.

        A prompt chunk reads the prompt; a one-token tail step (a speculative request
        whose decode window no longer fits the context, see ``relayc.engine.serving.overlap``)
        reads its last sampled token, which the host knows once no step is in flight.
        """
        start, prompt = self.kv_len, self.prompt_len
        ids = self.prompt_ids[start : start + n]
        if len(ids) < n:
            ids += self.output_ids[max(start - prompt, 0) : start + n - prompt]
        if len(ids) != n:
            raise RuntimeError(
                f"internal error: request {self.rid} needs {n} tokens after its committed "
                f"{start}, the host knows {prompt} + {len(self.output_ids)}; please report this"
            )
        return ids

    @property
    def kv_len_hint(self) -> int:
        """Committed KV length if every decode step in flight commits one token (exact for W=1)."""
        return self.kv_len + self.inflight_decodes

    @property
    def kv_len_bound(self) -> int:
        """Upper bound of the committed KV length: every step in flight fills its window."""
        return self.kv_len + self.decode_width * self.inflight_decodes

    @property
    def device_done(self) -> bool:
        """No further forward may include it: finished on the host, or every token is asked for."""
        return self.finish_reason is not None or self.scheduled_samples >= self.max_new_tokens

    def take_delta(self, byte_text: bool) -> StreamDelta:
        """Tokens the host has seen since the previous delta, with their text."""
        new = self.output_ids[self._streamed :]
        self._streamed = len(self.output_ids)
        text = ""
        if byte_text:
            text = self._utf8.decode(
                bytes(t for t in new if t < 256), final=self.finish_reason is not None
            )
        return StreamDelta(self.rid, new, text, self.finish_reason, self.error)


@dataclass(eq=False)
class Call:
    """One ``generate`` / ``stream`` call: its requests and the deltas not yet yielded."""

    requests: list[Request]
    live: dict[int, Request]  # unfinished, by index in the call
    deltas: deque[StreamDelta]
    text: dict[int, Detokenizer]  # the streamed text of each request, by index
    final: bool = False  # one delta a request, when it finishes (``generate``)
