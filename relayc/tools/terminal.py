"""Text from files on a terminal: what the ``relayc`` commands print from a spec, a GGUF
file, a checkpoint or a model's output passes through :func:`printable` first.

A spec's description or a tokenizer's piece is data, never a command to the terminal: an
``ESC ] 0 ; title BEL`` in it would retitle the window, ``ESC [ 2J`` clear it, a carriage
return overwrite the line before it, and a bidi override make text read in another order
than it runs (Trojan Source). Each of them is printed escaped as Python writes it
(``\\x1b``, ``\\r``, ``\\u202e``), as ``relayc.specs.errors.one_line`` escapes a message.
"""

from __future__ import annotations

import re

__all__ = ["printable"]

# C0 controls but newline and tab (the layout of multi-line text), DEL, C1 controls
# (0x9b is a one-byte CSI on terminals that take 8-bit controls), lone surrogates (which
# cannot be encoded for the terminal at all) and the bidi controls: embeddings,
# overrides and isolates, and the marks.
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def _escape(match: re.Match[str]) -> str:
    return ascii(match.group())[1:-1]


def printable(text: str) -> str:
    """``text`` with every character that would drive the terminal escaped; newlines and
    tabs kept, every other character (accents, CJK, emoji) as it is."""
    return _UNSAFE.sub(_escape, text)
