"""A request's prompt checked at submission, so a bad one fails alone.

What reaches the shared scheduler step must run: a token id outside the model's
vocabulary (one a tokenizer made -- a ``bos_token_id`` of 4e9, a ``tokenizer.json``
larger than the embedding) would fail the step of every request in it, and a string no
tokenizer can encode (a lone surrogate) would fail the whole call. Each check returns the
request's error message, or None.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from relayc.engine.core.sampling import SamplingParams
from relayc.engine.serving.request import Request
from relayc.engine.text.chat import Chat, ChatError

if TYPE_CHECKING:
    from relayc.engine.text.tokenizer import Tokenizer


def text_error(text: str, what: str = "prompt") -> str | None:
    """A lone surrogate (``"\\ud800"``, e.g. from decoding bytes with ``surrogateescape``)
    is no Unicode text: no tokenizer encodes it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = text[exc.start]
        return (
            f"{what} has a lone surrogate U+{ord(char):04X} at character {exc.start}: it is "
            "not valid Unicode text; remove it or decode the bytes with errors='replace'"
        )
    return None


def chat_text_error(messages: object) -> str | None:
    """:func:`text_error` of each string in each message (the template checks the rest)."""
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
        return None
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            continue
        for key, value in message.items():
            if isinstance(value, str):
                error = text_error(value, f"message {i} `{key}`")
                if error is not None:
                    return error
    return None


def token_ids_error(ids: Sequence[int], vocab_size: int, source: str | None = None) -> str | None:
    """Ids outside ``[0, vocab_size)``; ``source``: what made them (a tokenizer), named so the
    user knows which file disagrees with the model."""
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if not bad:
        return None
    shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
    if source is None:
        return f"prompt token ids [{shown}] are outside the vocabulary [0, {vocab_size})"
    return (
        f"{source} gave token ids [{shown}] outside the model's vocabulary [0, {vocab_size}): "
        "its vocabulary or its bos/eos ids do not match the model's embedding; use the "
        "model's own tokenizer or pass token ids"
    )


def encode_prompt(
    prompt: object,
    tokenizer: Tokenizer | None,
    vocab: int,
    no_tokenizer: Callable[[str], str],
) -> list[int] | str:
    """``prompt``'s token ids, or the request's error message (``no_tokenizer(what)`` says
    why a string or chat prompt cannot be encoded without a tokenizer)."""
    if isinstance(prompt, str):
        if not prompt:
            return "prompt is empty"
        if tokenizer is None:
            return no_tokenizer("string prompts")
        ids = text_error(prompt) or tokenizer.encode_prompt(prompt)
        if isinstance(ids, str):
            return ids
        return token_ids_error(ids, vocab, "the tokenizer") or ids or "prompt encodes to no tokens"
    if isinstance(prompt, Chat):
        if tokenizer is None:
            return no_tokenizer("chat prompts")
        error = chat_text_error(prompt.messages)
        if error is not None:
            return error
        try:
            ids = tokenizer.encode_chat(prompt.messages, prompt.add_generation_prompt)
        except ChatError as exc:
            return str(exc)
        return token_ids_error(ids, vocab, "the tokenizer") or ids
    if not isinstance(prompt, Sequence) or isinstance(prompt, bytes):
        return f"a prompt must be a string or a list of token ids; got {type(prompt).__name__}"
    ids = list(prompt)
    if not ids:
        return "prompt is empty"
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        return "prompt token ids must be integers"
    return token_ids_error(ids, vocab) or ids


def arrival_list(prompts: Sequence[object], arrivals: Sequence[int] | None) -> list[int]:
    """The iteration each prompt arrives at (all at 0 by default), checked."""
    if arrivals is None:
        return [0] * len(prompts)
    if len(arrivals) != len(prompts) or not all(
        isinstance(a, numbers.Integral) and not isinstance(a, bool) and a >= 0 for a in arrivals
    ):
        raise ValueError("`arrivals` needs one non-negative iteration per prompt (an integer)")
    return [int(a) for a in arrivals]


def params_per_prompt(
    prompts: Sequence[object], params: SamplingParams | Sequence[SamplingParams] | None
) -> list[SamplingParams]:
    """One ``SamplingParams`` per prompt: ``params`` shared by all, or a list as long as
    ``prompts``. A bare string for ``prompts`` or a list of the wrong length is a mistake in
    the call itself, not in one request: it raises."""
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise TypeError("`prompts` must be a list of strings or token-id lists, not a string")
    if params is None or isinstance(params, SamplingParams):
        return [params or SamplingParams()] * len(prompts)
    if len(params) != len(prompts):
        raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
    return list(params)


def context_error(prompt_tokens: int, context: int) -> str | None:
    """A prompt longer than the model's context."""
    if prompt_tokens <= context:
        return None
    return (
        f"prompt has {prompt_tokens} tokens but the context holds {context} "
        "(`max_context`); shorten the prompt"
    )


def kv_pool_error(request: Request, kv_pool_tokens: int) -> str | None:
    """A request whose KV slots (its prompt, its answer and its decode windows) the whole
    pool could not hold."""
    if request.kv_need <= kv_pool_tokens:
        return None
    width = request.decode_width
    windows = f" + 2 * ({width} - 1) for decode windows" if width > 1 else ""
    return (
        f"request needs {request.kv_need} KV slots (prompt + max_new_tokens - 1{windows}) "
        f"but the pool holds {kv_pool_tokens}; raise `kv_pool_tokens` or lower "
        "`max_new_tokens`"
    )
