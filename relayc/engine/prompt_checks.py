"""A request's prompt checked at submission, so a bad one fails alone.

What reaches the shared scheduler step must run: a token id outside the model's
vocabulary (one a tokenizer made -- a ``bos_token_id`` of 4e9, a ``tokenizer.json``
larger than the embedding) would fail the step of every request in it, and a string no
tokenizer can encode (a lone surrogate) would fail the whole call. Each check returns the
request's error message, or None.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


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
