"""Incremental detokenization for streams.

Text is released only when it is final: a multi-byte character whose bytes span tokens,
or a tokenizer whose decoding of a token depends on the tokens before it, would otherwise
show a replacement character or a wrong space that the full decode does not have. Each
step decodes a short window -- from the start of the previous delta's tokens
(``prefix``) to the end -- and releases what extends the previous window's text, unless
it ends in U+FFFD (an unfinished character). The last step releases the rest, so the
deltas concatenate to the decode of all tokens (tested against the full decode).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


class Detokenizer:
    """Text deltas of one growing token sequence, from ``decode(ids) -> str``."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.prefix = 0  # window start: tokens before it are released and never re-read
        self.read = 0  # tokens whose text has been released

    def push(self, new_ids: Sequence[int], final: bool = False) -> str:
        """Add ``new_ids``; return the text they complete (all that is left when ``final``)."""
        self.ids.extend(new_ids)
        if self.read == len(self.ids) and not final:
            return ""
        released = self.decode(self.ids[self.prefix : self.read])
        text = self.decode(self.ids[self.prefix :])
        if not text.startswith(released):
            # Decoding the longer window changed text already released (a tokenizer whose
            # cleanup looks ahead): hold on until the end, which releases the difference.
            if not final:
                return ""
            return text[len(released) :] if len(text) > len(released) else ""
        if final or (len(text) > len(released) and not text.endswith(REPLACEMENT)):
            self.prefix, self.read = self.read, len(self.ids)
            return text[len(released) :]
        return ""
